"""Worker processes (``--workers`` > 1): spawned early, each with its share of the samples, reaped.

A worker process builds its own model and sandbox factory (:func:`open_backends`), dies with its
parent, and reports an output error (the run directory cannot be written) as one line.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import dataclasses
import gc
import importlib
import multiprocessing
import os
import signal
from collections.abc import AsyncIterator
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from multiprocessing.queues import SimpleQueue
from typing import TypeVar

from trajforge.batch.backends import open_backends
from trajforge.batch.errors import RunError
from trajforge.batch.scheduler import WorkerSpec, run_worker
from trajforge.batch.writer import OutputError
from trajforge.sandbox.layout import AgentFile
from trajforge.tools.builtin import build_registry

T = TypeVar("T")


def partition(items: list[T], parts: int) -> list[list[T]]:
    """``parts`` interleaved shares of ``items`` (every part gets early and late rows alike)."""
    return [items[i::parts] for i in range(parts)]


class WorkerPool:
    """The run's worker processes, spawned before the preflight and given their specs after it.

    Why early: a spawned process imports trajforge and the openai SDK before it can run a sample,
    ~1.6 s of CPU each. Started at the top of the run, the processes import while the parent
    reads the dataset and checks the endpoint and the sandbox backend, instead of after. Each then
    waits for its :class:`WorkerSpec` on a pipe; one that gets none (fewer shares than processes,
    or a run that stops before its workers start) reads the pipe's end and exits."""

    def __init__(self, count: int, preload: tuple[str, ...] = ()) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._errors: SimpleQueue[str] = ctx.SimpleQueue()  # one-line output errors of workers
        self._procs: list[BaseProcess] = []
        self._specs: list[Connection] = []
        # The exec agent the parent's preflight built: each process runs it instead of its own.
        self.sandbox_agent: AgentFile | None = None
        try:
            for i in range(count):
                reader, writer = ctx.Pipe(duplex=False)
                proc = ctx.Process(
                    target=worker_process_main, args=(reader, self._errors, preload), name=f"trajforge-w{i}"
                )
                self._procs.append(proc)
                self._specs.append(writer)
                proc.start()
                reader.close()  # the child's end
        except BaseException:
            self._end(grace_s=0)
            raise

    async def run(self, specs: list[WorkerSpec]) -> None:
        """Hand each process its spec and wait for all to end; an abnormal exit raises with what
        to do. At most one spec per process."""
        if len(specs) > len(self._procs):
            raise ValueError(f"{len(specs)} worker specs for {len(self._procs)} processes")
        agent = self.sandbox_agent
        sends = [
            asyncio.to_thread(self._hand, i, dataclasses.replace(spec, sandbox_agent=agent))
            for i, spec in enumerate(specs)
        ]
        for i in range(len(specs), len(self._specs)):
            self._specs[i].close()  # nothing for this one: it exits
        procs = self._procs
        try:
            await asyncio.gather(*sends)
            await asyncio.gather(*(asyncio.to_thread(p.join) for p in procs))
        finally:
            for proc in procs:
                if proc.is_alive():
                    proc.terminate()
            for proc in procs:
                await asyncio.to_thread(proc.join, 10)
        given = procs[: len(specs)]
        _raise_for_exits([(s.worker_id, p.exitcode) for s, p in zip(specs, given, strict=True)], self._errors)

    def _hand(self, i: int, spec: WorkerSpec) -> None:
        with contextlib.suppress(OSError):  # a process already dead: its exit code says so
            self._specs[i].send(spec)
        self._specs[i].close()

    async def aclose(self) -> None:
        """End the processes not handed a spec (they read the pipe's end and exit) and reap all."""
        await asyncio.to_thread(self._end, grace_s=10)

    def _end(self, grace_s: float) -> None:
        """Close every pipe (a waiting process exits), give each process ``grace_s`` to end,
        then kill it."""
        for conn in self._specs:
            conn.close()
        for proc in self._procs:
            if proc.pid is None:  # never started
                continue
            proc.join(grace_s)
            if proc.is_alive():
                proc.kill()
                proc.join(10)


@contextlib.asynccontextmanager
async def worker_pool(count: int, preload: tuple[str, ...] = ()) -> AsyncIterator[WorkerPool]:
    """A :class:`WorkerPool` of ``count`` processes, reaped on the way out whatever happens."""
    pool = WorkerPool(count, preload)
    try:
        yield pool
    finally:
        await pool.aclose()


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


def worker_process_main(
    specs: Connection, errors: SimpleQueue[str] | None = None, preload: tuple[str, ...] = ()
) -> None:
    """Entry point of a spawned worker process: dies with its parent, imports the ``preload``
    modules, waits for its spec on ``specs`` (none: exits at once), runs, exits.

    An output error (the run directory cannot be written) is not a crash: its one-line message
    goes to ``errors`` (a queue the parent reads) and the process exits with code 2."""
    _die_with_parent()
    try:
        for module in preload:
            with contextlib.suppress(Exception):  # where it is used, the import fails with its message
                importlib.import_module(module)
        spec: WorkerSpec = specs.recv()
    except (EOFError, OSError):  # the run stopped before its workers started, or needs fewer
        return
    except KeyboardInterrupt:  # Ctrl-C during the preflight reaches the waiting workers too
        raise SystemExit(130) from None
    finally:
        specs.close()
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
        async with open_backends(spec.config, sandbox_agent=spec.sandbox_agent) as backends:
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
