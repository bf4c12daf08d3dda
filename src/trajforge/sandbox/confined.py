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

The same walk reads host trees that *data* names (a task directory, a dataset row's ``cwd``):
:class:`HostPath`, a path beneath a root the operator gave, with ``follow_links=False``. There a
link is not resolved at all but refused (:class:`DataPathError`): a task directory has no view of
its own in which a link could mean something safe, and an absolute target would otherwise be the
host's. A final file is opened ``O_PATH | O_NOFOLLOW`` first and reopened for reading only when its
inode is a regular file, so a device node or FIFO in a task directory is never opened.

Readers can be bounded (``max_bytes``): the size of the opened file is checked before anything is
read, and at most ``max_bytes + 1`` bytes are read (a file that grows meanwhile), so a sparse file
that costs the sandbox no disk cannot cost the host its full size in memory
(:class:`FileTooLargeError`).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fnmatch
import os
import posixpath
import stat
from collections.abc import Collection, Generator, Iterator
from dataclasses import dataclass

_MAX_LINKS = 40
_MAX_RETRIES = 64  # a component that keeps changing type under us (a racer) ends in an error
_DIR_FLAGS = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_WRITE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
NAME_MAX = 255  # bytes in one path component (Linux)
PATH_MAX = 4095  # bytes in a path, without the NUL

_libc = ctypes.CDLL(None, use_errno=True)


class DataPathError(ValueError):
    """A path named by data (a task directory's files, a dataset row's ``cwd`` or setup file name,
    an env item's ``task_dir``) that cannot be used: outside its root, through a symbolic link, or
    not a name a file can have. The data's fault, never an infrastructure failure: not retried."""


class FileTooLargeError(OSError):
    """A file larger than the reader's limit; nothing of it was returned (``errno`` EFBIG)."""

    def __init__(self, message: str) -> None:
        super().__init__(errno.EFBIG, message)

    def __str__(self) -> str:
        return str(self.strerror)


def name_problem(path: str) -> str | None:
    """Why ``path`` cannot name a file beneath a directory (a setup file a row gives), or None:
    a NUL byte, absolute, ``..``, a component over 255 bytes, over 4095 bytes in all, no file
    named (empty, or ending in ``/`` or ``.``)."""
    if "\0" in path:
        return "contains a NUL byte"
    if path.startswith("/"):
        return "is absolute (give a path relative to the working directory)"
    parts = path.split("/")
    if ".." in parts:
        return "goes up with '..'"
    try:
        sizes = [len(p.encode("utf-8", "surrogateescape")) for p in parts]
    except UnicodeEncodeError:
        return "is not valid UTF-8"
    if max(sizes) > NAME_MAX:
        return f"has a component of {max(sizes)} bytes (at most {NAME_MAX} bytes each)"
    if sum(sizes) + len(parts) - 1 > PATH_MAX:
        return f"is longer than {PATH_MAX} bytes"
    if parts[-1] in ("", "."):
        return "names no file (empty, or ends in '/' or '.')"
    return None


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
    """File access confined to ``host`` (the workdir on the host), named as ``inside`` names it.

    ``follow_links``: True for a sandbox's workdir (a link is resolved as the sandbox sees it,
    never above the workdir); False for a host tree named by data (a link anywhere beneath
    ``host`` is refused with :class:`DataPathError`; ``host`` itself is the operator's and is
    resolved by the kernel)."""

    inside: str
    host: str
    owner: tuple[int, int] | None = None
    follow_links: bool = True

    def read(self, path: str, limit: int | None = None, *, max_bytes: int | None = None) -> bytes:
        """The exact bytes of a regular file beneath the workdir (symlinks resolved inside it);
        at most ``limit`` bytes when given (a model-facing reader must not load a 1 GiB file: a
        prefix). ``max_bytes``: a file that would give more raises :class:`FileTooLargeError`,
        checked on the opened file before anything is read (reward code reads results whole, or
        not at all)."""
        walk, parts = self._start(path)
        with _fs_identity(self.owner):
            try:
                self._descend(walk, parts[:-1], path, create=False)
                fd = self._open_final(walk, parts[-1], path, _READ_FLAGS, 0)
            finally:
                walk.close()
            return read_fd(fd, path, limit, max_bytes)

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

    # -- directories (host trees: task directories, a row's cwd) -------------------------------

    def lstat(self, path: str) -> os.stat_result | None:
        """What ``path`` is, itself (a final link is reported, not followed); None if missing."""
        parts = self._dir_parts(path)
        if not parts:
            return os.stat(self.host)
        walk = self._open_root()
        try:
            try:
                self._descend(walk, parts[:-1], path, create=False)
                fd = os.open(parts[-1], _DIR_FLAGS, dir_fd=walk.top)
            except (FileNotFoundError, NotADirectoryError):
                return None
            try:
                return os.fstat(fd)
            finally:
                os.close(fd)
        finally:
            walk.close()

    def listdir(self, path: str = "") -> list[str]:
        """The sorted names in a directory beneath the root."""
        with self._opened_dir(path) as fd:
            return sorted(os.listdir(fd))

    def files(self, path: str = "", *, skip: Collection[str] = ()) -> list[tuple[str, bytes, int]]:
        """``(relative path, bytes, mode)`` of every regular file in the tree at ``path``, sorted;
        directories named in ``skip`` are left out. Only for host trees (``follow_links=False``):
        a link, FIFO, socket or device anywhere in the tree raises :class:`DataPathError`."""
        self._no_links_only("files")
        out: list[tuple[str, bytes, int]] = []
        with self._opened_dir(path) as fd, contextlib.closing(_entries(fd, skip)) as entries:
            for event, rel, st, pfd in entries:
                if event == "file":
                    out.append((rel, read_fd(_reopen(pfd, os.O_RDONLY | os.O_CLOEXEC), rel), st.st_mode))
                elif event in ("link", "other"):
                    raise DataPathError(self._refusal(_join(path, rel), rel, st.st_mode))
        return out

    def first_problem(self, path: str = "") -> str | None:
        """The first thing in the tree at ``path`` that :meth:`files` would refuse (a link, a
        FIFO, ...), as a sentence; None when the whole tree is plain directories and files. Opens
        no file."""
        self._no_links_only("first_problem")
        try:
            with self._opened_dir(path) as fd, contextlib.closing(_entries(fd)) as entries:
                for event, rel, st, _ in entries:
                    if event in ("link", "other"):
                        return self._refusal(_join(path, rel), rel, st.st_mode)
        except DataPathError as exc:
            return str(exc)
        return None

    def copy_tree(self, path: str, dest: str) -> None:
        """Copy the tree at ``path`` into the existing, empty directory ``dest`` (ours): files and
        directories with their permission bits (no set-id bits) and times, links as links (they
        are the copy's, resolved later by whoever reads it: never by this walk). A FIFO, socket
        or device raises :class:`DataPathError`; so does a link on the way *to* ``path``."""
        self._no_links_only("copy_tree")
        dirs = [os.open(dest, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)]
        try:
            with self._opened_dir(path) as fd, contextlib.closing(_entries(fd)) as entries:
                for event, rel, st, pfd in entries:
                    _copy_entry(event, posixpath.basename(rel), st, pfd, dirs)
                    if event == "other":
                        raise DataPathError(self._refusal(_join(path, rel), rel, st.st_mode))
        finally:
            for fd in dirs:
                os.close(fd)

    def _no_links_only(self, what: str) -> None:
        if self.follow_links:
            raise TypeError(f"ConfinedDir.{what} walks host trees only (follow_links=False)")

    @contextlib.contextmanager
    def _opened_dir(self, path: str) -> Iterator[int]:
        """A readable fd of the directory at ``path`` (every component walked without following)."""
        parts = self._dir_parts(path)
        walk = self._open_root()
        try:
            self._descend(walk, parts, path, create=False)
            fd = _reopen(walk.top, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        finally:
            walk.close()
        try:
            yield fd
        finally:
            os.close(fd)

    def _refusal(self, path: str, part: str, mode: int) -> str:
        what = "a symbolic link" if stat.S_ISLNK(mode) else "not a regular file or directory"
        return (
            f"{posixpath.join(self.host, path)}: {part} is {what}; links and special files beneath "
            f"{self.host} are not followed or opened (replace it with the file itself)"
        )

    # -- the walk -------------------------------------------------------------------------------

    def _open_root(self) -> _Walk:
        """The walk's start (the workdir, opened with the host's own rights: its parents may be
        private to us). A host tree's root is the operator's: the kernel resolves it."""
        flags = os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC | (os.O_NOFOLLOW if self.follow_links else 0)
        return _Walk(os.open(self.host, flags))

    def _dir_parts(self, path: str) -> list[str]:
        if "\0" in path:
            raise DataPathError(f"path contains a NUL byte: {path!r}")
        parts = [p for p in self._relative_parts(path, path) if p not in ("", ".")]
        if not self.follow_links and ".." in parts:
            raise DataPathError(f"{path!r} goes up with '..'")
        return parts

    def _start(self, path: str) -> tuple[_Walk, list[str]]:
        """The walk's start and the path's components, the last one naming a file."""
        if "\0" in path:
            raise PermissionError(f"path contains a NUL byte: {path!r}")
        parts = self._relative_parts(path, path)
        while parts and parts[-1] in ("", "."):
            parts.pop()
        if not parts or parts[-1] == "..":
            raise IsADirectoryError(errno.EISDIR, f"not a file path: {path!r}")
        if not self.follow_links and ".." in parts:
            raise DataPathError(f"{path!r} goes up with '..'")
        return self._open_root(), parts

    def _descend(self, walk: _Walk, parts: list[str], path: str, *, create: bool) -> None:
        links = retries = 0
        done: list[str] = []  # the components walked so far (for a host tree's message)
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
            done.append(part)
            if stat.S_ISDIR(mode):
                walk.push(fd)
                continue
            try:
                if not stat.S_ISLNK(mode):
                    raise NotADirectoryError(errno.ENOTDIR, f"not a directory in {path!r}: {part!r}")
                if not self.follow_links:
                    raise DataPathError(self._refusal(path, "/".join(done), mode))
                target = os.readlink("", dir_fd=fd)
            finally:
                os.close(fd)
            links += 1
            if links > _MAX_LINKS:
                raise PermissionError(f"too many symlinks resolving {path!r}")
            parts[:0] = self._follow(walk, target, path)

    def _open_final(self, walk: _Walk, name: str, path: str, flags: int, mode: int) -> int:
        """Open the final component relative to ``walk``; a symlink there is resolved inside (or,
        for a host tree, refused). A read opens the name ``O_PATH`` first and reopens it only when
        that inode is a regular file: a FIFO or device is never opened."""
        links = 0
        for _ in range(_MAX_RETRIES):
            if flags & os.O_CREAT:
                try:
                    fd: int | None = os.open(name, flags, mode, dir_fd=walk.top)
                except OSError as exc:
                    if exc.errno != errno.ELOOP:
                        raise
                    fd = None
            else:
                fd = self._open_read(walk.top, name, path, flags)
            if fd is None:  # a symlink
                if not self.follow_links:
                    raise DataPathError(self._refusal(path, name, stat.S_IFLNK))
                try:
                    target = os.readlink(name, dir_fd=walk.top)
                except OSError as again:
                    if again.errno in (errno.EINVAL, errno.ENOENT):
                        continue  # swapped back under us: look again
                    raise
                links += 1
                if links > _MAX_LINKS:
                    raise PermissionError(f"too many symlinks resolving {path!r}")
                parts = self._follow(walk, target, path)
                while parts and parts[-1] in ("", "."):
                    parts.pop()
                if not parts or parts[-1] == "..":
                    raise IsADirectoryError(errno.EISDIR, f"not a file path: {path!r}")
                name = parts.pop()
                self._descend(walk, parts, path, create=bool(flags & os.O_CREAT))
                continue
            st_mode = os.fstat(fd).st_mode
            if not stat.S_ISREG(st_mode):
                os.close(fd)
                if stat.S_ISDIR(st_mode):
                    raise IsADirectoryError(errno.EISDIR, f"is a directory: {path!r}")
                if not self.follow_links:
                    raise DataPathError(self._refusal(path, name, st_mode))
                raise OSError(errno.EINVAL, f"not a regular file: {path!r}")
            os.set_blocking(fd, True)
            return fd
        raise PermissionError(f"{path!r} kept changing while it was opened")

    @staticmethod
    def _open_read(dir_fd: int, name: str, path: str, flags: int) -> int | None:
        """``name`` opened for reading if it is a regular file; None if it is a symlink. Anything
        else raises (a directory: IsADirectoryError) without ever having been opened for I/O."""
        pfd = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
        try:
            st_mode = os.fstat(pfd).st_mode
            if stat.S_ISLNK(st_mode):
                return None
            if not stat.S_ISREG(st_mode):
                if stat.S_ISDIR(st_mode):
                    raise IsADirectoryError(errno.EISDIR, f"is a directory: {path!r}")
                return os.dup(pfd)  # the caller refuses it by its mode
            return _reopen(pfd, (flags & ~os.O_NOFOLLOW) | os.O_CLOEXEC)
        finally:
            os.close(pfd)

    def _follow(self, walk: _Walk, target: str, path: str) -> list[str]:
        """The parts a symlink's target adds; an absolute target restarts at the workdir."""
        if posixpath.isabs(target):
            walk.reset()
            return self._relative_parts(target, path)
        return target.split("/")

    def _relative_parts(self, path: str, original: str) -> list[str]:
        if not posixpath.isabs(path):
            return path.split("/")
        if not self.follow_links:
            raise DataPathError(f"{original!r} is absolute: give a path relative to {self.host}")
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


def read_fd(fd: int, path: str, limit: int | None = None, max_bytes: int | None = None) -> bytes:
    """Read an open regular file (and close it): at most ``limit`` bytes (a prefix); with
    ``max_bytes``, a file that would give more raises :class:`FileTooLargeError`, decided by its
    size on the fd before reading, then by reading at most ``max_bytes + 1`` bytes."""
    with os.fdopen(fd, "rb") as f:
        if max_bytes is None or (limit is not None and limit <= max_bytes):
            return f.read() if limit is None else f.read(limit)
        size = os.fstat(fd).st_size
        if size > max_bytes:
            raise FileTooLargeError(f"{path}: {size} bytes, over the limit of {max_bytes} bytes")
        data = f.read(max_bytes + 1)
        if len(data) > max_bytes:
            raise FileTooLargeError(f"{path}: over the limit of {max_bytes} bytes (it grew while read)")
        return data if limit is None else data[:limit]


def _reopen(fd: int, flags: int) -> int:
    """The file an (``O_PATH``) fd refers to, opened again with ``flags``: through
    ``/proc/self/fd``, which names that very inode, so no name is resolved again."""
    return os.open(f"/proc/self/fd/{fd}", flags)


def _join(base: str, rel: str) -> str:
    return f"{base.rstrip('/')}/{rel}" if base.strip("/.") else rel


def _entries(
    fd: int, skip: Collection[str] = (), prefix: str = ""
) -> Generator[tuple[str, str, os.stat_result, int], None, None]:
    """The tree under the readable directory ``fd``, depth first, names sorted, no link ever
    followed: ``(event, relative path, stat, O_PATH fd)``, the fd valid until the next step. Events:
    "dir" (before its contents), "end" (after them), "file", "link", "other" (FIFO, socket,
    device). Each entry is opened ``O_PATH | O_NOFOLLOW`` and judged by its inode; a directory is
    entered through that fd (``/proc/self/fd``), so a name swapped meanwhile changes nothing."""
    for name in sorted(os.listdir(fd)):
        rel = f"{prefix}{name}"
        pfd = os.open(name, _DIR_FLAGS, dir_fd=fd)
        try:
            st = os.fstat(pfd)
            if stat.S_ISDIR(st.st_mode):
                if name in skip:
                    continue
                yield "dir", rel, st, pfd
                sub = _reopen(pfd, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
                try:
                    yield from _entries(sub, skip, f"{rel}/")
                finally:
                    os.close(sub)
                yield "end", rel, st, pfd
            elif stat.S_ISREG(st.st_mode):
                yield "file", rel, st, pfd
            else:
                yield ("link" if stat.S_ISLNK(st.st_mode) else "other"), rel, st, pfd
        finally:
            os.close(pfd)


def _copy_entry(event: str, name: str, st: os.stat_result, pfd: int, dirs: list[int]) -> None:
    """One step of a tree copy into ``dirs[-1]`` (the stack of open destination directories)."""
    dest = dirs[-1]
    mode = stat.S_IMODE(st.st_mode) & 0o777
    times = (st.st_atime_ns, st.st_mtime_ns)
    if event == "dir":
        os.mkdir(name, 0o700, dir_fd=dest)
        dirs.append(os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dest))
    elif event == "end":  # its contents are in: now its own mode and times
        done = dirs.pop()
        try:
            os.chmod(done, mode)
            os.utime(done, ns=times)
        finally:
            os.close(done)
    elif event == "file":
        rfd = _reopen(pfd, os.O_RDONLY | os.O_CLOEXEC)
        try:
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            wfd = os.open(name, flags, 0o600, dir_fd=dest)
            try:
                while chunk := os.read(rfd, 1 << 20):
                    os.write(wfd, chunk)
                os.chmod(wfd, mode)
                os.utime(wfd, ns=times)
            finally:
                os.close(wfd)
        finally:
            os.close(rfd)
    elif event == "link":
        os.symlink(os.readlink("", dir_fd=pfd), name, dir_fd=dest)


@dataclass(frozen=True)
class HostPath:
    """A path beneath a host directory the operator gave (``root``: a tasks_dir, the data root)
    that data named (``rel``): every access walks from the root's fd, one component at a time,
    and a link anywhere beneath the root is refused, never followed (:class:`DataPathError`).
    Joins with ``/`` like a ``Path``; ``str()`` is the host path (for messages and ``docker build``).
    It has no ``__fspath__`` on purpose: nothing can ``open()`` it and follow a link by mistake."""

    root: str
    rel: str = ""

    @classmethod
    def of(cls, root: str | os.PathLike[str]) -> HostPath:
        """The operator's directory itself (resolved now, by the kernel: it is trusted)."""
        return cls(os.path.realpath(root))

    @classmethod
    def from_marked(cls, marked: str) -> HostPath:
        """Parse :meth:`marked` (a path without the marker is all root)."""
        root, sep, rel = marked.partition("/./")
        return cls(root or "/", rel) if sep else cls(marked)

    def marked(self) -> str:
        """``ROOT/./REL``: the root and the confined part in one string (rsync's convention), for
        APIs that carry a path as ``str`` (``SandboxFactory.create(cwd=...)``)."""
        return f"{self.root.rstrip('/')}/./{self.rel}"

    def __truediv__(self, name: str) -> HostPath:
        return HostPath(self.root, f"{self.rel}/{name}" if self.rel else name)

    def __str__(self) -> str:
        return f"{self.root.rstrip('/')}/{self.rel}" if self.rel else self.root

    @property
    def name(self) -> str:
        return posixpath.basename(self.rel) if self.rel else posixpath.basename(self.root)

    @property
    def _dir(self) -> ConfinedDir:
        return ConfinedDir(inside="", host=self.root, follow_links=False)

    def kind(self) -> str | None:
        """ "file", "dir", "link" or "other" (the entry itself, not followed); None if missing."""
        st = self._dir.lstat(self.rel)
        if st is None:
            return None
        if stat.S_ISREG(st.st_mode):
            return "file"
        if stat.S_ISDIR(st.st_mode):
            return "dir"
        return "link" if stat.S_ISLNK(st.st_mode) else "other"

    def is_file(self) -> bool:
        return self.kind() == "file"

    def is_dir(self) -> bool:
        return self.kind() == "dir"

    def mode(self) -> int:
        st = self._dir.lstat(self.rel)
        if st is None:
            raise FileNotFoundError(errno.ENOENT, f"no such file: {self}")
        return st.st_mode

    def read_bytes(self, max_bytes: int | None = None) -> bytes:
        return self._dir.read(self.rel, max_bytes=max_bytes)

    def read_text(self, errors: str = "strict") -> str:
        return self.read_bytes().decode("utf-8", errors)

    def iterdir(self) -> list[HostPath]:
        return [self / name for name in self._dir.listdir(self.rel)]

    def files(self, *, skip: Collection[str] = ()) -> list[tuple[str, bytes, int]]:
        """See :meth:`ConfinedDir.files`."""
        return self._dir.files(self.rel, skip=skip)

    def first_problem(self) -> str | None:
        """See :meth:`ConfinedDir.first_problem`; the entry itself counts (a link is one)."""
        kind = self.kind()
        if kind in ("link", "other"):
            mode = stat.S_IFLNK if kind == "link" else 0
            return self._dir._refusal(self.rel, self.rel, mode)
        return self._dir.first_problem(self.rel) if kind == "dir" else None

    def copy_into(self, dest: str) -> None:
        """See :meth:`ConfinedDir.copy_tree`."""
        self._dir.copy_tree(self.rel, dest)

    def glob(self, pattern: str) -> list[HostPath]:
        """Entries matching ``pattern`` (``fnmatch`` per component, as Docker's COPY; no ``**``),
        sorted; the entries themselves are not followed (a matching link is returned, and
        refused when read)."""
        found = [self]
        for part in pattern.split("/"):
            if part in ("", "."):
                continue
            if part == "..":
                raise DataPathError(f"{pattern!r} goes up with '..'")
            nxt: list[HostPath] = []
            for here in found:
                if not any(c in part for c in "*?["):
                    nxt.append(here / part)
                elif here.kind() == "dir":
                    nxt.extend(here / n for n in here._dir.listdir(here.rel) if fnmatch.fnmatchcase(n, part))
            found = nxt
        return sorted((p for p in found if p.kind() is not None), key=lambda p: p.rel)


def beneath(root: str | os.PathLike[str], path: str, what: str) -> HostPath:
    """The :class:`HostPath` that ``path`` (from data: relative to ``root``, or absolute) names
    beneath ``root`` (the operator's), decided on the text alone (``..`` resolved lexically; the
    walk that uses it refuses links); :class:`DataPathError` naming ``what`` when it is outside
    ``root`` or no usable path."""
    problem = None
    if not path:
        problem = "is empty"
    elif "\0" in path:
        problem = "contains a NUL byte"
    elif any(len(p.encode("utf-8", "surrogateescape")) > NAME_MAX for p in path.split("/")):
        problem = f"has a component over {NAME_MAX} bytes"
    if problem:
        raise DataPathError(f"{what} {path!r} {problem}")
    real = os.path.realpath(root)
    norm = posixpath.normpath(path)
    if posixpath.isabs(norm):
        for base in dict.fromkeys((os.path.abspath(root), real)):
            if norm == base or norm.startswith(base.rstrip("/") + "/"):
                return HostPath(real, norm[len(base) :].strip("/"))
    elif norm != ".." and not norm.startswith("../"):
        return HostPath(real, "" if norm == "." else norm)
    raise DataPathError(f"{what} {path!r} is outside {real}")
