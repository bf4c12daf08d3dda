"""The run manager: training runs as directories that outlive the process that started them.

Process control only; the files it reads and writes are :mod:`trajforge.rl.runs.schema`.

A run is ``RUNS_DIR/ID/``: ``config.yaml`` (what was asked, secrets by *name* only),
``state.json`` (every process's pid, start time, process group, status and reason), one
``NAME.log`` per process (stdout and stderr), ``NAME.exit.json`` (how it ended, written by its
supervisor), ``metrics.jsonl`` and ``checkpoints/`` (the trainer's). Nothing lives only in
memory: a new :class:`Manager` (another process, after a crash) reads the state and checks each
pid *and its start time* against ``/proc`` (pids are reused), so ``trajforge rl start`` can
return and ``trajforge rl status`` can run an hour later.

Why each rule (the reference's run manager failed all three):

- Readiness is observed, never slept on: an HTTP process is ready when the address it prints
  answers ``/health``; a trainer when its first metrics line is written. A process that dies
  first fails the run with its exit status and log tail.
- Every process starts in its own session and process group, under a supervisor
  (:mod:`trajforge.rl.runs.supervise`) that records its exit; stop sends SIGTERM to the group, waits,
  then SIGKILL -- grandchildren (a trainer's own inference server) go with it.
- Secrets reach a process through its environment only, named in ``ProcessSpec.secret_env`` and
  read from the manager's environment at start; argv, config, state and logs never hold them, and
  key-like variables not named there are not passed on at all.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import re
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import yaml

from trajforge.record.runs import kind_problem
from trajforge.rl.runs import procs
from trajforge.rl.runs.schema import (
    CONFIG_FILE,
    LOCK_FILE,
    PLACEHOLDER,
    RUN_ID,
    SECRET_NAME,
    STATE_FILE,
    ProcessSpec,
    ProcessState,
    ReadyCheck,
    RunError,
    RunResults,
    RunSpec,
    RunState,
    find_checkpoints,
    is_managed_run,
    log_tail,
    metric_summaries,
    printed_address,
    read_exit,
    read_metrics,
)


class Manager:
    """Starts, watches and stops runs under ``runs_dir``. Holds nothing a restart would lose:
    every method reads the run's files first (two managers may look at one run at once; state
    updates take the run's lock).

    ``environ`` is where processes' environments come from (default ``os.environ``)."""

    def __init__(self, runs_dir: str | Path, *, environ: Mapping[str, str] | None = None) -> None:
        self.runs_dir = Path(runs_dir)
        self._environ = environ
        self._children: dict[int, subprocess.Popen[bytes]] = {}  # ours to reap (no zombies)

    # ----------------------------------------------------------------- files
    def run_dir(self, run_id: str) -> Path:
        path = self.runs_dir / run_id
        if not RUN_ID.fullmatch(run_id) or not (path / STATE_FILE).is_file():
            known = ", ".join(self.run_ids()[-10:]) or "none"
            raise RunError(f"no run {run_id!r} in {self.runs_dir} (runs: {known})")
        if not is_managed_run(path):  # an `rl train` run's state.json is the trainer's
            raise RunError(kind_problem(path, ("rl run",), "a run `trajforge rl start` made") or str(path))
        return path

    def run_ids(self) -> list[str]:
        if not self.runs_dir.is_dir():
            return []
        ids = [p.name for p in self.runs_dir.iterdir() if is_managed_run(p)]
        return sorted(ids, key=lambda i: (self.runs_dir / i / STATE_FILE).stat().st_mtime_ns)

    def read_state(self, run_id: str) -> RunState:
        return RunState.model_validate(orjson.loads((self.run_dir(run_id) / STATE_FILE).read_bytes()))

    def _write_state(self, state: RunState) -> None:
        path = Path(state.dir) / STATE_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(orjson.dumps(state.model_dump(mode="json"), option=orjson.OPT_INDENT_2))
        os.replace(tmp, path)

    @contextlib.contextmanager
    def _locked(self, run_dir: Path) -> Iterator[None]:
        with (run_dir / LOCK_FILE).open("a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def _update(self, run_id: str, change: Any) -> RunState:
        """Read, change (a function of the state) and write the state under the run's lock."""
        run_dir = self.run_dir(run_id)
        with self._locked(run_dir):
            state = self.read_state(run_id)
            change(state)
            self._write_state(state)
            return state

    # ----------------------------------------------------------------- start
    async def start(self, spec: RunSpec) -> RunState:
        """Create the run directory and start its processes in order, each once the ones before
        it are ready. Returns the state: ``running`` when every process is ready, else ``failed``
        with the reason (which process, how it ended, its log tail) and nothing left running."""
        state = self._create(spec)
        try:
            for proc_spec in spec.processes:
                state = await self._start_process(state, proc_spec)
                if state.status == "failed":
                    await self._terminate(state.id, grace_s=10.0)
                    return await self.status(state.id)
        except BaseException:  # interrupted (Ctrl-C, cancelled): leave nothing half-started
            self._fail_run(state.id, "the start was interrupted before every process was ready")
            await asyncio.shield(self._terminate(state.id, grace_s=10.0))
            raise
        state = self._update(state.id, lambda s: setattr(s, "status", "running"))
        return await self.status(state.id)

    def _fail_run(self, run_id: str, reason: str) -> None:
        def change(s: RunState) -> None:
            if not s.ended:
                s.status, s.reason = "failed", reason

        self._update(run_id, change)

    def _create(self, spec: RunSpec) -> RunState:
        run_id = spec.run_id or f"{time.strftime('%Y%m%d-%H%M%S')}-{spec.kind}-{secrets.token_hex(3)}"
        if not RUN_ID.fullmatch(run_id):  # a spec built around its validators never gets here
            raise RunError(f"run id {run_id!r}: letters, digits, '.', '_' and '-' only")
        run_dir = self.runs_dir / run_id
        self.runs_dir.mkdir(parents=True, exist_ok=True)
        try:
            run_dir.mkdir()
        except FileExistsError:
            raise RunError(f"run {run_id} already exists in {self.runs_dir}; pick another id") from None
        (run_dir / spec.checkpoints_dir).mkdir(parents=True)
        main = next((p.name for p in spec.processes if p.main), spec.processes[-1].name)
        config = {
            "kind": spec.kind,
            **spec.config,
            "processes": [
                {"name": p.name, "argv": p.argv, "env": p.env, "secret_env": p.secret_env}
                for p in spec.processes
            ],
        }
        (run_dir / CONFIG_FILE).write_text(yaml.safe_dump(config, sort_keys=False))
        for name, text in spec.files.items():
            (run_dir / name).parent.mkdir(parents=True, exist_ok=True)
            (run_dir / name).write_text(text)
        state = RunState(
            id=run_id,
            kind=spec.kind,
            metrics_file=spec.metrics_file,
            dir=str(run_dir.resolve()),
            processes=[
                ProcessState(
                    name=p.name,
                    argv=p.argv,
                    main=p.name == main,
                    secret_env=p.secret_env,
                    log=f"{p.name}.log",
                )
                for p in spec.processes
            ],
        )
        self._write_state(state)
        return state

    def _child_env(self, spec: ProcessSpec) -> dict[str, str]:
        base = dict(os.environ if self._environ is None else self._environ)
        missing = [name for name in spec.secret_env if not base.get(name)]
        if missing:
            raise RunError(
                f"process {spec.name} needs {', '.join(missing)} set in the environment (secrets are "
                "read from the environment only)"
            )
        # Key-like variables reach a process only when its spec names them.
        env = {k: v for k, v in base.items() if not SECRET_NAME.search(k) or k in spec.secret_env}
        env.update(spec.env)
        env["PYTHONUNBUFFERED"] = "1"  # logs show what happened up to a crash
        return env

    def _argv(self, state: RunState, argv: list[str]) -> list[str]:
        def url(match: re.Match[str]) -> str:
            proc = state.process(match.group(1))
            if proc.url is None:
                raise RunError(f"{match.group(0)}: process {proc.name} has no ready URL (start it first)")
            return proc.url

        return [PLACEHOLDER.sub(url, a.replace("{run_dir}", state.dir)) for a in argv]

    async def _start_process(self, state: RunState, spec: ProcessSpec) -> RunState:
        run_dir = Path(state.dir)
        try:
            argv = self._argv(state, spec.argv)
            env = self._child_env(spec)
        except RunError as exc:
            return self._fail(state.id, spec.name, str(exc))
        exit_file = run_dir / f"{spec.name}.exit.json"
        with (run_dir / f"{spec.name}.log").open("ab") as log:
            child = await asyncio.to_thread(
                subprocess.Popen,
                [sys.executable, "-m", "trajforge.rl.runs.supervise", str(exit_file), "--", *argv],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # its own process group: stop signals the whole group
            )
        self._children[child.pid] = child
        ticks = procs.start_ticks(child.pid)

        def started(s: RunState) -> None:
            p = s.process(spec.name)
            p.argv, p.pid, p.pgid, p.start_ticks = argv, child.pid, child.pid, ticks
            p.status, p.started_at = "starting", time.time()

        state = self._update(state.id, started)
        try:
            url = await self._wait_ready(state, state.process(spec.name), spec.ready)
        except RunError as exc:
            return self._fail(state.id, spec.name, str(exc))

        def ready(s: RunState) -> None:
            p = s.process(spec.name)
            p.status, p.ready_at, p.url = "running", time.time(), url

        return self._update(state.id, ready)

    def _fail(self, run_id: str, name: str, reason: str) -> RunState:
        def change(s: RunState) -> None:
            p = s.process(name)
            if not p.ended:
                p.status, p.reason = "failed", reason
            s.status = "failed"
            s.reason = f"process {reason}" if reason.startswith(name) else f"process {name}: {reason}"

        return self._update(run_id, change)

    async def _wait_ready(self, state: RunState, proc: ProcessState, check: ReadyCheck) -> str | None:
        """Wait for ``check`` while watching the process: its death first is a failure with its
        exit status and log tail; so is the timeout."""
        assert proc.pid is not None
        probe = asyncio.create_task(self._probe(Path(state.dir), proc, check))
        death = asyncio.create_task(procs.wait_exit(proc.pid, proc.start_ticks, None))
        try:
            done, _ = await asyncio.wait(
                {probe, death}, timeout=check.timeout_s, return_when="FIRST_COMPLETED"
            )
        finally:
            for task in (probe, death):
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(probe, death, return_exceptions=True)
        if probe in done and probe.exception() is None:
            return probe.result()
        if death in done or not procs.alive(proc.pid, proc.start_ticks):
            self._reap(proc.pid)
            outcome = self._outcome(Path(state.dir), proc)
            raise RunError(f"{outcome} before it was ready; {self._tail_note(state, proc)}")
        raise RunError(
            f"not ready within {check.timeout_s:g}s ({self._describe_check(check)}); "
            f"{self._tail_note(state, proc)}"
        )

    @staticmethod
    def _describe_check(check: ReadyCheck) -> str:
        if check.kind == "http":
            return f"waiting for {check.url or 'its printed address'}{check.path} to answer 200"
        if check.kind == "file_line":
            return f"waiting for a first line in {check.path}"
        return "waiting for it to run"

    async def _probe(self, run_dir: Path, proc: ProcessState, check: ReadyCheck) -> str | None:
        if check.kind == "started":
            return None
        if check.kind == "file_line":
            path = run_dir / check.path
            while True:
                with contextlib.suppress(FileNotFoundError), path.open("rb") as f:
                    if b"\n" in f.read(1 << 20):
                        return None
                await asyncio.sleep(0.1)
        base = check.url
        timeout = aiohttp.ClientTimeout(total=5)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while True:
                if base is None:
                    base = printed_address(run_dir / proc.log)
                if base is not None:
                    with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                        async with session.get(base.rstrip("/") + check.path) as resp:
                            if resp.status == 200:
                                return base
                await asyncio.sleep(0.1)

    def _tail_note(self, state: RunState, proc: ProcessState, lines: int = 20) -> str:
        path = Path(state.dir) / proc.log
        return f"last lines of {path}:\n{log_tail(path, lines)}"

    def _outcome(self, run_dir: Path, proc: ProcessState) -> str:
        """How a finished process ended, from its supervisor's record."""
        code, sig = read_exit(run_dir / f"{proc.name}.exit.json")
        if sig is not None:
            return f"{proc.name} was killed by {sig}"
        if code is not None:
            return f"{proc.name} exited with code {code}"
        return f"{proc.name} (pid {proc.pid}) is gone without an exit status (its supervisor was killed too)"

    def _reap(self, pid: int | None) -> None:
        child = self._children.get(pid or -1)
        if child is not None and child.poll() is not None:
            del self._children[child.pid]

    # ----------------------------------------------------------------- watch
    async def status(self, run_id: str) -> RunState:
        """The run as it is now: ended processes get their exit status and reason; a crashed
        one fails the run (the rest are stopped); the main one finishing ends the run."""
        run_dir = self.run_dir(run_id)
        for pid in list(self._children):
            self._reap(pid)

        def reconcile(s: RunState) -> None:
            for p in s.processes:
                if p.ended or p.pid is None:
                    continue
                if procs.alive(p.pid, p.start_ticks):
                    continue
                self._settle(run_dir, s, p)
            self._conclude(s)

        state = self._update(run_id, reconcile)
        leftover = [p for p in state.processes if not p.ended and p.pid is not None]
        if state.status in {"finished", "failed"} and leftover:
            await self._terminate(run_id, grace_s=10.0)
            state = self._update(run_id, reconcile)
        return state

    def _settle(self, run_dir: Path, s: RunState, p: ProcessState) -> None:
        code, sig = read_exit(run_dir / f"{p.name}.exit.json")
        p.ended_at = time.time()
        p.exit_code, p.signal = code, sig
        if p.stop_signal is not None:
            p.status = "stopped"
            how = f"exited with code {code}" if code is not None else f"ended by {sig or 'SIGKILL'}"
            p.reason = f"stopped by the manager ({p.stop_signal}; {how})"
        elif code == 0:
            p.status, p.reason = "exited", "exited with code 0"
        elif code is None and sig is None:
            p.status = "vanished"
            p.reason = (
                f"pid {p.pid} is gone without an exit status (its supervisor was killed too: SIGKILL "
                f"from outside, the OOM killer?); last lines of {p.log}:\n{log_tail(run_dir / p.log)}"
            )
        else:
            p.status = "failed"
            how = f"was killed by {sig}" if sig is not None else f"exited with code {code}"
            p.reason = f"{how}; last lines of {p.log}:\n{log_tail(run_dir / p.log)}"

    @staticmethod
    def _conclude(s: RunState) -> None:
        if s.ended:
            return
        if s.status == "starting" and not procs.alive(s.starter_pid, s.starter_ticks):
            s.status = "failed"
            s.reason = (
                f"the manager that started the run (pid {s.starter_pid}) ended before every process was ready"
            )
            return
        if all(p.ended or p.pid is None for p in s.processes) and s.stop_requested:
            s.status, s.ended_at = "stopped", time.time()
            s.reason = s.reason or "stopped on request"
            return
        broken = next((p for p in s.processes if p.status in {"failed", "vanished"}), None)
        if broken is not None:
            s.status, s.reason = "failed", f"process {broken.name} {broken.reason}"
        elif s.main.status == "exited":
            s.status, s.reason = "finished", f"{s.main.name} exited with code 0"
        if s.status in {"failed", "finished"} and all(p.ended or p.pid is None for p in s.processes):
            s.ended_at = s.ended_at or time.time()

    async def list_runs(self) -> list[RunState]:
        return [await self.status(run_id) for run_id in self.run_ids()]

    # ----------------------------------------------------------------- stop
    async def stop(self, run_id: str, grace_s: float = 10.0) -> RunState:
        """SIGTERM to every live process group (main first), wait up to ``grace_s``, SIGKILL
        what is left; returns the final state (``stopped``)."""

        def request(s: RunState) -> None:
            s.stop_requested = True
            if not s.ended:
                s.status = "stopping"

        state = self._update(run_id, request)
        if not state.ended:
            await self._terminate(run_id, grace_s)
        return await self.status(run_id)

    async def _terminate(self, run_id: str, grace_s: float) -> None:
        state = self.read_state(run_id)
        live = [p for p in state.processes if p.pid is not None and not p.ended]
        live.sort(key=lambda p: not p.main)  # the trainer first: it may save a checkpoint
        sent = self._signal(run_id, live, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for p in sent:
            assert p.pid is not None
            await procs.wait_exit(p.pid, p.start_ticks, max(0.0, deadline - time.monotonic()))
        # The group outlives its leader when a grandchild ignores SIGTERM.
        # No pidfd tells when a whole group is gone: look again until the grace ends.
        while time.monotonic() < deadline and any(p.pgid and procs.group_members(p.pgid) for p in sent):  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        remaining = [p for p in sent if p.pgid and procs.group_members(p.pgid)]
        if remaining:
            self._signal(run_id, remaining, signal.SIGKILL)
            for p in remaining:
                assert p.pid is not None
                await procs.wait_exit(p.pid, p.start_ticks, 10.0)
        for p in sent:
            self._reap(p.pid)

    def _signal(self, run_id: str, targets: list[ProcessState], sig: signal.Signals) -> list[ProcessState]:
        """Signal each target's group if it is still ours (the leader's start time matches, or the
        leader is gone and members remain: a group id is not reused while it has members)."""
        sent = []
        for p in targets:
            assert p.pid is not None and p.pgid is not None
            # A gone leader's group id is still ours only while the pid is unused (the kernel does
            # not hand out a pid that is still some group's id) and members remain.
            if not procs.alive(p.pid, p.start_ticks) and (
                procs.start_ticks(p.pid) is not None or not procs.group_members(p.pgid)
            ):
                continue
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pgid, sig)
                sent.append(p)

        def mark(s: RunState) -> None:
            for p in sent:
                s.process(p.name).stop_signal = sig.name

        self._update(run_id, mark)
        return sent

    # ----------------------------------------------------------------- results
    def results(self, run_id: str) -> RunResults:
        """Metrics summary (first/last/min/max/mean of every numeric field), the last metrics
        line, checkpoint directories, and each process's log path."""
        state = self.read_state(run_id)
        run_dir = Path(state.dir)
        rows = read_metrics(run_dir / state.metrics_file)
        return RunResults(
            run_id=run_id,
            status=state.status,
            reason=state.reason,
            metric_lines=len(rows),
            last=rows[-1] if rows else {},
            metrics=metric_summaries(rows),
            checkpoints=[str(p) for p in find_checkpoints(run_dir)],
            logs={p.name: str(run_dir / p.log) for p in state.processes},
        )

    def logs(self, run_id: str, process: str | None = None, lines: int = 50) -> dict[str, str]:
        state = self.read_state(run_id)
        chosen = [state.process(process)] if process else state.processes
        return {p.name: log_tail(Path(state.dir) / p.log, lines) for p in chosen}
