"""What a seed env's code reaches through module-level names while ``env eval`` runs it.

The seed's tools are keyed by ``task_id``: ``HermesAgentLoop(task_id=...)`` runs a rollout in
"the terminal of that task", ``ToolContext(task_id)`` runs reward commands there afterwards,
``tools.terminal_tool.cleanup_vm(task_id)`` ends it, ``register_task_env_overrides(task_id,
{"modal_image": ...})`` picks its image first. Here a :class:`SeedRuntime` holds one run's state
-- the run's backends, the sandbox of each task id, the image overrides, every loop run for the
record -- and :data:`CURRENT` (a context variable, set by the run and inherited by the tasks the
env starts) says which runtime the code of this task belongs to. Nothing is process-wide.

A loop run is one rollout through :func:`trajforge.rollout.run_rollout` (the same step every
rollout takes: sandbox, agent loop, record), whose judge *parks* it: the rollout's sandbox stays
open, with the agent's files, until the env's code releases the task (``ToolContext.cleanup``,
``cleanup_vm``, ``cleanup_all_environments``) or the evaluation ends. Parked rollouts hold no
concurrency slot (a slot is held while the agent loop runs), so an env that releases its tasks
only at the end (YC-Bench) cannot starve itself.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import hashlib
import itertools
import logging
import os
import re
import shlex
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trajforge.agent import AgentConfig
from trajforge.agent.result import AgentResult as TrajforgeResult
from trajforge.distributions import derive_seed
from trajforge.envs.judge import mark_never_reached
from trajforge.envs.verifier import _SCRATCH, VerifierContext
from trajforge.llm.types import SamplingParams
from trajforge.protocols import Sandbox, SandboxFactory, SupportsVerification
from trajforge.record import Record, Reward
from trajforge.rollout import (
    Asked,
    Identity,
    RolloutBackends,
    RolloutOutcome,
    RolloutRequest,
    build_record,
    run_rollout,
    sent_sampling,
)

if TYPE_CHECKING:
    from trajforge.envs.protocol import AgentEnv

log = logging.getLogger(__name__)

CURRENT: contextvars.ContextVar[SeedRuntime | None] = contextvars.ContextVar(
    "trajforge_seed_runtime", default=None
)
"""The runtime of the evaluation this code runs in (None outside ``env eval``)."""

# Environment variables a seed env's code sets (os.environ) reach its sandboxes, as the seed's
# local backend passed its process environment on; never ones named like a secret.
_SECRET = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH|COOKIE", re.IGNORECASE)
_IMAGE_KEYS = ("modal_image", "docker_image", "daytona_image", "singularity_image", "image")


@contextlib.contextmanager
def blocking_room(threads: int) -> Iterator[None]:
    """The event loop's default executor, for the run, a pool of ``threads`` + 64 threads.

    The seed's code blocks threads of that executor waiting on the loop: its benchmark envs run
    their tests with ``loop.run_in_executor(None, ...)``, and each blocking ``ToolContext`` verb
    waits for a coroutine on the loop, some of whose steps (host file I/O, the docker backend's
    markers) are ``asyncio.to_thread`` calls -- on that same executor. Its default size
    (``cpu_count + 4``: 6 threads on 2 CPUs) was a deadlock as soon as six tasks ran their tests at
    once: every thread waiting for a step that needed a thread. The seed sizes the pool its
    blocking tools run in with ``tool_pool_size`` (128: "89 parallel TB2 eval tasks each need a
    thread"); so does this, with room for the loop's own steps. Threads start on demand."""
    loop = asyncio.get_running_loop()
    before = getattr(loop, "_default_executor", None)
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=threads + 64, thread_name_prefix="seed-blocking")
    loop.set_default_executor(pool)
    try:
        yield
    finally:
        loop._default_executor = before  # type: ignore[attr-defined]  # no public way to put it back
        pool.shutdown(wait=False)


def current() -> SeedRuntime:
    """The runtime of the running evaluation; outside one, an error that says where these work."""
    runtime = CURRENT.get()
    if runtime is None:
        raise RuntimeError(
            "the seed's task tools (HermesAgentLoop, ToolContext(task_id), tools.terminal_tool) work "
            "while `trajforge env eval` runs this env; outside it there is no sandbox to run in"
        )
    return runtime


@dataclass
class _Parking:
    """The judge of a loop run: hands the finished rollout's sandbox over, then holds it open
    until released."""

    handed: asyncio.Future[tuple[TrajforgeResult, Sandbox]]
    released: asyncio.Event = field(default_factory=asyncio.Event)

    async def __call__(self, result: TrajforgeResult, sandbox: Sandbox) -> Reward:
        if not self.handed.done():
            self.handed.set_result((result, sandbox))
        await self.released.wait()
        return Reward.not_judged("scored by the env's own evaluate()")


@dataclass
class LoopRun:
    """One ``HermesAgentLoop.run``: its rollout, and what the env's code was handed."""

    index: int
    task_id: str
    messages: list[dict[str, Any]]
    request: RolloutRequest
    asked: Asked
    parking: _Parking
    task: asyncio.Task[RolloutOutcome]
    sandbox: Sandbox | None = None
    verifier: VerifierContext | None = None
    prepared: bool = False


class SeedRuntime:
    """One evaluation's state for a seed env's module-level task tools."""

    def __init__(
        self,
        env: AgentEnv,
        backends: RolloutBackends,
        *,
        fit: Callable[[int | None], int | None] = lambda n: n,
        announce: Callable[[str], None] = lambda _m: None,
    ) -> None:
        self.env = env
        self.backends = backends
        self.fit = fit
        self.announce = announce
        self.loop = asyncio.get_running_loop()  # made by the run, on its event loop
        self.runs: list[LoopRun] = []
        self.by_task: dict[str, LoopRun] = {}
        self.overrides: dict[str, dict[str, Any]] = {}
        self._slots = asyncio.Semaphore(env.config.max_concurrent_rollouts)
        self._environ = dict(os.environ)
        self._said: set[str] = set()
        self._built: dict[str, str] = {}
        self._indices = itertools.count()

    def note_once(self, text: str) -> None:
        if text not in self._said:
            self._said.add(text)
            self.announce(f"note: {text}")

    # ------------------------------------------------------------------ environment

    def exported(self) -> dict[str, str]:
        """Variables the env's code set in ``os.environ`` since the run began (secrets left out)."""
        changed = {k: v for k, v in os.environ.items() if self._environ.get(k) != v and k.isidentifier()}
        kept = {k: v for k, v in changed.items() if not _SECRET.search(k)}
        if kept:
            self.note_once(
                "the env set " + ", ".join(sorted(kept)) + " in its environment: exported in its sandboxes' "
                "shells, as the seed's local backend passed them on"
            )
        return kept

    # ------------------------------------------------------------------ loop runs

    async def run_loop(
        self,
        messages: list[dict[str, Any]],
        *,
        task_id: str,
        tool_names: set[str],
        max_turns: int,
        temperature: float | None,
        max_tokens: int | None,
        extra_body: Mapping[str, Any] | None,
    ) -> TrajforgeResult | None:
        """Run the agent loop for ``task_id`` in a sandbox of its own; the result, or None when
        the rollout ended before its sandbox could be handed over (the record says why)."""
        if task_id in self.by_task:
            raise RuntimeError(f"task_id {task_id!r} already ran a HermesAgentLoop in this evaluation")
        cfg = self.env.config
        registry = self.backends.registry
        toolsets = sorted({t.toolset for n in tool_names if (t := registry.get(n)) is not None})
        unknown = sorted(n for n in tool_names if registry.get(n) is None)
        if unknown:
            self.note_once(f"tools {', '.join(unknown)} are not trajforge tools: not offered")
        index = next(self._indices)  # before any await: loops of concurrent tasks start interleaved
        seed = derive_seed(cfg.seed, f"evaluate#{index}")
        agent = AgentConfig(
            max_turns=max_turns,
            sampling=SamplingParams(
                temperature=temperature,
                max_tokens=self.fit(max_tokens),
                extra_body=dict(extra_body or {}),
                seed=seed,
            ),
            max_parallel_tools=cfg.max_parallel_tools,
            session_timeout_s=cfg.sandbox_lifetime_s,
        )
        loop = asyncio.get_running_loop()
        parking = _Parking(loop.create_future())
        backends = RolloutBackends(
            self.backends.model,
            SeedFactory(self.backends.factory, self.exported),
            registry,
            self.backends.template,
        )
        await self._slots.acquire()  # held while the image is built and the agent loop runs
        try:
            image = await self._image(task_id)
        except BaseException:
            self._slots.release()
            raise
        request = RolloutRequest(
            [dict(m) for m in messages],
            seed,
            toolsets,
            agent,
            task_id=_safe(f"{self.env.name}-{task_id}"),
            image=image,
            judge=parking,
        )
        task = asyncio.create_task(run_rollout(request, backends), name=f"seed-loop-{task_id}")
        asked = Asked(backends.model.name, sent_sampling(agent), None)
        run = LoopRun(index, task_id, messages, request, asked, parking, task)
        self.runs.append(run)
        self.by_task[task_id] = run
        try:
            waiting: list[asyncio.Future[Any]] = [task, parking.handed]
            await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:  # the env gave up on this loop (its timeout): so does its rollout
            task.cancel()
            raise
        finally:
            self._slots.release()
        if not parking.handed.done():
            parking.handed.cancel()
            return None
        result, sandbox = parking.handed.result()
        run.sandbox = sandbox
        return result

    async def _image(self, task_id: str) -> str | None:
        """The image ``register_task_env_overrides`` named for ``task_id`` (docker sandboxes)."""
        wanted = next((v for k in _IMAGE_KEYS if (v := self.overrides.get(task_id, {}).get(k))), None)
        if not wanted:
            return None
        if self.env.config.sandbox != "docker":
            self.note_once(
                f"per-task images ({wanted!r}, ...) are used by the docker sandbox only; this run's "
                f"{self.env.config.sandbox} sandbox runs every task on this machine's system"
            )
            return None
        path = Path(str(wanted))
        if path.name == "Dockerfile" and await asyncio.to_thread(path.is_file):
            return await self._build(path)
        return str(wanted)

    async def _build(self, dockerfile: Path) -> str:
        """``docker build`` a task's Dockerfile (once per content), tagged by its hash."""
        from trajforge.spawn import spawn

        digest = hashlib.sha256(await asyncio.to_thread(dockerfile.read_bytes)).hexdigest()[:12]
        if digest in self._built:
            return self._built[digest]
        tag = f"trajforge-seed-task:{digest}"
        proc = await spawn(
            "docker", "build", "-t", tag, "-f", str(dockerfile), str(dockerfile.parent),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        out, _ = await proc.communicate()
        if proc.returncode != 0:
            raise RuntimeError(f"docker build of {dockerfile} failed: {out.decode(errors='replace')[-500:]}")
        self._built[digest] = tag
        return tag

    # ------------------------------------------------------------------ reward commands

    async def verifier(self, task_id: str) -> VerifierContext:
        """The verifier context on ``task_id``'s parked sandbox, prepared as the judge prepares
        one: leftovers stopped (unless ``reward_shell: session``), scratch space cleared."""
        run = self.by_task.get(task_id)
        if run is None or run.sandbox is None:
            raise RuntimeError(
                f"no sandbox for task {task_id!r}: no HermesAgentLoop ran it, or its rollout ended "
                "before a sandbox started (its record says why)"
            )
        if run.parking.released.is_set():
            raise RuntimeError(f"task {task_id!r} was cleaned up already; its sandbox is gone")
        cfg = self.env.config
        session = cfg.reward_shell == "session"
        stop = cfg.stop_processes_before_reward and not session
        if not run.prepared:
            run.prepared = True
            if isinstance(run.sandbox, SupportsVerification):
                if stop:
                    await run.sandbox.stop_processes()
                scratch = shlex.quote(f"{run.sandbox.scratch_dir}/{_SCRATCH}")
                await run.sandbox.exec_fresh(f"rm -rf -- {scratch}", timeout=60)
        if run.verifier is None:
            run.verifier = VerifierContext(
                run.sandbox,
                tools=_registry_tools(self.backends.registry),
                default_timeout_s=cfg.reward_timeout_s,
                stop_leftovers=stop,
                max_read_bytes=cfg.max_read_bytes,
                shell=cfg.reward_shell,
            )
        return run.verifier

    def release(self, task_id: str) -> None:
        """End ``task_id``'s rollout: its sandbox closes (the seed's cleanup_vm). From any thread."""
        run = self.by_task.get(task_id)
        if run is not None:
            self._set(run.parking.released)

    def release_all(self) -> None:
        for run in self.runs:
            self._set(run.parking.released)

    def _set(self, event: asyncio.Event) -> None:
        try:
            here = asyncio.get_running_loop()
        except RuntimeError:
            here = None
        if here is self.loop:
            event.set()
        else:
            self.loop.call_soon_threadsafe(event.set)

    async def close(self) -> list[RolloutOutcome | BaseException]:
        """Release every task and wait for its rollout to end; the outcomes, in run order. A loop
        still running when the evaluation is over (nothing can use it any more) is cancelled."""
        self.release_all()
        self.runs.sort(key=lambda r: r.index)  # the order the loops started in
        for run in self.runs:
            if not run.parking.handed.done():
                run.task.cancel()
        return list(await asyncio.gather(*(r.task for r in self.runs), return_exceptions=True))

    # ------------------------------------------------------------------ records

    def records(
        self, outcomes: list[RolloutOutcome | BaseException], samples: list[dict[str, Any]]
    ) -> list[Record]:
        """One record per loop run, each scored by the env's own sample for it when one can be
        told: the sample whose ``messages`` are the very list the run filled, else (as many
        samples as runs, counting all or those without an ``error``) the sample in run order.
        Of what is left, one run and one sample with an ``error`` (a loop the env timed out) go
        together; samples with an ``error`` and no run left for them are tasks that failed before
        a loop ran (failed records); and a run left without a sample keeps no reward."""
        by_messages = {id(s["messages"]): s for s in samples if isinstance(s.get("messages"), list)}
        in_order: list[dict[str, Any]] = []
        if not by_messages:  # samples without the conversation: in run order, if they can be lined up
            ran = [s for s in samples if not s.get("error")]
            in_order = (
                samples if len(samples) == len(self.runs) else ran if len(ran) == len(self.runs) else []
            )
        chosen: dict[int, dict[str, Any]] = {}
        for run in self.runs:
            sample = by_messages.get(id(run.messages)) or (in_order[run.index] if in_order else None)
            if sample is not None:
                chosen[run.index] = sample
        used = {id(s) for s in chosen.values()}
        errors = [s for s in samples if id(s) not in used and s.get("error")]
        unmatched = [r for r in self.runs if r.index not in chosen]
        if len(errors) == len(unmatched) == 1:
            chosen[unmatched[0].index] = errors.pop()
        elif unmatched:
            errors = []  # which failed task was which run cannot be told: the runs say it
        out = [
            self._record(run, done, chosen.get(run.index))
            for run, done in zip(self.runs, outcomes, strict=True)
        ]
        out += [self._unrun(next(self._indices), sample) for sample in errors]
        return out

    def _unrun(self, index: int, sample: dict[str, Any]) -> Record:
        """A task the env's evaluate() reported as failed with no loop run of its own."""
        from trajforge.rollout import Outcome

        done = RolloutOutcome(
            Outcome("failed", f"the env's evaluate() reported: {_brief(str(sample['error']))}", "env_error"),
            None,
            [],
            [],
            judged=True,
        )
        who = self._identity(index, sample, {"task_id": None}, f"evaluate-{index}")
        return build_record(who, Asked(self.backends.model.name), done, seed=0, toolsets=[])

    def _identity(
        self, index: int, sample: dict[str, Any] | None, item: dict[str, Any], item_id: str
    ) -> Identity:
        category = None
        if sample is not None:
            item = {k: v for k, v in sample.items() if k != "messages" and _plain(v)}
            item_id = str(
                next((sample[k] for k in ("task_name", "id", "task_id", "name") if sample.get(k)), item_id)
            )
            if "preset" in sample and "seed" in sample and "task_name" not in sample:
                item_id = f"{sample['preset']}-seed{sample['seed']}"
            cat = sample.get("category", sample.get("preset"))
            category = str(cat) if cat is not None else None
        return Identity(
            key=f"evaluate#{index}",
            item=item,
            prompt_index=index,
            env=self.env.name,
            item_id=item_id,
            category=category,
        )

    def _record(
        self, run: LoopRun, done: RolloutOutcome | BaseException, sample: dict[str, Any] | None
    ) -> Record:
        from trajforge.rollout import Outcome

        if isinstance(done, asyncio.CancelledError):
            why = "cancelled: the env's evaluate() gave up on this loop (its timeout) or ended before it finished"
            done = RolloutOutcome(Outcome("failed", why, "cancelled"), None, [], [], judged=True)
        elif isinstance(done, BaseException):
            done = RolloutOutcome(
                Outcome("failed", f"error: {type(done).__name__}: {done}", "error"), None, [], [], judged=True
            )
        prompt = next((m.get("content") for m in run.request.prompt if m.get("role") == "user"), "")  # type: ignore[union-attr]
        mark_never_reached(done)
        who = self._identity(
            run.index, sample, {"prompt": prompt, "task_id": run.task_id}, f"evaluate-{run.index}"
        )
        record = build_record(who, run.asked, done, seed=run.request.seed, toolsets=run.request.toolsets)
        if done.result is None or done.outcome.status == "failed":
            return record
        if run.verifier is not None and run.verifier.setup_errors:  # the env's tests never ran as asked
            error = f"VerifierPlacementError: {run.verifier.setup_errors[0]}"
            return record.model_copy(update={"reward": Reward.failed(error)})
        reward, why = _sample_reward(sample)
        return record.model_copy(update={"reward": Reward(value=reward, reason=why)})


def _sample_reward(sample: dict[str, Any] | None) -> tuple[float | None, str]:
    if sample is None:
        return None, "the env's evaluate() reported no score that could be told to be this run's"
    for key in ("reward", "score", "composite_score"):
        value = sample.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value), f"the env's evaluate(): {key} {value}"
    if isinstance(sample.get("passed"), bool):
        return float(sample["passed"]), f"the env's evaluate(): passed {sample['passed']}"
    return None, "the env's evaluate() sample for this run has no reward, score or passed"


def _brief(text: str) -> str:
    """One line of an error text (a program's whole traceback, say): its last line naming an
    error, else its first; at most 300 characters."""
    lines = [" ".join(line.split()) for line in text.splitlines() if line.strip(" │╭╰─\t")]
    raised = [line for line in lines if re.search(r"\w(Error|Exception)\b:", line)]
    named = raised or [line for line in lines if "error" in line.lower()]
    line = (named[-1] if named else lines[0] if lines else "").strip(" │")
    return line if len(line) <= 300 else line[:297] + "..."


def _plain(value: Any) -> bool:
    return value is None or isinstance(value, str | int | float | bool)


def _safe(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text)[:64]


def _registry_tools(registry: Any) -> dict[str, Any]:
    return {n: t for n in registry.names() if (t := registry.get(n)) is not None}


@dataclass
class SeedFactory:
    """The run's sandbox factory: each new sandbox's shell starts with the variables the env's
    code exported (``exports()`` at the time the sandbox is made)."""

    inner: SandboxFactory
    exports: Callable[[], dict[str, str]]

    async def create(self, task_id: str, *, image: str | None = None, cwd: str | None = None) -> Sandbox:
        from trajforge.sandbox.errors import SandboxStartError

        sandbox = await self.inner.create(task_id, image=image, cwd=cwd)
        variables = self.exports()
        if variables:
            line = "export " + " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(variables.items()))
            try:
                res = await sandbox.exec(line, timeout=30)
            except BaseException:
                await sandbox.close()
                raise
            if not res.ok:
                await sandbox.close()
                raise SandboxStartError(f"exporting the env's variables failed: {res.shown[-300:]}")
        return sandbox


__all__ = ["CURRENT", "LoopRun", "SeedFactory", "SeedRuntime", "current"]
