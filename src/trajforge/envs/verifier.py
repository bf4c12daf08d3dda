"""``VerifierContext``: what reward code sees of its rollout (the reference calls it ToolContext).

Bound to one rollout's sandbox, after the rollout ended and before that sandbox is reset or
closed. Everything goes through the sandbox's own confinement: commands run inside it (as its
user, without its network), file paths resolve inside its workdir race-free. Unlike the model's
tools nothing is capped: a verifier reads 50 MB of test output whole.

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

from trajforge.protocols import Sandbox, SupportsVerification
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


class VerifierContext:
    """The verifier's handle on one finished rollout's sandbox. Async; one per rollout."""

    def __init__(
        self,
        sandbox: Sandbox,
        *,
        tools: Mapping[str, Tool] | None = None,
        limits: ToolLimits | None = None,
        default_timeout_s: float = 300.0,
    ) -> None:
        if not isinstance(sandbox, SupportsVerification):
            raise VerifierError(
                f"{type(sandbox).__name__} cannot run verifier commands (no exec_fresh/stop_processes); "
                "use a bwrap, local or docker sandbox"
            )
        self.sandbox = sandbox
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
            stdout = await self._scratch_or_empty(f"{box}/out")
            stderr = await self._scratch_or_empty(f"{box}/err")
        finally:
            await self._verify.exec_fresh(f"rm -rf -- {abs_box}", timeout=60)
        return VerifierExec(res.exit_code, stdout, stderr, res.timed_out)

    async def _scratch_or_empty(self, path: str) -> bytes:
        try:
            return await self._verify.read_scratch_bytes(path)
        except FileNotFoundError:
            return b""

    async def stop_processes(self) -> None:
        """Kill whatever the rollout left running (done for you unless the env opted out)."""
        await self._verify.stop_processes()

    # ------------------------------------------------------------------ files

    def _inside(self, path: str) -> bool:
        p = PurePosixPath(path)
        if not p.is_absolute():
            return ".." not in p.parts
        return p.is_relative_to(self.workdir) and ".." not in p.parts

    async def read_file(self, path: str) -> bytes:
        """The file's exact bytes. Inside the workdir through the race-free confined reader;
        elsewhere in the sandbox (``/logs/...``) through ``cat`` run inside it."""
        if self._inside(path):
            return await self.sandbox.read_bytes(path)
        res = await self.exec(["cat", "--", path])
        if not res.ok:
            raise FileNotFoundError(f"{path}: {res.stderr.decode(errors='replace').strip()}")
        return res.stdout

    async def exists(self, path: str) -> bool:
        try:
            await self.read_file(path)
        except (FileNotFoundError, IsADirectoryError, PermissionError):
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
        await self.write_file(remote, await asyncio.to_thread(Path(local).read_bytes))

    async def upload_dir(self, local: str | os.PathLike[str], remote: str) -> list[str]:
        """Copy a host directory tree into the sandbox; returns the sandbox paths written.
        Symlinks in the host tree are not followed (a task directory must not leak the host)."""
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
        out = Path(local)
        data = await self.read_file(remote)
        await asyncio.to_thread(_write_host_file, out, data)
        return out

    async def download_dir(self, remote: str, local: str | os.PathLike[str]) -> list[Path]:
        """Copy a sandbox directory's regular files to the host (names checked: no ``..``)."""
        res = await self.exec(["find", remote, "-type", "f", "-print0"])
        if not res.ok:
            raise FileNotFoundError(f"{remote}: {res.stderr.decode(errors='replace').strip()}")
        base = PurePosixPath(remote if PurePosixPath(remote).is_absolute() else f"{self.workdir}/{remote}")
        out = []
        for raw in filter(None, res.stdout.split(b"\0")):
            name = PurePosixPath(os.fsdecode(raw))
            full = name if name.is_absolute() else PurePosixPath(self.workdir) / name
            rel = full.relative_to(base) if full.is_relative_to(base) else PurePosixPath(name.name)
            if ".." in rel.parts:
                continue
            out.append(await self.download_file(str(full), Path(local) / rel.as_posix()))
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


def _host_files(root: Path) -> list[tuple[str, bytes, bool]]:
    """(relative path, bytes, executable) of a host tree's regular files, links not followed."""
    if not root.is_dir():
        raise NotADirectoryError(f"{root} is not a directory")
    out = []
    for path in sorted(root.rglob("*")):
        if path.is_symlink() or not path.is_file():
            continue
        out.append((path.relative_to(root).as_posix(), path.read_bytes(), os.access(path, os.X_OK)))
    return out


def _write_host_file(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
