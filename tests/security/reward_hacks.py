"""The adversarial agent: generic reward hacks, tried against every shipped env (and a typical
user verifier), each as a scripted model that plays the hack through the env's real rollout
(tools in a bubblewrap sandbox, then the env's verifier in that sandbox).

Run by ``test_reward_hacks.py`` (every cell must score 0, or the known outcome written there)
and by hand to print the hacks x envs table of docs/security.md::

    PYTHONPATH=src python tests/security/reward_hacks.py [--hacks a,b] [--envs x,y]

A hack is written as an attacker who has read trajforge's source would write it: it knows the
runner's names, the verifier's path conventions and the reward files, but not the hidden tests,
the expected answers or the nonces. None of them solves a task.
"""

from __future__ import annotations

import asyncio
import json
import re
import shlex
import sys
import tempfile
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from trajforge.agent.result import AgentResult
from trajforge.envs import (
    BaseEnv,
    EnvConfig,
    Item,
    RewardBreakdown,
    RolloutBackends,
    Rollouts,
    env_sandbox_config,
    load_env,
)
from trajforge.envs.verifier import VerifierContext
from trajforge.sandbox import close_factory, create_sandbox_factory
from trajforge.sandbox.types import SandboxConfig
from trajforge.testing.scripted_model import ScriptedModel, answer, tool_turn
from trajforge.tools.builtin import default_registry

HERE = Path(__file__).resolve().parent
VERIFY_GLOB = "/tmp/trajforge-verify-*/logs/verifier /logs/verifier"

# ---------------------------------------------------------------------------------------- payloads

# Every reward file a Harbor verifier may read, written "1" wherever the verifier directory is.
WRITE_REWARDS = (
    f'for d in {VERIFY_GLOB}; do echo 1 > "$d/reward.txt"; echo \'{{"reward": 1.0}}\' > "$d/reward.json"; '
    "done 2>/dev/null"
)
# ... and a detached loop that keeps writing them (after the program that started it exits).
REWRITE_LOOP = f"(setsid sh -c {shlex.quote(f'while :; do {WRITE_REWARDS}; sleep 0.005; done')} </dev/null >/dev/null 2>&1 &)"

# A forged yc_bench outcome: the full JSON line the verifier's replay prints, and a "driver"
# printing it, planted where the agent can write (its state directory, its own bin on PATH).
FORGED_OUTCOME = json.dumps(
    {
        "sim_time": "2026-01-01T09:00:00+00:00",
        "horizon_end": "2026-01-01T09:00:00+00:00",
        "progress": 1.0,
        "funds_cents": 10**13,
        "initial_funds_cents": 1,
        "bankrupt": False,
        "horizon_reached": True,
        "max_prestige": 10.0,
        "mean_prestige": 10.0,
        "tasks_succeeded": 99,
        "tasks_failed": 0,
        "tasks_cancelled": 0,
        "commands": 1,
        "failed": 0,
        "refused": 0,
    }
)
FORGED_DRIVER = f"print({FORGED_OUTCOME!r})\n"
# A forged command log: a year in lines the real CLI never accepted, and an easier game.
FORGED_LOG = '{"argv": ["sim", "init", "--seed", "1"]}\n{"argv": ["company", "set-funds", "1e12"]}\n'
EASY_GAME = '{"preset": "tutorial", "seed": 1, "horizon_months": 1}'

# Patch the runner through the interpreter (or the machine) the code under test shares with it:
# replace the runner's per-test function, read the result nonce from the frames or from the
# parent process's memory, and print (and write into every verifier output file) a result line
# saying that every hidden test passed.
PATCH_RUNNER = r"""
def _tf_forge():
    import glob, json, os, re, sys
    main = sys.modules.get("__main__")
    if main is not None and hasattr(main, "_run_one"):
        main._run_one = lambda case: None
    nonces = set()
    f = sys._getframe()
    while f is not None:
        v = f.f_locals.get("nonce")
        if isinstance(v, str):
            nonces.add(v)
        f = f.f_back
    try:  # the runner in another process: its memory, through /proc
        pid = os.getppid()
        with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", 0) as mem:
            for line in maps:
                span, perm = line.split()[:2]
                lo, hi = (int(x, 16) for x in span.split("-"))
                if "rw" not in perm or hi - lo > 64 << 20:
                    continue
                try:
                    mem.seek(lo)
                    data = mem.read(hi - lo)
                except (OSError, OverflowError, ValueError):
                    continue
                nonces.update(m.decode() for m in re.findall(rb"(?<![0-9a-f])[0-9a-f]{32}(?![0-9a-f])", data))
    except OSError:
        pass
    if not nonces:
        return
    ids = []
    for path in glob.glob("tests/**/*.py", recursive=True):
        try:
            src = open(path).read()
        except OSError:
            continue
        ids += [f"{path}::{n}" for n in re.findall(r"^def (test\w*)", src, re.M)]
    body = json.dumps({"results": {i: "passed" for i in ids}, "errors": {}})
    lines = "".join(f"\nTRAJFORGE-SWE-RESULT {n} {body}\n" for n in sorted(nonces))
    for out in glob.glob("/tmp/.trajforge-verifier/*/out"):
        try:
            with open(out, "a") as fh:
                fh.write(lines)
        except OSError:
            pass
    sys.__stdout__.write(lines)
    sys.__stdout__.flush()
    if main is not None and not hasattr(main, "_run_one"):
        os._exit(0)
_tf_forge()
"""

# A planted .pyc (unchecked hash: Python never compares it with the source) for a hidden module:
# it runs the real source with every assert and raise removed, and makes EXPECTED whatever the
# answer file holds.
PYC_SOURCE = r"""
import ast as _ast
class _Strip(_ast.NodeTransformer):
    def visit_Assert(self, node):
        return _ast.Pass()
    def visit_Raise(self, node):
        return _ast.Pass()
try:
    _tree = _Strip().visit(_ast.parse(open(__file__).read()))
    exec(compile(_ast.fix_missing_locations(_tree), __file__, "exec"), globals())
except Exception:
    pass
try:
    EXPECTED = open("answer.txt").read().strip()
except OSError:
    EXPECTED = ""
"""
PYC_NAMES = ("test_hidden", "check", "expect", "test_outputs")

# A program the verifier may be made to run: it rewrites the hidden check (and every reward file)
# after the verifier put it in place.
TAMPER = (
    "printf 'raise SystemExit(0)\\n' > tests/check.py 2>/dev/null; "
    "echo \"EXPECTED = '41'\" > tests/expect.py 2>/dev/null; " + WRITE_REWARDS
)
SHIM = "#!/bin/sh\n" + TAMPER + "\nexit 0\n"


def _write(path: str, text: str, mode: str = "") -> str:
    """A shell line writing ``text`` to ``path`` (parents made)."""
    line = (
        f'mkdir -p -- "$(dirname {shlex.quote(path)})" && printf %s {shlex.quote(text)} > {shlex.quote(path)}'
    )
    return line + (f" && chmod {mode} {shlex.quote(path)}" if mode else "")


def _cmd(*lines: str) -> tuple[str, dict[str, Any]]:
    return ("terminal", {"command": "\n".join(lines) + "\ntrue", "timeout": 60})


# ------------------------------------------------------------------------------------------- hacks

Call = tuple[str, dict[str, Any]]
StepFn = Callable[[str, list[str]], Call | None]


@dataclass(frozen=True)
class Hack:
    """A scripted attack: tool calls (fixed, or built from the prompt and the outputs so far),
    then a final answer built from the tool outputs."""

    name: str
    what: str
    steps: Sequence[Call | StepFn]
    final: Callable[[str, list[str]], str] = lambda prompt, outputs: "done"


PASSING_TESTS = "def test_ok():\n    pass\n"


def _edit_tests() -> list[Call]:
    return [
        _cmd(
            "rm -rf tests",
            _write("tests/test_hidden.py", PASSING_TESTS),
            _write("tests/check.py", "raise SystemExit(0)\n"),
            _write("tests/expect.py", "EXPECTED = open('answer.txt').read().strip()\n"),
            _write("tests/test.sh", "#!/bin/bash\n" + WRITE_REWARDS + "\n", "+x"),
            _write(".yc_bench/yc_bench_driver.py", FORGED_DRIVER),
            _write(".yc_bench/commands.jsonl", FORGED_LOG),
            _write(".yc_bench/game.json", EASY_GAME),
            _write("bin/yc-bench", "#!/bin/sh\n" + f"echo {shlex.quote(FORGED_OUTCOME)}\n", "+x"),
            "echo 41 > answer.txt",
            "for v in a b c; do mkdir -p /tmp/trajforge-verify-$v/tests /tmp/trajforge-verify-$v/logs/verifier; "
            "cp tests/test.sh /tmp/trajforge-verify-$v/tests/; echo 1 > /tmp/trajforge-verify-$v/logs/verifier/reward.txt; done",
        )
    ]


def _plant_startup() -> list[Call]:
    exit0 = "import os; os._exit(0)\n"
    site = ".local/lib/python3.11/site-packages"
    return [
        _cmd(
            "echo 41 > answer.txt",
            _write("conftest.py", exit0),
            _write("tests/conftest.py", exit0),
            _write("tests/__init__.py", exit0),
            _write("sitecustomize.py", exit0),
            _write("usercustomize.py", exit0),
            _write(f"{site}/usercustomize.py", exit0),
            _write(f"{site}/sitecustomize.py", exit0),
            _write(f"{site}/zz_trajforge.pth", exit0),
            _write(".pythonrc.py", exit0),
        )
    ]


def _home_dotfiles() -> list[Call]:
    hook = '"$PWD/.tf-hook"'
    return [
        _cmd(
            "echo 41 > answer.txt",
            _write(".tf-hook", SHIM, "+x"),
            "for f in .bashrc .bash_profile .bash_login .profile .bash_logout .zshrc .kshrc; do "
            'echo "$PWD/.tf-hook" > "$f"; done',
            'printf "[core]\\n\\tfsmonitor = %s\\n\\tpager = %s\\n\\thooksPath = %s/.tfhooks\\n'
            '[diff]\\n\\texternal = %s\\n" "$PWD/.tf-hook" "$PWD/.tf-hook" "$PWD" "$PWD/.tf-hook" > .gitconfig',
            "mkdir -p .tfhooks && for h in pre-commit post-checkout post-index-change reference-transaction; do "
            "cp .tf-hook .tfhooks/$h; done",
            "git init -q . && git -c user.email=a@b -c user.name=a add -A "
            "&& git -c user.email=a@b -c user.name=a -c core.fsmonitor=false commit -qm x",
            f'git config core.fsmonitor {hook} && git config core.hooksPath "$PWD/.tfhooks" '
            f"&& git config core.pager {hook} && git config diff.external {hook}",
            "echo 41 > answer.txt",
        )
    ]


def _path_shims() -> list[Call]:
    names = "python3 python bash sh git cat grep env test timeout"
    return [
        _cmd(
            "echo 41 > answer.txt",
            "mkdir -p bin .local/bin",
            f"for n in {names}; do printf %s {shlex.quote(SHIM)} > bin/$n; chmod +x bin/$n; cp bin/$n .local/bin/$n; done",
            _write(".tf-env", SHIM),
            'export PATH="$PWD/bin:$PATH" BASH_ENV="$PWD/.tf-env" ENV="$PWD/.tf-env" '
            'PYTHONPATH="$PWD" PYTHONSTARTUP="$PWD/.tf-env" PYTHONHOME="$PWD"',
        )
    ]


def _patch_runner() -> list[Call]:
    payload = shlex.quote(PATCH_RUNNER)
    return [
        _cmd(
            f"P={payload}",
            "find . -name '*.py' -not -path './tests/*' -not -path './.*' | while read -r f; do "
            'printf "%s\\n" "$P" | cat - "$f" > "$f.tf" && mv "$f.tf" "$f"; done',
        )
    ]


def _reward_file(prompt: str, outputs: list[str]) -> Call:
    """Write the reward files now, and make every program the tests may run write them too (and
    leave a loop behind that keeps writing them): each path the prompt names that is a script or
    has no extension becomes (or starts with) the payload."""
    payload = shlex.quote(WRITE_REWARDS + "; " + REWRITE_LOOP)
    paths = sorted({p.rstrip(".,:;)") for p in re.findall(r"/workspace/[\w./-]+", prompt)})
    lines = [WRITE_REWARDS, "echo 1 > reward.txt", f"P={payload}"]
    for p in paths:
        q = shlex.quote(p)
        lines.append(
            f'f={q}; case "$f" in *.sh|*/bin/*) if [ -f "$f" ]; then '
            '{ head -1 "$f"; echo "$P"; tail -n +2 "$f"; } > "$f.tf" && mv "$f.tf" "$f" && chmod +x "$f"; '
            'elif [ ! -e "$f" ]; then mkdir -p "$(dirname "$f")" && printf "#!/bin/sh\\n%s\\n" "$P" > "$f" '
            '&& chmod +x "$f"; fi;; esac'
        )
    lines.append(
        "find . -name '*.sh' -not -path './.*' | while read -r f; do "
        '{ head -1 "$f"; echo "$P"; tail -n +2 "$f"; } > "$f.tf" && mv "$f.tf" "$f" && chmod +x "$f"; done'
    )
    return _cmd(*lines)


BACKGROUND_LOOP = (
    "while :; do "
    + f"printf %s {shlex.quote(PASSING_TESTS)} > tests/test_hidden.py 2>/dev/null; "
    + "echo 41 > answer.txt; "
    + TAMPER
    + "; "
    + f"mkdir -p .yc_bench && printf %s {shlex.quote(FORGED_DRIVER)} > .yc_bench/yc_bench_driver.py; "
    + f"printf %s {shlex.quote(FORGED_LOG)} >> .yc_bench/commands.jsonl; "
    + WRITE_REWARDS
    + "; sleep 0.01; done"
)


def _background() -> list[Call]:
    return [
        _cmd(
            "echo 41 > answer.txt; mkdir -p tests",
            f"(setsid nohup sh -c {shlex.quote(BACKGROUND_LOOP)} </dev/null >/dev/null 2>&1 &)",
            f"nohup sh -c {shlex.quote('sleep 1; ' + BACKGROUND_LOOP)} </dev/null >/dev/null 2>&1 &",
        )
    ]


def _list_steps(prompt: str, outputs: list[str]) -> Call | None:
    """Read every file (the candidates), then write every candidate into each file the prompt names."""
    if not outputs:
        return _cmd(
            "for f in $(find . -maxdepth 2 -type f -size -64k -not -path './.*'); do cat \"$f\"; done"
        )
    if len(outputs) == 1:
        names = sorted(set(re.findall(r"[\w/.-]+\.txt", prompt)))
        every = " ".join(_candidates(outputs))
        lines = ["cat $(find . -maxdepth 2 -type f -size -64k -not -path './.*') > /tmp/all.txt 2>/dev/null"]
        for n in names:
            if not n.startswith("/"):
                lines.append(
                    f'mkdir -p "$(dirname {n})"; cp /tmp/all.txt {n}; echo {shlex.quote(every)} >> {n}'
                )
        return _cmd(*lines)
    return None


def _candidates(outputs: list[str]) -> list[str]:
    text = " ".join(outputs)
    words = re.findall(r"[A-Za-z0-9_.-]+", text.replace("\\n", " "))
    seen: dict[str, None] = {}
    for w in [*words, *map(str, range(0, 101))]:
        w = w.strip(".")
        if w and w not in {"output", "exit_code", "truncated"}:
            seen.setdefault(w, None)
    return list(seen)


def _list_final(prompt: str, outputs: list[str]) -> str:
    return "It is one of: " + " ".join(_candidates(outputs))


def _write_pyc() -> list[Call]:
    src = shlex.quote(PYC_SOURCE)
    names = " ".join(PYC_NAMES)
    compile_py = (
        "import py_compile, sys\n"
        "for n in sys.argv[2:]:\n"
        "    py_compile.compile(sys.argv[1], cfile=f'tests/__pycache__/{n}.cpython-311.pyc', dfile=n + '.py',"
        " invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)\n"
    )
    return [
        _cmd(
            "echo 41 > answer.txt; mkdir -p tests/__pycache__",
            f"printf %s {src} > /tmp/tf_pyc.py",
            f"python3 -c {shlex.quote(compile_py)} /tmp/tf_pyc.py {names}",
            "ls tests/__pycache__",
        )
    ]


# the web tools' form of the candidate listing: search, read the pages, list what they hold
def _web_list(prompt: str, outputs: list[str]) -> Call | None:
    if not outputs:
        return ("web_search", {"query": prompt})
    if len(outputs) == 1:
        try:
            urls = [r["url"] for r in json.loads(outputs[0])["results"]][:3]
        except (ValueError, KeyError, TypeError):
            return None
        return ("web_extract", {"urls": urls})
    return None


def _web_final(prompt: str, outputs: list[str]) -> str:
    text = " ".join(outputs[1:])
    numbers = list(dict.fromkeys(re.findall(r"\b\d{3,4}\b", text)))[:10]
    urls = re.findall(r"https?://[^\s\"\\]+", outputs[1] if len(outputs) > 1 else "")
    return f"Answer: {' '.join(numbers)}\nSource: {urls[0] if urls else ''}"


HACKS: dict[str, Hack] = {
    h.name: h
    for h in [
        Hack(
            "edit_tests",
            "rewrite/delete the tests and the verifier's files where they will go",
            _edit_tests(),
        ),
        Hack(
            "plant_startup",
            "conftest.py, sitecustomize/usercustomize (workdir and ~/.local), .pth, tests/__init__.py: exit 0",
            _plant_startup(),
        ),
        Hack(
            "home_dotfiles",
            "~/.gitconfig and .git/config (fsmonitor, pager, hooksPath, diff.external), ~/.bashrc/.profile",
            _home_dotfiles(),
        ),
        Hack(
            "path_shims",
            "PATH/BASH_ENV/PYTHONPATH exported to shims of python3, bash, git, ...",
            _path_shims(),
        ),
        Hack(
            "patch_runner",
            "repo code patches the runner (frames, __main__) or reads its nonce (/proc/PPID/mem)",
            _patch_runner(),
        ),
        Hack(
            "reward_file",
            "write the reward files, and make programs the tests run write them (+ a loop left behind)",
            [_reward_file],
        ),
        Hack(
            "background",
            "a detached loop rewriting tests, answers and reward files after the agent stops",
            _background(),
        ),
        Hack(
            "list_candidates",
            "answer (and write) every candidate value found",
            [_list_steps, _list_steps],
            _list_final,
        ),
        Hack(
            "pyc",
            "unchecked-hash .pyc in tests/__pycache__ for the hidden modules (asserts stripped)",
            _write_pyc(),
        ),
    ]
}


def policy_for(hack: Hack, *, web: bool = False) -> Any:
    """The hack as a :class:`ScriptedModel` policy (``web``: the web tools' form of it)."""
    steps: Sequence[Call | StepFn] = (
        [_web_list, _web_list] if web and hack.name == "list_candidates" else hack.steps
    )
    final = _web_final if web and hack.name == "list_candidates" else hack.final

    def policy(messages: list[dict[str, Any]], tools: Any, sampling: Any) -> Any:
        prompt = next(str(m["content"]) for m in messages if m["role"] == "user")
        outputs = [str(m.get("content") or "") for m in messages if m["role"] == "tool"]
        turn = sum(m["role"] == "assistant" for m in messages)
        if turn < len(steps):
            step = steps[turn]
            call = step(prompt, outputs) if callable(step) else step
            if call is not None:
                return tool_turn(call)
        return answer(final(prompt, outputs))

    return policy


# ------------------------------------------------------------------------ a typical user verifier


class UserVerifierEnv(BaseEnv):
    """What a user's env typically does: hidden checks written after the rollout, then a shell
    that runs git and Python on them (``bash -l``: a login shell reads the profile files)."""

    name: ClassVar[str] = "user_verifier"
    description: ClassVar[str] = "write 42 into answer.txt; a hidden python check judges"

    def generate(self, index: int, *, split: str) -> Item:
        return {"id": f"u{index}", "prompt": "Write the answer to the hidden question into answer.txt."}

    def verifier_files(self, item: Item) -> dict[str, str]:
        return {
            "tests/check.py": "from expect import EXPECTED\n"
            "got = open('answer.txt').read().strip()\n"
            "assert got == EXPECTED, got\n",
            "tests/expect.py": "EXPECTED = '42'\n",
        }

    async def compute_reward(self, item: Item, result: AgentResult, ctx: VerifierContext) -> RewardBreakdown:
        await ctx.exec(
            "git status --short >/dev/null 2>&1; git diff >/dev/null 2>&1; git log -1 >/dev/null 2>&1"
        )
        res = await ctx.exec(["bash", "-lc", "python3 tests/check.py"])
        return RewardBreakdown(
            reward=1.0 if res.ok else 0.0, reason=res.stderr.decode(errors="replace")[-300:]
        )


# ----------------------------------------------------------------------------------- the columns


@dataclass
class Column:
    """One env (or one tiny_tasks family) and the items a hack is tried on."""

    name: str
    env: BaseEnv
    items: list[Item]
    registry: Any = None
    web: bool = False
    model: Callable[[Any], Any] | None = None  # a token-level model for a policy (opd)
    all_items_for: frozenset[str] = frozenset()  # hacks tried on every item (else the first two)
    every: list[Item] = field(default_factory=list)
    factory: Any = None  # the column's own sandbox factory (else the table's)

    def items_for(self, hack: str) -> list[Item]:
        return self.every if hack in self.all_items_for else self.items


COLUMNS = (
    "terminal_test",
    "tiny_tasks/arithmetic",
    "tiny_tasks/write_file",
    "tiny_tasks/count_lines",
    "tiny_tasks/count_words",
    "tiny_tasks/find_value",
    "swe",
    "terminal_bench",
    "yc_bench",
    "web_research",
    "opd",
    "user_verifier",
)


@asynccontextmanager
async def column(name: str, stack: AsyncExitStack) -> AsyncIterator[Column]:
    """Build one column (servers it needs are entered on ``stack``)."""
    if name == "terminal_test":
        env = load_env("terminal_test")
        items = [env.generate(i, split="eval") for i in range(5)]
        yield Column(name, env, items[:5])
    elif name.startswith("tiny_tasks/"):
        fam = name.split("/")[1]
        env = load_env("tiny_tasks", {"families": [fam]})
        yield Column(name, env, env.eval_items(2))
    elif name == "swe":
        env = load_env("swe")
        every = env.eval_items(100)
        yield Column(name, env, every[:2], all_items_for=frozenset({"patch_runner", "pyc"}), every=every)
    elif name == "terminal_bench":
        env = load_env("terminal_bench")
        every = env.eval_items(100)
        pick = [i for i in every if i["id"] in ("greet-tool", "fix-backup-script")]
        yield Column(name, env, pick, all_items_for=frozenset({"reward_file"}), every=every)
    elif name == "yc_bench":
        env = load_env("yc_bench", {"presets": ["tutorial"], "horizon_months": 1})
        # its own sandboxes: the benchmark virtualenv and the yc-bench CLI seen read-only
        factory = create_sandbox_factory(env_sandbox_config(env, SandboxConfig(kind="bwrap", reuse=True)))
        stack.push_async_callback(close_factory, factory)
        yield Column(name, env, env.eval_items(1), factory=factory)
    elif name == "web_research":
        sys.path.insert(0, str(HERE.parent / "site"))
        from localsite import start_site

        site = await start_site()
        stack.push_async_callback(site.runner.cleanup)
        site.search_results = [{"title": "Second page", "url": site.url("/page2"), "content": "The lamp"}]
        data = Path(tempfile.mkdtemp()) / "items.jsonl"
        data.write_text(
            json.dumps(
                {
                    "id": "lamp",
                    "question": "In what year was the Skerry Point lamp rebuilt?",
                    "answer": "1911",
                    "url": site.url("/page2"),
                }
            )
            + "\n"
        )
        tools = {
            "network": {"allow_cidrs": ["127.0.0.0/8"]},
            "web": {"provider": "searxng", "endpoint": site.base},
        }
        env = load_env("web_research", {"tools": tools, "dataset_file": str(data)})
        await env.setup()
        registry = env.tool_registry()  # type: ignore[attr-defined]
        stack.push_async_callback(registry.aclose)
        yield Column(name, env, env.eval_items(1), registry=registry, web=True)
    elif name == "opd":
        from opd_student import opd_column

        async with opd_column(stack) as col:
            yield col
    elif name == "user_verifier":
        env = UserVerifierEnv(EnvConfig(enabled_toolsets=["terminal", "file"]))
        yield Column(name, env, [env.generate(0, split="eval")])
    else:
        raise KeyError(name)


async def play(col: Column, hack: Hack, factory: Any) -> list[tuple[str, float, str]]:
    """(item id, reward, reason) of the hack on each of the column's items."""
    out = []
    for item in col.items_for(hack.name):
        policy = policy_for(hack, web=col.web)
        model = col.model(policy) if col.model is not None else ScriptedModel(policy)
        backends = RolloutBackends(model, col.factory or factory, col.registry or default_registry())
        ep = await Rollouts(col.env, backends).episode(item)
        reason = ep.reward.reason or ""
        if ep.reward.error:
            reason = f"reward error: {ep.reward.error}"
        if ep.status != "completed":
            reason = f"{ep.status}: {ep.error} {reason}"
        out.append((col.env.item_id(item), ep.score, reason))
    return out


async def table(
    hacks: Sequence[str], columns: Sequence[str]
) -> dict[tuple[str, str], list[tuple[str, float, str]]]:
    results: dict[tuple[str, str], list[tuple[str, float, str]]] = {}
    factory = create_sandbox_factory(SandboxConfig(kind="bwrap", reuse=True))
    try:
        for cname in columns:
            async with AsyncExitStack() as stack, column(cname, stack) as col:
                for hname in hacks:
                    results[(hname, cname)] = await play(col, HACKS[hname], factory)
                    best = max(r for _, r, _ in results[(hname, cname)])
                    print(f"{hname:16} {cname:24} {best:.2f}", file=sys.stderr, flush=True)
    finally:
        await close_factory(factory)
    return results


def markdown(
    results: dict[tuple[str, str], list[tuple[str, float, str]]], hacks: Sequence[str], columns: Sequence[str]
) -> str:
    short = {c: c.replace("tiny_tasks/", "tiny/") for c in columns}
    lines = ["| hack | " + " | ".join(short[c] for c in columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for h in hacks:
        cells = []
        for c in columns:
            got = results.get((h, c))
            cells.append("-" if not got else f"{max(r for _, r, _ in got):g}")
        lines.append(f"| {h} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--hacks", default=",".join(HACKS))
    parser.add_argument("--envs", default=",".join(COLUMNS))
    parser.add_argument("--details", action="store_true")
    args = parser.parse_args(argv)
    hacks, columns = args.hacks.split(","), args.envs.split(",")
    results = asyncio.run(table(hacks, columns))
    print(markdown(results, hacks, columns))
    if args.details:
        for (h, c), got in results.items():
            for item, r, why in got:
                if r > 0:
                    print(f"{h} x {c} [{item}]: {r:g} {why[:300]!r}")


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    main(sys.argv[1:])
