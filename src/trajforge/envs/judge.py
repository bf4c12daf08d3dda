"""Judging a finished rollout in its own sandbox: what both env rollouts and graded batch lines
do, in the ``inspect`` hook of :func:`trajforge.agent.run_session` (after the loop, before the
sandbox is closed or reset).

In order: stop what the rollout left running (unless the env opted out: a service it must test),
clear the verifier's scratch space, put the verifier files in place, call ``compute_reward`` and
``keep`` under the env's reward deadline. A reward that raises (or times out) scores 0 with the
reason kept; a broken sandbox is re-raised (infrastructure: the sample fails and may be retried,
it is never scored).
"""

from __future__ import annotations

import asyncio
import logging
import shlex
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from trajforge.agent.result import AgentResult
from trajforge.envs.protocol import AgentEnv
from trajforge.envs.types import Item, RewardBreakdown
from trajforge.envs.verifier import _SCRATCH, VerifierContext
from trajforge.protocols import Sandbox, SupportsVerification
from trajforge.sandbox.errors import SandboxUnavailableError
from trajforge.tools.base import Tool

log = logging.getLogger(__name__)


@dataclass
class Judgement:
    breakdown: RewardBreakdown | None = None
    error: str | None = None
    kept: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def reward(self) -> float:
        return self.breakdown.reward if self.breakdown is not None else 0.0


async def judge(
    env: AgentEnv,
    item: Item,
    result: AgentResult,
    sandbox: Sandbox,
    *,
    tools: Mapping[str, Tool] | None = None,
    into: Judgement | None = None,
) -> Judgement:
    """Judge ``result`` from ``sandbox``; fills and returns ``into`` (or a new Judgement)."""
    judged = into if into is not None else Judgement()
    cfg = env.config
    t0 = time.monotonic()
    try:
        async with asyncio.timeout(cfg.reward_timeout_s):
            if isinstance(sandbox, SupportsVerification):
                if cfg.stop_processes_before_reward:
                    await sandbox.stop_processes()
                scratch = shlex.quote(f"{sandbox.scratch_dir}/{_SCRATCH}")
                await sandbox.exec_fresh(f"rm -rf -- {scratch}", timeout=60)
            ctx = VerifierContext(
                sandbox,
                tools=tools,
                default_timeout_s=cfg.reward_timeout_s,
                max_read_bytes=cfg.max_read_bytes,
            )
            for path, content in env.verifier_files(item).items():
                await ctx.write_file(path, content)
            judged.breakdown = RewardBreakdown.of(await env.compute_reward(item, result, ctx))
            judged.kept = await env.keep(item, result, ctx)
    except SandboxUnavailableError:
        raise
    except Exception as exc:  # reward code is the user's: its failure scores 0, with the reason
        judged.error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        judged.breakdown = RewardBreakdown(reward=0.0, reason=f"reward failed: {judged.error}")
        log.warning("reward of %s failed: %s", env.item_id(item), judged.error)
    judged.seconds = time.monotonic() - t0
    return judged


def registry_tools(registry: Any) -> dict[str, Tool]:
    """Every tool of a registry by name (what ``VerifierContext.call_tool`` can call)."""
    return {n: t for n in registry.names() if (t := registry.get(n)) is not None}
