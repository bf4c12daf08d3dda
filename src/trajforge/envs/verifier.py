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
They see the rollout's files as the rollout saw them -- ``HOME`` is the rollout's (so ``~``,
``$HOME``, the workdir and relative paths resolve as they did for the agent) -- and the
programs they start read none of the configuration the rollout could have written there: see
:func:`verifier_env` (no user site, git without global config, pip without config files, XDG
directories of the command's own, bash and sh never as login or interactive shells).
Arguments given as a list are quoted with :func:`shlex.join`, so a path or pattern from the
model's output is data, never shell code.

The seed's ``ToolContext`` verbs are here too, for reward code written in its style:
``await ctx.terminal("pytest -q", timeout=180)`` -> ``{"output": str, "exit_code": int}``,
``read_file``/``write_file``, ``upload``/``download`` (a file or a tree), ``web_search``/``web_extract``
(when the web tools are configured) and ``call_tool``. ``terminal`` runs in a fresh shell by default;
``shell="session"`` (the env's ``reward_shell``) runs it in the rollout's own resident shell
instead: its cwd, exported variables and live processes (a server the agent started), at the price
of everything the fresh shell protects against (docs/security.md, "Reward commands in the
rollout's session"). ``exec`` and the trusted runners built on it are always fresh.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from trajforge.envs.config import MAX_READ_BYTES
from trajforge.protocols import Sandbox, SupportsVerification
from trajforge.sandbox.confined import DataPathError, FileTooLargeError, HostPath
from trajforge.sandbox.types import ExecResult
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
    """What every verifier command's environment is set to, over the sandbox's start environment
    (which the operator chose and the rollout cannot change: ``HOME`` stays what the rollout had,
    so ``~`` names the same directory for the verifier as for the agent, and ``PATH`` is the one
    the sandbox started with -- the system's, plus the directories the operator or the env's
    ``sandbox_config`` put on it -- never one the rollout exported).

    Nothing the rollout wrote under that ``HOME`` (or anywhere) configures a verifier's programs:
    ``TMPDIR`` and the XDG config/cache/data directories are fresh ones outside the workdir, no
    Python user site (``~/.local``'s ``usercustomize.py`` and ``.pth`` files
    are never read), bytecode cached only in a fresh directory (a planted ``__pycache__/*.pyc``
    beside a hidden module is never read), git without system or global config (``~/.gitconfig``)
    and with every program-running setting off, pip without any config file (``~/.pip``,
    ``~/.config/pip``). Startup files (``~/.bashrc``, ``~/.profile``, ``$BASH_ENV``) are read by
    no shell a verifier starts: see :data:`SHELL_GUARD`."""
    env = {
        "TMPDIR": f"{box}/tmp",
        "XDG_CONFIG_HOME": f"{box}/config",
        "XDG_CACHE_HOME": f"{box}/cache",
        "XDG_DATA_HOME": f"{box}/data",
        "PYTHONNOUSERSITE": "1",
        "PYTHONPYCACHEPREFIX": f"{box}/pycache",
        "PIP_CONFIG_FILE": "/dev/null",
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


BOX_DIRS = ("tmp", "pycache", "config", "cache", "data")
"""The directories of a verifier command's own, under its box in the scratch dir (removed after)."""

# bash and sh as a verifier starts them, from its shell text (exported functions reach every bash
# beneath it): never a login or interactive shell, so the rollout's ~/.profile, ~/.bash_profile,
# ~/.bash_login, ~/.bash_logout, ~/.bashrc and $ENV are not read; bash also gets --noprofile
# --norc. (An argv list naming bash or sh is rewritten the same way by ``_guard_argv``.)
SHELL_GUARD = r"""
__tf_noninteractive() {
  __tf_args=(); __tf_opts=1
  for __tf_a in "$@"; do
    if [ "$__tf_opts" = 1 ]; then
      case "$__tf_a" in
        --) __tf_opts=0 ;;
        --login) continue ;;
        --*) ;;
        -?*) __tf_a="-${__tf_a:1}"; __tf_a="${__tf_a//l/}"; __tf_a="${__tf_a//i/}"
             [ "$__tf_a" = - ] && continue
             case "$__tf_a" in *c*) __tf_opts=0 ;; esac ;;
        *) __tf_opts=0 ;;
      esac
    fi
    __tf_args+=("$__tf_a")
  done
}
bash() { __tf_noninteractive "$@"; command bash --noprofile --norc "${__tf_args[@]}"; }
sh() { __tf_noninteractive "$@"; command sh "${__tf_args[@]}"; }
export -f __tf_noninteractive bash sh
"""

_SHELLS = {"bash": True, "sh": False, "dash": False}


def _guard_argv(argv: Sequence[str]) -> list[str]:
    """An argv list that runs bash or sh as :data:`SHELL_GUARD` runs them (no login or
    interactive shell; bash with --noprofile --norc); any other argv unchanged."""
    args = list(argv)
    if not args:
        return args
    name = PurePosixPath(args[0]).name
    if name not in _SHELLS:
        return args
    out = [args[0], *(["--noprofile", "--norc"] if _SHELLS[name] else [])]
    options = True
    for arg in args[1:]:
        if options:
            if arg == "--":
                options = False
            elif arg == "--login":
                continue
            elif arg.startswith("-") and not arg.startswith("--") and len(arg) > 1:
                arg = "-" + arg[1:].replace("l", "").replace("i", "")
                if arg == "-":
                    continue
                if "c" in arg:
                    options = False
            elif not arg.startswith("-"):
                options = False
        out.append(arg)
    return out


class VerifierPlacementError(RuntimeError):
    """The verifier cannot put its own files where the env asks, for a reason no rollout caused
    (the sandbox backend's read-only system). Not an ``OSError``: an env's reward code that
    catches those (the seed's ``ToolContext`` turns them into error dicts) does not swallow it,
    so the episode's reward fails with this reason instead of scoring 0 for work nobody judged."""


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
        stop_leftovers: bool = False,
        max_read_bytes: int = MAX_READ_BYTES,
        shell: Literal["fresh", "session"] = "fresh",
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
        self.setup_errors: list[str] = []
        """What the verifier could not set up for a reason no rollout caused
        (:class:`VerifierPlacementError`): a judgement made without it is no judgement, whatever
        the reward code did with the exception."""
        self._verify: SupportsVerification = sandbox
        self._tools = dict(tools or {})
        self._limits = limits or ToolLimits()
        self._timeout = default_timeout_s
        self.stop_leftovers = stop_leftovers
        if shell not in ("fresh", "session"):
            raise ValueError(f"shell must be 'fresh' or 'session', not {shell!r}")
        self.shell: Literal["fresh", "session"] = shell
        self._tool_ctx: ToolContext | None = None
        self._home: str | None = None

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

        Each command runs with the rollout's ``HOME`` and its own ``TMPDIR``, XDG directories and
        Python bytecode cache outside the workdir, removed afterwards; with ``stop_leftovers`` (the judge sets it when the
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
        dirs = " ".join(q(f"{abs_box}/{d}") for d in BOX_DIRS)
        redirect = f">{q(abs_box + '/out')} 2>{q(abs_box + '/err')}"
        if isinstance(command, str):
            run = f"(\n{command}\n) {redirect}"
        else:
            run = f"exec {shlex.join(_guard_argv(command))} {redirect}"
        script = f"mkdir -p -- {dirs} && {unsets} && {exports} && {SHELL_GUARD}\n{run}"
        try:
            res = await self._verify.exec_fresh(script, timeout=timeout or self._timeout, cwd=cwd)
            if self.stop_leftovers:
                await self._verify.stop_processes()
            stdout = await self._scratch_or_empty(f"{box}/out", "stdout", command)
            stderr = await self._scratch_or_empty(f"{box}/err", "stderr", command)
        finally:
            await self._verify.exec_fresh(f"rm -rf -- {q(abs_box)}", timeout=60)
        return VerifierExec(res.exit_code, stdout, stderr, res.timed_out)

    async def terminal(
        self,
        command: str,
        timeout: float = 180,  # noqa: ASYNC109 (the command's own deadline, enforced in the sandbox)
        *,
        session: bool | None = None,
    ) -> dict[str, Any]:
        """The seed's ``ToolContext.terminal``: run shell text, get ``{"output", "exit_code"}``
        (stdout and stderr as one stream, in the order written, exactly what the command printed;
        ``exit_code`` -1 when it was killed at ``timeout``), and ``timed_out`` and ``notes`` (the
        sandbox's own words about the command, e.g. that ``exit 3`` ended the session's shell:
        never part of ``output``).

        ``session`` (default: this context's ``shell == "session"``) runs it in the rollout's own
        resident shell: from the cwd the agent left, with the variables it exported, beside the
        processes it left running, with the sandbox's output cap. Otherwise it is :meth:`exec`: a
        fresh shell in the hardened environment, output exact and bounded by ``max_read_bytes``."""
        if not isinstance(command, str):
            raise TypeError("terminal takes shell text; use exec(argv) for an argument list")
        if self.shell == "session" if session is None else session:
            res = await self.sandbox.exec(command, timeout=timeout)
            code = -1 if res.timed_out or res.exit_code is None else res.exit_code
            # what the command printed, exactly: the sandbox's notes (``exit N`` ended the
            # session's shell, as it ends ``bash -c``) travel apart from it, in ``notes``
            notes = list(res.notes)
            return {"output": res.output, "exit_code": code, "timed_out": res.timed_out, "notes": notes}
        ran = await self.exec(f"exec 2>&1\n{command}", timeout=timeout)  # one stream, in order
        out = (ran.stdout + ran.stderr).decode(errors="replace")
        code = -1 if ran.timed_out or ran.exit_code is None else ran.exit_code
        return {"output": out, "exit_code": code, "timed_out": ran.timed_out, "notes": []}

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

    async def home(self) -> str:
        """The rollout's ``HOME`` (the sandbox's start environment's, which verifier commands keep)."""
        if self._home is None:
            res = await self._verify.exec_fresh('printf %s "$HOME"', timeout=60)
            self._home = res.output if res.ok and res.output.startswith("/") else self.workdir
        return self._home

    async def _path(self, path: str) -> str:
        """``path`` with a leading ``~`` resolved as the rollout's shell resolved it."""
        if path == "~" or path.startswith("~/"):
            return await self.home() + path[1:]
        return path

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
        path = await self._path(path)
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
        path = await self._path(path)
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
        path = await self._path(path)
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
            err = res.stderr.decode(errors="replace").strip()
            if await self._beyond_the_rollout(path, err):
                raise self._placement_error(
                    f"cannot write {path} ({err}): this sandbox's system is not writable outside the "
                    f"workdir ({self.workdir}), /tmp and the home directory, so a verifier cannot place "
                    "files at absolute paths such as /tests or /logs there; run this env with --sandbox "
                    "docker (a container of the task's image, writable everywhere)"
                )
            raise PermissionError(f"cannot write {path}: {err}")

    def _placement_error(self, message: str) -> VerifierPlacementError:
        """Remembered on the context as well: reward code that catches every exception (the seed's
        benchmark envs do) still cannot turn it into a score (:attr:`setup_errors`)."""
        self.setup_errors.append(message)
        return VerifierPlacementError(message)

    async def _beyond_the_rollout(self, path: str, err: str) -> bool:
        """Whether a write to ``path`` failed for a reason no rollout could have caused: ``path``
        is outside where a rollout writes (the workdir, temporary directories, its home), and the
        system there is read-only or its nearest existing directory belongs to someone else
        (bwrap's read-only binds, its root-owned root).
        A refusal where the rollout writes, or under a directory it owns (it could have made it
        read-only, or a link into a read-only tree), is the rollout's failure to score: counting it
        a setup error would let a rollout dodge its verdict."""
        p = PurePosixPath(path)
        if any(
            p.is_relative_to(r) for r in (self.workdir, "/tmp", "/var/tmp", "/dev/shm", await self.home())
        ):
            return False
        if "Read-only file system" in err:  # no rollout remounts a file system
            return True
        probe = 'd=$1; while [ ! -e "$d" ]; do d=$(dirname -- "$d"); done; [ "$(stat -c %u -- "$d")" != "$(id -u)" ]'
        res = await self.exec(["sh", "-c", probe, "sh", str(p.parent)])
        return res.ok

    async def upload_file(self, local: str | os.PathLike[str], remote: str) -> None:
        """Copy a host file into the sandbox; a link as its last component is not followed."""
        data = await asyncio.to_thread(_host_file, Path(local))
        await self.write_file(remote, data)

    async def upload_dir(self, local: str | os.PathLike[str], remote: str) -> list[str]:
        """Copy a host directory tree into the sandbox; returns the sandbox paths written. The
        tree is walked from its parent's fd without following any link: ``local`` itself being a
        link, or a link (FIFO, device) in it, raises ``DataPathError`` (a task directory must not
        leak the host)."""
        remote = await self._path(remote)
        files = await asyncio.to_thread(_host_files, Path(local))
        written = []
        for rel, data, executable in files:
            target = str(PurePosixPath(remote) / rel)
            await self.write_file(target, data)
            if executable:
                await self.exec(["chmod", "+x", "--", target])
            written.append(target)
        return written

    async def upload(self, local: str | os.PathLike[str], remote: str) -> list[str]:
        """The seed's upload: a host file or directory tree into the sandbox (``upload_file`` or
        ``upload_dir``); the sandbox paths written."""
        if await asyncio.to_thread(Path(local).is_dir):
            return await self.upload_dir(local, remote)
        await self.upload_file(local, remote)
        return [remote]

    async def download(self, remote: str, local: str | os.PathLike[str]) -> list[Path]:
        """The seed's download: a sandbox file or directory to the host (``download_file`` or
        ``download_dir``, bounded the same way); the host paths written."""
        remote = await self._path(remote)
        res = await self.exec(["test", "-d", remote])
        if res.ok:
            return await self.download_dir(remote, local)
        return [await self.download_file(remote, local)]

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
        remote = await self._path(remote)
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
        path = await self._path(path)
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

    async def web_search(self, query: str) -> ToolOutput:
        """The model's ``web_search`` tool (only when the run configured a search backend)."""
        return await self._configured("web_search", {"query": query})

    async def web_extract(self, urls: list[str]) -> ToolOutput:
        """The model's ``web_extract`` tool (only when the run configured it)."""
        return await self._configured("web_extract", {"urls": list(urls)})

    async def _configured(self, name: str, args: dict[str, Any]) -> ToolOutput:
        if name not in self._tools:
            raise KeyError(
                f"{name} is not configured for this run: give the run a tools config with a web "
                "backend (tools: web: ...; `trajforge tools check` shows what is set up)"
            )
        return await self.call_tool(name, args)

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
