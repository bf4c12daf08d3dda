"""Worker processes (``--workers`` > 1): spawned, each with its share of the samples, reaped.

A worker process builds its own model and sandbox factory (:func:`open_backends`), dies with its
parent, and reports an output error (the run directory cannot be written) as one line.
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import multiprocessing
import os
import signal
from multiprocessing.queues import SimpleQueue
from typing import TypeVar

from trajforge.batch.backends import open_backends
from trajforge.batch.errors import RunError
from trajforge.batch.scheduler import WorkerSpec, run_worker
from trajforge.batch.writer import OutputError
from trajforge.tools.builtin import build_registry

T = TypeVar("T")


def partition(items: list[T], parts: int) -> list[list[T]]:
    """``parts`` interleaved shares of ``items`` (every part gets early and late rows alike)."""
    return [items[i::parts] for i in range(parts)]


async def run_processes(specs: list[WorkerSpec]) -> None:
    """One spawned process per spec, to the end; an abnormal exit raises with what to do."""
    ctx = multiprocessing.get_context("spawn")
    errors: SimpleQueue[str] = ctx.SimpleQueue()  # one-line output errors of workers
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
    _raise_for_exits([(s.worker_id, p.exitcode) for s, p in zip(specs, procs, strict=True)], errors)


def _raise_for_exits(exits: list[tuple[int, int | None]], errors: SimpleQueue[str]) -> None:
    bad = [(worker, code) for worker, code in exits if code]
    if bad and not errors.empty():
        raise OutputError(errors.get())
    if bad:
        raise RunError(
            "worker(s) exited abnormally: "
            + ", ".join(f"w{w} code {c}" for w, c in bad)
            + "; their unfinished samples stay pending, rerun with --resume"
        )


def worker_process_main(spec: WorkerSpec, errors: SimpleQueue[str] | None = None) -> None:
    """Entry point of a spawned worker process: dies with its parent, runs, exits.

    An output error (the run directory cannot be written) is not a crash: its one-line message
    goes to ``errors`` (a queue the parent reads) and the process exits with code 2."""
    _die_with_parent()
    gc.freeze()  # the unpickled samples live all run long: keep them out of GC scans
    try:
        asyncio.run(_work(spec))
    except KeyboardInterrupt:
        raise SystemExit(130) from None
    except OutputError as exc:
        if errors is not None:
            errors.put(str(exc))
        raise SystemExit(2) from None


async def _work(spec: WorkerSpec) -> int:
    registry = build_registry(spec.config.tools)
    try:
        async with open_backends(spec.config) as backends:
            return await run_worker(spec, backends, registry)
    finally:
        await registry.aclose()  # the worker's browser, on the loop that used it


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when the parent dies, so a killed run leaves no worker
    writing behind the back of the next ``--resume``."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: fall back to the parent check below
        pass
    if os.getppid() == 1:
        os._exit(1)
