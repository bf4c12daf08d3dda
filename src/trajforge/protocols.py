"""The boundaries of trajforge, one Protocol each.

Concrete classes implement these structurally (no inheritance required), so tests and users can
drop in their own model, sandbox or tool without touching the rest.

- :class:`ChatModel`       -- a model that answers a conversation (HTTP endpoint, token-exact,
  local); optionally :class:`SupportsPreflight` (it can prove its endpoint answers before a run).
- :class:`Sandbox`         -- where a rollout's commands run and its files live, made by a
  :class:`SandboxFactory` (one sandbox per rollout).
- ``Tool`` (in :mod:`trajforge.tools.base`, next to its context and output types) -- something the
  model may call, confined to the rollout's sandbox.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from trajforge.llm.types import AssistantTurn, SamplingParams
from trajforge.sandbox.types import ExecResult


@runtime_checkable
class ChatModel(Protocol):
    """Answers a conversation with one assistant turn.

    Implementations raise :class:`trajforge.llm.types.ModelError` after their own retries.
    """

    @property
    def name(self) -> str: ...

    async def complete(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        sampling: SamplingParams | None = None,
    ) -> AssistantTurn: ...

    async def aclose(self) -> None: ...


@runtime_checkable
class Sandbox(Protocol):
    """An isolated place for one rollout: a working directory plus a shell session.

    ``workdir`` is the path of the working directory as commands inside the sandbox see it.
    Paths given to ``read_bytes``/``write_bytes`` are relative to ``workdir`` or absolute paths
    inside it; anything else raises ``PermissionError``. They are binary-safe and never truncate
    unless asked (``limit``: model-facing readers bound what they load; reward code reads results
    whole). No symlink, rename or swap made by the sandbox's commands can make them touch a file
    outside the working directory (see :mod:`trajforge.sandbox.confined`).
    """

    @property
    def task_id(self) -> str: ...

    @property
    def workdir(self) -> str:
        """The working directory as commands inside the sandbox see it."""
        ...

    async def exec(self, command: str, *, timeout: float | None = None, cwd: str | None = None) -> ExecResult:
        """Run ``command`` in the persistent session (as in a terminal: the cwd, variables, functions,
        aliases and options carry over)."""
        ...

    async def read_bytes(self, path: str, limit: int | None = None) -> bytes: ...

    async def write_bytes(self, path: str, data: bytes) -> None: ...

    async def close(self) -> None: ...


@runtime_checkable
class SandboxFactory(Protocol):
    """Builds one sandbox per rollout.

    A factory may keep closed sandboxes for reuse (after a verified reset); such a factory also
    has ``async def aclose()``, which :func:`trajforge.sandbox.close_factory` calls when present.
    """

    async def create(self, task_id: str, *, image: str | None = None, cwd: str | None = None) -> Sandbox: ...


@runtime_checkable
class SupportsPreflight(Protocol):
    """A model that can prove, cheaply and before any sample, that its endpoint answers and
    accepts its key (``OpenAIChatModel.check`` lists ``/models``). Optional: a model without it
    (an in-process test model) has nothing to check. Whatever it returns is not used."""

    async def check(self) -> object: ...


@runtime_checkable
class SupportsVerification(Protocol):
    """A sandbox a verifier can judge safely (every built-in backend): commands that do not
    inherit the rollout's shell session, a way to stop what the rollout left running, and a
    scratch directory (outside the workdir) for the verifier's own files."""

    @property
    def scratch_dir(self) -> str:
        """A writable directory inside the sandbox, outside the workdir."""
        ...

    async def exec_fresh(self, command: str, *, timeout: float, cwd: str | None = None) -> ExecResult: ...

    async def read_bytes(self, path: str, limit: int | None = None, *, max_bytes: int | None = None) -> bytes:
        """As ``Sandbox.read_bytes``; ``max_bytes``: a larger file raises ``FileTooLargeError``
        (an ``OSError``) before anything of it is read, so reward code bounds what it loads."""
        ...

    async def read_scratch_bytes(self, path: str, *, max_bytes: int | None = None) -> bytes: ...

    async def write_scratch_bytes(self, path: str, data: bytes) -> None: ...

    async def stop_processes(self) -> None: ...
