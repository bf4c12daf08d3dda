"""The sandbox attacked as a model would attack it, as root and as an unprivileged user.

As root (most containers and CI) bubblewrap runs without a user namespace: commands get a uid of
their own and the exec agent stays uid 0 with a few capabilities. As an unprivileged user bwrap
makes a user namespace with a single uid shared by the agent and the commands. Each scenario in
``attacks.py`` runs in both set-ups; the unprivileged run is a subprocess as ``nobody``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
from attacks import PLANTS, SCENARIOS

import trajforge

pytestmark = [
    pytest.mark.bwrap,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
    pytest.mark.skipif(os.geteuid() != 0, reason="runs as root and, through setpriv, as nobody"),
]

HERE = Path(__file__).parent
MODES = ["root", "unprivileged"]


def _as_nobody(scenario: str) -> dict[str, Any]:
    """Run one scenario with the system python3 as ``nobody`` on this checkout's code."""
    if shutil.which("setpriv") is None or not os.path.exists("/usr/bin/python3"):
        pytest.skip("needs setpriv and /usr/bin/python3 to run as an unprivileged user")
    work = Path(tempfile.mkdtemp(prefix="tf-nobody-"))  # pytest's tmp_path is private to root
    os.chmod(work, 0o777)
    paths = [str(HERE), str(Path(trajforge.__file__).parents[1])]
    paths += [p for p in sys.path if p.endswith("site-packages")]
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(work),
        "PYTHONPATH": os.pathsep.join(paths),
        "TMPDIR": str(work),
    }
    cmd = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3"]
    probe = subprocess.run([*cmd, "-c", "import trajforge.sandbox, pydantic"], env=env, capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"the system python3 cannot import this checkout as nobody: {probe.stderr[-200:]!r}")
    try:
        done = subprocess.run(
            [*cmd, str(HERE / "attacks.py"), scenario, str(work / "sb")],
            env=env,
            cwd=work,
            capture_output=True,
            text=True,
            timeout=600,
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


async def _run(scenario: str, mode: str, tmp_path: Path) -> dict[str, Any]:
    if mode == "root":
        return await SCENARIOS[scenario](str(tmp_path / "sb"))
    return _as_nobody(scenario)


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
async def test_file_tools_cannot_be_raced_out_of_the_sandbox(mode, tmp_path):
    """10,000 read/write calls through ``d/`` while a command swaps ``d`` with a symlink to a host
    directory (renameat2 RENAME_EXCHANGE in a loop): no host byte is read, no host file written.
    The same racer against the old check-then-open resolution does win (the control)."""
    out = await _run("race", mode, tmp_path)
    assert out["read_escapes"] == 0 and out["write_escapes"] == 0, out
    assert out["swaps"] > 1_000, out  # the racer really ran throughout
    assert out["reads_inside"] > 100 and out["refused"] > 100, out  # both sides of the race were hit
    assert out["naive_tries_to_escape"] > 0, out  # the attack is real: check-then-use loses to it


@pytest.mark.parametrize("mode", MODES)
async def test_nothing_a_rollout_plants_reaches_the_next_one(mode, tmp_path):
    """Each plant (files, modes, times, xattrs, ACLs, processes, IPC, message queues, keys, the
    exec agent's limits/niceness/affinity/scheduler/OOM score/I/O priority, tmpfs additions) is
    either undone by the reset -- the next rollout on the same sandbox sees exactly what the
    planting rollout saw before it planted -- or makes the factory discard the sandbox, with the
    reason counted, and the next rollout sees a fresh one."""
    out = await _run("plant_then_look", mode, tmp_path)
    plants = out["plants"]
    assert len(PLANTS) >= 20 and set(plants) == set(PLANTS) | {"_stats"}
    carried = {}
    for name in PLANTS:
        r = plants[name]
        if r["reused"]:  # the same sandbox: everything as before the plant, uid and mtimes too
            ref, seen = r["pristine"], r["seen"]
        else:  # a fresh sandbox: its own uid and times, the rest as any fresh one
            assert r["discarded"], (name, r)
            ref, seen = dict(out["baseline"]), dict(r["seen"])
            ref.pop("root owners and mtimes")
            seen.pop("root owners and mtimes")
        diff = {k: (seen[k], ref.get(k)) for k in seen if seen[k] != ref.get(k)}
        if diff:
            carried[name] = diff
    assert carried == {}, json.dumps(carried, indent=1)[:4000]
    stats = plants["_stats"]
    assert stats["reused"] > 0, stats  # the reset is not simply refusing everything
    if mode == "root":  # the agent is out of the commands' reach: nothing to discard for it
        agent_plants = [n for n in PLANTS if n.startswith("agent")]
        assert all(plants[n]["reused"] for n in agent_plants), {
            n: plants[n]["discarded"] for n in agent_plants
        }


@pytest.mark.parametrize("mode", MODES)
async def test_fork_bomb_is_killed_and_the_rollout_goes_on(mode, tmp_path):
    out = await _run("fork_bomb", mode, tmp_path)
    # Killed at its timeout (with its process group) or, when it outlives the call, by the agent
    # at the process limit: either way the call returns and the bomb is gone.
    assert out["bomb_timed_out"] or "reached its process limit" in " ".join(out["notes"]), out
    assert out["later"].startswith("alive"), out
    assert int(out["later"].split()[-1]) <= 8, out  # the bomb is gone: a handful of processes left
    assert out["next"] == "fine\n", out


@pytest.mark.parametrize("mode", MODES)
async def test_a_sandbox_holds_at_most_its_process_limit(mode, tmp_path):
    """A total cap on a sandbox's processes in both modes: as root its pids cgroup, unprivileged
    RLIMIT_NPROC in its own user namespace. Unprivileged there was none (a fork bomb took 32,514 of
    the machine's 32,768 pids while the agent's guard caught up)."""
    out = await _run("process_cap", mode, tmp_path)
    held = int(next(line for line in out["held"].splitlines() if line.isdigit()))
    assert 3 <= held <= out["limit"], out  # the agent, the shell, dash and some of the 100


async def test_disk_cap_gives_enospc_never_a_full_host_disk(tmp_path):
    """Root: work, tmp and /dev/shm share one size-limited tmpfs per sandbox (files and inodes)."""
    out = await _run("disk_cap", "root", tmp_path)
    assert out["capped"], out
    assert "No space left on device" in out["big"], out
    assert "No space left on device" in out["scratch"], out  # the total counts every directory
    assert "No space left on device" in out["shm"], out  # /dev/shm too: no way around the cap
    assert "No space left on device" in out["inodes"], out
    assert out["host_bytes_under_root"] < 1_000_000, out  # nothing landed on the host's disk
    assert out["after"].split()[-1] == "0", out  # the reused sandbox starts empty again
    assert out["stats"]["reused"] == 1, out


@pytest.mark.parametrize("mode", MODES)
async def test_nothing_a_rollout_leaves_in_its_shell_reaches_the_next_one(mode, tmp_path):
    """The resident shell keeps a rollout's session across its calls; none of it may reach the next
    rollout on the same sandbox: traps (EXIT, DEBUG, ERR, RETURN, signals), PROMPT_COMMAND, aliases
    and functions shadowing commands, an exported function, BASH_ENV/ENV, lowered ulimits, umask, fds
    left open, readonly variables, IFS, shell options (posix, allexport, noclobber, nullglob...),
    plain and exported variables, the cwd, loadable or disabled builtins, and a shell broken on
    purpose (``builtin`` and ``read`` redefined, ``set -n``). The plants took in the planting
    rollout (its probe differs); the next rollout's probe is the pristine one, on a reused sandbox."""
    out = await _run("shell_plants", mode, tmp_path)
    assert out["stats"]["reused"] == 2 and out["stats"]["created"] == 1, out["stats"]
    tainted = out["tainted"]
    for sign in (
        "HIJACKED",
        "ALIASED",
        "TRAP-USR1",
        "open files (-n) 256",
        "umask: 0077",
        "PLAIN",
        "RO",
        "posix",
    ):
        assert sign in tainted, (sign, tainted)  # the control: each plant did change the shell
    assert out["seen"] == out["pristine"], (out["pristine"], out["seen"])
    assert out["wedged"] == "still-here\n", out  # the planter's own shell came back too


@pytest.mark.parametrize("mode", MODES)
async def test_a_command_cannot_forge_its_end(mode, tmp_path):
    """The end of a command is ``NONCE RC`` on the shell's channel, the nonce fresh per command: the
    status line's format in the output, nonces the command could guess, writes to every fd of the
    shell (from the shell and from a child), and reading stdin all leave the call to last the
    command's whole second and report its own exit code."""
    out = await _run("forge", mode, tmp_path)
    out.pop("insider")  # the next test's
    for name, r in out.items():
        assert r["exit_code"] == 7 and r["took"] >= 1.0 and r["next"] == "next\n", (name, r)
    # stdin is /dev/null: EOF at once (then ``exit 7`` ends its shell, and the note says so,
    # apart from what the command printed)
    assert out["a stdin reader"]["output"] == "read: 1 []\n", out["a stdin reader"]
    assert out["a stdin reader"]["notes"][0].startswith("the shell ended (status 7)"), out["a stdin reader"]


@pytest.mark.parametrize("mode", MODES)
async def test_a_command_that_reads_the_loops_nonce_gains_nothing(mode, tmp_path):
    """A command runs *in* the shell, so it can read the loop's own nonce and write the status line
    itself: its call ends early. What follows is bounded and said: its later output stays in its
    own FIFO (never in the next command's), the next command waits for it, runs, gets its own
    output and exit code and a note saying why it started late; one that ends the shell that way
    leaves the next command told it did not run, and the session goes on."""
    out = await _run("forge", mode, tmp_path)
    insider = out["insider"]
    code, output, took = insider["forged"]
    assert code == 0 and took < 2.0 and "LATE" not in output, insider  # the forgery itself works
    code, output, notes = insider["next"]
    assert code == 4 and output == "next\n" and "reported its end early" in notes[0], insider
    assert list(insider["later"]) == [0, "/tmp/forger-finished\nagain\n"], insider
    code, output, notes = insider["after_death"]
    assert "did not run" in " ".join(notes), insider
