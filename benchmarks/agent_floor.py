"""What the exec agent holds per sandbox: its memory idle and after a session, against the floor
of any process (a C program of ~10 lines that does nothing), in one run.

The agent (``exec_agent.c``, built as sandboxes get it) is one process per live sandbox, so its
dirty private memory is what each more sandbox adds (its clean pages are the binary's, shared by a
thousand agents). Measured from ``/proc/PID/smaps_rollup`` (``Pss`` and ``Private_Dirty``):

- **idle**: after its ``ready`` line, before any request (a sandbox built and not yet used);
- **after N commands**: a session of ``--commands`` commands in its resident shell, each printing
  ``--output-bytes`` (the agent's own memory, not the shell's: does it grow with use?);
- **floor**: the do-nothing C program, idle, compiled in the same run: the baseline the ratios use.

Until issue 40 this script also started the CPython agent (``exec_agent.py``) beside it; that
agent is gone, and its figures are history in docs/benchmarks.md.

Needs ``cc`` (Debian: ``apt-get install gcc libc6-dev``); without it, says so and exits 2.

    .venv/bin/python benchmarks/agent_floor.py
    .venv/bin/python benchmarks/agent_floor.py --commands 1000 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, Any

import orjson

sys.path.insert(0, str(Path(__file__).parent))
from _endpoint import load_average  # noqa: E402

from trajforge.sandbox.native_agent import build_native_agent  # noqa: E402

FLOOR = r"""
#include <stdio.h>
#include <unistd.h>
int main(void) { printf("ready\n"); fflush(stdout); pause(); return 0; }
"""
ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}


def _memory(pid: int) -> dict[str, float]:
    """PSS and dirty private memory (MiB) of a live process, from ``/proc/PID/smaps_rollup``."""
    fields: dict[str, float] = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name in ("Pss", "Private_Dirty"):
            fields[name] = int(rest.split()[0]) / 1024
    return {"pss_mib": fields["Pss"], "private_dirty_mib": fields["Private_Dirty"]}


def _ask(stdin: IO[bytes], stdout: IO[bytes], request: dict[str, Any]) -> dict[str, Any]:
    stdin.write(json.dumps(request).encode() + b"\n")
    stdin.flush()
    answer: dict[str, Any] = json.loads(stdout.readline())
    return answer


def _agent_memory(binary: Path, tmp: Path, commands: int, output_bytes: int) -> dict[str, dict[str, float]]:
    """The agent's memory idle, then after ``commands`` session commands."""
    work, scratch = tmp / "work", tmp / "scratch"
    for path in (work, scratch):
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir()
    proc = subprocess.Popen(
        [str(binary), str(work), str(scratch)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=ENV
    )
    try:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdout.readline()  # ready
        time.sleep(0.5)
        idle = _memory(proc.pid)
        command = f"head -c {output_bytes} /dev/zero | tr '\\0' x; echo"
        for n in range(commands):
            answer = _ask(proc.stdin, proc.stdout, {"id": n, "op": "exec", "command": command, "timeout": 30})
            assert answer.get("exit_code") == 0, answer
        time.sleep(0.2)
        used = _memory(proc.pid)
        _ask(proc.stdin, proc.stdout, {"id": "end", "op": "close"})
    finally:
        proc.kill()
        proc.wait()
    return {"idle": idle, f"after_{commands}_commands": used}


def _floor_memory(binary: Path) -> dict[str, float]:
    proc = subprocess.Popen([str(binary)], stdout=subprocess.PIPE, env=ENV)
    try:
        assert proc.stdout is not None
        proc.stdout.readline()
        time.sleep(0.5)
        return _memory(proc.pid)
    finally:
        proc.kill()
        proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--commands", type=int, default=200, help="session commands before the second read")
    parser.add_argument("--output-bytes", type=int, default=100_000, help="what each command prints")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds of agent and floor")
    args = parser.parse_args()
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        print("agent_floor.py needs a C compiler: apt-get install gcc libc6-dev", file=sys.stderr)
        sys.exit(2)
    rounds: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="tf-agent-floor-") as name:
        tmp = Path(name)
        (tmp / "floor.c").write_text(FLOOR)
        subprocess.run([cc, "-O2", "-o", str(tmp / "floor"), str(tmp / "floor.c")], check=True)
        agent = build_native_agent()  # the real one, as sandboxes run it
        (tmp / agent.name).write_bytes(agent.data)
        (tmp / agent.name).chmod(0o755)
        for _ in range(args.rounds):
            rounds.append(
                {
                    "agent": _agent_memory(tmp / agent.name, tmp, args.commands, args.output_bytes),
                    "floor": _floor_memory(tmp / "floor"),
                    "load_average": load_average(),
                }
            )
    dirty = [r["agent"]["idle"]["private_dirty_mib"] for r in rounds]
    used = [r["agent"][f"after_{args.commands}_commands"]["private_dirty_mib"] for r in rounds]
    floor = [r["floor"]["private_dirty_mib"] for r in rounds]
    report = {
        "rounds": rounds,
        "agent_binary_kib": round(len(agent.data) / 1024, 1),
        "idle_dirty_over_floor": round(min(dirty) / min(floor), 2),
        "used_dirty_over_idle": round(min(used) / min(dirty), 2),
        "cpus": os.cpu_count(),
    }
    print(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode())


if __name__ == "__main__":
    main()
