"""Judging a finished rollout in its own sandbox: what both env rollouts and graded batch lines
do, in the ``inspect`` hook of :func:`trajforge.agent.run_session` (after the loop, before the
sandbox is closed or reset).

In order: stop what the rollout left running (unless the env opted out: a service it must test,
or asked for its reward commands in the rollout's own shell session, ``reward_shell: session``),
clear the verifier's scratch space, put the verifier files in place (each top-level directory
they go into removed whole first: see :func:`hidden_dirs`), call ``compute_reward`` and
``keep`` under the env's reward deadline. A reward that raises (or times out) scores 0 with the
reason kept; a broken sandbox is re-raised (infrastructure: the sample fails and may be retried,
it is never scored).
"""

from __future__ import annotations

import asyncio
import logging
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from trajforge.agent.result import AgentResult, Termination
from trajforge.envs.protocol import AgentEnv
from trajforge.envs.types import Item
from trajforge.envs.verifier import _SCRATCH, VerifierContext, VerifierPlacementError
from trajforge.protocols import Sandbox, SupportsVerification
from trajforge.record import Reward
from trajforge.rollout import Outcome, RolloutOutcome
from trajforge.sandbox.errors import SandboxUnavailableError
from trajforge.tools.base import Tool

log = logging.getLogger(__name__)


async def judge(
    env: AgentEnv,
    item: Item,
    result: AgentResult,
    sandbox: Sandbox,
    *,
    tools: Mapping[str, Tool] | None = None,
) -> Reward:
    """Judge ``result`` from ``sandbox``: the env's reward, with what it kept (``keep``); a reward
    code that raised scores 0 with its error."""
    cfg = env.config
    try:
        async with asyncio.timeout(cfg.reward_timeout_s):
            session = cfg.reward_shell == "session"  # the service the reward checks must live
            stop = cfg.stop_processes_before_reward and not session
            if isinstance(sandbox, SupportsVerification):
                if stop:
                    await sandbox.stop_processes()
                scratch = shlex.quote(f"{sandbox.scratch_dir}/{_SCRATCH}")
                await sandbox.exec_fresh(f"rm -rf -- {scratch}", timeout=60)
            ctx = VerifierContext(
                sandbox,
                tools=tools,
                default_timeout_s=cfg.reward_timeout_s,
                stop_leftovers=stop,
                max_read_bytes=cfg.max_read_bytes,
                shell=cfg.reward_shell,
            )
            files = env.verifier_files(item)
            for top in hidden_dirs(files, ctx.workdir):
                await ctx.exec(["rm", "-rf", "--", f"{ctx.workdir}/{top}"])
            for path, content in files.items():
                await ctx.write_file(path, content)
            if await ctx.exists(".git/HEAD") or await ctx.exists(".git"):  # a repo, or a gitdir file
                await ctx.exec(SCRUB_GIT_CONFIG)
            reward = Reward.of(await env.compute_reward(item, result, ctx))
            kept = await env.keep(item, result, ctx)
            if ctx.setup_errors:  # raised in the reward code, whatever it did with it
                raise VerifierPlacementError(ctx.setup_errors[0])
            # A copy, the record's own: an env may hand back an object it keeps and edits for
            # its next rollout (a module-level breakdown), which must not rewrite this one's.
            return reward.model_copy(deep=True, update={"kept": dict(kept)} if kept else None)
    except SandboxUnavailableError:
        raise
    except Exception as exc:  # reward code is the user's: its failure scores 0, with the reason
        error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        log.warning("reward of %s failed: %s", env.item_id(item), error)
        return Reward.failed(error)


# The repository's own git config is the model's: settings in it that make git run a program
# (fsmonitor, hooks, pager, editor, external diff, diff/filter/merge drivers, includes, aliases,
# credential helpers, ...) are removed before any verifier command runs, so a verifier that
# runs ``git diff`` or ``git status`` in the workdir runs no model code. (Every verifier command
# also overrides the fixed-name ones itself: ``verifier.GIT_OVERRIDES``.)
SCRUB_GIT_CONFIG = r"""
[ -e .git ] || exit 0
git config --local --no-includes --name-only --list 2>/dev/null \
  | grep -iE '^(core\.(fsmonitor|hookspath|pager|editor|sshcommand|askpass|gitproxy|attributesfile|excludesfile)|diff\.external|diff\..+\.(command|textconv)|filter\..+|merge\..+\.driver|include\.path|includeif\..+|alias\..+|pager\..+|credential\..*|gpg\..*program|sequence\.editor|interactive\.difffilter|uploadpack\..+|receive\..+|sendemail\..+)$' \
  | sort -u | while read -r key; do git config --local --unset-all "$key"; done
exit 0
"""


def hidden_dirs(files: Mapping[str, Any], workdir: str) -> list[str]:
    """The workdir's top-level directories that verifier files go into: each is removed whole
    before they are written, so nothing the rollout put beside them survives (a ``conftest.py``,
    an ``__init__.py``, a ``__pycache__`` of planted bytecode, another test file)."""
    tops = set()
    for path in files:
        p = PurePosixPath(path)
        if p.is_absolute():
            if not p.is_relative_to(workdir):
                continue
            p = p.relative_to(workdir)
        if len(p.parts) > 1 and p.parts[0] not in ("..", "."):
            tops.add(p.parts[0])
    return sorted(tops)


@dataclass
class EnvJudge:
    """An env's judgement of one item as the rollout step's :class:`~trajforge.rollout.Judge`:
    what ``env eval`` and ``batch --env`` both hand to :func:`trajforge.rollout.run_rollout`."""

    env: AgentEnv
    item: Item
    tools: Mapping[str, Tool] | None = None

    async def __call__(self, result: AgentResult, sandbox: Sandbox) -> Reward:
        if never_reached(result):  # nothing of the model's to judge: no reward, not a 0
            return Reward.not_judged(f"not judged: the model was never reached ({result.termination.value})")
        return await judge(self.env, self.item, result, sandbox, tools=self.tools)


def never_reached(result: AgentResult) -> bool:
    """Whether the session ended without one answer from the model (its first request was
    refused: a prompt or ``max_tokens`` over the context, an endpoint that kept failing). Such an
    episode failed to run; scoring what the sandbox holds would count it as a completed 0."""
    return result.api_calls == 0 and result.termination is not Termination.FINAL_ANSWER


MODEL_NOT_REACHED = "model_not_reached"
"""The reason kind of an episode whose model never answered (see :func:`never_reached`): status
``failed``, no reward, left out of the rates as an episode that could not run."""


def mark_never_reached(done: RolloutOutcome) -> None:
    """An env rollout whose model never answered failed to run (:data:`MODEL_NOT_REACHED`); it is
    not a judged 0. Every env front end (``Rollouts``, a seed env's own loop) says it so."""
    if done.result is not None and never_reached(done.result):
        done.outcome = Outcome(
            "failed", f"the model was never reached: {done.outcome.reason}", MODEL_NOT_REACHED
        )


def registry_tools(registry: Any) -> dict[str, Tool]:
    """Every tool of a registry by name (what ``VerifierContext.call_tool`` can call)."""
    return {n: t for n in registry.names() if (t := registry.get(n)) is not None}
