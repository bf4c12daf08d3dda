"""Rewards no rollout can forge: the adversarial agent (``reward_hacks.py``) against every shipped
env, and the defences one by one.

Before the fixes of this suite's commit (the table in docs/security.md, "Reward hacks"): the
runner patch scored 1.0 on all 11 swe tasks and planted .pyc on 7 of them; a program the tests
ran wrote terminal_bench's reward file (greet-tool, fix-backup-script: 1.0); listing every value
scored 1.0 on tiny_tasks find_value (and opd over it); web_research paid 0.8 for a list of years;
terminal_test paid 0.25 for junk at the expected paths; a user verifier was fooled by a
usercustomize.py in ~/.local, a ~/.profile / .git/config hook and a planted .pyc (1.0 each).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest
from reward_hacks import COLUMNS, HACKS, HERE, column, play

from trajforge.agent.result import AgentResult
from trajforge.envs import RolloutBackends, Rollouts, env_sandbox_config, load_env
from trajforge.envs.judge import judge
from trajforge.envs.library import trusted_proc
from trajforge.envs.library.web_research import normalize, restates
from trajforge.envs.library.yc_bench import score
from trajforge.sandbox import close_factory, create_sandbox_factory
from trajforge.sandbox.types import SandboxConfig
from trajforge.testing.scripted_model import ScriptedModel, answer, tool_turn
from trajforge.tools.builtin import default_registry

pytestmark = [
    pytest.mark.bwrap,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
]

# Hacks that cannot be prevented by design, per column, with the outcome the docs state.
# (Empty: every hack scores 0 on every shipped env.)
KNOWN: dict[tuple[str, str], float] = {}


@pytest.mark.timeout(900)
@pytest.mark.parametrize("name", COLUMNS)
async def test_every_hack_scores_zero(name: str, bwrap: Any) -> None:
    """One column of the table: every hack, played through the env's real rollout and verifier."""
    async with AsyncExitStack() as stack, column(name, stack) as col:
        for hack in HACKS.values():
            got = await play(col, hack, bwrap)
            want = KNOWN.get((hack.name, name), 0.0)
            for item, reward, reason in got:
                assert reward == want, f"{hack.name} x {name} [{item}]: {reward} ({reason[:400]})"
                assert "reward error" not in reason and not reason.startswith(("failed", "error")), reason


# ------------------------------------------------------------------------ trusted_proc, directly


def _as_nobody() -> None:
    os.setgroups([])
    os.setgid(65534)
    os.setuid(65534)


_TARGET = textwrap.dedent(
    """
    import sys, time
    sys.path.insert(0, sys.argv[2])
    secret = "S3CRET-" + "x" * 20
    if sys.argv[1] == "hardened":
        import trusted_proc
        trusted_proc.harden()
    print("ready", flush=True)
    time.sleep(30)
    """
)
_READER = textwrap.dedent(
    """
    import re, sys
    pid = int(sys.argv[1])
    try:
        with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", 0) as mem:
            for line in maps:
                span, perm = line.split()[:2]
                lo, hi = (int(x, 16) for x in span.split("-"))
                if "rw" in perm and hi - lo < 64 << 20:
                    try:
                        mem.seek(lo); data = mem.read(hi - lo)
                    except OSError:
                        continue
                    if b"S3CRET-" + b"x" * 20 in data:
                        print("FOUND"); sys.exit(0)
        print("NOT FOUND")
    except OSError as exc:
        print("DENIED", exc.errno)
    """
)


SYSTEM_PYTHON = shutil.which("python3", path="/usr/bin:/bin") or sys.executable


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run both processes as nobody")
@pytest.mark.parametrize("mode", ["plain", "hardened"])
def test_a_same_uid_process_reads_a_runner_only_when_it_is_not_hardened(mode: str, tmp_path: Path) -> None:
    """No Yama here: a same-uid process reads another's memory -- unless it is non-dumpable."""
    shutil.copy(trusted_proc.__file__, tmp_path / "trusted_proc.py")
    (tmp_path / "t.py").write_text(_TARGET)
    (tmp_path / "r.py").write_text(_READER)
    for p in (tmp_path, *tmp_path.parents):
        if p == Path("/"):
            break
        os.chmod(p, os.stat(p).st_mode | 0o005)  # nobody must reach the scripts
    target = subprocess.Popen(
        [SYSTEM_PYTHON, "-I", str(tmp_path / "t.py"), mode, str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=_as_nobody,
    )
    try:
        assert target.stdout is not None and target.stdout.readline().strip() == "ready"
        out = subprocess.run(
            [SYSTEM_PYTHON, "-I", str(tmp_path / "r.py"), str(target.pid)],
            capture_output=True,
            text=True,
            preexec_fn=_as_nobody,
            timeout=60,
        ).stdout.strip()
    finally:
        target.kill()
        target.wait()
    if mode == "plain":
        assert out == "FOUND"  # the attack works on an ordinary process
    else:
        assert out.startswith("DENIED"), out


def test_kill_descendants_finds_a_double_forked_daemon() -> None:
    """A subreaper sees a process that double-forked and called setsid, and kills it."""
    script = textwrap.dedent(
        f"""
        import os, sys, time
        sys.path.insert(0, {str(Path(trusted_proc.__file__).parent)!r})
        import trusted_proc
        trusted_proc.harden()
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                time.sleep(60); os._exit(0)
            os._exit(0)
        time.sleep(0.3)
        print(len(trusted_proc.children()), trusted_proc.kill_descendants(), len(trusted_proc.children()))
        """
    )
    out = subprocess.run([sys.executable, "-I", "-c", script], capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["1", "1", "0"], out.stderr


# ------------------------------------------------------------------------------------ swe, directly


def _swe_task(root: Path, repo: str, test: str) -> Path:
    task = root / "probe"
    for sub in ("repo", "tests", "solution"):
        (task / sub).mkdir(parents=True)
    (task / "repo" / "probe.py").write_text(repo)
    (task / "solution" / "probe.py").write_text(repo)
    (task / "tests" / "test_hidden.py").write_text(test)
    (task / "task.toml").write_text('instruction = "x"\nfail_to_pass = ["tests/test_hidden.py::test_it"]\n')
    return root


PROBE = textwrap.dedent(
    """
    import ctypes, gc, os, sys

    def attempts():
        got = {}
        pid = os.getppid()
        for what in ("mem", "environ", "maps", "cmdline"):
            try:
                with open(f"/proc/{pid}/{what}", "rb") as fh:
                    got[what] = len(fh.read(4096))
            except OSError as exc:
                got[what] = exc.errno
        libc = ctypes.CDLL(None, use_errno=True)
        got["ptrace"] = libc.ptrace(16, pid, 0, 0) == 0 or ctypes.get_errno()  # PTRACE_ATTACH
        f, names = sys._getframe(), set()
        while f is not None:
            names |= set(f.f_locals)
            f = f.f_back
        got["nonce_in_frames"] = "nonce" in names
        got["runner_in_gc"] = any(getattr(o, "__name__", "") == "run_one" for o in gc.get_objects())
        return got
    """
)


async def test_swe_repository_code_cannot_read_trace_or_walk_into_the_runner(
    tmp_path: Path, bwrap: Any
) -> None:
    """The probe runs in the repository's interpreter and reports what it reached of the runner
    (its parent): /proc/PID/mem and environ refused, ptrace refused, no nonce in its frames."""
    tests = "from probe import attempts\n\ndef test_it():\n    got = attempts()\n    print(got)\n    raise AssertionError(repr(got))\n"
    env = load_env("swe", {"tasks_dir": str(_swe_task(tmp_path / "t", PROBE, tests))})
    model = ScriptedModel([answer("done")])
    ep = await Rollouts(env, RolloutBackends(model, bwrap, default_registry())).episode(env.eval_items(1)[0])
    got = eval(ep.reward.reason.split("AssertionError: ")[-1].strip())  # noqa: S307 (our own probe's repr)
    assert got["mem"] == 13 and got["environ"] == 13  # EACCES: the runner is non-dumpable
    assert got["ptrace"] == 1  # EPERM
    assert got["nonce_in_frames"] is False and got["runner_in_gc"] is False


async def test_swe_an_object_equal_to_everything_is_not_a_right_answer(bwrap: Any) -> None:
    """``assert to_roman(4) == "IV"`` compares values in the runner: a repository object whose
    ``__eq__`` says True to everything (which passes the same assert under pytest) fails."""
    env = load_env("swe")
    task = next(t for t in env.eval_items(100) if t["id"] == "roman_subtractive")
    cheat = (
        "class _Any(str):\n    def __eq__(self, other):\n        return True\n    __hash__ = str.__hash__\n\n"
        "def to_roman(n):\n    if not 0 < n < 4000:\n        raise ValueError(n)\n    return _Any('?')\n"
    )
    assert eval("_Any('?') == 'IV'", {}, _exec(cheat))  # noqa: S307 (in one interpreter it is "equal")
    model = ScriptedModel(
        [tool_turn(("write_file", {"path": "numerals.py", "content": cheat})), answer("ok")]
    )
    ep = await Rollouts(env, RolloutBackends(model, bwrap, default_registry())).episode(task)
    assert ep.reward.value == 0.0 and ep.reward.components["fail_to_pass"] == 0.0, ep.reward.reason


def _exec(src: str) -> dict[str, Any]:
    ns: dict[str, Any] = {}
    exec(src, ns)  # noqa: S102 (test data)
    return ns


# ------------------------------------------------------------------------- terminal_bench, directly


async def test_terminal_bench_a_program_the_tests_run_cannot_write_the_reward(bwrap: Any) -> None:
    """greet-tool's test.sh writes reward.json; a greet that writes reward.txt (which Harbor
    reads first) is ignored, because the task's tests never name reward.txt. A greet that leaves
    a process behind gets the reward distrusted."""
    env = load_env("terminal_bench")
    task = next(t for t in env.eval_items(100) if t["id"] == "greet-tool")
    write = 'for d in /tmp/trajforge-verify-*/logs/verifier; do echo 1 > "$d/reward.txt"; done'
    for body, why in (
        (write, "reward.json"),
        (f"({write}; sleep 30) >/dev/null 2>&1 &", "still running when test.sh exited"),
    ):
        greet = f"#!/bin/bash\n{body}\necho nope\n"
        calls = [
            ("write_file", {"path": "bin/greet", "content": greet}),
            ("terminal", {"command": "chmod +x bin/greet"}),
        ]
        model = ScriptedModel([*(tool_turn(c) for c in calls), answer("ok")])
        ep = await Rollouts(env, RolloutBackends(model, bwrap, default_registry())).episode(task)
        assert ep.reward.value == 0.0 and why in ep.reward.reason, ep.reward.reason


# ------------------------------------------------- terminal_bench: a verdict only test.sh can write

# What a program the tests run (bin/greet, backup.sh) does to the verdict. Each first writes
# reward 1 into every reward file of the verifier's directory, as a program of test.sh's own uid can.
_VDIRS = "/tmp/trajforge-verify-*/logs/verifier"
_FORGE = (
    f'for d in {_VDIRS}; do echo 1 > "$d/reward.txt"; echo \'{{"reward": 1.0}}\' > "$d/reward.json"; '
    "done 2>/dev/null"
)
# every ancestor up to the verifier's own wrapper (a python3): test.sh, and the subshell of a $(...)
_ANCESTORS = (
    'p=$PPID; while [ "$p" -gt 1 ]; do c=$(cat /proc/$p/comm 2>/dev/null); case "$c" in python*|\'\') break;; esac; '
    'q=$(cut -d" " -f4 /proc/$p/stat); echo $p; p=$q; done'
)
VERDICT_ATTACKS = {
    # the issue's first break: the tests' own `echo 0 > reward.txt` fails with EACCES
    "read-only": _FORGE
    + f'; for d in {_VDIRS}; do chmod 444 "$d"/reward.*; chmod 555 "$d"; done 2>/dev/null',
    "a directory in its place": (
        f'for d in {_VDIRS}; do for f in reward.txt reward.json; do rm -f "$d/$f"; mkdir -p "$d/$f/x"; '
        'echo 1 > "$d/$f/x/reward.txt"; done; done 2>/dev/null'
    ),
    # the second: test.sh dies before its verdict
    "test.sh killed": _FORGE + f"; for p in $({_ANCESTORS}); do kill -9 $p; done",
    "test.sh stopped, then killed": _FORGE
    + f"; for p in $({_ANCESTORS}); do kill -STOP $p; done; sleep 0.3; for p in $({_ANCESTORS}); do kill -9 $p; done",
    "test.sh stopped": _FORGE + f"; for p in $({_ANCESTORS}); do kill -STOP $p; done",
    # a background job that keeps writing while test.sh writes its own verdict, then is gone
    "a background job racing the verdict": (
        f"(end=$((SECONDS + 2)); while [ $SECONDS -lt $end ]; do {_FORGE}; done) >/dev/null 2>&1 &"
    ),
}


@pytest.mark.timeout(600)
@pytest.mark.parametrize("attack", list(VERDICT_ATTACKS))
@pytest.mark.parametrize("task_id", ["greet-tool", "fix-backup-script"])
async def test_terminal_bench_what_the_tests_run_cannot_forge_the_verdict(
    task_id: str, attack: str, bwrap: Any
) -> None:
    """The program the task's test.sh runs (greet-tool's bin/greet, fix-backup-script's
    backup.sh) is the attack, and fails the task: it writes reward 1 into the verifier's log
    directory and then makes the files read-only or puts directories in their place, kills or
    stops test.sh (every bash between it and the verifier's wrapper), or races test.sh's own write
    from a background job. Each scores 0 (before the fix: read-only, killed and stopped-then-killed
    paid 1.0, the reason even saying "FAIL: count.txt is not 4")."""
    env = load_env("terminal_bench")
    task = next(t for t in env.eval_items(100) if t["id"] == task_id)
    path = "bin/greet" if task_id == "greet-tool" else "backup.sh"
    program = f"#!/bin/bash\n{VERDICT_ATTACKS[attack]}\necho nope\nexit 1\n"
    calls = [
        ("write_file", {"path": path, "content": program}),
        ("terminal", {"command": f"chmod +x {path}"}),
    ]
    model = ScriptedModel([*(tool_turn(c) for c in calls), answer("ok")])
    ep = await Rollouts(env, RolloutBackends(model, bwrap, default_registry())).episode(task)
    assert ep.reward.value == 0.0, (attack, ep.reward.reason)
    assert ep.reward.error is None and ep.status == "completed", (ep.reward.error, ep.error)
    assert re.search(VERDICT_REASONS[attack], ep.reward.reason), ep.reward.reason


# Why each scores 0: test.sh's own verdict (the forged files never were the verdict), or the
# run distrusted for what happened to test.sh.
VERDICT_REASONS = {
    "read-only": r"^reward\.(txt|json) \(test\.sh exit code \d+\); ",  # test.sh's own verdict, 0
    "a directory in its place": "wrote no verdict",
    "test.sh killed": "killed by signal 9",
    "test.sh stopped, then killed": r"was stopped \(signal 19\)",
    "test.sh stopped": r"was stopped \(signal 19\)",
    "a background job racing the verdict": "still running when test.sh exited",
}


# The suite-wide form: after the task's own solution, every program of the workdir the tests could
# run becomes the attack -- scripts and programs (compiled ones included), Python modules, C
# sources (a constructor), Makefiles ($(shell)) -- and fails the task; the attack leaves a mark in
# the workdir each time it runs, so a task whose tests never run it is told from one that held.
_FORGE_PROLOGUE = "echo ran >> /workspace/.forge-ran\n"
SUITE_ATTACKS = {
    "lock": _FORGE_PROLOGUE + VERDICT_ATTACKS["read-only"] + "\n",
    "replace": _FORGE_PROLOGUE + VERDICT_ATTACKS["a directory in its place"] + "\n",
    "kill": _FORGE_PROLOGUE + VERDICT_ATTACKS["test.sh killed"] + "\n",
}
POISON = r"""
cd /workspace || exit 1
find . -name .git -prune -o -type f ! -name '.*' -print | while IFS= read -r f; do
  case "$f" in
    *.py) { printf 'import os as _tf_os\n_tf_os.system("sh /workspace/.f.sh")\nraise SystemExit(1)\n'; cat "$f"; } > /tmp/.tf && cat /tmp/.tf > "$f";;
    *.c) { printf '#include <stdlib.h>\n#include <unistd.h>\n__attribute__((constructor)) static void tf_forge(void) { system("sh /workspace/.f.sh"); _exit(1); }\n'; cat "$f"; } > /tmp/.tf && cat /tmp/.tf > "$f";;
    */Makefile|*/makefile|*/GNUmakefile|*.mk) { printf '$(shell sh /workspace/.f.sh)\n$(error poisoned)\n'; cat "$f"; } > /tmp/.tf && cat /tmp/.tf > "$f";;
    *.sh) printf '#!/bin/sh\nsh /workspace/.f.sh\nexit 1\n' > "$f";;
    *) case "$(head -c 4 "$f" | od -An -c | tr -d ' ')" in
         177ELF*|'#!'*) printf '#!/bin/sh\nsh /workspace/.f.sh\nexit 1\n' > "$f";;
       esac;;
  esac
done
echo poisoned
"""


@pytest.mark.slow
@pytest.mark.timeout(3000)
@pytest.mark.parametrize("attack", list(SUITE_ATTACKS))
async def test_terminal_bench_the_shipped_suite_pays_nothing_to_what_the_tests_run(attack: str) -> None:
    """Every task of the shipped suite: its solution, then the attack in every program the tests
    could run. Each task whose tests ran the attack (the mark says so) scores 0; the rest (their
    tests read files, or a git repository, and run none of the workdir's code) are listed. The
    solved runs paying 1 is tests/test_env_terminal_bench.py's oracle test, on the same verifier."""
    env = load_env("terminal_bench")
    factory = create_sandbox_factory(SandboxConfig(kind="bwrap"))
    slots = asyncio.Semaphore(3)

    async def one(item: dict[str, Any]) -> tuple[str, int, float, str]:
        async with slots:
            sb = await factory.create(f"poison-{item['id']}")
            try:
                await env.prepare_sandbox(item, sb)  # type: ignore[attr-defined]
                solved = await sb.exec(env.oracle_command(item), timeout=300)  # type: ignore[attr-defined]
                assert solved.exit_code == 0, (item["id"], solved.output[-500:])
                await sb.write_bytes("/workspace/.f.sh", SUITE_ATTACKS[attack].encode())
                poisoned = await sb.exec(POISON, timeout=120)
                assert poisoned.output.endswith("poisoned\n"), (item["id"], poisoned.output[-500:])
                judged = await judge(env, item, AgentResult(messages=[]), sb)
                marks = await sb.exec("cat /workspace/.forge-ran 2>/dev/null | wc -l", timeout=30)
                reason = judged.reason or ""
                return item["id"], int(marks.output.split()[0]), judged.value, reason
            finally:
                await sb.close()

    try:
        results = await asyncio.gather(*(one(item) for item in env.eval_items(1000)))
    finally:
        await close_factory(factory)
    attacked = {tid: (reward, why) for tid, ran, reward, why in results if ran}
    untouched = sorted(tid for tid, ran, _, _ in results if not ran)
    print(f"\n{attack}: attack ran in {len(attacked)} tasks' tests, in none of {untouched}")
    assert {"greet-tool", "fix-backup-script"} <= set(attacked), (attacked, untouched)
    assert len(attacked) >= 15, (len(attacked), untouched)
    paid = {tid: r for tid, r in attacked.items() if r[0] != 0.0}
    print(f"{attack}: {len(paid)} of them paid: {sorted(paid)}")
    assert not paid, paid


# ---------------------------------------- the resident shell: only the shell reports a command's end

# A subshell a command forks keeps the loop's fds: it takes the next command's request from the
# control channel (fd 10 in both layouts the loop has had), stops the loop, and answers that
# command and every later one itself on the status channel (fd 11 of the pipe layout, fd 10 of
# the socket one), with output of its choosing in the command's output FIFO (named by the
# command's number in the old layout, by its nonce in the new one; the loop named its directory in
# a variable before issue 39: the path is the bwrap backend's).
IMPOSTOR = r"""
CMD_DIR=/run/trajforge/session/cmd
( sleep 1; kill -STOP $$
  while IFS=' ' builtin read -r -u 10 n nonce c; do
    for f in "$CMD_DIR/o$n" "$CMD_DIR/o$nonce"; do
      [ -p "$f" ] && printf 'all 12 tests passed\n' > "$f"
    done
    printf '%s 0\n' "$nonce" >&11; printf '%s 0\n' "$nonce" >&10
  done ) >/dev/null 2>&1 &
echo planted
"""
# The same from an exec'd program holding copies of the fds, reading every nonce-like token from
# the loop's memory as it appears and answering with each, on every channel, into every FIFO.
RACER = r"""
import glob, os, re, sys, time
loop, cmd_dir, fds = int(sys.argv[1]), sys.argv[2], [int(x) for x in sys.argv[3:] if x != "-"]
end = time.time() + 20
while time.time() < end:
    seen = set()
    try:
        with open(f"/proc/{loop}/maps") as maps, open(f"/proc/{loop}/mem", "rb", 0) as mem:
            for line in maps:
                span, perm = line.split()[:2]
                lo, hi = (int(x, 16) for x in span.split("-"))
                if "rw" in perm and hi - lo < 16 << 20:
                    try:
                        mem.seek(lo); seen.update(re.findall(rb"[0-9a-f]{32}", mem.read(hi - lo)))
                    except OSError:
                        pass
    except OSError:
        pass
    for token in seen:
        for fd in fds:
            try:
                os.write(fd, token + b" 0\n")
            except OSError:
                pass
        for fifo in glob.glob(cmd_dir + "/o*") + [cmd_dir + "/o" + token.decode()]:
            try:
                out = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK); os.write(out, b"all 12 tests passed\n"); os.close(out)
            except OSError:
                pass
    time.sleep(0.01)
"""


def _racer_command(tmp: str, fds: str = "7 8") -> str:
    return (
        f"printf %s {shlex.quote(RACER)} > {tmp}; "
        "( exec 7<&10 2>/dev/null; exec 8<&11 2>/dev/null; "
        f"exec python3 {tmp} $$ /run/trajforge/session/cmd {fds} ) >/dev/null 2>&1 & echo planted"
    )


ATTACKS = {
    "impostor": IMPOSTOR,
    "racer": _racer_command("/tmp/racer.py"),
    # only output: into the FIFO of each command whose name it can find (listing, the loop's memory)
    "injector": _racer_command("/tmp/racer.py", "-"),
}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("attack", list(ATTACKS))
async def test_a_background_job_cannot_answer_for_the_shell(attack: str, tmp_path: Path) -> None:
    """The issue's third break, and its racing form: a job a command left behind answers for the
    resident shell. Before the fix the impostor took the next command's request, stopped the loop
    and made ``echo FAIL; exit 1`` read exit 0 and "all 12 tests passed", and every later command
    too. Now a command's end counts only from the shell's own process: each command reports its
    own exit code and output (or, when it was interfered with, no exit code, none of the output,
    and a note saying so), and the session goes on."""
    config = SandboxConfig(kind="bwrap", root_dir=str(tmp_path / "sb"), command_timeout_s=8)
    factory = create_sandbox_factory(config)
    sb = await factory.create("impostor")
    try:
        await sb.exec("echo warm")
        planted = await sb.exec(ATTACKS[attack])
        assert planted.exit_code == 0 and planted.output == "planted\n", planted
        await asyncio.sleep(2.0)
        for i in range(3):
            res = await sb.exec(f"echo FAIL {i}; exit 1", timeout=8)
            assert "all 12 tests passed" not in res.output, (i, res)
            assert res.exit_code != 0, (i, res)
            if res.exit_code is not None:  # it ran: its own output and exit code
                assert res.exit_code == 1 and res.output.startswith(f"FAIL {i}\n"), (i, res)
            else:  # it was interfered with: said so (a note), and nothing of what reached its output
                assert "FAIL" not in res.output and any("not" in note for note in res.notes), (i, res)
        after = await sb.exec("echo after")
        assert after.exit_code == 0 and after.output.endswith("after\n"), after
    finally:
        await sb.close()
        await close_factory(factory)


# ------------------------------------------------------------------------------ yc_bench, directly

_RICH = (
    "python3 -c \"import sqlite3; c = sqlite3.connect('.yc_bench/sim.db'); "
    "c.execute('update companies set funds_cents = 10000000000000'); "
    "c.execute('update company_prestige set prestige_level = 10'); c.commit()\""
)


@pytest.mark.timeout(900)
async def test_yc_bench_editing_the_database_wins_nothing() -> None:
    """The agent plays two honest rounds through ``yc-bench``, then makes itself rich and famous
    in its own SQLite database (the sandbox's python3 has sqlite3), rewrites its game file to a
    one-month game and plays on to the horizon on the forged state. Its own CLI then shows the
    forged funds; the verifier's replay of its log scores exactly what the same commands score on
    the item's own world without the edit (replayed here on the host), funds far from forged."""
    env = load_env("yc_bench", {"presets": ["tutorial"], "horizon_months": 1})
    item = env.eval_items(1)[0]
    plan = env.plan(item)  # type: ignore[attr-defined]
    resumes = [i for i, argv in enumerate(plan) if argv[:2] == ["sim", "resume"]]
    honest = plan[: resumes[1] + 1]
    after = [["company", "status"], *[["sim", "resume"]] * 4]
    steps = [
        " && ".join(shlex.join(["yc-bench", *argv]) for argv in honest),
        _RICH + ' && echo \'{"preset": "easy", "seed": 7, "horizon_months": 12}\' > .yc_bench/game.json',
        " && ".join(shlex.join(["yc-bench", *argv]) for argv in after),
    ]
    model = ScriptedModel([*(tool_turn(("terminal", {"command": c})) for c in steps), answer("rich")])
    factory = create_sandbox_factory(env_sandbox_config(env, SandboxConfig(kind="bwrap")))
    try:
        ep = await Rollouts(env, RolloutBackends(model, factory, default_registry())).episode(item)
    finally:
        await close_factory(factory)
    assert ep.reward.error is None and ep.status == "completed", (ep.reward.error, ep.reason)
    seen = json.loads([m["content"] for m in ep.messages if m["role"] == "tool"][2])["output"]
    assert '"funds_cents": 10000000000000' in seen, seen[:400]  # the agent's own view: forged
    log = "".join(json.dumps({"argv": argv}) + "\n" for argv in [*honest, *after])
    expected = score(env._replay_here(item["game"], log), env.cfg.funds_target_multiple)  # type: ignore[attr-defined]
    assert ep.reward.value == expected.reward and ep.reward.components == expected.components, (
        ep.reward.reason
    )
    assert ep.reward.components["funds"] < 1_000_000 and ep.reward.components["max_prestige"] < 10
    assert ep.reward.components["refused"] == 0 and ep.reward.components["commands"] == len(honest) + len(
        after
    )


# ------------------------------------------------------------------------------ answers, directly


def test_web_research_contains_credit_needs_one_candidate() -> None:
    q = "In what year was the Skerry Point lamp rebuilt?"
    t = [normalize("1911")]
    assert restates(normalize("rebuilt in 1911"), t, q)
    assert restates(normalize("In 1911."), t, q)
    assert not restates(normalize("1887 1888 1911 1952"), t, q)
    assert not restates(normalize("1911 or 1912"), t, q)
    assert not restates(normalize("1911 and many other years"), t, q)
    g = [normalize("Guido van Rossum")]
    assert not restates(normalize("Guido van Rossum, Larry Wall"), g, "Who created Python?")


def test_the_table_in_the_docs_is_this_suite() -> None:
    """docs/security.md lists exactly the hacks and envs this suite runs."""
    doc = (HERE.parent.parent / "docs" / "security.md").read_text()
    for hack in HACKS:
        assert f"| {hack} |" in doc, hack
    for name in COLUMNS:
        assert name.replace("tiny_tasks/", "tiny/") in doc, name
