"""One rollout: draw -> sandbox -> session -> judge -> trace -> status -> one typed result.

The batch factory (``batch/scheduler.py``'s ``Worker``) and the environments (``envs/episode.py``'s
``Rollouts``, and through them ``env eval``, the Atropos/TRL/verifiers adapters, the trainers and
both Ray backends) each used to do these steps in their own words and write their own record.
Now both call :func:`run_rollout` and turn its :class:`RolloutOutcome` into the one
:class:`~trajforge.record.Record` with :func:`trajforge.rollout.records.build_record`: a change to
how a rollout runs or what it records is made here, once.

What the step does not know: where the prompt came from (a dataset row, an env item), how the
reward is computed (a :class:`Judge`, the env's, handed in), and where the record goes.
"""

from __future__ import annotations

import asyncio
import random
import time
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from trajforge.agent import AgentConfig, AgentResult, Termination, run_session
from trajforge.agent.session import Closer
from trajforge.distributions import Distribution, sample_toolsets
from trajforge.llm.chat_template import ChatTemplate
from trajforge.llm.token_trace import TraceError, TurnSpan
from trajforge.protocols import ChatModel, Sandbox, SandboxFactory
from trajforge.record import Reward, TokenRecord
from trajforge.rollout.status import Outcome, classify
from trajforge.sandbox.confined import DataPathError
from trajforge.sandbox.errors import SandboxUnavailableError
from trajforge.tools.base import Tool
from trajforge.tools.registry import ToolRegistry

HARD_DEADLINE_GRACE_S = 30.0
"""What a caller adds to the session's own timeout (which should fire first) for ``hard_deadline_s``."""


class Judge(Protocol):
    """Scores a finished session in its own sandbox, after the loop ended and before the sandbox
    is closed (or reset for reuse). Never raises for what the rollout did: a reward that failed
    is a :class:`~trajforge.record.Reward` with ``error``, one that could not be judged a reward
    whose value is None; an exception here means the sandbox broke."""

    async def __call__(self, result: AgentResult, sandbox: Sandbox) -> Reward: ...


def draw_toolsets(
    seed: int,
    *,
    distribution: Distribution | str | None = None,
    enabled: Sequence[str] | None = None,
    disabled: Sequence[str] = (),
) -> list[str]:
    """The toolsets one rollout is offered: drawn from ``distribution`` with ``random.Random(seed)``
    (recorded, so a resume or a replay draws the same), else ``enabled``; minus ``disabled``."""
    drawn = sample_toolsets(distribution, random.Random(seed)) if distribution else list(enabled or ())
    return [t for t in drawn if t not in disabled]


@dataclass
class RolloutRequest:
    """One rollout to run. ``prompt`` is the user turn (or the opening messages)."""

    prompt: str | list[dict[str, Any]]
    seed: int
    toolsets: list[str]
    agent: AgentConfig
    task_id: str
    image: str | None = None
    cwd: str | None = None
    setup_files: Mapping[str, str | bytes] | None = None
    judge: Judge | None = None
    filters: bool = False
    """Apply the trajectory filters to a finished answer (a hit is status ``filtered``)."""
    require_reasoning: bool = False
    hard_deadline_s: float | None = None
    """The whole step's deadline (sandbox start, session, judge); past it the rollout fails as
    ``sample_timeout``. None: the session's own timeout and the judge's are the only ones."""


@dataclass
class RolloutBackends:
    """What a rollout runs on. ``template`` (the model's chat template) makes token traces carry a
    drift report; a token-level model (``CompletionChatModel``) brings its own."""

    model: ChatModel
    factory: SandboxFactory
    registry: ToolRegistry
    template: ChatTemplate | None = None
    closer: Closer | None = None


@dataclass
class RolloutOutcome:
    """Everything a record is made of, however the rollout ended. ``transient``: an
    infrastructure failure a retry may fix (the batch factory retries it, with backoff)."""

    outcome: Outcome
    result: AgentResult | None
    tools: list[Tool]
    schemas: list[dict[str, Any]]
    reward: Reward | None = None
    """The judge's reward, whole (None: no judge, or it never got to run)."""
    trace: TokenRecord | None = None
    trace_error: str | None = None
    transient: bool = False
    started_at: float = field(default_factory=time.time)
    finished_at: float = field(default_factory=time.time)
    judged: bool = False
    """A judge was asked (whether or not it got to run)."""
    reward_s: float = 0.0
    """How long the judge took (execution provenance: the record's ``timings.reward_s``)."""


async def run_rollout(request: RolloutRequest, backends: RolloutBackends) -> RolloutOutcome:
    """Run ``request``: its own sandbox, the agent loop, the judge inside the sandbox, the token
    trace, the status. Never raises for the rollout's own failures: a row or item that cannot run,
    a sandbox that would not start, a bug -- each is an outcome with a reason."""
    started = time.time()
    tools = backends.registry.for_toolsets(request.toolsets)
    schemas = backends.registry.schemas(tools)
    rewards: list[Reward] = []
    judged_s: list[float] = []
    judge = request.judge

    async def inspect(result: AgentResult, sandbox: Sandbox) -> None:
        assert judge is not None
        t0 = time.monotonic()
        try:
            rewards.append(await judge(result, sandbox))
        finally:
            judged_s.append(time.monotonic() - t0)

    deadline = asyncio.timeout(request.hard_deadline_s)
    try:
        async with deadline:
            result = await run_session(
                request.prompt,
                model=backends.model,
                tools=tools,
                sandbox_factory=backends.factory,
                config=request.agent,
                task_id=request.task_id,
                image=request.image,
                cwd=request.cwd,
                setup_files=request.setup_files,
                closer=backends.closer,
                inspect=inspect if judge is not None else None,
            )
    except Exception as exc:
        outcome, transient = failure(exc, hard_deadline=deadline.expired())
        return RolloutOutcome(
            outcome, None, tools, schemas, transient=transient, started_at=started, judged=judge is not None
        )
    reward = rewards[0] if rewards else None
    trace, trace_error = _trace(result, backends, schemas)
    offered = [t.name for t in tools]
    outcome = classify(result, offered, filters=request.filters, require_reasoning=request.require_reasoning)
    transient = result.termination is Termination.MODEL_ERROR and result.error_kind == "transient"
    return RolloutOutcome(
        outcome,
        result,
        tools,
        schemas,
        reward,
        trace,
        trace_error,
        transient,
        started_at=started,
        judged=judge is not None,
        reward_s=judged_s[0] if judged_s else 0.0,
    )


def _trace(
    result: AgentResult, backends: RolloutBackends, schemas: list[dict[str, Any]]
) -> tuple[TokenRecord | None, str | None]:
    """The exact tokens of a token-level run; why not, when they broke."""
    if not result.token_traces:
        return None, None
    template = getattr(backends.model, "template", None) or backends.template
    try:
        et = result.episode_trace(template, tools=schemas)
    except TraceError as exc:
        return None, str(exc)
    return TokenRecord(
        tokens=et.tokens,
        masks=et.masks,
        logprobs=et.logprobs,
        span_versions=_span_versions(et.spans),
    ), None


def _span_versions(spans: list[TurnSpan]) -> list[tuple[int, int, int]] | None:
    """Each sampled turn's ``(start, end, version)``, or None unless the server named every one."""
    if not spans or any(s.model_version is None for s in spans):
        return None
    return [(s.start, s.end, int(s.model_version or 0)) for s in spans]


def failure(exc: Exception, *, hard_deadline: bool) -> tuple[Outcome, bool]:
    """(the outcome, whether a retry may help) of a rollout that raised: a path the row or item
    names that cannot be used (a cwd swapped for a link, a bad setup file name) is bad data, never
    retried; a sandbox that could not start may be retried; a bug is recorded as data."""
    if isinstance(exc, DataPathError):
        return Outcome("failed", f"bad_row: {exc}", "bad_row"), False
    if isinstance(exc, TimeoutError) and hard_deadline:
        return Outcome("failed", "sample_timeout: hard deadline passed", "sample_timeout"), False
    if isinstance(exc, (TimeoutError, SandboxUnavailableError, OSError)):
        return Outcome("failed", f"sandbox_unavailable: {exc}", "sandbox_unavailable"), True
    tb = traceback.format_exception_only(exc)[-1].strip()
    return Outcome("failed", f"internal_error: {tb}", "internal_error"), False
