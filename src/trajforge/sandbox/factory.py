"""The factory every process-based backend shares: build a sandbox (layout, copy-in, cgroup,
launch, agent), hand it to one rollout, and on close either reset it for reuse -- verified, and
counted -- or destroy it.

A backend only decides *how the agent is launched* (plain process, inside bubblewrap, inside a
container) and where the working directory appears inside; see :class:`Launch`. Everything else
-- session semantics, output caps, timeouts, confined binary-safe file access, cleanup -- lives
here once, so the three backends cannot drift apart.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import uuid
import weakref
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from trajforge.cleanup import finish
from trajforge.sandbox.cgroup import SandboxCgroup
from trajforge.sandbox.disk import remove_tree
from trajforge.sandbox.errors import SandboxUnavailableError
from trajforge.sandbox.exec_client import ExecAgent
from trajforge.sandbox.launch import Launch
from trajforge.sandbox.layout import (
    AgentFile,
    Layout,
    SandboxIO,
    chown_tree,
    copy_in,
    make_layout,
    shared_root,
)
from trajforge.sandbox.native_agent import build_native_agent
from trajforge.sandbox.process import ProcessSandbox, Resident
from trajforge.sandbox.sweep import sweep_stale, write_owner
from trajforge.sandbox.templates import (
    SandboxTemplate,
    TemplateGone,
    can_overlay,
    copy_tree,
    mount_overlay,
    remove_template,
)
from trajforge.sandbox.types import SandboxConfig

log = logging.getLogger(__name__)


@dataclass
class ReuseStats:
    """How a factory's sandboxes were obtained: built fresh, reused, or discarded at reset."""

    created: int = 0
    reused: int = 0
    templates: int = 0  # templates prepared
    forked: int = 0  # sandboxes started from a template
    discarded: dict[str, int] = field(default_factory=dict)

    # A reason often names a path a command chose ("cannot restore /: /x1 changed", a 4 KiB path
    # the reset could not remove): each is cut to a readable length, and past this many distinct
    # ones the rest are counted together, so a model cannot grow the run's statistics per sample.
    MAX_REASON_CHARS: ClassVar[int] = 200
    MAX_REASONS: ClassVar[int] = 50
    OTHER_REASONS: ClassVar[str] = "other reasons (more distinct reasons than are listed)"

    def discard(self, reason: str) -> None:
        if len(reason) > self.MAX_REASON_CHARS:
            reason = f"{reason[:140]} ... {reason[-40:]}"
        if reason not in self.discarded and len(self.discarded) >= self.MAX_REASONS:
            reason = self.OTHER_REASONS
        self.discarded[reason] = self.discarded.get(reason, 0) + 1

    def counts(self) -> dict[str, int]:
        """Flat counters for run statistics: created, reused, ``discarded: <why>``."""
        flat = {"created": self.created, "reused": self.reused}
        if self.templates or self.forked:
            flat.update(templates=self.templates, forked=self.forked)
        flat.update({f"discarded: {why}": n for why, n in self.discarded.items()})
        return flat


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
    # Idle sandboxes kept; None: as many as were ever in use at once (see _release).
    max_idle: int | None = None
    # Fresh builds at once: each costs ~40 ms of CPU, and a thousand started together on a few cores
    # only slow each other (and every reset with them, until resets time out and sandboxes are
    # rebuilt). Queued builds start in order; a rollout's first model call hides the wait.
    max_building = 2 * (os.cpu_count() or 1)
    max_uses = 500  # rollouts per sandbox before it is rebuilt anyway (bounds any slow drift)
    forks = False  # whether ``template``/``create(template=)`` work (backends that mount or copy)
    static_agent = False  # the agent linked statically (docker: the image's C library is its own)
    max_templates = 16  # templates kept; the least recently used one without children goes first

    def __init__(self, config: SandboxConfig) -> None:
        self.config = config
        self._root: Path | None = None
        self.io = SandboxIO()
        self.stats = ReuseStats()
        self._idle: list[Resident] = []
        self._closed = False
        self._disk_warned = False
        self._checked: str | None = None  # None: not yet; "": fine; else why the backend cannot run
        self._check_lock = asyncio.Lock()
        self._finalizer = weakref.finalize(self, _destroy_all_now, self._idle)
        self._building = asyncio.Semaphore(self.max_building)
        self.agent_file: AgentFile | None = None  # the exec agent: built at the first create, or adopted
        self._live = 0  # sandboxes asked for and not yet closed
        self._peak_live = 0
        self._resetting = 0  # resets in flight: sandboxes about to be idle
        self._claims = 0  # creates waiting for one of those
        self._returned = asyncio.Condition()  # notified whenever a reset ends
        self._templates: OrderedDict[str, SandboxTemplate] = OrderedDict()
        self._template_locks: dict[str, asyncio.Lock] = {}
        self._template_uids: set[int] = set()  # uids shared by a template's sandboxes

    def adopt_agent(self, agent: AgentFile | None) -> None:
        """Run ``agent``, the one a factory of the same config built in this machine's parent
        process, instead of building it again: a batch's worker processes then start without
        compiling the native agent (~1 s of CPU each, at the start of every run). None: build
        it as usual. The probe still runs; call this before the first ``create``."""
        if agent is not None:
            self.agent_file = agent

    @property
    def reuse(self) -> bool:
        return self.config.reuse and self.supports_reuse and not self.config.keep and not self._closed

    def _root_dir(self) -> Path:
        if self._root is None:
            if self.config.root_dir:
                self._root = Path(self.config.root_dir)
                self._root.mkdir(parents=True, exist_ok=True)
            else:
                self._root = shared_root()
        return self._root

    async def _check(self) -> None:
        """Once per factory, before its first sandbox: remove what killed runs left in the root
        directory, then ask the backend whether it can run here (:meth:`_probe`, cached). Raises
        :class:`SandboxUnavailableError` with the backend's message when it cannot."""
        async with self._check_lock:
            if self._checked is None:
                await self.io.run(sweep_stale, self._root_dir())
                self._checked = await self._build_agent() or await self._probe()
        if self._checked:
            raise SandboxUnavailableError(self._checked)

    async def check(self) -> None:
        """Whether this backend can run here, without starting a sandbox (cheap: commands ask it
        before anything slow starts, such as a model server). Raises ``SandboxUnavailableError``."""
        await self._check()

    async def _build_agent(self) -> str:
        """The exec agent compiled by this machine's ``cc``, once per process (unless a parent
        process's was adopted); '' when it is there, else what to install. No fallback: there is
        one agent (docs/architecture.md, "One exec agent")."""
        if self.agent_file is None:
            try:
                self.agent_file = await asyncio.to_thread(build_native_agent, self.static_agent)
            except SandboxUnavailableError as exc:
                return str(exc)
        return ""

    async def _probe(self) -> str:
        """'' when the backend can run on this machine, else what the user should do (the agent
        is built by then: ``agent_file`` is set)."""
        return ""

    async def _launch(self, task_id: str, layout: Layout, cgroup: SandboxCgroup, image: str | None) -> Launch:
        raise NotImplementedError

    async def create(
        self,
        task_id: str,
        *,
        image: str | None = None,
        cwd: str | None = None,
        template: SandboxTemplate | None = None,
    ) -> ProcessSandbox:
        """A sandbox for one rollout, in its starting state: fresh, or reset after an earlier one.

        ``cwd``: a host directory whose contents are copied into the new workdir (a per-row
        starting state); the commands start in the workdir. ``image`` is used by docker only.
        ``template``: start from a template of this factory (:meth:`template`) instead: its
        files, forked (see :mod:`trajforge.sandbox.templates`); never a reused sandbox.
        """
        if self._closed:
            raise RuntimeError("this sandbox factory is closed")
        await self._check()
        if template is not None and cwd is not None:
            raise ValueError("create(template=...) starts from the template's files: give no cwd")
        if template is not None and (template.removed or self._templates.get(template.key) is not template):
            raise TemplateGone(f"template {template.key!r} is not (or no longer) one of this factory's")
        # Counted from the request on: builds queue, so what was asked for at once is the peak.
        self._live += 1
        self._peak_live = max(self._peak_live, self._live)
        try:
            if template is not None:
                template.children += 1
                try:
                    async with self._building:
                        resident = await self._build(task_id, None, image, template=template)
                except BaseException:
                    template.children -= 1
                    raise
                self.stats.forked += 1
            else:
                resident = await self._obtain(task_id, cwd, image)
        except BaseException:
            self._live -= 1
            raise
        return ProcessSandbox(
            task_id=task_id,
            config=self.config,
            resident=resident,
            io=self.io,
            release=self._release,
        )

    async def _obtain(self, task_id: str, cwd: str | None, image: str | None) -> Resident:
        resident = await self._take_idle(cwd) if self.reuse else None
        if resident is None and self.reuse:
            # A sample that just ended may have asked for its close without it having started
            # yet (a task scheduled by the batch): let it start, so its reset counts below.
            await asyncio.sleep(0)
            resident = await self._take_idle(cwd)
        # A reset takes a few milliseconds, a build ~30 ms of CPU: with one in flight that no other
        # create has claimed yet, wait for it rather than build (a sample that ends hands its
        # sandbox to the next one even while the reset still runs).
        while resident is None and self.reuse and self._resetting > self._claims:
            self._claims += 1
            try:
                async with self._returned:
                    await self._returned.wait()
            finally:
                self._claims -= 1
            resident = await self._take_idle(cwd)
        if resident is None:
            async with self._building:
                # One may have come back while this create waited for its turn to build.
                resident = await self._take_idle(cwd) if self.reuse else None
                if resident is None:
                    resident = await self._build(task_id, cwd, image)
                    self.stats.created += 1
                    return resident
        self.stats.reused += 1
        return resident

    async def _take_idle(self, cwd: str | None) -> Resident | None:
        while self._idle:
            resident = self._idle.pop()
            if not resident.agent.alive():
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
        """A rollout closed its sandbox: keep it for the next one if it resets cleanly.

        The idle pool holds up to as many sandboxes as were ever in use at once (unless
        ``max_idle`` caps it): a thousand rollouts that end together hand theirs to the next
        thousand, instead of destroying all but a few and building the rest again.

        The closing task may be cancelled at any ``await`` here (a rollout at its deadline, a run
        stopped): a removal then still runs to its end, and a reset cut short removes the sandbox
        (its state is unknown) before the cancellation goes on. Either way nothing is left
        behind: no tmpfs, directory or process that nobody owns. The reset itself starts at once,
        in the closing task (a create that starts meanwhile waits for it rather than build)."""
        self._live -= 1
        if resident.template is not None:  # a fork's upper layer is its own: never reused
            try:
                await finish(resident.destroy(self.io, self.config.keep))
            finally:
                resident.template.children -= 1
            return
        if not self.reuse:
            await finish(resident.destroy(self.io, self.config.keep))
            return
        self._resetting += 1
        try:
            problem = await self._reset(resident)
        except BaseException as exc:
            self._resetting -= 1
            self.stats.discard(f"reset cut short ({type(exc).__name__})")
            try:
                await finish(resident.destroy(self.io, False))
            finally:
                await self._notify_returned()
            raise
        self._resetting -= 1
        if problem is None and self.reuse and len(self._idle) < self._idle_cap():
            self._idle.append(resident)
            await self._notify_returned()
            return
        await self._notify_returned()  # nothing came back: a waiting create builds instead
        if problem is not None:
            self.stats.discard(problem)
        await finish(resident.destroy(self.io, False))

    async def _notify_returned(self) -> None:
        async with self._returned:
            self._returned.notify_all()

    def _idle_cap(self) -> int:
        return self._peak_live if self.max_idle is None else self.max_idle

    async def _reset(self, resident: Resident) -> str | None:
        if resident.uses >= self.max_uses:
            return "reached max_uses"
        problem = await resident.agent.reset()
        if problem is not None:
            return problem
        left, pids, stats = await self.io.run(resident.host_state)
        if left:
            return "workdir, scratch dir or /dev/shm not empty after reset"
        if stats != resident.dir_stats:
            return "workdir, scratch dir or /dev/shm mode/owner changed"
        if sorted(pids) != sorted(resident.baseline_pids):
            return "unexpected processes in the sandbox cgroup"
        return None

    async def aclose(self) -> None:
        """Destroy the idle sandboxes and the templates; later closes destroy theirs instead of
        keeping them."""
        self._closed = True
        idle, self._idle[:] = list(self._idle), []
        await asyncio.gather(*(r.destroy(self.io, False) for r in idle), return_exceptions=True)
        templates = list(self._templates.values())
        self._templates.clear()
        for template in templates:
            template.removed = True
            await self.io.run(remove_template, template)

    # -- templates ---------------------------------------------------------------------------

    async def template(
        self,
        key: str,
        *,
        cwd: str | None = None,
        setup: Callable[[ProcessSandbox], Awaitable[None]] | None = None,
    ) -> SandboxTemplate:
        """The template ``key``: prepared once per factory (later calls, concurrent ones included,
        get the same one) by building a sandbox (``cwd`` copied in), running ``setup`` on it
        (commands, file writes: anything a rollout could do), stopping its processes and freezing
        its workdir. Start sandboxes from it with ``create(task_id, template=...)``. A setup that
        raises leaves no template (the next call tries again)."""
        if not self.forks:
            raise SandboxUnavailableError(f"the {self.kind} backend cannot fork sandboxes from a template")
        if self._closed:
            raise RuntimeError("this sandbox factory is closed")
        await self._check()
        lock = self._template_locks.setdefault(key, asyncio.Lock())
        async with lock:
            template = self._templates.get(key)
            if template is None:
                template = await self._make_template(key, cwd, setup)
                self._templates[key] = template
                await self._evict_templates(keep=key)
            self._templates.move_to_end(key)
            return template

    async def _make_template(
        self, key: str, cwd: str | None, setup: Callable[[ProcessSandbox], Awaitable[None]] | None
    ) -> SandboxTemplate:
        owner = self._new_owner()
        if owner is not None:  # its sandboxes share this uid: no kernel keys for any of them
            self._template_uids.add(owner[0])
        async with self._building:
            resident = await self._build(f"template-{key}", cwd, None, owner=owner)
        sandbox = ProcessSandbox(task_id=f"template-{key}", config=self.config, resident=resident, io=self.io)
        try:
            if setup is not None:
                await setup(sandbox)
            await sandbox.stop_processes()
            await resident.agent.close()
            await self.io.run(resident.cgroup.remove)
            if resident.teardown is not None:
                await resident.teardown()
        except BaseException:
            await resident.destroy(self.io, False)
            raise
        self.stats.templates += 1
        return SandboxTemplate(
            key=key,
            root=resident.layout.root,
            lower=resident.layout.work,
            owner=resident.owner,
            overlay=can_overlay(),
        )

    async def _evict_templates(self, keep: str) -> None:
        while len(self._templates) > self.max_templates:
            idle = next((k for k, t in self._templates.items() if t.children == 0 and k != keep), None)
            if idle is None:
                return  # all in use: kept until their children are gone and another is made
            template = self._templates.pop(idle)
            template.removed = True
            self._template_locks.pop(idle, None)
            await self.io.run(remove_template, template)

    async def __aenter__(self) -> ProcessSandboxFactory:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _build(
        self,
        task_id: str,
        cwd: str | None,
        image: str | None,
        *,
        template: SandboxTemplate | None = None,
        owner: tuple[int, int] | None = None,
    ) -> Resident:
        if template is not None:
            owner = template.owner
        elif owner is None:
            owner = self._new_owner()
        if cwd is None and template is None:  # a fresh, tiny tree: cheaper than a thread hop
            layout, cgroup = self._prepare(task_id, None, owner)
        else:  # copying a directory in (or mounting a template) can take long: off the event loop
            preparing = asyncio.ensure_future(self.io.run(self._prepare, task_id, cwd, owner, template))
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
            agent = ExecAgent(launch.argv, log_path=layout.log, env=launch.env, pass_fds=launch.pass_fds)
            await agent.start()
            if launch.started is not None:
                launch.started()
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
            agent=agent,
            cgroup=cgroup,
            teardown=launch.teardown,
            owner=launch.owner,
            baseline_pids=tuple(cgroup.pids()) if self.reuse else (),
            dir_stats=dir_stats,
            template=template,
        )

    def _new_owner(self) -> tuple[int, int] | None:
        """The (uid, gid) a new sandbox's tree should belong to; None keeps ours (backends override)."""
        return None

    def _disk(self) -> tuple[int, int] | None:
        """(MiB, inodes) of the tmpfs that should hold a new sandbox's files; None: plain host
        directories (backends that can enforce ``limits.disk_mb`` override)."""
        return None

    def _disk_not_enforced(self, why: str) -> None:
        """Say once per factory that ``limits.disk_mb`` is not enforced here, and why."""
        if self._disk_warned:
            return
        self._disk_warned = True
        log.warning(
            "sandbox disk_mb=%s cannot be enforced (%s: no tmpfs can be mounted); each file is still "
            "capped at file_size_mb=%d",
            self.config.limits.disk_mb,
            why,
            self.config.limits.file_size_mb,
        )

    def _prepare(
        self,
        task_id: str,
        cwd: str | None,
        owner: tuple[int, int] | None,
        template: SandboxTemplate | None = None,
    ) -> tuple[Layout, SandboxCgroup]:
        """Directory layout, copy-in (or a template's files), ownership and cgroup (blocking)."""
        disk = self._disk()
        if self.agent_file is None:  # _check builds (or a parent gave) it before any sandbox
            raise SandboxUnavailableError("the exec agent was not built: call check() first")
        layout = make_layout(self._root_dir(), task_id, self.agent_file, disk)
        if disk is not None and not layout.disk_capped:
            self._disk_not_enforced("mounting a tmpfs was refused (no CAP_SYS_ADMIN?)")
        try:
            if cwd is not None:
                copy_in(cwd, layout.work)
            if template is not None and not template.overlay:
                copy_tree(template.lower, layout.work)
            if owner is not None:
                chown_tree(layout.root, owner)  # before the overlay: never through it
                for shared in (layout.tmp, layout.shm):  # root's and 1777, as on any Linux box
                    os.chown(shared, 0, 0)
                layout.root.chmod(0o700)
                layout.owner = owner
            if (
                template is not None
                and template.overlay
                and not mount_overlay(template.lower, layout.work, owner)
            ):
                copy_tree(template.lower, layout.work)  # refused here after all: a copy, owned alike
                if owner is not None:
                    chown_tree(layout.work, owner)
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
