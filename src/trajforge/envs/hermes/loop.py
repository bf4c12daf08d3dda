"""The seed's ``environments.agent_loop``: ``HermesAgentLoop``, ``AgentResult``, ``ToolError``.

A seed benchmark env's ``evaluate()`` runs its tasks itself::

    agent = HermesAgentLoop(server=self.server, tool_schemas=tools, valid_tool_names=names,
                            max_turns=..., task_id=task_id, temperature=..., max_tokens=...)
    result = await agent.run(messages)

Here ``run`` is one trajforge rollout (:meth:`.runtime.SeedRuntime.run_loop`): a sandbox of the
run's factory for ``task_id``, trajforge's agent loop with the offered tools that are trajforge
tools, the run's model; the sandbox then stays open for ``ToolContext(task_id)`` until the env
cleans the task up. ``messages`` is extended in place, as the seed does, and the seed's
``AgentResult`` is returned. Each run is an episode of the evaluation's record.
"""

from __future__ import annotations

import concurrent.futures
import uuid
from typing import Any

from trajforge.agent.result import AgentResult as _TrajforgeResult
from trajforge.agent.result import ToolErrorRecord
from trajforge.envs.hermes import runtime as _runtime
from trajforge.envs.hermes.server import SeedServer

ToolError = ToolErrorRecord
"""The seed's record of a failed tool call (``turn``, ``tool_name``, ``arguments``, ``error``,
``tool_result``): the same fields."""


class AgentResult(_TrajforgeResult):
    """The seed's ``AgentResult``: trajforge's (``messages``, ``turns_used``,
    ``finished_naturally``, ``reasoning_per_turn``, ``tool_errors`` are the same fields) plus
    ``managed_state``, which is None here: an exact-token run keeps its tokens in
    ``token_traces`` instead."""

    managed_state: dict[str, Any] | None = None

    @classmethod
    def of(cls, result: _TrajforgeResult) -> AgentResult:
        if isinstance(result, AgentResult):
            return result
        return cls.model_construct(**dict(result), managed_state=None)


# The seed sizes a thread pool for its blocking tools (resize_tool_pool) and shuts it down at the
# end of an evaluation. trajforge's tools are async; these exist so that code runs unchanged.
_tool_executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="seed-unused")


def resize_tool_pool(max_workers: int) -> None:
    """The seed's tool thread pool size: accepted, unused (trajforge's tools are async)."""


class HermesAgentLoop:
    """The seed's agent loop, run as a trajforge rollout (see the module's docstring)."""

    def __init__(
        self,
        server: Any,
        tool_schemas: list[dict[str, Any]] | None,
        valid_tool_names: set[str] | None,
        max_turns: int = 30,
        task_id: str | None = None,
        temperature: float = 1.0,
        max_tokens: int | None = None,
        extra_body: dict[str, Any] | None = None,
        budget_config: Any = None,
        **kwargs: Any,
    ) -> None:
        self.server = server
        self.tool_schemas = tool_schemas or []
        names = {t.get("function", {}).get("name") for t in self.tool_schemas if isinstance(t, dict)}
        self.valid_tool_names = (
            set(valid_tool_names) if valid_tool_names is not None else {n for n in names if n}
        )
        self.max_turns = max_turns
        self.task_id = task_id or str(uuid.uuid4())
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.extra_body = extra_body
        self.budget_config = budget_config  # the seed's tool-result budget: not applied here

    async def run(self, messages: list[dict[str, Any]]) -> AgentResult:
        """Run the loop; ``messages`` (system + user) gets the conversation appended in place."""
        runtime = _runtime.current()
        if not isinstance(self.server, SeedServer):
            raise TypeError(
                "HermesAgentLoop(server=...) takes the env's self.server in trajforge (its model is "
                "the run's --model/--base-url)"
            )
        result = await runtime.run_loop(
            messages,
            task_id=self.task_id,
            tool_names=self.valid_tool_names,
            max_turns=self.max_turns,
            temperature=self.temperature,
            max_tokens=self.max_tokens,
            extra_body=self.extra_body,
        )
        if result is None:  # ended before a sandbox was handed over: no turn counts (the seed's "no output")
            return AgentResult(messages=messages, turns_used=0, finished_naturally=False)
        messages.extend(dict(m) for m in result.messages[len(messages) :])
        seed = AgentResult.of(result)
        seed.messages = messages
        return seed


__all__ = ["AgentResult", "HermesAgentLoop", "ToolError", "_tool_executor", "resize_tool_pool"]
