"""``VerifierContext``: what reward code sees of its rollout (the reference calls it ToolContext).

Bound to one rollout's sandbox, after the rollout ended and before that sandbox is reset or
closed. Everything goes through the sandbox's own confinement: commands run inside it (as its
user, without its network), file paths resolve inside its workdir race-free. Unlike the model's
tools nothing is capped: a verifier reads 50 MB of test output whole.

Commands never inherit the rollout's shell session (``exec_fresh``): a rollout that exported
``PATH=/tmp/evil:$PATH`` or ``PYTHONPATH`` does not choose the interpreter its tests run with;
nor its home directory (the workdir): each command gets a fresh ``HOME`` and the hardened
environment of :func:`verifier_env`.
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
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# Git settings that would run a program, neutralised for every verifier command: repository
# config (.git/config) is the model's, and it outranks nothing set this way (GIT_CONFIG_COUNT is
# git's command-line scope). Not coverable by name: filter/diff/merge drivers the repository's
# own .gitattributes and .git/config define (docs/envs.md, "What a verifier trusts").
GIT_OVERRIDES = {
    "core.fsmonitor": "false",
    "core.hooksPath": "/dev/null",
    "core.pager": "cat",
    "core.editor": "true",
    "sequence.editor": "true",
    "core.sshCommand": "false",
    "core.askPass": "",
    "core.gitProxy": "",
    "credential.helper": "",
    "gpg.program": "false",
    "core.untrackedCache": "false",
}
UNSET_VARS = (
    "BASH_ENV",
    "ENV",
    "CDPATH",
    "GLOBIGNORE",
    "PYTHONPATH",
    "PYTHONHOME",
    "PYTHONSTARTUP",
    "PYTHONUSERBASE",
    "PYTHONINSPECT",
    "PYTHONBREAKPOINT",
    "PYTHONWARNINGS",
    "PERL5LIB",
    "PERL5OPT",
    "RUBYOPT",
    "RUBYLIB",
    "NODE_OPTIONS",
    "NODE_PATH",
    "LD_PRELOAD",
    "LD_LIBRARY_PATH",
    "GIT_DIR",
    "GIT_WORK_TREE",
    "GIT_EXTERNAL_DIFF",
    "GIT_SSH",
    "GIT_SSH_COMMAND",
    "GIT_ASKPASS",
    "GIT_EXEC_PATH",
    "GIT_TEMPLATE_DIR",
)


def verifier_env(box: str) -> dict[str, str]:
    """What every verifier command's environment is set to (over the sandbox's start
    environment, which the operator chose and the rollout cannot change): ``HOME`` and
    ``TMPDIR`` fresh directories of its own outside the workdir (so no dotfile of the model's is
    read: ``.gitconfig``, ``.bashrc``/``.profile``, ``~/.local`` user site-packages, ...), the
    system ``PATH``, no Python user site, bytecode cached only in a fresh directory (a planted
    ``__pycache__/*.pyc`` beside a hidden module is never read), git without system or global
    config and with every program-running setting off."""
    env = {
        "HOME": f"{box}/home",
        "TMPDIR": f"{box}/tmp",
        "PATH": SYSTEM_PATH,
        "PYTHONNOUSERSITE": "1",
        "PYTHONPYCACHEPREFIX": f"{box}/pycache",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_PAGER": "cat",
        "PAGER": "cat",
        "GIT_CONFIG_COUNT": str(len(GIT_OVERRIDES)),
    }
    for i, (key, value) in enumerate(GIT_OVERRIDES.items()):
        env[f"GIT_CONFIG_KEY_{i}"] = key
        env[f"GIT_CONFIG_VALUE_{i}"] = value
    return env


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
        stop_leftovers: bool = False,
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
        self.stop_leftovers = stop_leftovers
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
        """Run ``command`` (shell text, or an argv list that is quoted for you and ``exec``-ed, so
        it is the only process between the sandbox's agent and what it starts) in the sandbox,
        from ``cwd`` (default: the workdir), in :func:`verifier_env` plus ``env``.

        Each command gets its own fresh ``HOME``, ``TMPDIR`` and Python bytecode cache outside
        the workdir, removed afterwards; with ``stop_leftovers`` (the judge sets it when the
        rollout's processes were stopped) whatever the command left running is killed after it,
        so nothing it started can tamper with the next command."""
        box = f"{_SCRATCH}/{secrets.token_hex(8)}"
        abs_box = f"{self._verify.scratch_dir}/{box}"
        q = shlex.quote
        variables = {**verifier_env(abs_box), **(env or {})}
        for name in variables:
            if not name.isidentifier():
                raise ValueError(f"not an environment variable name: {name!r}")
        exports = "export " + " ".join(f"{k}={q(v)}" for k, v in variables.items())
        unsets = "unset " + " ".join(UNSET_VARS)
        dirs = " ".join(q(f"{abs_box}/{d}") for d in ("home", "tmp", "pycache"))
        redirect = f">{q(abs_box + '/out')} 2>{q(abs_box + '/err')}"
        if isinstance(command, str):
            run = f"(\n{command}\n) {redirect}"
        else:
            run = f"exec {shlex.join(list(command))} {redirect}"
        script = f"mkdir -p -- {dirs} && {unsets} && {exports} && {run}"
        try:
            res = await self._verify.exec_fresh(script, timeout=timeout or self._timeout, cwd=cwd)
            if self.stop_leftovers:
                await self._verify.stop_processes()
            stdout = await self._scratch_or_empty(f"{box}/out")
            stderr = await self._scratch_or_empty(f"{box}/err")
        finally:
            await self._verify.exec_fresh(f"rm -rf -- {q(abs_box)}", timeout=60)
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
