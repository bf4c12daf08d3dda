"""The task families: how each one makes a task, solves it, and checks an answer.

Every family is small on purpose: tasks a tiny policy can learn to solve with one tool call and
an RL loop can then improve on. Each family gives a reference :class:`Solution` (used to build
synthetic training trajectories with real tool outputs, and by tests to prove the checker
accepts a correct solution) and an async checker that reads the final answer and/or the sandbox.
"""

from __future__ import annotations

import json
import random
import re
import shlex
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING

from trajforge.tasks.types import CheckResult, Solution, SolutionStep, Task

if TYPE_CHECKING:  # imported for annotations only: keeps this package free of import cycles
    from trajforge.protocols import Sandbox

WORDS = [
    "apple",
    "river",
    "stone",
    "cloud",
    "maple",
    "orange",
    "tiger",
    "silver",
    "garden",
    "window",
    "paper",
    "candle",
    "rocket",
    "forest",
    "planet",
    "yellow",
    "copper",
    "dragon",
    "pencil",
    "summer",
    "winter",
    "violet",
    "harbor",
    "meadow",
    "falcon",
    "castle",
    "marble",
    "bridge",
    "lemon",
    "ocean",
    "pepper",
    "rabbit",
    "sunset",
    "thunder",
    "velvet",
    "wagon",
    "zebra",
    "anchor",
    "basket",
]

_INT = re.compile(r"-?\d[\d,]*")
_WORD = re.compile(r"[A-Za-z0-9_\-]+(?:\.[A-Za-z0-9_\-]+)*")


def terminal_output(tool_content: str) -> str:
    """The command output inside a ``terminal`` tool result (JSON with ``output``), stripped."""
    try:
        payload = json.loads(tool_content)
    except json.JSONDecodeError:
        return tool_content.strip()
    output = payload.get("output") if isinstance(payload, dict) else None
    if isinstance(output, str):
        return output.strip()
    return tool_content.strip()


def last_integer(text: str | None) -> int | None:
    """The last integer written in ``text`` (thousands separators allowed), or ``None``."""
    found = [m.replace(",", "") for m in _INT.findall(text or "")]
    found = [f for f in found if f not in {"", "-"}]
    return int(found[-1]) if found else None


def _integers(text: str) -> list[int]:
    found = [m.replace(",", "") for m in _INT.findall(text)]
    return [int(f) for f in found if f not in {"", "-"}]


def _check_number(task: Task, answer: str | None) -> CheckResult:
    """The answer must name exactly one number besides those of the prompt (the operands of
    ``12 + 30 = 42`` are fine): an answer listing several candidates scores 0, whichever is
    last."""
    if not answer or not answer.strip():
        return CheckResult(reward=0.0, reason="no final answer")
    found = _integers(answer)
    if not found:
        return CheckResult(reward=0.0, reason="the final answer contains no number")
    given = set(_integers(task.prompt))
    candidates = list(dict.fromkeys(n for n in found if n not in given)) or [found[-1]]
    if len(candidates) > 1:
        listed = ", ".join(map(str, candidates[:5])) + (", ..." if len(candidates) > 5 else "")
        return CheckResult(
            reward=0.0, reason=f"the answer names {len(candidates)} numbers ({listed}), not one"
        )
    got = candidates[0]
    if str(got) == task.expected:
        return CheckResult(reward=1.0, reason=f"answer {got} is correct")
    return CheckResult(reward=0.0, reason=f"answer {got} is wrong; expected {task.expected}")


Checker = Callable[..., Awaitable[CheckResult]]
"""``async (task, answer, sandbox) -> CheckResult``."""


@dataclass(frozen=True)
class Family:
    """One task family. ``make`` builds a task from a seeded RNG; ``check`` scores an attempt."""

    name: str
    description: str
    make: Callable[[random.Random, str], Task]
    solution: Callable[[Task], Solution]
    result_from_output: Callable[[str], str]
    check: Checker
    needs_setup: bool = False


# --- arithmetic -----------------------------------------------------------------------------

_OPS = {"+": (3, 6, 3, 6), "-": (3, 6, 3, 5), "*": (2, 4, 2, 3)}
_ARITH_PROMPTS = (
    "What is {a} {op} {b}? Use the terminal.",
    "Compute {a} {op} {b} using the terminal.",
    "Use the terminal to calculate {a} {op} {b}.",
)


def _digits(rng: random.Random, lo: int, hi: int) -> int:
    n = rng.randint(lo, hi)
    return rng.randint(10 ** (n - 1), 10**n - 1)


def _make_arithmetic(rng: random.Random, task_id: str) -> Task:
    op = rng.choice(tuple(_OPS))
    alo, ahi, blo, bhi = _OPS[op]
    a, b = _digits(rng, alo, ahi), _digits(rng, blo, bhi)
    value = {"+": a + b, "-": a - b, "*": a * b}[op]
    prompt = rng.choice(_ARITH_PROMPTS).format(a=a, op=op, b=b)
    return Task(
        id=task_id,
        family="arithmetic",
        prompt=prompt,
        expected=str(value),
        metadata={"a": a, "b": b, "op": op},
    )


def _solve_arithmetic(task: Task) -> Solution:
    a, op, b = task.metadata["a"], task.metadata["op"], task.metadata["b"]
    return Solution(
        steps=[
            SolutionStep(
                thought=f"I need {a} {op} {b}. I will compute it in the terminal.",
                tool="terminal",
                arguments={"command": f"echo $(({a} {op} {b}))"},
            )
        ],
        final_thought="The terminal printed {result}.",
        answer_template=f"{a} {op} {b} = {{result}}",
    )


async def _check_arithmetic(task: Task, answer: str | None, sandbox: Sandbox | None = None) -> CheckResult:
    return _check_number(task, answer)


# --- write_file -----------------------------------------------------------------------------

_WRITE_PROMPTS = (
    "Write the text '{text}' to the file {path}.",
    "Create a file named {path} containing '{text}'.",
    "Save '{text}' into {path}.",
)


def _make_write_file(rng: random.Random, task_id: str) -> Task:
    text = " ".join(rng.sample(WORDS, rng.randint(2, 4)) + [str(rng.randint(1, 999))])
    path = f"{rng.choice(WORDS)}.txt"
    return Task(
        id=task_id,
        family="write_file",
        prompt=rng.choice(_WRITE_PROMPTS).format(text=text, path=path),
        expected=text,
        metadata={"path": path},
    )


def _solve_write_file(task: Task) -> Solution:
    path = task.metadata["path"]
    return Solution(
        steps=[
            SolutionStep(
                thought=f"I will write the text to {path} with write_file.",
                tool="write_file",
                arguments={"path": path, "content": task.expected},
            )
        ],
        final_thought="The file was written.",
        answer_template=f"Done: {path} now contains the text.",
    )


async def _check_write_file(task: Task, answer: str | None, sandbox: Sandbox | None = None) -> CheckResult:
    if sandbox is None:
        raise ValueError("the write_file checker reads the file, so it needs the rollout's sandbox")
    path = task.metadata["path"]
    try:
        data = await sandbox.read_bytes(path)
    except FileNotFoundError:
        return CheckResult(reward=0.0, reason=f"{path} was not written")
    except (OSError, PermissionError) as exc:
        return CheckResult(reward=0.0, reason=f"cannot read {path}: {exc}")
    text = data.decode("utf-8", errors="replace")
    if text.rstrip("\n") == task.expected:
        return CheckResult(reward=1.0, reason=f"{path} holds the expected text")
    return CheckResult(reward=0.0, reason=f"{path} holds {text[:80]!r}, expected {task.expected!r}")


# --- shell: count lines / words --------------------------------------------------------------


def _random_lines(rng: random.Random, n: int) -> str:
    return "".join(" ".join(rng.sample(WORDS, rng.randint(1, 5))) + "\n" for _ in range(n))


def _make_count(unit: str) -> Callable[[random.Random, str], Task]:
    def make(rng: random.Random, task_id: str) -> Task:
        path = f"{rng.choice(WORDS)}.txt"
        text = _random_lines(rng, rng.randint(3, 40))
        value = len(text.splitlines()) if unit == "lines" else len(text.split())
        prompt = rng.choice(
            (
                f"How many {unit} are in {path}? Use the terminal.",
                f"Count the {unit} in the file {path}.",
            )
        )
        return Task(
            id=task_id,
            family=f"count_{unit}",
            prompt=prompt,
            setup_files={path: text},
            expected=str(value),
            metadata={"path": path, "unit": unit},
        )

    return make


def _solve_count(task: Task) -> Solution:
    path, unit = task.metadata["path"], task.metadata["unit"]
    flag = "-l" if unit == "lines" else "-w"
    return Solution(
        steps=[
            SolutionStep(
                thought=f"I will count the {unit} of {path} with wc.",
                tool="terminal",
                arguments={"command": f"wc {flag} < {shlex.quote(path)}"},
            )
        ],
        final_thought="wc printed {result}.",
        answer_template=f"{path} has {{result}} {unit}.",
    )


async def _check_count(task: Task, answer: str | None, sandbox: Sandbox | None = None) -> CheckResult:
    return _check_number(task, answer)


# --- shell: find a value in a file ------------------------------------------------------------


def _make_find_value(rng: random.Random, task_id: str) -> Task:
    keys = rng.sample(
        ("port", "host", "user", "mode", "level", "color", "region", "owner", "size", "code"), 6
    )
    values = {k: rng.choice((str(rng.randint(100, 99999)), rng.choice(WORDS))) for k in keys}
    path = rng.choice(("settings.conf", "config.ini", "app.env"))
    key = rng.choice(keys)
    return Task(
        id=task_id,
        family="find_value",
        prompt=f"What is the value of {key} in {path}? Use the terminal.",
        setup_files={path: "".join(f"{k}={v}\n" for k, v in values.items())},
        expected=values[key],
        metadata={"path": path, "key": key},
    )


def _solve_find_value(task: Task) -> Solution:
    path, key = task.metadata["path"], task.metadata["key"]
    return Solution(
        steps=[
            SolutionStep(
                thought=f"I will look for {key} in {path} with grep.",
                tool="terminal",
                arguments={"command": f"grep ^{key}= {shlex.quote(path)}"},
            )
        ],
        final_thought="grep found {result}.",
        answer_template=f"The value of {key} is {{result}}.",
    )


def _value_after_equals(output: str) -> str:
    line = output.strip().splitlines()[0] if output.strip() else ""
    return line.split("=", 1)[1].strip() if "=" in line else line


def _file_values(task: Task) -> set[str]:
    text = task.setup_files.get(str(task.metadata.get("path")), "")
    return {line.split("=", 1)[1].strip() for line in text.splitlines() if "=" in line} | {task.expected}


async def _check_find_value(task: Task, answer: str | None, sandbox: Sandbox | None = None) -> CheckResult:
    """The answer must name the value and no other value of the file: listing every value (or
    several) scores 0."""
    if not answer or not answer.strip():
        return CheckResult(reward=0.0, reason="no final answer")
    values = _file_values(task)
    named = list(dict.fromkeys(w for w in _WORD.findall(answer) if w in values))
    if named == [task.expected]:
        return CheckResult(reward=1.0, reason=f"answer names the value {task.expected!r}")
    if task.expected in named:
        return CheckResult(
            reward=0.0, reason=f"answer names {len(named)} of the file's values, not only {task.expected!r}"
        )
    return CheckResult(reward=0.0, reason=f"answer does not contain the value {task.expected!r}")


FAMILIES: Mapping[str, Family] = MappingProxyType(
    {
        "arithmetic": Family(
            "arithmetic",
            "integer + - * of multi-digit numbers, computed in the terminal",
            _make_arithmetic,
            _solve_arithmetic,
            terminal_output,
            _check_arithmetic,
        ),
        "write_file": Family(
            "write_file",
            "write a given text to a file; checked by reading the file",
            _make_write_file,
            _solve_write_file,
            lambda content: content,
            _check_write_file,
        ),
        "count_lines": Family(
            "count_lines",
            "count the lines of a provided file",
            _make_count("lines"),
            _solve_count,
            terminal_output,
            _check_count,
            needs_setup=True,
        ),
        "count_words": Family(
            "count_words",
            "count the words of a provided file",
            _make_count("words"),
            _solve_count,
            terminal_output,
            _check_count,
            needs_setup=True,
        ),
        "find_value": Family(
            "find_value",
            "find the value of a key in a provided key=value file",
            _make_find_value,
            _solve_find_value,
            lambda content: _value_after_equals(terminal_output(content)),
            _check_find_value,
            needs_setup=True,
        ),
    }
)
