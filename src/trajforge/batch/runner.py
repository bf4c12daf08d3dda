"""Start, resume and finish a batch run: checks first, then workers, then merged outputs.

Everything that can make a run fail for a reason the user must fix (unknown distribution or
toolset, bad dataset row, unreachable endpoint, bad key, unusable sandbox, a run directory that
already holds a run, a second run on the same directory) fails before any sample starts: see
:mod:`.prepare`, :mod:`.checks`, :mod:`.preflight`, :mod:`.lock` and :mod:`.run_file`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trajforge.batch.backends import Backends, open_backends
from trajforge.batch.bad_rows import commit_bad_rows
from trajforge.batch.checks import check_output_dir, check_run_dir
from trajforge.batch.config import BatchConfig
from trajforge.batch.dataset import INDEX_FILE, Sample, save_index
from trajforge.batch.errors import RunError
from trajforge.batch.ledger import LEDGER_FILE
from trajforge.batch.lock import run_lock
from trajforge.batch.monitor import Monitor
from trajforge.batch.plan import plan_run
from trajforge.batch.preflight import check_backend, preflight
from trajforge.batch.prepare import Prepared, prepare, unimplemented_tools
from trajforge.batch.processes import WorkerPool, partition, worker_pool
from trajforge.batch.progress import NullProgress, ProgressSink
from trajforge.batch.ray_backend import run_on_ray
from trajforge.batch.run_file import check_same_run, recorded_model, write_run_file
from trajforge.batch.scheduler import Activity, WorkerSpec, run_worker
from trajforge.batch.writer import (
    SHARDS_DIR,
    OutputError,
    OutputMerger,
    find_output_error,
    open_ledger,
    remove_temp_files,
    repair_shards,
    writing,
)
from trajforge.endpoint import embedded_endpoint, embedded_weights
from trajforge.extras import missing_ml
from trajforge.protocols import ChatModel, SandboxFactory
from trajforge.tools.builtin import build_registry
from trajforge.tools.registry import ToolRegistry

__all__ = ["RunError", "RunSummary", "run_batch"]

log = logging.getLogger(__name__)


@dataclass
class RunSummary:
    run_dir: Path
    statistics: dict[str, Any]
    output_counts: dict[str, int]
    session: int
    truncated_bytes: int


@dataclass
class _Session:
    """This start of the run: its number, the samples it still has to do, the bytes repaired."""

    number: int
    todo: list[Sample]
    total_rows: int
    truncated_bytes: int


async def run_batch(
    cfg: BatchConfig,
    *,
    progress: ProgressSink | None = None,
    model: ChatModel | None = None,
    sandbox_factory: SandboxFactory | None = None,
    registry: ToolRegistry | None = None,
    announce: Callable[[str], None] = log.info,
) -> RunSummary:
    """Run (or resume) a batch to the end. ``model``/``sandbox_factory`` let tests and embedders
    inject backends (in-process workers only; the caller closes them). Without an endpoint in
    ``cfg`` the embedded policy is served on loopback for the duration of the run (``announce``
    says so)."""
    owned = build_registry(cfg.tools) if registry is None else None  # closed with the run (browser)
    try:
        return await _run_batch(
            cfg, progress or NullProgress(), model, sandbox_factory, registry or owned, announce
        )
    except OutputError as exc:  # the run directory cannot be written: one line, what to do
        raise RunError(str(exc)) from None
    except BaseExceptionGroup as group:
        found = find_output_error(group)
        if found is None:
            raise
        raise RunError(str(found)) from None
    finally:
        if owned is not None:
            await owned.aclose()


async def _run_batch(
    cfg: BatchConfig,
    progress: ProgressSink,
    model: ChatModel | None,
    sandbox_factory: SandboxFactory | None,
    registry: ToolRegistry | None,
    announce: Callable[[str], None],
) -> RunSummary:
    registry = registry or build_registry(cfg.tools)
    if model is not None and (cfg.workers > 1 or cfg.backend == "ray"):
        raise RunError("an injected model only works with workers=1 and the local backend")
    progress.phase("reading the dataset")
    prep = prepare(cfg, registry)  # bad rows, names and directories fail before anything starts
    check_run_dir(cfg)
    check_output_dir(cfg)
    _warn_unimplemented(registry, prep, announce)
    if cfg.resume:
        check_same_run(cfg, cfg.run_dir)  # changed settings are refused before "nothing to do" is said
    if cfg.resume and await asyncio.to_thread(_nothing_left, cfg, prep):
        announce(f"every sample of {cfg.run_dir} is done: nothing to do (no model server started)")
        # no server started: the statistics keep naming the model that wrote the samples
        cfg = cfg.model_copy(update={"model": cfg.model or recorded_model(cfg.run_dir)})
        return await _run_locked(cfg, prep, registry, progress, None)
    async with contextlib.AsyncExitStack() as stack:
        pool = None
        if cfg.workers > 1 and cfg.backend == "local":
            # Spawned now, they import while the checks below run (see WorkerPool).
            pool = await stack.enter_async_context(worker_pool(cfg.workers, _worker_modules(cfg)))
        if sandbox_factory is None:  # a backend that cannot run here says so before a server starts
            await check_backend(cfg)
        if cfg.embedded and model is None:
            problem = missing_ml("the embedded default policy (no --model/--base-url)")
            if problem:
                raise RunError(problem)
            progress.phase("starting the model server (embedded policy)")
            base_url, name = await stack.enter_async_context(embedded_endpoint(announce=announce))
            update: dict[str, object] = {"base_url": base_url, "model": name}
            if cfg.tokenizer == "auto":  # token level on the embedded policy: its own tokenizer
                update["tokenizer"] = str(embedded_weights())
            cfg = cfg.model_copy(update=update)
        return await _start(cfg, prep, registry, progress, model, sandbox_factory, pool)


def _worker_modules(cfg: BatchConfig) -> tuple[str, ...]:
    """The modules a worker process builds its backends from (imported while it waits)."""
    client = "trajforge.llm.completion_model" if cfg.tokenizer else "trajforge.llm.openai_client"
    return (client, f"trajforge.sandbox.{cfg.sandbox}")


def _nothing_left(cfg: BatchConfig, prep: Prepared) -> bool:
    """Whether a resumed run has no sample left to run (read-only: the ledger is not changed)."""
    if not (cfg.run_dir / LEDGER_FILE).exists():
        return False
    ledger = open_ledger(cfg.run_dir)
    try:
        plan = plan_run(ledger, prep.dataset)
    finally:
        ledger.close()
    return not plan.todo and not plan.upserts and not plan.bad


def _warn_unimplemented(registry: ToolRegistry, prep: Prepared, announce: Callable[[str], None]) -> None:
    if prep.tools_warning:  # toolsets a distribution samples but this configuration cannot offer
        announce(prep.tools_warning)
    pending = unimplemented_tools(registry, prep.run_tools)
    if pending:
        announce(
            f"warning: this run offers tools that are not implemented yet ({', '.join(pending)}); "
            "calls to them return an error to the model. Use --toolsets terminal,file (or a "
            "distribution without them) for clean data."
        )


async def _start(
    cfg: BatchConfig,
    prep: Prepared,
    registry: ToolRegistry,
    progress: ProgressSink,
    model: ChatModel | None,
    sandbox_factory: SandboxFactory | None,
    pool: WorkerPool | None,
) -> RunSummary:
    """Preflight on the model and sandbox factory the run goes on with, then run under the lock.

    With worker processes the parent's pair only serves the preflight: each process builds its
    own (neither an HTTP client nor live sandboxes cross into a process)."""
    progress.phase("preflight: endpoint and sandbox")
    async with open_backends(cfg, model=model, sandbox_factory=sandbox_factory) as backends:
        await preflight(backends, cfg.sandbox, announce=lambda line: _announce(progress, line))
        if cfg.workers == 1 and cfg.backend == "local":
            return await _run_locked(cfg, prep, registry, progress, backends)
        if pool is not None:  # the local worker processes run the agent the preflight built
            pool.sandbox_agent = getattr(backends.sandbox_factory, "agent_file", None)
    return await _run_locked(cfg, prep, registry, progress, None, pool)


def _announce(progress: ProgressSink, line: str) -> None:
    """The endpoint's preflight line (which server, which dialect), in the log and on the progress."""
    log.info("%s", line)
    progress.phase(f"preflight: {line}")


async def _run_locked(
    cfg: BatchConfig,
    prep: Prepared,
    registry: ToolRegistry,
    progress: ProgressSink,
    backends: Backends | None,
    pool: WorkerPool | None = None,
) -> RunSummary:
    with writing(cfg.run_dir / SHARDS_DIR, resume=False):
        (cfg.run_dir / SHARDS_DIR).mkdir(parents=True, exist_ok=True)
    with run_lock(cfg.run_dir):
        session = _open_session(cfg, prep)
        progress.phase(
            "first samples in flight" if cfg.workers == 1 and cfg.backend == "local" else "starting workers"
        )
        activity = Activity()  # counted by an in-process worker; the display's sign of life
        monitor = Monitor(cfg, session.total_rows, session.number, progress, activity)
        merger = OutputMerger(cfg.run_dir, cfg.run_dir / LEDGER_FILE, min_interval_s=cfg.merge_interval)
        specs = [
            WorkerSpec(cfg, w, session.number, part, prep.run_tools, prep.prefill)
            for w, part in enumerate(partition(session.todo, cfg.workers))
            if part
        ]
        await _run_workers(specs, backends, registry, monitor, merger, pool, activity)
        counts, stats = await _finish(merger, monitor)
    return RunSummary(cfg.run_dir, stats, counts, session.number, session.truncated_bytes)


def _open_session(cfg: BatchConfig, prep: Prepared) -> _Session:
    """Under the lock: clean up after an earlier run, record the run, plan what is left."""
    run_dir = cfg.run_dir
    with writing(run_dir):
        left = remove_temp_files(run_dir)  # a crashed or failed run's; ours start only now
        if left:
            log.info("removed %d temp file(s) left in %s by an earlier run", len(left), run_dir)
        ledger = open_ledger(run_dir)
        try:
            check_same_run(cfg, run_dir)
            write_run_file(cfg, prep, run_dir)
            cut = repair_shards(run_dir, ledger)
            with writing(run_dir / LEDGER_FILE):
                number = ledger.next_session()
                plan = plan_run(ledger, prep.dataset)
                ledger.add_pending(plan.upserts, plan.mark)
            commit_bad_rows(cfg, ledger, plan.bad, number, prep.run_tools)
        finally:
            ledger.close()
        _save_index(prep, run_dir)
    return _Session(number, plan.todo, prep.dataset.total_rows, sum(cut.values()))


def _save_index(prep: Prepared, run_dir: Path) -> None:
    """Save the dataset index: the next start parses only rows added since."""
    prep.dataset.forget_parsed()
    try:
        save_index(prep.rows, run_dir / INDEX_FILE)
    except OSError as exc:  # only costs the next start a full parse
        log.warning("could not save the dataset index in %s: %s", run_dir, exc)


async def _run_workers(
    specs: list[WorkerSpec],
    backends: Backends | None,
    registry: ToolRegistry,
    monitor: Monitor,
    merger: OutputMerger,
    pool: WorkerPool | None,
    activity: Activity | None = None,
) -> None:
    """The workers (in-process on ``backends``, else spawned), with statistics and merged files
    kept current meanwhile. On any error the outputs are still brought up to date with what was
    committed (if the disk is full that fails too, and the first error is the one reported)."""
    try:
        async with asyncio.TaskGroup() as tg:
            watcher = tg.create_task(monitor.watch())
            merging = tg.create_task(merger.keep_current())
            try:
                if backends is not None and specs:
                    await run_worker(specs[0], backends, registry, activity)
                elif specs and specs[0].config.backend == "ray":
                    await run_on_ray(specs)
                elif specs and pool is not None:
                    await pool.run(specs)
                elif specs:  # a resumed run that found work after all (no pool was started)
                    async with worker_pool(len(specs)) as late:
                        await late.run(specs)
            finally:
                watcher.cancel()
                merging.cancel()
    except BaseException as exc:
        with contextlib.suppress(OutputError):
            await _finish(merger, monitor)
        found = find_output_error(exc) if isinstance(exc, BaseExceptionGroup) else None
        if found is not None:
            raise found from None
        raise


async def _finish(merger: OutputMerger, monitor: Monitor) -> tuple[dict[str, int], dict[str, Any]]:
    """The final merge and statistics (the ledger and the display are closed whatever happens)."""
    try:
        counts = await asyncio.to_thread(merger.merge)
        stats = monitor.refresh(finished=True)
    finally:
        monitor.close()
    return counts, stats
