"""Per-sandbox cgroups (v1 ``pids`` and ``memory`` controllers), where the host lets us make them.

Why: rlimits are per process (RLIMIT_AS, RLIMIT_FSIZE) or per *user* system-wide (RLIMIT_NPROC,
which root ignores entirely). Only a cgroup caps the whole sandbox: ``pids.max`` contains a fork
bomb whatever uid it runs under, ``memory.limit_in_bytes`` caps the sum of all its processes, and
``cgroup.procs`` lists every process to kill at close, even ones that escaped their process group.

Groups are made *below the cgroup we already run in*, so a sandbox never leaves the limits that
the host put on us. Every step is best effort: a controller we cannot write is simply absent, and
the caller falls back to rlimits.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


def _own_path(controller: str) -> str | None:
    """Our cgroup path for a v1 controller, from /proc/self/cgroup."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):
            return path
    return None


@dataclass
class SandboxCgroup:
    """The cgroup directories of one sandbox, one per controller that could be set up."""

    dirs: dict[str, Path] = field(default_factory=dict)
    _files: dict[tuple[str, str], str] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def create(cls, name: str, *, max_pids: int, memory_bytes: int | None) -> SandboxCgroup:
        group = cls()
        settings = {"pids": {"pids.max": str(max_pids)}}
        if memory_bytes:
            settings["memory"] = {"memory.limit_in_bytes": str(memory_bytes)}
        for controller, files in settings.items():
            own = _own_path(controller)
            base = CGROUP_ROOT / controller
            if own is None or not (base / "cgroup.procs").exists():
                continue
            path = base / own.lstrip("/") / name
            try:
                path.mkdir(parents=False)
                for fname, value in files.items():
                    (path / fname).write_text(value)
            except OSError:
                with contextlib.suppress(OSError):
                    path.rmdir()
                continue
            group.dirs[controller] = path
        return group

    @property
    def limits_pids(self) -> bool:
        return "pids" in self.dirs

    @property
    def limits_memory(self) -> bool:
        return "memory" in self.dirs

    def join_command(self) -> list[str]:
        """A shell prefix that moves itself into every group, then execs the rest of argv."""
        if not self.dirs:
            return []
        writes = " && ".join(f'echo $$ > "{p}/cgroup.procs"' for p in self.dirs.values())
        return ["/bin/sh", "-c", f'{writes} && exec "$@"', "trajforge-cgroup"]

    def pids(self) -> list[int]:
        seen: set[int] = set()
        for controller in self.dirs:
            seen.update(int(x) for x in (self.read(controller, "cgroup.procs") or "").split())
        return sorted(seen)

    def read(self, controller: str, fname: str) -> str | None:
        # Raw calls on a path joined once: the host reads pids.events around every command (a
        # pathlib text read builds a buffered stack per call, ~4x the cost of these three system
        # calls, and a pathlib join per read was half of what was left).
        fpath = self._files.get((controller, fname))
        if fpath is None:
            path = self.dirs.get(controller)
            if path is None:
                return None
            fpath = self._files[controller, fname] = os.path.join(path, fname)
        try:
            fd = os.open(fpath, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            data = os.read(fd, 65536)
            if len(data) == 65536:  # a cgroup.procs of thousands of processes
                while more := os.read(fd, 65536):
                    data += more
            return data.decode("ascii", "replace")
        except OSError:
            return None
        finally:
            os.close(fd)

    def kill_all(self) -> None:
        """SIGKILL everything in the groups, repeating while a fork bomb keeps spawning."""
        for _ in range(100):
            pids = self.pids()
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.01)

    def remove(self) -> None:
        """Kill what is left and remove the directories (retrying while exits are reaped)."""
        self.kill_all()
        for path in self.dirs.values():
            for _ in range(100):
                try:
                    path.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.02)
        self.dirs.clear()
