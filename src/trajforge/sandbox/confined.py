"""Host-side file access beneath a sandbox's working directory that no race can escape.

The file tools (and reward code) read and write a sandbox's files from the host: no exec round
trip, no output cap, bytes exact. The host may be root; the sandbox's commands run at the same time
and control every name beneath the workdir. Checking a path and then opening it by name loses to a
command that swaps a directory for a symlink in between (``renameat2(RENAME_EXCHANGE)`` in a loop
wins about one call in four). So nothing here ever lets the kernel resolve more than one name:

- the walk starts from a directory fd of the workdir and opens one component at a time with
  ``O_PATH | O_NOFOLLOW`` relative to the fd of the directory before it; ``fstat`` of that fd says
  what the component *is* (the inode, not a name that may change under us);
- a symlink is read from its own fd (``readlinkat(fd, "")``) and resolved by this code as the
  sandbox would see it: an absolute target is an inside path, mapped back to the workdir; ``..``
  pops our own stack of directory fds and never goes above the workdir;
- the final open, create and ``mkdir`` are all relative to those fds, with
  ``O_NOFOLLOW | O_NONBLOCK`` (a FIFO cannot block the host) and a regular-file check on the fd.

When the sandbox has an owner uid (bwrap as root), the calling thread also switches its file-system
uid/gid to that owner for the duration (``setfsuid`` is per thread): the host then has exactly the
sandbox's permissions, drops root's file capabilities, and creates files owned by the sandbox.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import posixpath
import stat
from collections.abc import Iterator
from dataclasses import dataclass

_MAX_LINKS = 40
_MAX_RETRIES = 64  # a component that keeps changing type under us (a racer) ends in an error
_DIR_FLAGS = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_WRITE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC

_libc = ctypes.CDLL(None, use_errno=True)


@contextlib.contextmanager
def _fs_identity(owner: tuple[int, int] | None) -> Iterator[None]:
    """Run the block with this thread's file-system uid/gid set to ``owner`` (root only)."""
    if owner is None or os.geteuid() != 0:
        yield
        return
    _libc.setfsgid(owner[1])
    _libc.setfsuid(owner[0])
    try:
        if _libc.setfsuid(-1 & 0xFFFFFFFF) != owner[0]:  # query: did the switch take?
            raise PermissionError("could not switch to the sandbox's file-system uid")
        yield
    finally:
        _libc.setfsuid(0)
        _libc.setfsgid(0)


class _Walk:
    """A stack of directory fds from the workdir down; closes them all at the end."""

    def __init__(self, root_fd: int) -> None:
        self.fds = [root_fd]

    @property
    def top(self) -> int:
        return self.fds[-1]

    def push(self, fd: int) -> None:
        self.fds.append(fd)

    def pop(self) -> None:
        os.close(self.fds.pop())

    def reset(self) -> None:
        while len(self.fds) > 1:
            self.pop()

    def close(self) -> None:
        while self.fds:
            os.close(self.fds.pop())


@dataclass(frozen=True)
class ConfinedDir:
    """File access confined to ``host`` (the workdir on the host), named as ``inside`` names it."""

    inside: str
    host: str
    owner: tuple[int, int] | None = None

    def read(self, path: str, limit: int | None = None) -> bytes:
        """The exact bytes of a regular file beneath the workdir (symlinks resolved inside it);
        at most ``limit`` bytes when given (a model-facing reader must not load a 1 GiB file)."""
        walk, parts = self._start(path)
        with _fs_identity(self.owner):
            try:
                self._descend(walk, parts[:-1], path, create=False)
                fd = self._open_final(walk, parts[-1], path, _READ_FLAGS, 0)
            finally:
                walk.close()
            with os.fdopen(fd, "rb") as f:
                return f.read() if limit is None else f.read(limit)

    def write(self, path: str, data: bytes) -> None:
        """Create or replace a regular file beneath the workdir, making missing directories."""
        walk, parts = self._start(path)
        with _fs_identity(self.owner):
            try:
                self._descend(walk, parts[:-1], path, create=True)
                fd = self._open_final(walk, parts[-1], path, _WRITE_FLAGS, 0o644)
            finally:
                walk.close()
            with os.fdopen(fd, "wb") as f:
                f.write(data)

    # -- the walk -------------------------------------------------------------------------------

    def _start(self, path: str) -> tuple[_Walk, list[str]]:
        """The walk's start (the workdir, opened with the host's own rights: its parents may be
        private to us) and the path's components, the last one naming a file."""
        if "\0" in path:
            raise PermissionError(f"path contains a NUL byte: {path!r}")
        parts = self._relative_parts(path, path)
        while parts and parts[-1] in ("", "."):
            parts.pop()
        if not parts or parts[-1] == "..":
            raise IsADirectoryError(errno.EISDIR, f"not a file path: {path!r}")
        return _Walk(os.open(self.host, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)), parts

    def _descend(self, walk: _Walk, parts: list[str], path: str, *, create: bool) -> None:
        links = retries = 0
        while parts:
            part = parts.pop(0)
            if part in ("", "."):
                continue
            if part == "..":
                if len(walk.fds) == 1:
                    raise PermissionError(f"path escapes the sandbox working directory: {path!r}")
                walk.pop()
                continue
            try:
                fd = os.open(part, _DIR_FLAGS, dir_fd=walk.top)
            except FileNotFoundError:
                if not create:
                    raise
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o755, dir_fd=walk.top)  # owned by the sandbox (fs identity)
                parts.insert(0, part)
                retries += 1
                if retries > _MAX_RETRIES:
                    raise
                continue
            mode = os.fstat(fd).st_mode
            if stat.S_ISDIR(mode):
                walk.push(fd)
                continue
            try:
                if not stat.S_ISLNK(mode):
                    raise NotADirectoryError(errno.ENOTDIR, f"not a directory in {path!r}: {part!r}")
                target = os.readlink("", dir_fd=fd)
            finally:
                os.close(fd)
            links += 1
            if links > _MAX_LINKS:
                raise PermissionError(f"too many symlinks resolving {path!r}")
            parts[:0] = self._follow(walk, target, path)

    def _open_final(self, walk: _Walk, name: str, path: str, flags: int, mode: int) -> int:
        """Open the final component relative to ``walk``; a symlink there is resolved inside."""
        links = 0
        for _ in range(_MAX_RETRIES):
            try:
                fd = os.open(name, flags, mode, dir_fd=walk.top)
            except OSError as exc:
                if exc.errno != errno.ELOOP:
                    raise
                try:
                    target = os.readlink(name, dir_fd=walk.top)
                except OSError as again:
                    if again.errno in (errno.EINVAL, errno.ENOENT):
                        continue  # swapped back under us: look again
                    raise
                links += 1
                if links > _MAX_LINKS:
                    raise PermissionError(f"too many symlinks resolving {path!r}") from exc
                parts = self._follow(walk, target, path)
                while parts and parts[-1] in ("", "."):
                    parts.pop()
                if not parts or parts[-1] == "..":
                    raise IsADirectoryError(errno.EISDIR, f"not a file path: {path!r}") from exc
                name = parts.pop()
                self._descend(walk, parts, path, create=bool(flags & os.O_CREAT))
                continue
            mode = os.fstat(fd).st_mode
            if not stat.S_ISREG(mode):
                os.close(fd)
                if stat.S_ISDIR(mode):
                    raise IsADirectoryError(errno.EISDIR, f"is a directory: {path!r}")
                raise OSError(errno.EINVAL, f"not a regular file: {path!r}")
            os.set_blocking(fd, True)
            return fd
        raise PermissionError(f"{path!r} kept changing while it was opened")

    def _follow(self, walk: _Walk, target: str, path: str) -> list[str]:
        """The parts a symlink's target adds; an absolute target restarts at the workdir."""
        if posixpath.isabs(target):
            walk.reset()
            return self._relative_parts(target, path)
        return target.split("/")

    def _relative_parts(self, path: str, original: str) -> list[str]:
        if not posixpath.isabs(path):
            return path.split("/")
        norm = posixpath.normpath(path)
        inside = self.inside.rstrip("/") or "/"
        if norm == inside:
            return []
        if not norm.startswith(inside + "/"):
            raise PermissionError(
                f"path is outside the sandbox working directory {self.inside}: {original!r}"
            )
        # Keep the un-normalised remainder so '..' after a symlink is applied in order.
        if path.startswith(inside + "/"):
            return path[len(inside) + 1 :].split("/")
        return norm[len(inside) + 1 :].split("/")
