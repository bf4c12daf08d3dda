"""Start, resume and finish a batch run: checks first, then workers, then merged outputs.

Everything that can make a run fail for a reason the user must fix (unknown distribution or
toolset, bad dataset row, unreachable endpoint, bad key, unusable sandbox, a run directory that
already holds a run, a second run on the same directory) fails here, before any sample starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import fcntl
import logging
import multiprocessing
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

import trajforge
from trajforge.batch.config import BatchConfig
from trajforge.batch.dataset import INDEX_FILE, BadRow, DatasetError, DatasetIndex, index_dataset, save_index
from trajforge.batch.ledger import Ledger
from trajforge.batch.plan import plan_run
from trajforge.batch.progress import NullProgress, ProgressSink, Snapshot
from trajforge.batch.records import Attempting, Outcome, build_line
from trajforge.batch.scheduler import LEDGER_FILE, WorkerSpec, build_model, run_worker, worker_process_main
from trajforge.batch.stats import Aggregate, build_statistics, merge_all
from trajforge.batch.writer import (
    SHARDS_DIR,
    Finished,
    OutputError,
    OutputMerger,
    ShardWriter,
    find_output_error,
    output_error,
    remove_temp_files,
    repair_shards,
    write_atomic,
    writing,
)
from trajforge.distributions import UnknownDistributionError, get_distribution
from trajforge.endpoint import embedded_endpoint
from trajforge.protocols import ChatModel, SandboxFactory
from trajforge.sandbox import close_factory, create_sandbox_factory
from trajforge.tools.registry import ToolRegistry, default_registry
from trajforge.tools.toolsets import UnknownToolsetError, check_toolsets

log = logging.getLogger(__name__)

RUN_FILE = "run.json"
STATS_FILE = "statistics.json"
LOCK_FILE = ".lock"


class RunError(RuntimeError):
    """The run cannot start or finish; the message says what to do."""


@dataclass
class RunSummary:
    run_dir: Path
    statistics: dict[str, Any]
    output_counts: dict[str, int]
    session: int
    truncated_bytes: int


@dataclass
class Prepared:
    """The run's fixed facts, computed once before any worker starts."""

    dataset: DatasetIndex
    run_tools: list[str]
    tool_schemas: list[dict[str, Any]]
    prefill: list[dict[str, Any]]


def _toolsets_of_run(cfg: BatchConfig) -> list[str]:
    try:
        if cfg.distribution_name is not None:
            return list(get_distribution(cfg.distribution_name).toolsets)
        return check_toolsets(cfg.toolsets or ())
    except (UnknownDistributionError, UnknownToolsetError) as exc:
        raise RunError(str(exc)) from None


def _load_prefill(path: Path | None) -> list[dict[str, Any]]:
    if path is None:
        return []
    try:
        data = orjson.loads(Path(path).read_bytes())
    except (OSError, orjson.JSONDecodeError) as exc:
        raise RunError(f"cannot read --prefill-messages {path}: {exc}") from None
    if not isinstance(data, list) or not all(isinstance(m, dict) and "role" in m for m in data):
        raise RunError(f"--prefill-messages {path} must hold a JSON list of messages with a 'role'")
    return data


def prepare(cfg: BatchConfig, registry: ToolRegistry) -> Prepared:
    toolsets = _toolsets_of_run(cfg)
    tools = registry.for_toolsets(toolsets)
    prefill = _load_prefill(cfg.prefill_messages)
    try:
        # A resume reuses the keys saved in the run directory for the bytes they were built from.
        dataset = index_dataset(
            cfg.dataset,
            skip_bad_rows=cfg.skip_bad_rows,
            max_samples=cfg.max_samples,
            cache=cfg.run_dir / INDEX_FILE,
        )
    except DatasetError as exc:
        raise RunError(str(exc)) from None
    return Prepared(dataset, [t.name for t in tools], registry.schemas(tools), prefill)


def check_run_dir(cfg: BatchConfig) -> None:
    run_dir = cfg.run_dir
    if cfg.resume or not run_dir.exists():
        return
    if (run_dir / LEDGER_FILE).exists():
        raise RunError(
            f"{run_dir} already holds a run; pass --resume to continue it, "
            "or choose another --run-name / --output-dir"
        )
    if any(run_dir.iterdir()):
        raise RunError(f"{run_dir} exists and is not empty; choose another --run-name or empty it")


def check_output_dir(cfg: BatchConfig) -> None:
    """Fail fast, before any endpoint or sandbox starts, on an output directory that cannot be
    written: a file in the way, no permission, a read-only or full file system. Creates nothing
    that stays: a probe file goes into the run directory or, while that does not exist yet, into
    its nearest existing ancestor, and is removed at once."""
    run_dir = cfg.run_dir
    target = run_dir
    while True:
        try:
            os.stat(target)
            break
        except (FileNotFoundError, NotADirectoryError):
            if target.parent == target:
                break
            target = target.parent
        except OSError as exc:
            raise RunError(str(output_error(target, exc, resume=False))) from None
    if not target.is_dir():
        raise RunError(
            f"{target} is not a directory; remove or rename that file, or choose another --output-dir"
        )
    probe = target / f".trajforge-probe-{os.getpid()}.tmp"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, b"trajforge\n")
            os.fsync(fd)
        finally:
            os.close(fd)
            probe.unlink(missing_ok=True)
    except OSError as exc:  # named after the directory, not the probe
        bare = OSError(exc.errno, exc.strerror)
        raise RunError(str(output_error(target, bare, resume=False))) from None


@contextmanager
def run_lock(run_dir: Path) -> Iterator[None]:
    """An exclusive ``flock`` on the run directory for the whole run (released by the kernel
    even on ``kill -9``)."""
    with writing(run_dir / LOCK_FILE):
        fd = os.open(run_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            raise RunError(
                f"another trajforge batch (pid {holder}) is running on {run_dir}; wait for it or "
                "stop it before starting another"
            ) from None
        with writing(run_dir / LOCK_FILE):
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)


async def preflight(cfg: BatchConfig, model: ChatModel | None, factory: SandboxFactory | None) -> None:
    """Fail fast on an unreachable endpoint, a bad key, or a sandbox backend that cannot start."""
    if model is None:
        try:
            probe = build_model(cfg)
        except Exception as exc:  # missing key, bad URL: the message says what to do
            raise RunError(str(exc)) from None
        try:
            await probe.check()  # type: ignore[attr-defined]
        except Exception as exc:
            raise RunError(f"endpoint check failed: {exc}") from None
        finally:
            await probe.aclose()
    own = factory is None
    factory = factory or create_sandbox_factory(cfg.sandbox_config())
    try:
        sandbox = await factory.create("trajforge-preflight")
        await sandbox.close()
    except Exception as exc:
        raise RunError(
            f"sandbox backend {cfg.sandbox!r} cannot start: {exc}; choose another with --sandbox"
        ) from None
    finally:
        if own:
            await close_factory(factory)


_SAMPLE_DEFINING = ("distribution", "toolsets", "seed")


def _check_same_run(cfg: BatchConfig, run_dir: Path) -> None:
    """A resume must draw the same toolsets and pad the same tool columns as the run it
    continues; otherwise old and new lines would disagree (and one file hold two schemas)."""
    path = run_dir / RUN_FILE
    if not path.exists():
        return
    saved = orjson.loads(path.read_bytes()).get("config", {})
    now = cfg.public_dict()
    changed = [k for k in _SAMPLE_DEFINING if saved.get(k) != now.get(k)]
    if changed:
        diffs = ", ".join(f"--{k} {saved.get(k)!r} -> {now.get(k)!r}" for k in changed)
        raise RunError(
            f"cannot resume {run_dir} with different sampling settings ({diffs}); use the original "
            "values or start a new --run-name"
        )


def _write_run_file(cfg: BatchConfig, prep: Prepared, run_dir: Path) -> None:
    if (run_dir / RUN_FILE).exists():
        return
    info = {
        "trajforge_version": trajforge.__version__,
        "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "config": cfg.public_dict(),
        "run_tools": prep.run_tools,
        "tools": prep.tool_schemas,
        "total_rows": prep.dataset.total_rows,
    }
    write_atomic(run_dir / RUN_FILE, orjson.dumps(info, option=orjson.OPT_INDENT_2))


def _commit_bad_rows(
    cfg: BatchConfig, ledger: Ledger, rows: list[BadRow], session: int, run_tools: list[str]
) -> None:
    """Bad rows are samples too: recorded failed with their reason, never silently skipped."""
    if not rows:
        return
    owner = f"s{session:04d}-bad"
    writer = ShardWriter(ledger, cfg.run_dir / SHARDS_DIR / f"{owner}.jsonl", owner, fsync=cfg.fsync)
    now = time.time()
    for row in rows:
        outcome = Outcome("failed", f"bad_row: {row.reason}", "bad_row")
        line, summary = build_line(
            row, outcome, None, Attempting([], [], 0, now, now, -1, 0), model=cfg.model, run_tools=run_tools
        )
        writer.submit(Finished(row.key, "failed", outcome.reason, line, summary))
    writer.finish_sync()


class _Monitor:
    """Reads durable progress from the ledger; writes statistics.json; feeds the display."""

    def __init__(self, cfg: BatchConfig, total: int, session: int, progress: ProgressSink) -> None:
        self.cfg = cfg
        self.total = total
        self.prefix = f"s{session:04d}-"
        self.progress = progress
        self.started = time.monotonic()
        self.ledger = Ledger(cfg.run_dir / LEDGER_FILE)
        self.last: Snapshot | None = None
        # A refresh cancelled mid-way keeps running in its thread; the final one waits for it.
        self._lock = threading.Lock()

    def refresh(self, finished: bool = False) -> dict[str, Any]:
        with self._lock:
            return self._refresh(finished)

    def _refresh(self, finished: bool) -> dict[str, Any]:
        raws = self.ledger.aggregates()
        agg = merge_all(raws)
        session = merge_all(raws, self.prefix)
        elapsed = time.monotonic() - self.started
        stats = build_statistics(
            agg,
            run_name=self.cfg.run_name,
            model=self.cfg.model,
            distribution=self.cfg.distribution_name,
            toolsets=self.cfg.toolsets,
            total_samples=self.total,
            session=session,
            session_elapsed_s=elapsed,
            finished=finished,
        )
        write_atomic(self.cfg.run_dir / STATS_FILE, orjson.dumps(stats, option=orjson.OPT_INDENT_2))
        self.last = _snapshot(agg, session, self.total, elapsed)
        self.progress.update(self.last)
        return stats

    async def watch(self, interval_s: float = 1.0) -> None:
        while True:
            await asyncio.sleep(interval_s)
            await asyncio.to_thread(self.refresh)


def _snapshot(agg: Aggregate, session: Aggregate, total: int, elapsed: float) -> Snapshot:
    s = agg.status
    return Snapshot(
        total=total,
        completed=s.get("completed", 0),
        failed=s.get("failed", 0),
        partial=s.get("partial", 0),
        filtered=s.get("filtered", 0),
        session_done=session.done,
        elapsed_s=elapsed,
        tokens=agg.tokens.get("total_tokens", 0),
    )


def _partition(items: list[Any], parts: int) -> list[list[Any]]:
    return [items[i::parts] for i in range(parts)]


async def _run_processes(specs: list[WorkerSpec]) -> None:
    ctx = multiprocessing.get_context("spawn")
    errors = ctx.SimpleQueue()  # one-line output errors of workers (see worker_process_main)
    procs = [
        ctx.Process(target=worker_process_main, args=(spec, errors), name=f"trajforge-w{spec.worker_id}")
        for spec in specs
    ]
    for proc in procs:
        proc.start()
    try:
        await asyncio.gather(*(asyncio.to_thread(p.join) for p in procs))
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.terminate()
        for proc in procs:
            await asyncio.to_thread(proc.join, 10)
    bad = [(s.worker_id, p.exitcode) for s, p in zip(specs, procs, strict=True) if p.exitcode]
    if bad and not errors.empty():
        raise OutputError(errors.get())
    if bad:
        raise RunError(
            "worker(s) exited abnormally: "
            + ", ".join(f"w{w} code {c}" for w, c in bad)
            + "; their unfinished samples stay pending, rerun with --resume"
        )


async def run_batch(
    cfg: BatchConfig,
    *,
    progress: ProgressSink | None = None,
    model_factory: Callable[[], ChatModel] | None = None,
    sandbox_factory: SandboxFactory | None = None,
    registry: ToolRegistry | None = None,
    announce: Callable[[str], None] = log.info,
) -> RunSummary:
    """Run (or resume) a batch to the end. ``model_factory``/``sandbox_factory`` let tests and
    embedders inject backends (in-process workers only). Without an endpoint in ``cfg`` the
    embedded policy is served on loopback for the duration of the run (``announce`` says so)."""
    try:
        return await _run_batch(cfg, progress, model_factory, sandbox_factory, registry, announce)
    except OutputError as exc:  # the run directory cannot be written: one line, what to do
        raise RunError(str(exc)) from None
    except BaseExceptionGroup as group:
        found = find_output_error(group)
        if found is None:
            raise
        raise RunError(str(found)) from None


async def _run_batch(
    cfg: BatchConfig,
    progress: ProgressSink | None,
    model_factory: Callable[[], ChatModel] | None,
    sandbox_factory: SandboxFactory | None,
    registry: ToolRegistry | None,
    announce: Callable[[str], None],
) -> RunSummary:
    registry = registry or default_registry()
    if model_factory is not None and cfg.workers > 1:
        raise RunError("an injected model only works with workers=1")
    prep = prepare(cfg, registry)  # bad rows, names and directories fail before anything starts
    check_run_dir(cfg)
    check_output_dir(cfg)
    pending = [n for n in prep.run_tools if not getattr(registry.get(n), "implemented", True)]
    if pending:
        announce(
            f"warning: this run offers tools that are not implemented yet ({', '.join(pending)}); "
            "calls to them return an error to the model. Use --toolsets terminal,file (or a "
            "distribution without them) for clean data."
        )
    if cfg.embedded and model_factory is None:
        async with embedded_endpoint(announce=announce) as (base_url, name):
            served = cfg.model_copy(update={"base_url": base_url, "model": name})
            return await _start(served, prep, registry, progress, None, sandbox_factory)
    return await _start(cfg, prep, registry, progress, model_factory, sandbox_factory)


async def _start(
    cfg: BatchConfig,
    prep: Prepared,
    registry: ToolRegistry,
    progress: ProgressSink | None,
    model_factory: Callable[[], ChatModel] | None,
    sandbox_factory: SandboxFactory | None,
) -> RunSummary:
    await preflight(cfg, model_factory() if model_factory else None, sandbox_factory)
    run_dir = cfg.run_dir
    with writing(run_dir / SHARDS_DIR, resume=False):
        (run_dir / SHARDS_DIR).mkdir(parents=True, exist_ok=True)
    with run_lock(run_dir):
        return await _run_locked(
            cfg, prep, registry, progress or NullProgress(), model_factory, sandbox_factory
        )


async def _run_locked(
    cfg: BatchConfig,
    prep: Prepared,
    registry: ToolRegistry,
    progress: ProgressSink,
    model_factory: Callable[[], ChatModel] | None,
    sandbox_factory: SandboxFactory | None,
) -> RunSummary:
    run_dir = cfg.run_dir
    with writing(run_dir):
        left = remove_temp_files(run_dir)  # a crashed or failed run's; ours start only now
        if left:
            log.info("removed %d temp file(s) left in %s by an earlier run", len(left), run_dir)
        with writing(run_dir / LEDGER_FILE):
            ledger = Ledger(run_dir / LEDGER_FILE)
        try:
            _check_same_run(cfg, run_dir)
            _write_run_file(cfg, prep, run_dir)
            cut = repair_shards(run_dir, ledger)
            with writing(run_dir / LEDGER_FILE):
                session = ledger.next_session()
                data = prep.dataset
                plan = plan_run(ledger, data)
                ledger.add_pending(plan.upserts, plan.mark)
            _commit_bad_rows(cfg, ledger, plan.bad, session, prep.run_tools)
            todo = plan.todo
            data.forget_parsed()
            try:
                save_index(data, run_dir / INDEX_FILE)  # the next start parses only rows added since
            except OSError as exc:  # only costs the next start a full parse
                log.warning("could not save the dataset index in %s: %s", run_dir, exc)
        finally:
            ledger.close()
    with writing(run_dir / LEDGER_FILE):
        monitor = _Monitor(cfg, data.total_rows, session, progress)
    specs = [
        WorkerSpec(cfg, w, session, part, prep.run_tools, prep.prefill)
        for w, part in enumerate(_partition(todo, cfg.workers))
        if part
    ]
    merger = OutputMerger(run_dir, run_dir / LEDGER_FILE, min_interval_s=cfg.merge_interval)
    try:
        async with asyncio.TaskGroup() as tg:
            watcher = tg.create_task(monitor.watch())
            merging = tg.create_task(merger.keep_current())
            try:
                if len(specs) == 1 and (cfg.workers == 1 or model_factory):
                    await run_worker(
                        specs[0],
                        model=model_factory() if model_factory else None,
                        sandbox_factory=sandbox_factory,
                        registry=registry,
                    )
                elif specs:
                    await _run_processes(specs)
            finally:
                watcher.cancel()
                merging.cancel()
    except BaseException as exc:
        # The merged files and statistics are still brought up to date with what was committed;
        # if the disk is full that fails too, and the first error is the one reported.
        with contextlib.suppress(OutputError):
            await _finish(merger, monitor, progress)
        found = find_output_error(exc) if isinstance(exc, BaseExceptionGroup) else None
        if found is not None:
            raise found from None
        raise
    counts, stats = await _finish(merger, monitor, progress)
    return RunSummary(run_dir, stats, counts, session, sum(cut.values()))


async def _finish(
    merger: OutputMerger, monitor: _Monitor, progress: ProgressSink
) -> tuple[dict[str, int], dict[str, Any]]:
    """The final merge and statistics (the ledger and the display are closed whatever happens)."""
    try:
        counts = await asyncio.to_thread(merger.merge)
        stats = monitor.refresh(finished=True)
    finally:
        monitor.ledger.close()
        progress.close(monitor.last)
    return counts, stats
