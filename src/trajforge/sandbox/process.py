"""A running sandbox: its live parts (:class:`Resident`: directories, exec agent, cgroup) and one
rollout's handle on them (:class:`ProcessSandbox`: exec, confined file access, close)."""

from __future__ import annotations

import contextlib
import functools
import math
import os
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from trajforge.cleanup import finish
from trajforge.sandbox.cgroup import SandboxCgroup
from trajforge.sandbox.confined import ConfinedDir
from trajforge.sandbox.disk import remove_tree
from trajforge.sandbox.exec_client import ExecAgent
from trajforge.sandbox.layout import Layout, SandboxIO
from trajforge.sandbox.templates import SandboxTemplate
from trajforge.sandbox.types import ExecResult, SandboxConfig


@dataclass
class Resident:
    """The live parts of one sandbox: its directories, exec agent and cgroup.

    A sandbox that is reused keeps its ``Resident`` across rollouts; each rollout gets its own
    :class:`ProcessSandbox` handle onto it, so a handle kept past ``close`` cannot reach the next
    rollout's sandbox.
    """

    workdir: str
    scratch_dir: str
    layout: Layout
    agent: ExecAgent
    cgroup: SandboxCgroup
    teardown: Callable[[], Awaitable[None]] | None = None
    owner: tuple[int, int] | None = None
    baseline_pids: tuple[int, ...] = ()  # the cgroup's processes when idle (bwrap + the agent)
    dir_stats: tuple[tuple[int, int], ...] = ()  # (mode, uid) of workdir and scratch dir at start
    uses: int = 1
    template: SandboxTemplate | None = None  # forked from it: never reused

    async def destroy(self, io: SandboxIO, keep: bool) -> None:
        """Kill everything, remove the cgroup and (unless ``keep``) the directories."""
        try:
            await self.agent.close()
            await io.run(self.cgroup.remove)
            if self.teardown is not None:
                await self.teardown()
        finally:
            if not keep:
                await io.run(remove_tree, self.layout.root)

    def destroy_now(self) -> None:
        """Blocking last-resort cleanup (a factory collected or the process exiting without
        ``aclose``): kill, remove, delete. The cgroup names exactly the sandbox's processes; a
        bare pid is signalled only while asyncio has not seen it exit (it could be reused after)."""
        pid = self.agent.pid
        if not self.cgroup.dirs and pid is not None and self.agent.alive():
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(OSError):
            self.cgroup.remove()
        remove_tree(self.layout.root)

    def host_state(self) -> tuple[list[str], list[int], tuple[tuple[int, int], ...]]:
        """What the host itself can check after a reset: directory contents, processes, modes."""
        left = [name for path in self.layout.writable for name in os.listdir(path)]
        return left, self.cgroup.pids(), self.layout.dir_stats()


@dataclass
class ProcessSandbox:
    """One rollout's handle on a sandbox whose commands run through a resident exec agent."""

    task_id: str
    config: SandboxConfig
    resident: Resident
    io: SandboxIO = field(default_factory=SandboxIO)
    release: Callable[[Resident], Awaitable[None]] | None = None  # default: destroy
    _closed: bool = field(default=False, init=False)
    _refused_seen: int | None = field(default=None, init=False)
    """Forks the cgroup had refused at its pids limit when this handle last looked."""

    @property
    def workdir(self) -> str:
        return self.resident.workdir

    @property
    def scratch_dir(self) -> str:
        return self.resident.scratch_dir

    @property
    def layout(self) -> Layout:
        return self.resident.layout

    @property
    def agent(self) -> ExecAgent:
        return self.resident.agent

    @property
    def cgroup(self) -> SandboxCgroup:
        return self.resident.cgroup

    @property
    def owner(self) -> tuple[int, int] | None:
        return self.resident.owner

    @property
    def host_workdir(self) -> Path:
        """Where the workdir lives on the host (for debugging and ``keep``)."""
        return self.layout.work

    @property
    def files(self) -> ConfinedDir:
        """Race-free host access to the workdir, with the sandbox's own file permissions."""
        return ConfinedDir(inside=self.workdir, host=str(self.layout.work), owner=self.owner)

    @property
    def scratch_files(self) -> ConfinedDir:
        """The same race-free access to the scratch dir (``scratch_dir`` inside the sandbox)."""
        return ConfinedDir(inside=self.scratch_dir, host=str(self.layout.tmp), owner=self.owner)

    async def read_scratch_bytes(self, path: str, *, max_bytes: int | None = None) -> bytes:
        """A file of the scratch dir (relative to it), read race-free: where a verifier keeps its
        command output, out of the workdir that the rollout's own files and tests look at.
        ``max_bytes``: a larger file raises ``FileTooLargeError`` before it is read."""
        self._check_open()
        return await self.io.run(functools.partial(self.scratch_files.read, path, None, max_bytes=max_bytes))

    async def write_scratch_bytes(self, path: str, data: bytes) -> None:
        self._check_open()
        await self.io.run(self.scratch_files.write, path, bytes(data))

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"sandbox {self.task_id} is closed")

    async def exec(
        self,
        command: str,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 (the Sandbox protocol's own parameter)
        cwd: str | None = None,
    ) -> ExecResult:
        self._check_open()
        if timeout is not None and not (math.isfinite(timeout) and timeout > 0):
            raise ValueError(
                f"a command timeout must be a positive finite number of seconds, not {timeout!r}"
            )
        before = await self._recover_from_refused_forks()
        result = await self.agent.exec(
            command,
            timeout=timeout if timeout is not None else self.config.command_timeout_s,
            cwd=cwd,
            cap=self.config.output_cap_bytes,
        )
        after = await self._recover_from_refused_forks()
        if not (before or after):
            return result
        return result.model_copy(update={"notes": (*before, *result.notes, *after)})

    def _refused_forks(self) -> int | None:
        """How many forks the sandbox's pids cgroup has refused (``pids.events``: ``max N``);
        None without a pids cgroup. A small kernfs read, done inline."""
        text = self.cgroup.read("pids", "pids.events") if self.cgroup.limits_pids else None
        if not text:
            return None
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "max" and value.strip().isdigit():
                return int(value)
        return None

    async def _recover_from_refused_forks(self) -> tuple[str, ...]:
        """Kill every process the commands left when the kernel refused a fork since the last look.

        Why here and not only in the exec agent: the agent kills at 80% of the process limit, but
        a fork bomb whose shells sit in bash's fork-retry back-off can hold ~70% of the slots
        indefinitely, below any count threshold, and starve the rollout's later commands. A
        refused fork is the kernel saying the limit was hit, so it is the signal that cannot be
        dodged by timing. Returns the note the model sees (none when nothing was done), for the
        command's ``notes``."""
        refused = self._refused_forks()
        if refused is None:
            return ()
        seen, self._refused_seen = self._refused_seen, refused
        if seen is None or refused <= seen:
            return ()
        await self.agent.stop_processes()
        return (
            f"the sandbox reached its process limit ({self.config.limits.max_processes}): the kernel "
            "refused new processes, so every process in it, background jobs included, was killed",
        )

    async def exec_fresh(self, command: str, *, timeout: float, cwd: str | None = None) -> ExecResult:  # noqa: ASYNC109
        """Run ``command`` outside the rollout's shell session: the sandbox's start environment,
        ``cwd`` relative to the workdir (default: the workdir), and nothing it changes kept.
        For code that judges the rollout (a verifier), which must not inherit what the rollout
        exported (``PATH``, ``PYTHONPATH``, ...)."""
        self._check_open()
        if not (math.isfinite(timeout) and timeout > 0):
            raise ValueError(
                f"a command timeout must be a positive finite number of seconds, not {timeout!r}"
            )
        return await self.agent.exec(
            command, timeout=timeout, cwd=cwd, cap=self.config.output_cap_bytes, fresh=True
        )

    async def stop_processes(self) -> None:
        """Kill everything the rollout's commands left running (background jobs, daemons); its
        files stay. Done before a verifier looks, so nothing can rewrite what it checks."""
        self._check_open()
        await self.agent.stop_processes()

    async def read_bytes(self, path: str, limit: int | None = None, *, max_bytes: int | None = None) -> bytes:
        """``limit``: a prefix of at most that many bytes; ``max_bytes``: a file that would give
        more raises ``FileTooLargeError``, decided before anything is read (reward code)."""
        self._check_open()
        return await self.io.run(functools.partial(self.files.read, path, limit, max_bytes=max_bytes))

    async def write_bytes(self, path: str, data: bytes) -> None:
        self._check_open()
        await self.io.run(self.files.write, path, bytes(data))

    async def close(self) -> None:
        """Kill everything still running in the sandbox; then its factory either resets it for
        the next rollout or removes it (and its directory, unless ``keep``)."""
        if self._closed:
            return
        self._closed = True
        if self.release is not None:  # the factory's: it finishes what it starts (a reset, a removal)
            await self.release(self.resident)
        else:  # a removal cut short by a cancellation would leave it all behind (trajforge.cleanup)
            await finish(self.resident.destroy(self.io, self.config.keep))

    async def __aenter__(self) -> ProcessSandbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
