"""Value types and config for sandboxes (the ``Sandbox`` protocol is in :mod:`trajforge.protocols`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import PurePosixPath
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

SandboxKind = Literal["bwrap", "local", "docker"]
# Both name the one exec agent (exec_agent.c): the choice is kept so configs that name one load.
AgentKind = Literal["auto", "native"]
PYTHON_AGENT_REMOVED = (
    "agent: python was removed: the exec agent is exec_agent.c, compiled on this machine at the "
    "first sandbox, in every backend; set agent: auto (or leave it out) and install a C compiler "
    "where none is: apt-get install gcc libc6-dev"
)


def refuse_python_agent(value: object) -> object:
    """The validator of every field naming the exec agent: ``python`` gets the line saying why it
    is gone and what to do, rather than pydantic's list of the allowed values."""
    if value == "python":
        raise ValueError(PYTHON_AGENT_REMOVED)
    return value


# Top-level directories a read-only bind must not cover: the sandbox's own (workdir, scratch dir,
# the agent under /run, fresh /proc and /dev) and the system ones it already binds.
_RESERVED = frozenset({"workspace", "tmp", "run", "proc", "dev", "usr", "etc", "bin", "sbin", "lib", "lib64"})


class ExecResult(BaseModel):
    """Outcome of one command.

    ``output`` is stdout and stderr interleaved, exactly what the command printed, capped for the
    model: when it printed more than the cap, the head and the tail are kept around a
    ``[... K bytes of output omitted (T total) ...]`` line and ``truncated`` is set
    (``output_bytes``: what it printed in all). ``exit_code`` is ``None`` when the command was
    killed at its timeout.

    ``notes`` are the sandbox's own words about the command, one sentence each: the shell ended
    (``exit 3``) or was restarted after a timeout, the process limit was reached and everything
    killed, the cwd does not exist. They are never part of ``output``, so code that reads what a
    command printed (a verifier, a parser) gets only that, and a command printing the same words
    keeps them; :attr:`shown` is what the model reads: the output, then the notes.
    """

    exit_code: int | None
    output: str
    notes: tuple[str, ...] = ()
    timed_out: bool = False
    truncated: bool = False
    output_bytes: int = 0
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out

    @property
    def shown(self) -> str:
        """The output with the notes after it: a newline, then each note in brackets on a line of
        its own: ``"pwd\n\n[the shell ended (status 3); ...]\n"``. The text the terminal tool
        gives the model (the exec agent wrote its notes into the output this way until they got
        a field of their own)."""
        return shown(self.output, self.notes)


def shown(output: str, notes: Sequence[str]) -> str:
    """``output`` and then ``notes`` as the model reads them (see :attr:`ExecResult.shown`)."""
    if not notes:
        return output
    return output + "\n" + "".join(f"[{note}]\n" for note in notes)


class SandboxLimits(BaseModel):
    """Resource limits applied to every command in a sandbox."""

    max_processes: int = Field(256, description="tasks (processes+threads) the sandbox may hold")
    memory_mb: int = Field(2048, description="address-space / memory cap per command")
    file_size_mb: int = Field(1024, description="largest file a command may write")
    cpu_seconds: int = Field(600, description="CPU time per command")
    disk_mb: int | None = Field(
        1024,
        ge=1,
        description="total size of a sandbox's files (workdir + scratch dir); beyond it commands get "
        "ENOSPC. Enforced with a per-sandbox tmpfs when trajforge runs as root (bwrap); the files then "
        "also count toward memory_mb. None: no total cap (files go to plain host directories)",
    )
    disk_inodes: int = Field(131_072, ge=64, description="files and directories a sandbox may hold")


class SandboxConfig(BaseModel):
    """How to build a sandbox. One config serves many sandboxes (one per rollout)."""

    model_config = ConfigDict(allow_inf_nan=False)  # timeouts are finite numbers

    kind: SandboxKind = Field("bwrap", description="bwrap (default), local (no isolation), docker")
    network: bool = Field(False, description="allow network access (bwrap/docker); off by default")
    command_timeout_s: float = Field(60.0, description="default per-command timeout")
    output_cap_bytes: int = Field(
        16_384, description="bytes of command output shown to the model (head and tail kept)"
    )
    limits: SandboxLimits = Field(default_factory=SandboxLimits)
    agent: AgentKind = Field(
        "auto",
        description="the exec agent that runs commands inside each sandbox; auto and native both "
        "mean the one agent, exec_agent.c, compiled on this machine with cc at the first sandbox "
        "(~0.2 MiB per sandbox; in docker linked statically, so an image needs no python). Without a "
        "C compiler the first sandbox fails saying what to install (apt-get install gcc libc6-dev). "
        "The python agent was removed: python is refused",
    )
    root_dir: str | None = Field(
        None, description="parent directory for sandbox working dirs (default: a temp dir)"
    )
    docker_image: str = Field("python:3.11-slim", description="image for the docker backend")
    keep: bool = Field(False, description="keep the sandbox directory after close (debugging)")
    reuse: bool = Field(
        False,
        description="after a rollout, reset its sandbox (processes killed, files removed, session "
        "forgotten; verified) and give it to the next rollout instead of building a new one "
        "(bwrap only). The factory then keeps idle sandboxes: close it with `aclose()` or "
        "`async with`. The batch runner turns this on",
    )
    env: dict[str, str] = Field(
        default_factory=dict, description="extra environment variables for commands (no secrets)"
    )
    ro_binds: list[str] = Field(
        default_factory=list,
        description="host directories the commands see read-only, each at its own path (bwrap, "
        "docker; the local backend sees the host anyway): an interpreter or a virtualenv a task "
        "runs, e.g. the benchmark virtualenv (trajforge.benchpython)",
    )

    _no_python_agent = field_validator("agent", mode="before")(refuse_python_agent)

    @field_validator("ro_binds")
    @classmethod
    def _binds_are_plain_absolute_paths(cls, binds: list[str]) -> list[str]:
        for path in binds:
            parts = PurePosixPath(path).parts
            if not path.startswith("/") or ".." in parts or path != str(PurePosixPath(path)):
                raise ValueError(f"ro_binds: {path!r} must be a normalised absolute path")
            if len(parts) < 2 or parts[1] in _RESERVED:
                raise ValueError(
                    f"ro_binds: {path!r} would cover the sandbox's own {'/' + '/'.join(parts[1:2])}; "
                    "bind a directory elsewhere"
                )
        return binds
