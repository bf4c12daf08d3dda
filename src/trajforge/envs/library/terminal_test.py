"""``terminal_test``: file-creation and shell tasks, judged by reading the files back.

Each item asks for one or more files with exact contents (plain text, a directory of files, a
shell script's output, sorted/filtered data derived from a provided input). Reward, per expected
file, averaged over the item's files:

- 1.0  the file holds exactly the expected bytes (one trailing newline is forgiven),
- 0.5  the same lines after stripping whitespace at line ends and blank lines at the end,
- 0.0  the file holds something else, is missing, or is not a regular file. (A file that merely
  exists earns nothing: credit for existence pays a policy for writing anything -- every
  candidate line, say -- at every path the prompt names.)

An item's reward is 1.0 only when every file is exact; ``components`` records each file.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any, ClassVar

from trajforge.envs.base import BaseEnv
from trajforge.envs.config import EnvConfig
from trajforge.envs.kept import KeptFiles, snapshot
from trajforge.envs.types import Item, RewardBreakdown
from trajforge.tasks.families import WORDS

if TYPE_CHECKING:
    from trajforge.agent.result import AgentResult
    from trajforge.envs.verifier import VerifierContext


def _words(rng: random.Random, n: int) -> str:
    return " ".join(rng.sample(WORDS, n))


def _write_one(rng: random.Random) -> tuple[str, dict[str, str], dict[str, str]]:
    path = f"{rng.choice(WORDS)}.txt"
    text = _words(rng, rng.randint(2, 5))
    return f"Create a file named {path} containing exactly this line: {text}", {}, {path: text + "\n"}


def _make_dir(rng: random.Random) -> tuple[str, dict[str, str], dict[str, str]]:
    d = rng.choice(WORDS)
    names = rng.sample(WORDS, 3)
    prompt = (
        f"Create a directory {d} holding three files {', '.join(n + '.txt' for n in names)}; "
        "each file contains its own name without the extension, on one line."
    )
    return prompt, {}, {f"{d}/{n}.txt": n + "\n" for n in names}


def _sort_numbers(rng: random.Random) -> tuple[str, dict[str, str], dict[str, str]]:
    nums = [rng.randint(1, 999) for _ in range(rng.randint(5, 9))]
    src = "\n".join(map(str, nums)) + "\n"
    out = "\n".join(map(str, sorted(nums))) + "\n"
    return (
        "Sort the numbers in numbers.txt in ascending numeric order into sorted.txt.",
        {"numbers.txt": src},
        {"sorted.txt": out},
    )


def _grep_lines(rng: random.Random) -> tuple[str, dict[str, str], dict[str, str]]:
    key = rng.choice(WORDS)
    lines = [
        " ".join(rng.sample(WORDS, 3)) + (f" {key}" if rng.random() < 0.5 else "")
        for _ in range(rng.randint(6, 10))
    ]
    lines[0] += f" {key}"
    src = "\n".join(lines) + "\n"
    out = "\n".join(line for line in lines if key in line.split()) + "\n"
    return (
        f"Copy every line of log.txt that contains the word {key} into matches.txt, in order.",
        {"log.txt": src},
        {"matches.txt": out},
    )


def _script(rng: random.Random) -> tuple[str, dict[str, str], dict[str, str]]:
    n = rng.randint(3, 7)
    return (
        f"Write a shell script count.sh that prints the numbers 1 to {n}, one per line, then run it "
        "and save its output in count.txt.",
        {},
        {"count.txt": "".join(f"{i}\n" for i in range(1, n + 1))},
    )


_KINDS = {
    "write_one": _write_one,
    "make_dir": _make_dir,
    "sort_numbers": _sort_numbers,
    "grep_lines": _grep_lines,
    "script": _script,
}


def _score(expected: str, actual: bytes | None) -> tuple[float, str]:
    if actual is None:
        return 0.0, "missing"
    text = actual.decode(errors="replace")
    if text == expected or text == expected.rstrip("\n") or text == expected + "\n":
        return 1.0, "exact"

    def norm(s: str) -> list[str]:
        out = [line.rstrip() for line in s.splitlines()]
        while out and not out[-1]:
            out.pop()
        return out

    if norm(text) == norm(expected):
        return 0.5, "same lines, different whitespace"
    return 0.0, "wrong content"


class TerminalTestEnv(BaseEnv):
    name: ClassVar[str] = "terminal_test"
    description: ClassVar[str] = "create files and run shell steps; reward by reading the files back"

    @classmethod
    def default_config(cls) -> EnvConfig:
        return EnvConfig(enabled_toolsets=["terminal", "file"], max_agent_turns=8)

    def generate(self, index: int, *, split: str) -> Item:
        kinds = list(_KINDS)
        kind = kinds[index % len(kinds)]
        rng = random.Random(f"terminal_test:{split}:{self.config.seed}:{index}")
        prompt, setup, expected = _KINDS[kind](rng)
        return {
            "id": f"{kind}-{split}-{index}",
            "category": kind,
            "prompt": prompt,
            "setup_files": setup,
            "expected_files": expected,
        }

    def setup_files(self, item: Item) -> dict[str, str]:
        return dict(item.get("setup_files") or {})

    async def compute_reward(self, item: Item, result: AgentResult, ctx: VerifierContext) -> RewardBreakdown:
        return await self._judge(item, ctx.sandbox)

    async def _judge(self, item: Item, files: Any) -> RewardBreakdown:
        parts: dict[str, float] = {}
        notes = []
        for path, expected in item["expected_files"].items():
            try:
                actual: bytes | None = await files.read_bytes(path)
            except (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError):
                actual = None
            parts[path], why = _score(expected, actual)
            notes.append(f"{path}: {why}")
        reward = sum(parts.values()) / max(1, len(parts))
        return RewardBreakdown(value=reward, components=parts, reason="; ".join(notes))

    def oracle_calls(self, item: Item) -> list[tuple[str, dict[str, Any]]]:
        """Write each expected file (what `--agent oracle` does): every item must score 1.0."""
        return [
            ("write_file", {"path": path, "content": text}) for path, text in item["expected_files"].items()
        ]

    async def keep(self, item: Item, result: AgentResult, ctx: VerifierContext) -> dict[str, Any]:
        return await snapshot(ctx)

    async def rescore(
        self, item: Item, messages: list[dict[str, Any]], kept: dict[str, Any]
    ) -> RewardBreakdown | None:
        return await self._judge(item, KeptFiles(kept))
