"""Agents that are not a model: ``oracle`` (the item's own reference solution) and ``none``.

Task authors validate an env with them: the oracle must score 1.0 and doing nothing 0.0 on every
item, or the task or its verifier is wrong. Both are :class:`~trajforge.protocols.ChatModel`\\ s,
so they go through the same agent loop, tools, sandboxes and verifiers as a real model.

An env supports the oracle by defining ``oracle_calls(item) -> list[(tool name, arguments)]``
(the tool calls of its reference solution) and optionally ``oracle_answer(item, messages)`` (the
final answer, built from what the tools printed), ``oracle_reasoning(item, messages)`` (the
reasoning of the next turn, given the conversation so far), or ``oracle_model_for`` for anything
else.

Why reasoning and argument layout matter: an oracle trajectory is also *training data* (``rl
train --guide oracle`` puts it into groups the policy never solves). If its turns are written in
another style than the policy's own — no ``<think>`` block where the policy always thinks, compact
JSON where the policy writes ``{"path": "x"}`` — every one of those tokens is off-policy and
the update pulls the policy toward the oracle's style, not only toward the one token it got
wrong. So an env whose policy was taught with reasoning gives the oracle the same reasoning, and
arguments are serialised the way ``json.dumps`` writes them (``", "`` and ``": "``), the layout
of trajforge's own synthetic data and of most chat templates' ``tojson``.
"""

from __future__ import annotations

import base64
import itertools
import json
import shlex
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from trajforge.envs.hooks import (
    oracle_answer_hook,
    oracle_calls_hook,
    oracle_model_for_hook,
    oracle_reasoning_hook,
)
from trajforge.envs.protocol import AgentEnv
from trajforge.envs.running.episode import ModelFor
from trajforge.envs.types import Item
from trajforge.llm.types import AssistantTurn, SamplingParams, ToolCall

_ids = itertools.count(1)


class OracleModel:
    """Makes the given tool calls, one per turn, then answers ``done``."""

    def __init__(
        self,
        calls: Sequence[tuple[str, dict[str, Any]]],
        name: str = "oracle",
        answer: Callable[[list[dict[str, Any]]], str] | None = None,
        reasoning: Callable[[list[dict[str, Any]]], str | None] | None = None,
    ) -> None:
        self._calls = list(calls)
        self._name = name
        self._answer = answer
        self._reasoning = reasoning

    @property
    def name(self) -> str:
        return self._name

    async def complete(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        sampling: SamplingParams | None = None,
    ) -> AssistantTurn:
        turn = sum(m.get("role") == "assistant" for m in messages)
        reasoning = self._reasoning(messages) if self._reasoning is not None else None
        if turn < len(self._calls):
            tool, args = self._calls[turn]
            offered = {(t.get("function") or {}).get("name") for t in tools or []}
            if tool not in offered:  # the env's toolsets leave the solution's tool out: say so
                return AssistantTurn(content=f"oracle: the {tool} tool is not offered", finish_reason="stop")
            arguments = json.dumps(args, ensure_ascii=False)
            call = ToolCall(id=f"oracle_{next(_ids)}", name=tool, arguments=arguments)
            return AssistantTurn(
                tool_calls=[call], finish_reason="tool_calls", model=self._name, reasoning=reasoning
            )
        content = self._answer(messages) if self._answer is not None else "done"
        return AssistantTurn(content=content, finish_reason="stop", model=self._name, reasoning=reasoning)

    async def aclose(self) -> None:
        return None


class NoAgent(OracleModel):  # (also known as the do-nothing agent)
    """Answers at once and touches nothing: the floor every verifier must score 0."""

    def __init__(self) -> None:
        super().__init__([], name="none")


def agent_model_for(env: AgentEnv, agent: str) -> ModelFor:
    """The per-item model of ``agent`` ("oracle" or "none") for ``env``; a ValueError says why an
    env has no oracle."""
    if agent == "none":
        return lambda _env, _item: NoAgent()
    if agent != "oracle":
        raise ValueError(f"unknown agent {agent!r}: use model, oracle or none")
    custom = oracle_model_for_hook(env)
    if custom is not None:
        made = custom()
        if callable(made):
            return made
    calls = oracle_calls_hook(env)
    if calls is None:
        raise ValueError(
            f"env {env.name!r} has no reference solutions (no oracle_calls): --agent oracle cannot run"
        )

    final = oracle_answer_hook(env)
    think = oracle_reasoning_hook(env)

    def model_for(_env: AgentEnv, item: Item) -> OracleModel:
        if not item:
            return OracleModel([])
        answer = (lambda messages: str(final(item, messages))) if final is not None else None
        reasoning = (lambda messages: think(item, messages)) if think is not None else None
        return OracleModel(calls(item), answer=answer, reasoning=reasoning)

    return model_for


def oracle_model_for(env: AgentEnv) -> ModelFor:
    return agent_model_for(env, "oracle")


def nothing_model_for(env: AgentEnv) -> ModelFor:
    return agent_model_for(env, "none")


def write_files_command(files: Mapping[str, bytes], base: str = ".") -> str:
    """A shell command that writes ``files`` (paths relative to ``base``) byte-exact, with
    ``mkdir -p`` for their directories (base64 in the command: no quoting or heredoc hazards).
    What an oracle runs to put a reference solution in place."""
    steps = []
    for rel, data in files.items():
        path = shlex.quote(f"{base.rstrip('/')}/{rel}")
        encoded = base64.b64encode(data).decode()
        steps.append(f'mkdir -p "$(dirname {path})" && printf %s {encoded} | base64 -d > {path}')
    return " && ".join(steps) or "true"


NothingModel = NoAgent
