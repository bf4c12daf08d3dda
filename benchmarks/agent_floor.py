"""What the exec agent costs for being a CPython process: its floor against a compiled one, in one run.

Issue 29's last two sandbox goals (at most 4 ms of machine CPU per trajectory on the sandbox side,
at most 2 MiB per live rollout) are out of reach of the agent as it is; this measures by how much
its interpreter alone accounts for it, so the decision to write the agent in a compiled language
rests on a number. Side by side, alternating rounds:

- **spawn**: the agent's own ``_start`` (``_posixsubprocess.fork_exec``: no Python runs in the
  child) starting ``/bin/true`` in a session of its own with stdin/stdout/stderr redirected, as it
  starts each rollout's shell, run by the interpreter the bwrap sandbox runs it on
  (``/usr/bin/python3 -I -S``); against a C program doing the same ``fork``/``setsid``/``dup2``/
  ``execve``. The parent's CPU per spawn (``RUSAGE_SELF``): a fork write-protects every page of the
  parent, and a CPython parent then takes a fault for each page its reference counts touch.
- **memory**: the real agent (its bytecode compiled for that interpreter, as a sandbox gets it;
  idle, before its first request: a floor) against the same C program idle and against the native
  agent (``exec_agent.c``, built as sandboxes get it): ``Pss`` and dirty private memory from
  ``smaps_rollup``.

Needs ``cc`` (Debian: ``apt-get install gcc``); without it, says so and exits 2.

    .venv/bin/python benchmarks/agent_floor.py
    .venv/bin/python benchmarks/agent_floor.py --spawns 2000 --rounds 3
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).parent))
from _endpoint import load_average  # noqa: E402

from trajforge.sandbox.layout import compile_agent  # noqa: E402
from trajforge.sandbox.native_agent import build_native_agent  # noqa: E402

SRC = Path(__file__).resolve().parent.parent / "src" / "trajforge" / "sandbox"
PYTHON = "/usr/bin/python3"

C_PROBE = r"""
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

static double cpu(void) {
    struct rusage r;
    getrusage(RUSAGE_SELF, &r);
    return r.ru_utime.tv_sec + r.ru_stime.tv_sec + (r.ru_utime.tv_usec + r.ru_stime.tv_usec) / 1e6;
}

int main(int argc, char **argv) {
    int n = atoi(argv[1]);
    char *args[] = {"/bin/true", NULL}, *envp[] = {"PATH=/usr/bin:/bin", NULL};
    double before = cpu();
    for (int i = 0; i < n; i++) {
        int report[2], out = open("/dev/null", O_WRONLY | O_CLOEXEC);
        int in = open("/dev/null", O_RDONLY | O_CLOEXEC);
        if (pipe2(report, O_CLOEXEC) != 0 || out < 0 || in < 0) return 1;
        pid_t pid = fork();
        if (pid == 0) {
            setsid();
            dup2(in, 0); dup2(out, 1); dup2(out, 2);
            if (chdir("/") == 0) execve(args[0], args, envp);
            _exit(127);
        }
        close(report[1]);
        char buf[64];
        while (read(report[0], buf, sizeof buf) > 0) {}
        close(report[0]); close(out); close(in);
        int status;
        waitpid(pid, &status, 0);
    }
    printf("%.9f\n", (cpu() - before) / n);
    fflush(stdout);
    if (argc > 2) pause();  /* idle, for its memory to be read */
    return 0;
}
"""

PY_SPAWN = r"""
import os, resource, sys
sys.path.insert(0, sys.argv[2])
import exec_agent as agent
n, env = int(sys.argv[1]), {"PATH": "/usr/bin:/bin"}
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
before = cpu()
for _ in range(n):
    out = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
    try:
        agent._wait(agent._start(["/bin/true"], "/", env, None, out))
    finally:
        os.close(out)
print("%.9f" % ((cpu() - before) / n))
"""


def _memory(pid: int) -> dict[str, float]:
    """PSS and dirty private memory (MiB) of a live process, from ``/proc/PID/smaps_rollup``.

    Dirty private pages are what each more sandbox adds: the clean ones are the binary's and
    libraries' pages, private here only because no other process maps them (a thousand agents
    share them)."""
    fields: dict[str, float] = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name in ("Pss", "Private_Dirty"):
            fields[name] = int(rest.split()[0]) / 1024
    return {"pss_mib": fields["Pss"], "private_dirty_mib": fields["Private_Dirty"]}


def _idle_memory(argv: list[str], tmp: Path, *, says_a_line: bool) -> dict[str, float]:
    """Start ``argv``, let it settle (its first line read when it prints one, then 0.5 s), read
    its memory, stop it."""
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=tmp)
    try:
        assert proc.stdout is not None
        if says_a_line:
            proc.stdout.readline()
        time.sleep(0.5)
        return _memory(proc.pid)
    finally:
        proc.kill()
        proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spawns", type=int, default=1000, help="spawns per measurement")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds of both")
    args = parser.parse_args()
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        print("agent_floor.py needs a C compiler for its probe: apt-get install gcc", file=sys.stderr)
        sys.exit(2)
    with tempfile.TemporaryDirectory(prefix="tf-agent-floor-") as name:
        tmp = Path(name)
        (tmp / "probe.c").write_text(C_PROBE)
        subprocess.run([cc, "-O2", "-o", str(tmp / "probe"), str(tmp / "probe.c")], check=True)
        (work := tmp / "work").mkdir()
        (scratch := tmp / "scratch").mkdir()
        spawn: dict[str, list[float]] = {"python agent": [], "c": []}
        for _ in range(args.rounds):
            python = [PYTHON, "-I", "-S", "-c", PY_SPAWN, str(args.spawns), str(SRC)]
            spawn["python agent"].append(float(subprocess.check_output(python)) * 1e3)
            spawn["c"].append(float(subprocess.check_output([str(tmp / "probe"), str(args.spawns)])) * 1e3)
        code = compile_agent(PYTHON)
        if code is None:
            sys.exit(f"{PYTHON} could not compile the exec agent")
        (tmp / code.name).write_bytes(code.data)
        agent = [PYTHON, "-I", "-S", str(tmp / code.name), str(work), str(scratch)]
        native = build_native_agent()  # the real one, as bwrap sandboxes run it by default
        (tmp / native.name).write_bytes(native.data)
        (tmp / native.name).chmod(0o755)
        memory = {
            "python agent": _idle_memory(agent, tmp, says_a_line=False),
            "native agent": _idle_memory(
                [str(tmp / native.name), str(work), str(scratch)], tmp, says_a_line=True
            ),
            "c": _idle_memory([str(tmp / "probe"), "1", "idle"], tmp, says_a_line=True),
        }
    report = {
        "spawn_parent_cpu_ms": {k: [round(v, 4) for v in vs] for k, vs in spawn.items()},
        "spawn_ratio": round(min(spawn["python agent"]) / min(spawn["c"]), 1),
        "idle_memory_mib": {k: {f: round(v, 2) for f, v in m.items()} for k, m in memory.items()},
        "saved_dirty_mib_per_sandbox": round(
            memory["python agent"]["private_dirty_mib"] - memory["c"]["private_dirty_mib"], 2
        ),
        "interpreter": subprocess.check_output([PYTHON, "-c", "import sys; print(sys.version.split()[0])"])
        .decode()
        .strip(),
        "load_average": load_average(),
    }
    print(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode())


if __name__ == "__main__":
    main()
