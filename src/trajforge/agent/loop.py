"""``AgentLoop``: drive a model and sandboxed tools until a final answer or a budget runs out.

The loop never raises for model or tool failures: they end up in the :class:`AgentResult`
(termination reason, error, tool errors), because every failure is data for the trajectory
factory and for RL. Only cancellation propagates.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

import orjson

from trajforge.agent.config import AgentConfig
from trajforge.agent.result import AgentResult, Termination, ToolErrorRecord, ToolStat
from trajforge.llm.parsers import get_parser
from trajforge.llm.parsers.markup import find_call_markup
from trajforge.llm.types import AssistantTurn, ModelError, ModelErrorKind, ToolCall
from trajforge.protocols import ChatModel
from trajforge.sandbox.errors import SandboxUnavailableError
from trajforge.tools.base import Tool, ToolContext, ToolOutput, openai_schema

_KIND_TO_TERMINATION = {ModelErrorKind.CONTEXT_LENGTH: Termination.CONTEXT_LENGTH}


class AgentLoop:
    """One agent session over a fixed set of offered tools and one tool context (sandbox)."""

    def __init__(
        self, model: ChatModel, tools: Sequence[Tool], ctx: ToolContext, config: AgentConfig | None = None
    ) -> None:
        self.model = model
        self.tools = {t.name: t for t in tools}
        self.schemas = [openai_schema(t) for t in tools]
        self.ctx = ctx
        self.config = config or AgentConfig()
        self._tool_slots = asyncio.Semaphore(self.config.max_parallel_tools)
        if self.config.unexecuted_call_parser:  # an unknown name fails here, not at the first answer
            get_parser(self.config.unexecuted_call_parser)

    async def run(self, messages: list[dict[str, Any]]) -> AgentResult:
        """Run until a final answer, the turn budget, a fatal model error or the deadline."""
        cfg = self.config
        history: list[dict[str, Any]] = []
        if cfg.system_prompt:
            history.append({"role": "system", "content": cfg.system_prompt})
        history.extend(dict(m) for m in messages)
        result = AgentResult(messages=history, tools_offered=list(self.tools), model=self.model.name)
        history = result.messages  # pydantic copied the list; keep appending to the result's own
        started = time.perf_counter()
        try:
            async with asyncio.timeout(cfg.session_timeout_s):
                await self._turns(history, result)
        except TimeoutError:
            result.termination = Termination.TIMEOUT
            result.error = f"session deadline of {cfg.session_timeout_s:g}s passed"
        finally:
            result.wall_time_s = time.perf_counter() - started
        result.finished_naturally = result.termination is Termination.FINAL_ANSWER
        return result

    def _request_messages(self, history: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """What the model sees: history plus the never-saved ephemeral prompt and prefill."""
        cfg = self.config
        if not cfg.ephemeral_system_prompt and not cfg.prefill_messages:
            return history
        rest = history
        system_parts: list[str] = []
        if history and history[0].get("role") == "system":
            system_parts.append(str(history[0].get("content") or ""))
            rest = history[1:]
        if cfg.ephemeral_system_prompt:
            system_parts.append(cfg.ephemeral_system_prompt)
        head = [{"role": "system", "content": "\n\n".join(system_parts)}] if system_parts else []
        return [*head, *cfg.prefill_messages, *rest]

    async def _turns(self, history: list[dict[str, Any]], result: AgentResult) -> None:
        parse_errors_in_row = 0
        for turn_index in range(self.config.max_turns):
            turn = await self._next_turn(history, result)
            if turn is None:
                return
            result.turns_used = turn_index + 1
            if not turn.tool_calls and not turn.parse_errors:
                turn.parse_errors = self._unexecuted_calls(turn)
            if turn.parse_errors and not turn.tool_calls:
                parse_errors_in_row += 1
                self._report_parse_errors(turn, turn_index, history, result)
                if parse_errors_in_row >= self.config.max_consecutive_parse_errors:
                    result.termination = Termination.TOOL_PARSE_ERROR
                    result.error = f"{parse_errors_in_row} turns in a row with unparseable tool calls"
                    return
                continue
            parse_errors_in_row = 0
            if not turn.tool_calls:
                self._finish(turn, result)
                return
            await self._run_turn_calls(turn, turn_index, history, result)
        result.termination = Termination.MAX_TURNS
        result.error = f"turn budget of {self.config.max_turns} model calls used up"

    async def _next_turn(self, history: list[dict[str, Any]], result: AgentResult) -> AssistantTurn | None:
        """The model's next turn, recorded; None when the model failed (the result says why)."""
        try:
            turn = await self.model.complete(
                self._request_messages(history), self.schemas or None, self.config.sampling
            )
        except ModelError as exc:
            result.termination = _KIND_TO_TERMINATION.get(exc.kind, Termination.MODEL_ERROR)
            result.error = str(exc)
            result.error_kind = exc.kind.value
            return None
        self._account(turn, result)
        history.append(turn.to_message())
        return turn

    @staticmethod
    def _finish(turn: AssistantTurn, result: AgentResult) -> None:
        result.final_answer = turn.content
        if turn.finish_reason == "length":
            result.termination = Termination.TRUNCATED
            result.error = "the final answer was cut off by max_tokens"
        else:
            result.termination = Termination.FINAL_ANSWER

    async def _run_turn_calls(
        self, turn: AssistantTurn, turn_index: int, history: list[dict[str, Any]], result: AgentResult
    ) -> None:
        await self.ctx.ensure_sandbox()  # started during the first model call; failures propagate
        tool_started = time.perf_counter()
        outputs = await self._run_calls(turn.tool_calls, turn_index, result)
        result.tool_time_s += time.perf_counter() - tool_started
        for call, out in zip(turn.tool_calls, outputs, strict=True):
            history.append({"role": "tool", "tool_call_id": call.id, "content": out.content})
        if turn.parse_errors:  # some calls parsed, others did not: run the good ones, report the rest
            self._report_parse_errors(turn, turn_index, history, result)

    def _account(self, turn: AssistantTurn, result: AgentResult) -> None:
        result.api_calls += 1
        result.usage = result.usage + turn.usage
        result.model_time_s += turn.latency_s
        result.reasoning_per_turn.append(turn.reasoning or None)
        if turn.calls_from_text:  # the client parsed them out of the text the endpoint returned
            result.recovered_calls.extend(call.id for call in turn.tool_calls)
        if turn.token_trace is not None:
            result.token_traces.append(turn.token_trace)

    def _unexecuted_calls(self, turn: AssistantTurn) -> list[str]:
        """Tool-call markup in what would be the final answer, or in its reasoning: a call the
        endpoint returned as text instead of parsing it, a dangling closing tag, a call written in
        the thought. Ending on it would make a "completed" trajectory hold a call that never ran
        (and an SFT row or a DPO "chosen" reply that teaches it). What counts is
        :func:`~trajforge.llm.parsers.markup.find_call_markup`'s, shared with the exports."""
        parser = self.config.unexecuted_call_parser
        if not self.schemas or parser is None:
            return []
        for where, text, tools in (
            ("reply", turn.content, self.schemas),
            ("reasoning", turn.reasoning, None),
        ):
            what = find_call_markup(text, parser=parser, tools=tools)
            if what is not None:
                return [
                    f"your {where} contains {what} as plain text; it was not run. Emit tool calls in "
                    "the tool-call format (not inside the answer or the reasoning), or answer without "
                    "call markup."
                ]
        return []

    def _report_parse_errors(
        self, turn: AssistantTurn, turn_index: int, history: list[dict[str, Any]], result: AgentResult
    ) -> None:
        detail = "\n".join(turn.parse_errors)
        for err in turn.parse_errors:
            result.tool_errors.append(
                ToolErrorRecord(turn=turn_index, tool_name="<parse>", arguments="", error=err)
            )
        history.append(
            {
                "role": "user",
                "content": (
                    "Your tool call could not be parsed, so no tool was run:\n"
                    f"{detail}\nPlease emit the call again in the correct format."
                ),
            }
        )

    async def _run_calls(
        self, calls: list[ToolCall], turn_index: int, result: AgentResult
    ) -> list[ToolOutput]:
        """Run a turn's calls: parallel-safe ones concurrently, the others one at a time in order."""
        outputs: list[ToolOutput | None] = [None] * len(calls)
        group: list[int] = []

        async def flush() -> None:
            done = await asyncio.gather(
                *(self._one_call(calls[i], turn_index, result) for i in group), return_exceptions=True
            )
            for i, out in zip(group, done, strict=True):
                if isinstance(out, BaseException):  # the sandbox broke: the siblings have finished
                    raise out
                outputs[i] = out
            group.clear()

        for i, call in enumerate(calls):
            tool = self.tools.get(call.name)
            if tool is not None and getattr(tool, "parallel_safe", False):
                group.append(i)
                continue
            await flush()
            outputs[i] = await self._one_call(call, turn_index, result)
        await flush()
        return [o for o in outputs if o is not None]

    async def _one_call(self, call: ToolCall, turn_index: int, result: AgentResult) -> ToolOutput:
        tool = self.tools.get(call.name)
        if tool is None:
            offered = ", ".join(self.tools) or "none"
            out = ToolOutput.failure(f"unknown tool {call.name!r}; the tools you can call are: {offered}")
            return self._record(call, turn_index, out, result, counted=False)
        try:
            args = orjson.loads(call.arguments or "{}")
        except orjson.JSONDecodeError as exc:
            out = ToolOutput.failure(
                f"arguments for {call.name!r} are not valid JSON ({exc}); the tool was not run. "
                "Send the arguments as a JSON object."
            )
            return self._record(call, turn_index, out, result)
        if not isinstance(args, dict):
            out = ToolOutput.failure(
                f"arguments for {call.name!r} must be a JSON object, got {type(args).__name__}; "
                "the tool was not run"
            )
            return self._record(call, turn_index, out, result)
        async with self._tool_slots:
            try:
                async with asyncio.timeout(self.config.tool_timeout_s):
                    out = await tool(args, self.ctx)
            except TimeoutError:
                out = ToolOutput.failure(
                    f"tool {call.name!r} took longer than {self.config.tool_timeout_s:g}s"
                )
            except SandboxUnavailableError:  # the sandbox broke: not the model's doing, not its data
                raise
            except Exception as exc:  # a crashing tool is reported to the model, not raised
                out = ToolOutput.failure(f"tool {call.name!r} crashed: {type(exc).__name__}: {exc}")
        return self._record(call, turn_index, out, result)

    @staticmethod
    def _record(
        call: ToolCall, turn_index: int, out: ToolOutput, result: AgentResult, *, counted: bool = True
    ) -> ToolOutput:
        if counted:
            stat = result.tool_stats.setdefault(call.name, ToolStat())
            stat.count += 1
            if out.ok:
                stat.success += 1
            else:
                stat.failure += 1
        if not out.ok:
            result.tool_errors.append(
                ToolErrorRecord(
                    turn=turn_index,
                    tool_name=call.name,
                    arguments=call.arguments,
                    error=out.error or "tool failed",
                    tool_result=out.content[:2000],
                )
            )
        return out
