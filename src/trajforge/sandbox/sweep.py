"""Remove what sandboxes of dead trajforge processes left behind (after ``kill -9``, a power cut).

A killed run cannot clean up: bubblewrap dies with it (``--die-with-parent``), but the sandbox
directories -- with whatever files the samples wrote -- and the per-sandbox cgroups stay, and every
crash adds more. So each sandbox directory carries an ``owner.json`` naming the process that made it
(pid *and* that process's start time, so a recycled pid is not mistaken for the owner) and its
cgroups; the first ``create`` of a factory removes every directory whose owner is gone.

Directories without ``owner.json`` are never touched: they may belong to a process that has just
made its directory and not yet written the file, or to something that is not ours.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from pathlib import Path
from typing import Any

import orjson

from trajforge.sandbox.cgroup import CGROUP_ROOT, SandboxCgroup
from trajforge.sandbox.disk import remove_tree

OWNER_FILE = "owner.json"
# The only cgroups a sweep may kill and remove: ones named like ours, below the cgroup root.
_OUR_CGROUP = re.compile(r"trajforge-[0-9a-f]{12}")

log = logging.getLogger(__name__)


def process_start(pid: int) -> int | None:
    """When ``pid`` started (clock ticks since boot, /proc/PID/stat field 22); None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
    except OSError:
        return None
    return int(fields[19])


def write_owner(root: Path, cgroup: SandboxCgroup | None = None) -> None:
    """Mark a sandbox directory as this process's (host-side: the sandbox never sees ``root``).

    Replaced, not rewritten, so the file is always ours even after the tree was chowned to the
    sandbox's uid (a sweep trusts only files of its own uid)."""
    pid = os.getpid()
    cgroups = [str(p) for p in cgroup.dirs.values()] if cgroup is not None else []
    path = root / OWNER_FILE
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    path.write_bytes(orjson.dumps({"pid": pid, "start": process_start(pid), "cgroups": cgroups}))


def _owner_alive(record: dict[str, Any]) -> bool:
    pid, start = record.get("pid"), record.get("start")
    if not isinstance(pid, int):
        return True  # unreadable: not ours to judge
    now = process_start(pid)
    return now is not None and now == start


def _read_owner(path: Path) -> dict[str, Any] | None:
    """The owner record, only if we wrote it: a file of another uid is never trusted."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        if os.fstat(fd).st_uid != os.geteuid():
            return None
        with os.fdopen(fd, "rb", closefd=False) as f:
            record = orjson.loads(f.read(65536))
    except (OSError, orjson.JSONDecodeError):
        return None
    finally:
        os.close(fd)
    return record if isinstance(record, dict) else None


def _our_cgroups(paths: object) -> list[Path]:
    if not isinstance(paths, list):
        return []
    found = []
    for raw in paths:
        path = Path(raw) if isinstance(raw, str) else None
        if path is not None and path.is_relative_to(CGROUP_ROOT) and _OUR_CGROUP.fullmatch(path.name):
            found.append(path)
    return found


def sweep_stale(root_dir: Path) -> int:
    """Remove the sandbox directories (and cgroups) under ``root_dir`` whose owner process is dead.

    Returns how many were removed. Blocking; best effort: anything it cannot read is left alone.
    """
    removed = 0
    try:
        entries = list(os.scandir(root_dir))
    except OSError:
        return 0
    for entry in entries:
        if not entry.is_dir(follow_symlinks=False):
            continue
        record = _read_owner(Path(entry.path, OWNER_FILE))
        if record is None or _owner_alive(record):
            continue
        stale = SandboxCgroup({str(i): p for i, p in enumerate(_our_cgroups(record.get("cgroups")))})
        with contextlib.suppress(OSError):
            stale.remove()  # kills anything still in them first
        remove_tree(Path(entry.path))
        removed += 1
    if removed:
        log.info("removed %d sandbox directories left by dead trajforge processes in %s", removed, root_dir)
    return removed
