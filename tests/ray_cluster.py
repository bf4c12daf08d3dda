"""A real Ray cluster on loopback for the ``--backend ray`` tests (``batch`` and ``env eval``): a
head and two worker nodes, each started as its own ``ray start`` (own raylet, own process group,
so a test can SIGKILL one node whole)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

RAY = str(Path(sys.executable).with_name("ray"))
# Loopback, but not 127.0.0.1: `ray start` rewrites exactly that one to the machine's outward
# address (so that other hosts could join); any other 127/8 address stays on loopback.
LOOPBACK = "127.0.0.2"
# Node death is noticed by the head's health checks; tight ones keep the test short.
_FAST_HEALTH = {
    "RAY_health_check_initial_delay_ms": "0",
    "RAY_health_check_period_ms": "500",
    "RAY_health_check_timeout_ms": "500",
    "RAY_health_check_failure_threshold": "3",
}
_SMALL = ["--num-cpus", "1", "--object-store-memory", str(80 * 2**20), "--disable-usage-stats"]


@dataclass
class Node:
    name: str
    pgid: int  # every process of the node (raylet, its workers, the actor) is in this group


@dataclass
class Cluster:
    address: str
    head: Node
    workers: list[Node]

    def kill(self, node: Node) -> None:
        os.killpg(node.pgid, signal.SIGKILL)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


def _spawn(name: str, args: list[str], temp_dir: str) -> tuple[str, subprocess.Popen[str]]:
    # No token authentication, whatever ~/.ray holds: `ray start` turns it on when a token file
    # exists (any earlier local `ray.init()` writes one), a driver given an address never does.
    env = {**os.environ, **_FAST_HEALTH, "RAY_AUTH_MODE": "disabled"}
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.Popen(
        [RAY, "start", "--node-ip-address", LOOPBACK, "--node-name", name, *_SMALL, *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # leads its own process group, which the node's daemons keep
        cwd=temp_dir,
    )
    return name, proc


def _started(name: str, proc: subprocess.Popen[str]) -> Node:
    """Wait for ``ray start`` to return (its daemons keep running in its process group)."""
    out, _ = proc.communicate(timeout=120)
    if proc.returncode != 0:
        raise AssertionError(f"ray start of {name} failed: {out}")
    return Node(name, proc.pid)


@contextlib.contextmanager
def local_ray_cluster() -> Iterator[Cluster]:
    """A head and two worker nodes (``node-b``, ``node-c``) on loopback, started here, each its
    own process group; all killed at the end. The nodes inherit this process's environment, as
    ``ray start`` on a real host would (set an endpoint's key variable before)."""
    temp_dir = tempfile.mkdtemp(prefix="tfray", dir="/tmp")  # short: Ray's socket paths
    port = _free_port()
    groups: list[int] = []  # every node's process group, killed at teardown whatever happened

    def spawn(name: str, args: list[str]) -> tuple[str, subprocess.Popen[str]]:
        started = _spawn(name, args, temp_dir)
        groups.append(started[1].pid)
        return started

    try:
        head = _started(
            *spawn(
                "head", ["--head", "--port", str(port), "--include-dashboard=false", "--temp-dir", temp_dir]
            )
        )
        # One at a time: `ray start` finds its own raylet by address, the same for every node here.
        workers = [
            _started(*spawn(name, ["--address", f"{LOOPBACK}:{port}"])) for name in ("node-b", "node-c")
        ]
        yield Cluster(f"{LOOPBACK}:{port}", head, workers)
    finally:
        for pgid in reversed(groups):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
        shutil.rmtree(temp_dir, ignore_errors=True)
