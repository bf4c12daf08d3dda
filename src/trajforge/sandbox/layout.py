"""Where a sandbox lives on the host: its directories (and tmpfs), the exec agent's copy,
copy-in of a starting directory, ownership, and the thread pool for that blocking work."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import stat
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from trajforge.sandbox.confined import DataPathError, HostPath
from trajforge.sandbox.disk import mount_disk, remove_tree
from trajforge.sandbox.sweep import write_owner


@dataclass(frozen=True)
class AgentFile:
    """The exec agent as a sandbox gets it: the program ``native_agent`` built (its file name and
    bytes), copied read-only into each sandbox and run there."""

    name: str
    data: bytes


T = TypeVar("T")


@dataclass
class Layout:
    """Host directories of one sandbox: ``work`` (the workdir), ``tmp`` (scratch), ``shm`` (the
    sandbox's ``/dev/shm``: POSIX shared memory and semaphores, which Python's multiprocessing,
    pytest-xdist, joblib, PostgreSQL and Chromium need), the agent copy."""

    root: Path
    work: Path
    tmp: Path
    agent: Path
    log: Path
    shm: Path
    owner: tuple[int, int] | None = None  # (uid, gid) the tree belongs to, when not ours
    disk_capped: bool = False  # work, tmp and shm live on one tmpfs of the configured size

    @property
    def writable(self) -> tuple[Path, ...]:
        """The directories commands write: what a reset empties and the host checks."""
        return (self.work, self.tmp, self.shm)

    def dir_stats(self) -> tuple[tuple[int, int], ...]:
        """(mode, uid) of the writable directories: what a reset must leave as it found."""
        return tuple((st.st_mode, st.st_uid) for st in map(os.lstat, self.writable))


def shared_root() -> Path:
    """One parent directory per user for all sandboxes (each one is a fresh mkdtemp inside), so
    factories leave no empty directories behind. Falls back to a private mkdtemp when the shared
    path is not a plain directory owned by us (someone else planted it)."""
    root = Path(tempfile.gettempdir()) / f"trajforge-sandboxes-{os.getuid()}"
    with contextlib.suppress(FileExistsError):
        root.mkdir(mode=0o711)
    info = root.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        root = Path(tempfile.mkdtemp(prefix="trajforge-sandboxes-"))
    root.chmod(0o711)  # a sandbox's own uid must be able to traverse it
    return root


class SandboxIO:
    """The thread pool that runs a factory's (and its sandboxes') blocking file-system work.

    Its own pool rather than asyncio's default one (``cpu_count + 4`` threads, shared with
    everything else in the process): with dozens of sandboxes starting and closing at once, queueing
    on the default pool was most of a sandbox's start-up time (measured in benchmarks/).
    """

    def __init__(self, workers: int = 8) -> None:
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="trajforge-sandbox-io")

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, functools.partial(fn, *args))


def make_layout(
    root_dir: Path, task_id: str, agent: AgentFile, disk: tuple[int, int] | None = None
) -> Layout:
    """A fresh sandbox directory; with ``disk`` (MiB, inodes) its work, tmp and shm dirs share one
    size-limited tmpfs when this process may mount one (``layout.disk_capped`` says): what a command
    puts in ``/dev/shm`` counts against the same cap as its files. ``tmp`` and ``shm`` are 1777, as
    ``/tmp`` and ``/dev/shm`` are on a Linux box. ``agent``: the exec agent, copied in as a program."""
    safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in task_id)[:40]
    root = Path(tempfile.mkdtemp(prefix=f"{safe}-", dir=root_dir))
    write_owner(root)  # from now on a sweep can tell whether the process that made it is alive
    try:
        files = mount_disk(root, *disk) if disk is not None else None
    except BaseException:
        remove_tree(root)
        raise
    base = files or root
    layout = Layout(root, base / "work", base / "tmp", root / agent.name, root / "agent.log", base / "shm")
    layout.disk_capped = files is not None
    layout.work.mkdir()
    for shared in (layout.tmp, layout.shm):
        shared.mkdir()
        shared.chmod(0o1777)
    layout.agent.write_bytes(agent.data)
    layout.agent.chmod(0o755)
    return layout


def copy_in(source: str, dest: Path) -> None:
    """Copy a row's starting directory into the fresh workdir (the original is never touched).

    ``source`` is ``ROOT/./REL`` (:meth:`HostPath.marked`: what a dataset row's ``cwd`` becomes
    once checked to lie under the data root; a path without the marker is all root). The root is
    the operator's and the kernel resolves it; below it, the row's path and the whole tree are
    walked from directory fds with ``O_NOFOLLOW``, so a directory swapped for a link to a host
    directory while it is copied is refused (:class:`DataPathError`), never followed. Links *inside*
    the tree are copied as links: the sandbox resolves them in its own view, and the host reads
    the workdir only through :mod:`trajforge.sandbox.confined`."""
    src = HostPath.from_marked(source)
    try:
        kind = src.kind()
    except DataPathError as exc:
        raise DataPathError(f"cwd {src}: {exc}") from None
    except OSError as exc:
        raise DataPathError(f"cwd {src} is not a directory on this machine ({exc.strerror or exc})") from None
    if kind != "dir":
        raise DataPathError(
            f"cwd {src} is {'a symbolic link' if kind == 'link' else 'not a directory'} on this machine; "
            "give a directory under the data root whose contents should be copied into the sandbox, "
            "or leave cwd unset"
        )
    try:
        src.copy_into(str(dest))
    except DataPathError as exc:
        raise DataPathError(f"cwd {src}: {exc}") from None


def chown_tree(path: Path, owner: tuple[int, int]) -> None:
    os.chown(path, *owner, follow_symlinks=False)
    for dirpath, dirnames, filenames in os.walk(path):
        for name in dirnames + filenames:
            os.chown(os.path.join(dirpath, name), *owner, follow_symlinks=False)
