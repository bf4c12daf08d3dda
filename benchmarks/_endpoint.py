"""What the batch benchmarks share: the scripted endpoint they run against, in a process of its own,
and the CPU counters they read.

The endpoint is ``python -m trajforge.testing.server_cli`` with ``--latency`` per call and the
``tool_then_answer`` policy: ``tool_calls`` calls that each run ``echo hi`` in the ``terminal``
tool, then an answer, so a sample makes ``tool_calls + 1`` model calls. It runs in its own process
so its CPU is not ours (``process_cpu`` reads it, for subtracting it from the machine's).
"""

from __future__ import annotations

import contextlib
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import orjson

CALLS = 3  # model calls per sample with the default two tool calls
KEY_VAR = "BENCH_KEY"  # the endpoint checks no key; the batch config names a variable anyway


def load_average() -> float:
    """The 1-minute load average (printed beside figures taken on a shared machine)."""
    return os.getloadavg()[0]


def write_prompts(path: Path, n: int) -> Path:
    """A dataset of ``n`` rows ``{"prompt": "task i"}``, the scripted endpoint's workload."""
    path.write_bytes(b"".join(orjson.dumps({"prompt": f"task {i}"}) + b"\n" for i in range(n)))
    return path


def machine_cpu() -> float:
    """Busy CPU-seconds of the whole machine (/proc/stat): also counts the endpoint process and
    kernel work done outside our process tree (namespace and cgroup teardown, killed sandbox
    processes), which ``getrusage`` never charges to us."""
    with open("/proc/stat") as stat:
        fields = [int(x) for x in stat.readline().split()[1:]]
    busy = sum(fields) - fields[3] - fields[4]  # minus idle and iowait
    return busy / os.sysconf("SC_CLK_TCK")


def process_cpu(pid: int) -> float:
    """CPU-seconds of another process (the endpoint), from /proc/PID/stat."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def own_cpu() -> float:
    """CPU-seconds of this process and its reaped children (worker processes). Not a sandbox's:
    see :class:`TreeCpu`."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


class TreeCpu:
    """CPU-seconds of this process and of every process started under it while the ``with``
    lasts, reaped or not: a cgroup-v1 ``cpuacct`` group of our own (root only; ``seconds()`` is
    None where none can be made, and ``own_cpu`` is all there is).

    Why not ``getrusage``: a sandbox's processes are reaped inside its pid namespace by bwrap, and
    their CPU never reaches our RUSAGE_CHILDREN (measured: 5 ms of 1.37 s for 100 rollouts'
    commands and resets), so "our CPU" from it left the sandboxes out."""

    def __init__(self) -> None:
        self.path: Path | None = None
        self._home: Path | None = None

    def __enter__(self) -> TreeCpu:
        base = Path("/sys/fs/cgroup/cpuacct")
        own = next(
            (
                line.split(":", 2)[2].strip()
                for line in Path("/proc/self/cgroup").read_text().splitlines()
                if "cpuacct" in line.split(":", 2)[1].split(",")
            ),
            None,
        )
        if own is None or not (base / "cgroup.procs").exists():
            return self
        home = base / own.lstrip("/")
        # A name of its own per use: an earlier group whose last sandbox processes were still
        # exiting could not be removed, and its name refused the next round's (no CPU figure).
        path = home / f"trajforge-bench-{os.getpid()}-{time.monotonic_ns()}"
        try:
            path.mkdir()
            (path / "cgroup.procs").write_text(str(os.getpid()))
        except OSError:
            with contextlib.suppress(OSError):
                path.rmdir()
            return self
        self.path, self._home = path, home
        return self

    def seconds(self) -> float | None:
        if self.path is None:
            return None
        return int((self.path / "cpuacct.usage").read_text()) / 1e9

    def __exit__(self, *exc: object) -> None:
        if self.path is None or self._home is None:
            return
        with contextlib.suppress(OSError):
            (self._home / "cgroup.procs").write_text(str(os.getpid()))
        for _ in range(50):  # the last sandbox processes may still be exiting
            try:
                self.path.rmdir()
                return
            except OSError:
                time.sleep(0.1)


def start_server(latency: float, port_file: Path, *, tool_calls: int = CALLS - 1) -> subprocess.Popen[bytes]:
    """Start the scripted endpoint and wait until it listens (its port is then in ``port_file``)."""
    cmd = [
        sys.executable,
        "-m",
        "trajforge.testing.server_cli",
        "--latency",
        str(latency),
        "--policy",
        "tool_then_answer",
        "--calls-per-sample",
        str(tool_calls),
        "--command",
        "echo hi",
        "--port-file",
        str(port_file),
    ]
    # The endpoint is the fixture, not what is measured: always this checkout's, also when a
    # benchmark measures another checkout's src/ through PYTHONPATH (--compare-src).
    here = str(Path(__file__).resolve().parents[1] / "src")
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([here, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    )
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, env=env)
    assert proc.stdout is not None
    line = proc.stdout.readline().decode()
    if not line.startswith("READY"):
        proc.kill()
        raise SystemExit(f"scripted server did not start: {line!r}")
    return proc


@dataclass(frozen=True)
class Endpoint:
    """A running scripted endpoint and the scratch directory of the benchmark that uses it."""

    pid: int
    base_url: str  # ends in /v1
    tmp: Path  # removed when the ``with`` ends
    dataset: Path  # ``prompts`` rows {"prompt": "task i"} (an empty file when none were asked for)


@contextlib.contextmanager
def scripted_endpoint(
    latency: float, *, prefix: str, prompts: int = 0, tool_calls: int = CALLS - 1
) -> Iterator[Endpoint]:
    """A scratch directory with a dataset of ``prompts`` rows and the endpoint, for a ``with``.

    Sets ``KEY_VAR`` (when unset) to a placeholder: the endpoint checks no key."""
    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        dataset = write_prompts(tmp / "prompts.jsonl", prompts)
        os.environ.setdefault(KEY_VAR, "unused")
        server = start_server(latency, tmp / "port", tool_calls=tool_calls)
        try:
            yield Endpoint(server.pid, f"http://127.0.0.1:{int((tmp / 'port').read_text())}/v1", tmp, dataset)
        finally:
            server.terminate()
            server.wait()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
