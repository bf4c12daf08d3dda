"""``VerifierContext``: what reward code sees of its rollout (the reference calls it ToolContext).

Bound to one rollout's sandbox, after the rollout ended and before that sandbox is reset or
closed. Everything goes through the sandbox's own confinement: commands run inside it (as its
user, without its network), file paths resolve inside its workdir race-free. Unlike the model's
tools nothing is cut: a verifier reads 50 MB of test output whole, exact. But every read is
bounded (``max_read_bytes``, the env's ``EnvConfig.max_read_bytes``, default 64 MiB): a file or a
command output over it raises :class:`FileTooLargeError` naming the limit, decided by the file's
size before anything is read. A rollout makes a 1 GB sparse file for free; a host that read it
whole would hold 1 GB per rollout. ``ctx.sandbox`` is bounded the same way
(:class:`BoundedSandbox`), so a checker written as ``await ctx.sandbox.read_bytes(path)`` is too.

Commands never inherit the rollout's shell session (``exec_fresh``): a rollout that exported
``PATH=/tmp/evil:$PATH`` or ``PYTHONPATH`` does not choose the interpreter its tests run with.
Arguments given as a list are quoted with :func:`shlex.join`, so a path or pattern from the
model's output is data, never shell code.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from trajforge.envs.config import MAX_READ_BYTES
from trajforge.protocols import Sandbox, SupportsVerification
from trajforge.sandbox.confined import DataPathError, FileTooLargeError, HostPath
from trajforge.sandbox.types import ExecResult
from trajforge.tools.base import Tool, ToolContext, ToolOutput
from trajforge.tools.limits import ToolLimits

_SCRATCH = ".trajforge-verifier"  # under the sandbox scratch dir, never the workdir


class VerifierError(RuntimeError):
    """The verifier could not do what it asked (the sandbox cannot run fresh commands, ...)."""


@dataclass(frozen=True)
class VerifierExec:
    """A verifier command's outcome: exact bytes, nothing capped. ``exit_code`` is None when the
    command was killed at its timeout."""

    exit_code: int | None
    stdout: bytes
    stderr: bytes
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    @property
    def text(self) -> str:
        return self.stdout.decode(errors="replace")


@dataclass(frozen=True)
class SearchHit:
    path: str
    line: int
    text: str


def _shown(command: str | Sequence[str]) -> str:
    text = command if isinstance(command, str) else shlex.join(list(command))
    return text if len(text) <= 200 else text[:200] + "..."


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 and n % (1 << 20) == 0 else f"{n} bytes"


def over_limit(exc: FileTooLargeError, limit: int) -> FileTooLargeError:
    """``exc`` with what the limit is and how to raise it."""
    return FileTooLargeError(
        f"{exc}; reward code reads at most {_size(limit)} of a sandbox file or command output "
        "(max_read_bytes in the env config: raise it to read more)"
    )


class BoundedSandbox:
    """The rollout's sandbox as reward code sees it (``ctx.sandbox``): the sandbox's own methods,
    except that no read returns more than ``max_bytes``. ``read_bytes(path)`` of a larger file
    raises :class:`FileTooLargeError` before reading it; with an explicit ``limit`` at or below
    ``max_bytes`` it returns a prefix, as it always did."""

    def __init__(self, sandbox: Sandbox, verify: SupportsVerification, max_bytes: int) -> None:
        self._sandbox = sandbox
        self._verify = verify
        self.max_bytes = max_bytes

    @property
    def task_id(self) -> str:
        return self._sandbox.task_id

    @property
    def workdir(self) -> str:
        return self._sandbox.workdir

    @property
    def scratch_dir(self) -> str:
        return self._verify.scratch_dir

    async def exec(self, command: str, *, timeout: float | None = None, cwd: str | None = None) -> ExecResult:  # noqa: ASYNC109
        return await self._sandbox.exec(command, timeout=timeout, cwd=cwd)

    async def exec_fresh(self, command: str, *, timeout: float, cwd: str | None = None) -> ExecResult:  # noqa: ASYNC109
        return await self._verify.exec_fresh(command, timeout=timeout, cwd=cwd)

    async def read_bytes(self, path: str, limit: int | None = None, *, max_bytes: int | None = None) -> bytes:
        cap = self.max_bytes if max_bytes is None else min(max_bytes, self.max_bytes)
        try:
            return await self._verify.read_bytes(path, limit, max_bytes=cap)
        except FileTooLargeError as exc:
            raise over_limit(exc, self.max_bytes) from None

    async def read_scratch_bytes(self, path: str, *, max_bytes: int | None = None) -> bytes:
        cap = self.max_bytes if max_bytes is None else min(max_bytes, self.max_bytes)
        try:
            return await self._verify.read_scratch_bytes(path, max_bytes=cap)
        except FileTooLargeError as exc:
            raise over_limit(exc, self.max_bytes) from None

    async def write_bytes(self, path: str, data: bytes) -> None:
        await self._sandbox.write_bytes(path, data)

    async def write_scratch_bytes(self, path: str, data: bytes) -> None:
        await self._verify.write_scratch_bytes(path, data)

    async def stop_processes(self) -> None:
        await self._verify.stop_processes()

    async def close(self) -> None:
        await self._sandbox.close()


class VerifierContext:
    """The verifier's handle on one finished rollout's sandbox. Async; one per rollout.

    ``max_read_bytes``: the most any read returns (a file, a command's stdout or stderr, a
    ``download_dir`` in all); the env's ``EnvConfig.max_read_bytes``."""

    def __init__(
        self,
        sandbox: Sandbox,
        *,
        tools: Mapping[str, Tool] | None = None,
        limits: ToolLimits | None = None,
        default_timeout_s: float = 300.0,
        max_read_bytes: int = MAX_READ_BYTES,
    ) -> None:
        if not isinstance(sandbox, SupportsVerification):
            raise VerifierError(
                f"{type(sandbox).__name__} cannot run verifier commands (no exec_fresh/stop_processes); "
                "use a bwrap, local or docker sandbox"
            )
        if max_read_bytes < 1:
            raise ValueError(f"max_read_bytes must be a positive number of bytes, not {max_read_bytes}")
        self._max_read = max_read_bytes
        self.sandbox = BoundedSandbox(sandbox, sandbox, max_read_bytes)
        self._verify: SupportsVerification = sandbox
        self._tools = dict(tools or {})
        self._limits = limits or ToolLimits()
        self._timeout = default_timeout_s
        self._tool_ctx: ToolContext | None = None

    @property
    def workdir(self) -> str:
        return self.sandbox.workdir

    # ------------------------------------------------------------------ commands

    async def exec(
        self,
        command: str | Sequence[str],
        *,
        timeout: float | None = None,  # noqa: ASYNC109 (the command's own deadline, enforced in the sandbox)
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> VerifierExec:
        """Run ``command`` (shell text, or an argv list that is quoted for you) in the sandbox,
        in its start environment plus ``env``, from ``cwd`` (default: the workdir)."""
        text = command if isinstance(command, str) else shlex.join(list(command))
        if env:
            for name in env:
                if not name.isidentifier():
                    raise ValueError(f"not an environment variable name: {name!r}")
            text = "export " + " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items()) + "\n" + text
        box = f"{_SCRATCH}/{secrets.token_hex(8)}"
        abs_box = shlex.quote(f"{self._verify.scratch_dir}/{box}")
        script = f"mkdir -p -- {abs_box} && (\n{text}\n) >{abs_box}/out 2>{abs_box}/err"
        try:
            res = await self._verify.exec_fresh(script, timeout=timeout or self._timeout, cwd=cwd)
            stdout = await self._scratch_or_empty(f"{box}/out", "stdout", command)
            stderr = await self._scratch_or_empty(f"{box}/err", "stderr", command)
        finally:
            await self._verify.exec_fresh(f"rm -rf -- {abs_box}", timeout=60)
        return VerifierExec(res.exit_code, stdout, stderr, res.timed_out)

    async def _scratch_or_empty(self, path: str, stream: str, command: str | Sequence[str]) -> bytes:
        """A command's output, read back bounded: over ``max_read_bytes`` it is refused unread.
        (The error names the command as given, never the ``env`` exported before it.)"""
        try:
            return await self._verify.read_scratch_bytes(path, max_bytes=self._max_read)
        except FileNotFoundError:
            return b""
        except FileTooLargeError as exc:
            raise over_limit(
                FileTooLargeError(
                    f"the {stream} of the verifier command {_shown(command)!r} is too large ({exc}); "
                    "send it to a file in the sandbox and read what you need of it"
                ),
                self._max_read,
            ) from None

    async def stop_processes(self) -> None:
        """Kill whatever the rollout left running (done for you unless the env opted out)."""
        await self._verify.stop_processes()

    # ------------------------------------------------------------------ files

    def _inside(self, path: str) -> bool:
        p = PurePosixPath(path)
        if not p.is_absolute():
            return ".." not in p.parts
        return p.is_relative_to(self.workdir) and ".." not in p.parts

    async def read_file(self, path: str, *, limit: int | None = None, max_bytes: int | None = None) -> bytes:
        """The file's exact bytes. Inside the workdir through the race-free confined reader;
        elsewhere in the sandbox (``/logs/...``) through ``head -c`` run inside it.

        Bounded: a file over ``max_read_bytes`` (or over ``max_bytes``, when that is lower) raises
        :class:`FileTooLargeError` without being read. ``limit``: just the first ``limit`` bytes
        (a prefix, never an error for size)."""
        cap = self._max_read if max_bytes is None else min(max_bytes, self._max_read)
        try:
            return await self._read(path, limit, cap)
        except FileTooLargeError as exc:
            raise over_limit(exc, self._max_read) from None

    async def _read(self, path: str, limit: int | None, cap: int) -> bytes:
        prefix = limit is not None and limit <= cap
        if self._inside(path):
            return await self._verify.read_bytes(path, limit, max_bytes=None if prefix else cap)
        # Outside the workdir: read inside the sandbox, at most cap + 1 bytes (so a larger file is
        # told from one of exactly cap bytes), into the scratch dir, then back with the cap.
        tmp = f"{_SCRATCH}/{secrets.token_hex(8)}.read"
        abs_tmp = f"{self._verify.scratch_dir}/{tmp}"
        count = str(limit if prefix else cap + 1)
        try:
            res = await self.exec(
                ["sh", "-c", 'mkdir -p -- "$(dirname -- "$3")" && head -c "$1" -- "$2" > "$3"', "sh"]
                + [count, path, abs_tmp]
            )
            if not res.ok:
                raise FileNotFoundError(f"{path}: {res.stderr.decode(errors='replace').strip()}")
            try:
                return await self._verify.read_scratch_bytes(tmp, max_bytes=None if prefix else cap)
            except FileTooLargeError:
                raise FileTooLargeError(f"{path}: over the limit of {cap} bytes") from None
        finally:
            await self._verify.exec_fresh(f"rm -f -- {shlex.quote(abs_tmp)}", timeout=60)

    async def exists(self, path: str) -> bool:
        """Whether ``path`` is a regular file the verifier can read (nothing of it is loaded)."""
        if not self._inside(path):
            res = await self.exec(["sh", "-c", 'test -f "$1" && test -r "$1"', "sh", path])
            return res.ok
        try:
            await self._verify.read_bytes(path, 0)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError):
            return False
        except OSError:  # not a regular file (a FIFO, ...)
            return False
        return True

    async def write_file(self, path: str, data: bytes | str) -> None:
        blob = data.encode() if isinstance(data, str) else bytes(data)
        if self._inside(path):  # the confined writer makes missing directories
            await self.sandbox.write_bytes(path, blob)
            return
        tmp = f"{_SCRATCH}/{secrets.token_hex(8)}.blob"
        abs_tmp = shlex.quote(f"{self._verify.scratch_dir}/{tmp}")
        await self._verify.write_scratch_bytes(tmp, blob)
        try:
            res = await self.exec(
                f"mkdir -p -- {shlex.quote(str(PurePosixPath(path).parent))} && cp -- {abs_tmp} {shlex.quote(path)}"
            )
        finally:
            await self._verify.exec_fresh(f"rm -f -- {abs_tmp}", timeout=60)
        if not res.ok:
            raise PermissionError(f"cannot write {path}: {res.stderr.decode(errors='replace').strip()}")

    async def upload_file(self, local: str | os.PathLike[str], remote: str) -> None:
        """Copy a host file into the sandbox; a link as its last component is not followed."""
        data = await asyncio.to_thread(_host_file, Path(local))
        await self.write_file(remote, data)

    async def upload_dir(self, local: str | os.PathLike[str], remote: str) -> list[str]:
        """Copy a host directory tree into the sandbox; returns the sandbox paths written. The
        tree is walked from its parent's fd without following any link: ``local`` itself being a
        link, or a link (FIFO, device) in it, raises ``DataPathError`` (a task directory must not
        leak the host)."""
        files = await asyncio.to_thread(_host_files, Path(local))
        written = []
        for rel, data, executable in files:
            target = str(PurePosixPath(remote) / rel)
            await self.write_file(target, data)
            if executable:
                await self.exec(["chmod", "+x", "--", target])
            written.append(target)
        return written

    async def download_file(self, remote: str, local: str | os.PathLike[str]) -> Path:
        """Copy a sandbox file to the host (bounded like :meth:`read_file`: nothing is written
        when it is over the limit)."""
        out = Path(local)
        data = await self.read_file(remote)
        await asyncio.to_thread(_write_host_file, out, data)
        return out

    async def download_dir(self, remote: str, local: str | os.PathLike[str]) -> list[Path]:
        """Copy a sandbox directory's regular files to the host (names checked: no ``..``), at most
        ``max_read_bytes`` in all: past it, :class:`FileTooLargeError`."""
        res = await self.exec(["find", remote, "-type", "f", "-print0"])
        if not res.ok:
            raise FileNotFoundError(f"{remote}: {res.stderr.decode(errors='replace').strip()}")
        base = PurePosixPath(remote if PurePosixPath(remote).is_absolute() else f"{self.workdir}/{remote}")
        out = []
        left = self._max_read
        for raw in filter(None, res.stdout.split(b"\0")):
            name = PurePosixPath(os.fsdecode(raw))
            full = name if name.is_absolute() else PurePosixPath(self.workdir) / name
            rel = full.relative_to(base) if full.is_relative_to(base) else PurePosixPath(name.name)
            if ".." in rel.parts:
                continue
            try:
                data = await self._read(str(full), None, left)
            except FileTooLargeError as exc:
                why = exc
                if left < self._max_read:  # the total is over (the file alone may have fitted)
                    why = FileTooLargeError(f"download_dir {remote}: more than {self._max_read} bytes in all")
                raise over_limit(why, self._max_read) from None
            left -= len(data)
            target = Path(local) / rel.as_posix()
            await asyncio.to_thread(_write_host_file, target, data)
            out.append(target)
        return out

    async def search(self, pattern: str, path: str = ".", *, fixed: bool = False) -> list[SearchHit]:
        """Lines matching ``pattern`` (extended regex, or a fixed string) under ``path``."""
        argv = ["grep", "-rnI", "-F" if fixed else "-E", "-e", pattern, "--", path]
        res = await self.exec(argv)
        if res.exit_code not in (0, 1):
            raise RuntimeError(f"search failed: {res.stderr.decode(errors='replace').strip()}")
        hits = []
        for line in res.text.splitlines():
            name, _, rest = line.partition(":")
            num, _, text = rest.partition(":")
            if num.isdigit():
                hits.append(SearchHit(name, int(num), text))
        return hits

    # ------------------------------------------------------------------ tools

    async def call_tool(self, name: str, args: dict[str, Any]) -> ToolOutput:
        """Call one of the model's tools exactly as the model would (its own state, not the
        rollout's: a verifier does not resume the rollout's background processes)."""
        tool = self._tools.get(name)
        if tool is None:
            raise KeyError(f"no tool {name!r}; known: {', '.join(sorted(self._tools)) or 'none'}")
        if self._tool_ctx is None:
            self._tool_ctx = ToolContext(
                task_id=f"{self.sandbox.task_id}-verifier", sandbox=self.sandbox, limits=self._limits
            )
        return await tool(args, self._tool_ctx)


def _host_file(path: Path) -> bytes:
    """A host file's bytes, read from its directory's fd: a link as its name is refused."""
    here = path.absolute()
    return (HostPath.of(here.parent) / here.name).read_bytes()


def _host_files(root: Path) -> list[tuple[str, bytes, bool]]:
    """(relative path, bytes, executable) of a host tree's regular files, walked from its parent's
    fd; the tree's own name being a link, or a link or special file anywhere in it, raises
    ``DataPathError``."""
    tree = HostPath.of(root.absolute().parent) / root.name
    if tree.kind() == "link":
        raise DataPathError(tree.first_problem())
    if not tree.is_dir():
        raise NotADirectoryError(f"{root} is not a directory")
    return [(rel, data, bool(mode & 0o111)) for rel, data, mode in tree.files()]


def _write_host_file(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
