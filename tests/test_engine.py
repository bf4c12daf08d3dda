"""The one engine (``trajforge.engine``): plans in, records out, on a real bwrap sandbox factory.

Both front ends (``batch``'s planner, ``env eval``'s ``Rollouts``) are tested through their own
suites; these pin what the engine alone promises: retries as the policy says, slots that bound
and resize the rollouts in flight, jobs pulled as slots free, background teardowns that have all
finished when the engine stops (also when the run stops on an error), and errors that come out
as they were raised.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from trajforge.agent import AgentConfig
from trajforge.engine import Engine, Plan, Ran, RetryPolicy
from trajforge.llm.types import AssistantTurn, SamplingParams
from trajforge.rollout import Asked, Identity, RolloutBackends, RolloutRequest
from trajforge.sandbox.confined import DataPathError
from trajforge.sandbox.errors import SandboxUnavailableError
from trajforge.testing.scripted_model import ScriptedModel, answer, tool_turn
from trajforge.tools.builtin import default_registry


class Gauge:
    """A scripted model that runs one command in the sandbox, then answers (each call after
    ``delay_s``), and counts calls in flight."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.inner = ScriptedModel(_one_command, delay_s=delay_s)
        self.in_flight = 0
        self.peak = 0
        self.answered = 0

    @property
    def name(self) -> str:
        return "gauge"

    async def complete(
        self, messages: list[dict[str, Any]], tools: Any = None, sampling: SamplingParams | None = None
    ) -> AssistantTurn:
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            return await self.inner.complete(messages, tools, sampling)
        finally:
            self.in_flight -= 1
            self.answered += 1

    async def aclose(self) -> None:
        pass


def _one_command(messages: list[dict[str, Any]], _tools: Any, _sampling: Any) -> AssistantTurn:
    if any(m["role"] == "tool" for m in messages):
        return answer("done")
    return tool_turn(("terminal", {"command": "echo hi"}))


class _Counted:
    """A sandbox whose close is counted (everything else is the real one's)."""

    def __init__(self, inner: Any, owner: Counting) -> None:
        self._inner = inner
        self._owner = owner

    async def close(self) -> None:
        try:
            await self._inner.close()
        finally:
            self._owner.closed += 1
        if self._owner.fail_close:
            raise OSError(5, "the sandbox's directory could not be removed")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class Counting:
    """A real factory whose first ``fail`` creates raise ``SandboxUnavailableError`` (a sandbox
    that could not start: infrastructure, retried) and whose sandboxes' closes are counted."""

    def __init__(self, inner: Any, *, fail: int = 0) -> None:
        self.inner = inner
        self.fail = fail
        self.creates = 0
        self.created = 0
        self.closed = 0
        self.fail_close = False

    async def create(self, task_id: str, *, image: str | None = None, cwd: str | None = None) -> Any:
        self.creates += 1
        if self.creates <= self.fail:
            raise SandboxUnavailableError(f"no sandbox for {task_id} (try {self.creates})")
        sandbox = await self.inner.create(task_id, image=image, cwd=cwd)
        self.created += 1
        return _Counted(sandbox, self)


def _plan(n: int, *, bad_path: bool = False, judged: bool = False) -> Plan:
    agent = AgentConfig(max_turns=3)

    def request(attempt: int) -> RolloutRequest:
        if bad_path:
            raise DataPathError("setup file '../etc/passwd' leaves the workdir")
        return RolloutRequest(f"job {n}", n, ["terminal"], agent, task_id=f"job{n}-{attempt}")

    return Plan(
        Identity(key=f"k{n}", item={"prompt": f"job {n}"}, prompt_index=n),
        Asked("gauge"),
        n,
        ["terminal"],
        request,
        judged=judged,
    )


def _engine(model: Any, factory: Any, *, slots: int = 1, retry: RetryPolicy | None = None) -> Engine:
    return Engine(RolloutBackends(model, factory, default_registry()), slots, retry or RetryPolicy())


async def test_an_infrastructure_failure_is_tried_again_as_the_policy_says(bwrap: Any) -> None:
    once = Counting(bwrap, fail=1)
    ran = await _engine(Gauge(), once, retry=RetryPolicy(3, backoff_s=0.01)).run(_plan(0))
    assert (ran.attempts, ran.record.attempts, ran.record.status) == (2, 2, "completed"), ran.record.reason
    assert once.creates == 2 and once.closed == 1

    never = Counting(bwrap, fail=99)
    ran = await _engine(Gauge(), never, retry=RetryPolicy(3, backoff_s=0.01)).run(_plan(1))
    assert ran.attempts == 3 and ran.record.status == "failed"
    assert ran.record.reason_kind == "sandbox_unavailable"
    assert ran.record.reason.endswith("(gave up after 3 attempts)"), ran.record.reason

    # No policy (an env evaluation): one attempt, the outcome as it came.
    one = Counting(bwrap, fail=99)
    ran = await _engine(Gauge(), one).run(_plan(2))
    assert one.creates == 1 and ran.attempts == 1 and ran.record.status == "failed"
    assert "gave up" not in ran.record.reason


async def test_a_path_the_row_names_is_its_failure_and_never_retried(bwrap: Any) -> None:
    factory = Counting(bwrap)
    engine = _engine(Gauge(), factory, retry=RetryPolicy(5, backoff_s=0.01))
    ran = await engine.run(_plan(0, bad_path=True, judged=True))
    assert ran.attempts == 1 and factory.creates == 0
    assert (ran.record.status, ran.record.reason_kind) == ("failed", "bad_row")
    assert "leaves the workdir" in ran.record.reason
    reward = ran.record.reward
    assert reward is not None and reward.value is None and reward.reason.startswith("not judged"), reward


async def test_jobs_are_pulled_as_slots_free_and_never_exceed_them(bwrap: Any) -> None:
    model = Gauge(delay_s=0.2)
    factory = Counting(bwrap)
    engine = _engine(model, factory, slots=3)
    pulled: list[int] = []
    pulled_at_first_done: list[int] = []
    finished: list[str] = []

    def jobs() -> Iterator[int]:
        for n in range(12):
            pulled.append(n)
            yield n

    def done(job: int, ran: Ran) -> None:
        if not finished:
            pulled_at_first_done.append(len(pulled))
        finished.append(ran.record.key)
        assert ran.record.status == "completed", ran.record.reason

    started: list[int] = []
    await engine.run_all(jobs(), _plan, done, started=started.append)
    assert sorted(finished) == sorted(f"k{n}" for n in range(12)) and started == list(range(12))
    assert model.peak == 3, model.peak  # the three slots were used, never more
    assert pulled_at_first_done[0] <= 4, pulled_at_first_done  # a job is pulled when a slot frees
    assert factory.closed == factory.created == 12  # every teardown finished before run_all returned


async def test_finished_teardowns_are_not_kept(bwrap: Any) -> None:
    """A run of a million rollouts must not keep a million finished teardown tasks."""
    engine = _engine(Gauge(), Counting(bwrap), slots=2)
    held: list[int] = []

    def done(job: int, ran: Ran) -> None:
        held.append(len(engine._teardowns or ()))

    await engine.run_all(range(16), _plan, done)
    assert len(held) == 16 and max(held) <= 4, held  # the ones in flight, never all of them


async def test_a_teardown_that_failed_is_raised_when_the_engine_stops(bwrap: Any) -> None:
    factory = Counting(bwrap)
    factory.fail_close = True
    engine = _engine(Gauge(), factory, slots=2)
    finished: list[int] = []
    with pytest.raises(OSError, match="could not be removed"):
        async with engine.running():
            await asyncio.gather(*(engine.run(_plan(n)) for n in range(4)))
            finished.append(4)
    assert finished == [4] and factory.closed == 4  # every rollout ran and every close was tried


async def test_slots_resize_while_running(bwrap: Any) -> None:
    model = Gauge(delay_s=0.3)
    engine = _engine(model, Counting(bwrap), slots=1)
    peaks: list[int] = []

    async def grow(job: int, ran: Ran) -> None:
        peaks.append(model.peak)
        if job == 0:
            await engine.resize(4)

    await engine.run_all(range(9), _plan, grow)
    assert peaks[0] == 1 and model.peak == 4, (peaks, model.peak)
    assert engine.report()["size"] == 4


async def test_an_error_in_done_stops_the_run_and_every_sandbox_still_closes(bwrap: Any) -> None:
    factory = Counting(bwrap)
    engine = _engine(Gauge(delay_s=0.1), factory, slots=2)

    def done(job: int, ran: Ran) -> None:
        if job == 1:
            raise OSError(28, "No space left on device")

    with pytest.raises(ExceptionGroup) as caught:
        await engine.run_all(range(50), _plan, done)
    assert caught.group_contains(OSError)
    assert factory.created < 50  # stopped early
    assert factory.closed == factory.created  # nothing left running past the engine


async def test_running_lets_an_error_out_as_it_was_raised(bwrap: Any) -> None:
    """An evaluation refused for its run directory must say so, not as an exception group."""
    factory = Counting(bwrap)
    engine = _engine(Gauge(), factory)
    with pytest.raises(ValueError, match="holds another evaluation"):
        async with engine.running():
            await engine.run(_plan(0))
            raise ValueError("run holds another evaluation")
    assert factory.closed == factory.created == 1


async def test_outside_running_a_rollout_closes_its_sandbox_before_it_returns(bwrap: Any) -> None:
    factory = Counting(bwrap)
    engine = _engine(Gauge(), factory)
    await engine.run(_plan(0))
    assert factory.closed == 1
    async with engine.running():
        await asyncio.gather(engine.run(_plan(1)), engine.run(_plan(2)))
    assert factory.closed == 3
