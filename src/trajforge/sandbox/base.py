"""What every backend shares: directories, the exec agent session, file access, limits and close.

A backend only decides *how the agent is launched* (plain process, inside bubblewrap, inside a
container) and where the working directory appears inside; see :class:`Launch`. Everything else
-- session semantics, output caps, timeouts, confined binary-safe file access, cleanup -- lives
here once, so the three backends cannot drift apart.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import shutil
import signal
import stat
import tempfile
import uuid
import weakref
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

from trajforge.sandbox.cgroup import SandboxCgroup
from trajforge.sandbox.confined import ConfinedDir
from trajforge.sandbox.disk import mount_disk, remove_tree
from trajforge.sandbox.errors import SandboxUnavailableError
from trajforge.sandbox.session import AgentSession
from trajforge.sandbox.sweep import sweep_stale, write_owner
from trajforge.sandbox.types import ExecResult, SandboxConfig

AGENT_SOURCE = "agent.py"


T = TypeVar("T")


@dataclass
class Layout:
    """Host directories of one sandbox: ``work`` (the workdir), ``tmp`` (scratch), the agent copy."""

    root: Path
    work: Path
    tmp: Path
    agent: Path
    log: Path
    owner: tuple[int, int] | None = None  # (uid, gid) the tree belongs to, when not ours
    disk_capped: bool = False  # work and tmp live on a tmpfs of the configured size

    def dir_stats(self) -> tuple[tuple[int, int], ...]:
        """(mode, uid) of the workdir and the scratch dir: what a reset must leave as it found."""
        return tuple((st.st_mode, st.st_uid) for st in map(os.lstat, (self.work, self.tmp)))


@dataclass
class Launch:
    """How a backend runs the agent: its argv and the inside paths of workdir and scratch dir."""

    argv: list[str]
    workdir: str
    scratch_dir: str
    env: dict[str, str] | None = None
    teardown: Callable[[], Awaitable[None]] | None = None
    owner: tuple[int, int] | None = None  # uid/gid that must own files the host writes
    pass_fds: tuple[int, ...] = ()  # fds the launcher refers to (kept open while it runs)


def command_env(config: SandboxConfig, workdir: str, scratch: str) -> dict[str, str]:
    """The environment commands start with: minimal and explicit, never the host's (no secrets)."""
    env = {
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": workdir,
        "TMPDIR": scratch,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "TERM": "dumb",
        "PAGER": "cat",
        "GIT_PAGER": "cat",
        "PYTHONUNBUFFERED": "1",
    }
    env.update(config.env)
    return env


def limit_env(config: SandboxConfig, cgroup: SandboxCgroup, *, nproc_effective: bool) -> dict[str, str]:
    """rlimits the agent applies (with ``ulimit``) before each command.

    The address-space cap is only a fallback for a missing memory cgroup: it breaks programs that
    reserve large virtual ranges (JVMs, Go), and the cgroup caps the real thing for all processes.
    """
    limits = config.limits
    env = {
        "TF_LIMIT_FSIZE_KB": str(limits.file_size_mb * 1024),
        "TF_LIMIT_CPU_S": str(limits.cpu_seconds),
    }
    if not cgroup.limits_memory:
        env["TF_LIMIT_AS_KB"] = str(limits.memory_mb * 1024)
    if not cgroup.limits_pids and nproc_effective:
        env["TF_LIMIT_NPROC"] = str(limits.max_processes)
    return env


def _shared_root() -> Path:
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


def make_layout(root_dir: Path, task_id: str, disk: tuple[int, int] | None = None) -> Layout:
    """A fresh sandbox directory; with ``disk`` (MiB, inodes) its work and tmp dirs share one
    size-limited tmpfs when this process may mount one (``layout.disk_capped`` says)."""
    safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in task_id)[:40]
    root = Path(tempfile.mkdtemp(prefix=f"{safe}-", dir=root_dir))
    write_owner(root)  # from now on a sweep can tell whether the process that made it is alive
    try:
        files = mount_disk(root, *disk) if disk is not None else None
    except BaseException:
        remove_tree(root)
        raise
    base = files or root
    layout = Layout(root, base / "work", base / "tmp", root / AGENT_SOURCE, root / "agent.log")
    layout.disk_capped = files is not None
    layout.work.mkdir()
    layout.tmp.mkdir()
    source = resources.files("trajforge.sandbox").joinpath(AGENT_SOURCE).read_bytes()
    layout.agent.write_bytes(source)
    layout.agent.chmod(0o644)
    return layout


def copy_in(source: str, dest: Path) -> None:
    """Copy a row's starting directory into the fresh workdir (the original is never touched)."""
    src = Path(source)
    if not src.is_dir():
        raise ValueError(
            f"cwd {source!r} is not a directory on this machine; give a host directory whose "
            "contents should be copied into the sandbox, or leave cwd unset"
        )
    shutil.copytree(src, dest, symlinks=True, dirs_exist_ok=True)


def chown_tree(path: Path, owner: tuple[int, int]) -> None:
    os.chown(path, *owner, follow_symlinks=False)
    for dirpath, dirnames, filenames in os.walk(path):
        for name in dirnames + filenames:
            os.chown(os.path.join(dirpath, name), *owner, follow_symlinks=False)


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
    session: AgentSession
    cgroup: SandboxCgroup
    teardown: Callable[[], Awaitable[None]] | None = None
    owner: tuple[int, int] | None = None
    baseline_pids: tuple[int, ...] = ()  # the cgroup's processes when idle (bwrap + the agent)
    dir_stats: tuple[tuple[int, int], ...] = ()  # (mode, uid) of workdir and scratch dir at start
    uses: int = 1

    async def destroy(self, io: SandboxIO, keep: bool) -> None:
        """Kill everything, remove the cgroup and (unless ``keep``) the directories."""
        try:
            await self.session.close()
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
        pid = self.session.pid
        if not self.cgroup.dirs and pid is not None and self.session.alive():
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(OSError):
            self.cgroup.remove()
        remove_tree(self.layout.root)

    def host_state(self) -> tuple[list[str], list[int], tuple[tuple[int, int], ...]]:
        """What the host itself can check after a reset: directory contents, processes, modes."""
        left = os.listdir(self.layout.work) + os.listdir(self.layout.tmp)
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

    workdir = property(lambda self: self.resident.workdir)
    scratch_dir = property(lambda self: self.resident.scratch_dir)
    layout = property(lambda self: self.resident.layout)
    session = property(lambda self: self.resident.session)
    cgroup = property(lambda self: self.resident.cgroup)
    owner = property(lambda self: self.resident.owner)

    @property
    def host_workdir(self) -> Path:
        """Where the workdir lives on the host (for debugging and ``keep``)."""
        return self.layout.work

    @property
    def files(self) -> ConfinedDir:
        """Race-free host access to the workdir, with the sandbox's own file permissions."""
        return ConfinedDir(inside=self.workdir, host=str(self.layout.work), owner=self.owner)

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
        return await self.session.exec(
            command,
            timeout=timeout if timeout is not None else self.config.command_timeout_s,
            cwd=cwd,
            cap=self.config.output_cap_bytes,
        )

    async def read_bytes(self, path: str, limit: int | None = None) -> bytes:
        self._check_open()
        return await self.io.run(self.files.read, path, limit)

    async def write_bytes(self, path: str, data: bytes) -> None:
        self._check_open()
        await self.io.run(self.files.write, path, bytes(data))

    async def close(self) -> None:
        """Kill everything still running in the sandbox; then its factory either resets it for
        the next rollout or removes it (and its directory, unless ``keep``)."""
        if self._closed:
            return
        self._closed = True
        if self.release is not None:
            await self.release(self.resident)
        else:
            await self.resident.destroy(self.io, self.config.keep)

    async def __aenter__(self) -> ProcessSandbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


@dataclass
class ReuseStats:
    """How a factory's sandboxes were obtained: built fresh, reused, or discarded at reset."""

    created: int = 0
    reused: int = 0
    discarded: dict[str, int] = field(default_factory=dict)

    def discard(self, reason: str) -> None:
        self.discarded[reason] = self.discarded.get(reason, 0) + 1

    def counts(self) -> dict[str, int]:
        """Flat counters for run statistics: created, reused, ``discarded: <why>``."""
        flat = {"created": self.created, "reused": self.reused}
        flat.update({f"discarded: {why}": n for why, n in self.discarded.items()})
        return flat


LaunchBuilder = Callable[[Layout, SandboxCgroup], Awaitable[Launch]]


class ProcessSandboxFactory:
    """Shared ``create``: layout, copy-in, cgroup, launch, start the agent; undo all on failure.

    Reuse (``config.reuse``, backends with ``supports_reuse``): a closed sandbox is reset by its
    agent -- processes killed, directories emptied, IPC and tmpfs restored, session forgotten --
    the host checks what it can see itself (empty directories, modes, only the idle processes left
    in the cgroup), and the sandbox waits in an idle pool for the next ``create``. Building a
    sandbox (namespaces, cgroups, an interpreter) costs ~40 ms of machine CPU; a reset ~2 ms. A
    sandbox that fails any check is destroyed instead, and every outcome is counted in ``stats``.
    Call :meth:`aclose` (or use ``async with``) to remove the idle ones; a forgotten factory still
    removes them when it is collected or the process exits.
    """

    kind = "base"
    supports_reuse = False
    max_idle = 64  # idle sandboxes kept; beyond that a closed sandbox is destroyed
    max_uses = 500  # rollouts per sandbox before it is rebuilt anyway (bounds any slow drift)

    def __init__(self, config: SandboxConfig) -> None:
        self.config = config
        self._root: Path | None = None
        self.io = SandboxIO()
        self.stats = ReuseStats()
        self._idle: list[Resident] = []
        self._closed = False
        self._checked: str | None = None  # None: not yet; "": fine; else why the backend cannot run
        self._check_lock = asyncio.Lock()
        self._finalizer = weakref.finalize(self, _destroy_all_now, self._idle)

    @property
    def reuse(self) -> bool:
        return self.config.reuse and self.supports_reuse and not self.config.keep and not self._closed

    def _root_dir(self) -> Path:
        if self._root is None:
            if self.config.root_dir:
                self._root = Path(self.config.root_dir)
                self._root.mkdir(parents=True, exist_ok=True)
            else:
                self._root = _shared_root()
        return self._root

    async def _check(self) -> None:
        """Once per factory, before its first sandbox: remove what killed runs left in the root
        directory, then ask the backend whether it can run here (:meth:`_probe`, cached). Raises
        :class:`SandboxUnavailableError` with the backend's message when it cannot."""
        async with self._check_lock:
            if self._checked is None:
                await self.io.run(sweep_stale, self._root_dir())
                self._checked = await self._probe()
        if self._checked:
            raise SandboxUnavailableError(self._checked)

    async def _probe(self) -> str:
        """'' when the backend can run on this machine, else what the user should do."""
        return ""

    async def _launch(self, task_id: str, layout: Layout, cgroup: SandboxCgroup, image: str | None) -> Launch:
        raise NotImplementedError

    async def create(
        self, task_id: str, *, image: str | None = None, cwd: str | None = None
    ) -> ProcessSandbox:
        """A sandbox for one rollout, in its starting state: fresh, or reset after an earlier one.

        ``cwd``: a host directory whose contents are copied into the new workdir (a per-row
        starting state); the commands start in the workdir. ``image`` is used by docker only.
        """
        if self._closed:
            raise RuntimeError("this sandbox factory is closed")
        await self._check()
        resident = await self._take_idle(cwd) if self.reuse else None
        if resident is None:
            resident = await self._build(task_id, cwd, image)
            self.stats.created += 1
        else:
            self.stats.reused += 1
        return ProcessSandbox(
            task_id=task_id,
            config=self.config,
            resident=resident,
            io=self.io,
            release=self._release,
        )

    async def _take_idle(self, cwd: str | None) -> Resident | None:
        while self._idle:
            resident = self._idle.pop()
            if not resident.session.alive():
                self.stats.discard("exec agent exited while idle")
                await resident.destroy(self.io, False)
                continue
            if cwd is not None:
                try:
                    await self.io.run(self._fill, resident, cwd)
                except BaseException:
                    await resident.destroy(self.io, False)
                    raise
            resident.uses += 1
            return resident
        return None

    @staticmethod
    def _fill(resident: Resident, cwd: str) -> None:
        copy_in(cwd, resident.layout.work)
        if resident.owner is not None:
            chown_tree(resident.layout.work, resident.owner)

    async def _release(self, resident: Resident) -> None:
        """A rollout closed its sandbox: keep it for the next one if it resets cleanly."""
        if not self.reuse:
            await resident.destroy(self.io, self.config.keep)
            return
        problem = await self._reset(resident)
        if problem is None and self.reuse and len(self._idle) < self.max_idle:
            self._idle.append(resident)
            return
        if problem is not None:
            self.stats.discard(problem)
        await resident.destroy(self.io, False)

    async def _reset(self, resident: Resident) -> str | None:
        if resident.uses >= self.max_uses:
            return "reached max_uses"
        problem = await resident.session.reset()
        if problem is not None:
            return problem
        left, pids, stats = await self.io.run(resident.host_state)
        if left:
            return "workdir or scratch dir not empty after reset"
        if stats != resident.dir_stats:
            return "workdir or scratch dir mode/owner changed"
        if sorted(pids) != sorted(resident.baseline_pids):
            return "unexpected processes in the sandbox cgroup"
        return None

    async def aclose(self) -> None:
        """Destroy the idle sandboxes; later closes destroy theirs instead of keeping them."""
        self._closed = True
        idle, self._idle[:] = list(self._idle), []
        await asyncio.gather(*(r.destroy(self.io, False) for r in idle), return_exceptions=True)

    async def __aenter__(self) -> ProcessSandboxFactory:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _build(self, task_id: str, cwd: str | None, image: str | None) -> Resident:
        owner = self._new_owner()
        if cwd is None:  # a fresh, tiny tree: a few sub-millisecond syscalls, cheaper than a thread hop
            layout, cgroup = self._prepare(task_id, None, owner)
        else:  # copying a directory in can take long: off the event loop
            preparing = asyncio.ensure_future(self.io.run(self._prepare, task_id, cwd, owner))
            try:
                layout, cgroup = await asyncio.shield(preparing)
            except asyncio.CancelledError:  # the thread finishes anyway: undo what it made
                with contextlib.suppress(Exception):
                    layout, cgroup = await preparing
                    await self.io.run(cgroup.remove)
                    await self.io.run(remove_tree, layout.root)
                raise
        dir_stats = layout.dir_stats()
        launch: Launch | None = None
        try:
            launch = await self._launch(task_id, layout, cgroup, image)
            session = AgentSession(launch.argv, log_path=layout.log, env=launch.env, pass_fds=launch.pass_fds)
            await session.start()
        except BaseException:
            await self.io.run(cgroup.remove)
            if launch is not None and launch.teardown is not None:
                with contextlib.suppress(Exception):
                    await launch.teardown()
            await self.io.run(remove_tree, layout.root)
            raise
        return Resident(
            workdir=launch.workdir,
            scratch_dir=launch.scratch_dir,
            layout=layout,
            session=session,
            cgroup=cgroup,
            teardown=launch.teardown,
            owner=launch.owner,
            baseline_pids=tuple(cgroup.pids()) if self.reuse else (),
            dir_stats=dir_stats,
        )

    def _new_owner(self) -> tuple[int, int] | None:
        """The (uid, gid) a new sandbox's tree should belong to; None keeps ours (backends override)."""
        return None

    def _disk(self) -> tuple[int, int] | None:
        """(MiB, inodes) of the tmpfs that should hold a new sandbox's files; None: plain host
        directories (backends that can enforce ``limits.disk_mb`` override)."""
        return None

    def _prepare(
        self, task_id: str, cwd: str | None, owner: tuple[int, int] | None
    ) -> tuple[Layout, SandboxCgroup]:
        """Directory layout, copy-in, ownership and cgroup (blocking)."""
        layout = make_layout(self._root_dir(), task_id, self._disk())
        try:
            if cwd is not None:
                copy_in(cwd, layout.work)
            if owner is not None:
                chown_tree(layout.root, owner)
                layout.root.chmod(0o700)
                layout.owner = owner
            cgroup = SandboxCgroup.create(
                f"trajforge-{uuid.uuid4().hex[:12]}",
                max_pids=self.config.limits.max_processes,
                memory_bytes=self.config.limits.memory_mb * 1024 * 1024,
            )
            write_owner(layout.root, cgroup)  # ours again after chown, and names the cgroups
        except BaseException:
            remove_tree(layout.root)
            raise
        return layout, cgroup


def _destroy_all_now(idle: list[Resident]) -> None:
    """Finalizer of a factory that was never closed: remove its idle sandboxes synchronously."""
    while idle:
        with contextlib.suppress(Exception):
            idle.pop().destroy_now()


def first_existing(paths: Sequence[str]) -> str | None:
    return next((p for p in paths if os.path.exists(p)), None)
