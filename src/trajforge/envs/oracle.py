"""Agents that are not models: the ``oracle`` (runs the task's reference solution) and ``none``
(does nothing). Task authors use them to validate tasks: the oracle must score 1.0 and the
do-nothing agent 0.0, or the task (or its verifier) is broken.

Both are :class:`~trajforge.protocols.ChatModel`s, so they run through the same rollout, sandbox
and verifier as a real model. An env offers an oracle by defining ``oracle_command(item) -> str``
(one shell command that applies its reference solution in the sandbox);
:func:`oracle_model_for` turns that into the per-item ``model_for`` of
:class:`~trajforge.envs.episode.RolloutBackends`.
"""

from __future__ import annotations

import base64
import shlex
from collections.abc import Mapping
from typing import Any

import orjson

from trajforge.envs.episode import ModelFor
from trajforge.envs.protocol import AgentEnv
from trajforge.envs.types import Item
from trajforge.llm.types import AssistantTurn, SamplingParams, ToolCall
from trajforge.protocols import ChatModel

TERMINAL = "terminal"


class OracleModel:
    """Makes one ``terminal`` call running ``command``, then answers. Stateless: it looks at the
    conversation to know whether its call was made (so one instance serves any number of
    rollouts). Without a ``terminal`` tool on offer it answers at once, saying so."""

    def __init__(self, command: str, *, timeout_s: float | None = None, name: str = "oracle") -> None:
        self._command = command
        self._timeout_s = timeout_s
        self._name = name

    @property
    def name(self) -> str:
        return self._name

    async def complete(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        sampling: SamplingParams | None = None,
    ) -> AssistantTurn:
        offered = {(t.get("function") or {}).get("name") for t in tools or []}
        if TERMINAL not in offered:
            return AssistantTurn(content="oracle: no terminal tool is offered", finish_reason="stop")
        if any(m.get("role") == "assistant" for m in messages):
            results = [m for m in messages if m.get("role") == "tool"]
            tail = str(results[-1].get("content", ""))[-400:] if results else ""
            return AssistantTurn(content=f"oracle: ran the reference solution.\n{tail}", finish_reason="stop")
        args: dict[str, Any] = {"command": self._command}
        if self._timeout_s is not None:
            args["timeout"] = self._timeout_s
        call = ToolCall(id="call_oracle_1", name=TERMINAL, arguments=orjson.dumps(args).decode())
        return AssistantTurn(tool_calls=[call], finish_reason="tool_calls")

    async def aclose(self) -> None:
        return None


class NothingModel:
    """The do-nothing agent: answers at once, touches nothing."""

    name = "none"

    async def complete(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        sampling: SamplingParams | None = None,
    ) -> AssistantTurn:
        return AssistantTurn(content="I will not do anything.", finish_reason="stop")

    async def aclose(self) -> None:
        return None


def oracle_model_for(env: AgentEnv) -> ModelFor:
    """``model_for`` of an env whose items carry a reference solution (``oracle_command``);
    raises ValueError for an env without one."""
    command_of = getattr(env, "oracle_command", None)
    if not callable(command_of):
        raise ValueError(f"env {env.name!r} has no oracle (it defines no oracle_command(item))")
    timeout_of = getattr(env, "oracle_timeout_s", None)

    def model_for(_env: AgentEnv, item: Item) -> ChatModel:
        timeout = timeout_of(item) if callable(timeout_of) else None
        return OracleModel(str(command_of(item)), timeout_s=timeout)

    return model_for


def nothing_model_for(env: AgentEnv) -> ModelFor:
    """``model_for`` of the do-nothing agent (any env)."""
    model = NothingModel()
    return lambda _env, _item: model


def write_files_command(files: Mapping[str, bytes], base: str = ".") -> str:
    """A shell command that writes ``files`` (paths relative to ``base``) byte-exact, with
    ``mkdir -p`` for their directories (base64 in the command: no quoting or heredoc hazards)."""
    steps = []
    for rel, data in files.items():
        path = shlex.quote(f"{base.rstrip('/')}/{rel}")
        encoded = base64.b64encode(data).decode()
        steps.append(f'mkdir -p "$(dirname {path})" && printf %s {encoded} | base64 -d > {path}')
    return " && ".join(steps) or "true"
