"""What one agent session produced: the input to trajectories, batch records and RL rewards."""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from trajforge.llm.token_trace import EpisodeTrace, build_episode_trace
from trajforge.llm.types import TokenTrace, Usage

if TYPE_CHECKING:
    from trajforge.llm.chat_template import ChatTemplate


class Termination(enum.StrEnum):
    """Why the loop stopped. Only ``FINAL_ANSWER`` counts as finishing naturally."""

    FINAL_ANSWER = "final_answer"
    MAX_TURNS = "max_turns"
    MODEL_ERROR = "model_error"  # the endpoint failed after the client's retries
    CONTEXT_LENGTH = "context_length"  # the conversation outgrew the model's context
    TOOL_PARSE_ERROR = "tool_parse_error"  # the model kept producing unparseable calls
    TRUNCATED = "truncated"  # the final answer hit max_tokens (finish_reason=length)
    TIMEOUT = "timeout"  # the per-session deadline passed
    CANCELLED = "cancelled"


class ToolErrorRecord(BaseModel):
    """One failed tool call: unknown tool, invalid JSON arguments, or a tool that failed."""

    turn: int
    tool_name: str
    arguments: str
    error: str
    tool_result: str = ""


class ToolStat(BaseModel):
    count: int = 0
    success: int = 0
    failure: int = 0


class AgentResult(BaseModel):
    """The full outcome of ``AgentLoop.run``.

    ``messages`` is the lossless OpenAI-format conversation (system prompt included, reasoning
    kept under ``reasoning`` on assistant messages). ``reasoning_per_turn`` has one entry per
    assistant turn (``None`` when that turn had none).
    """

    messages: list[dict[str, Any]]
    turns_used: int = 0
    finished_naturally: bool = False
    termination: Termination = Termination.FINAL_ANSWER
    error: str | None = None
    error_kind: str | None = Field(
        default=None,
        description="for MODEL_ERROR: the ModelErrorKind value ('transient' means a retry may help)",
    )
    final_answer: str | None = None
    reasoning_per_turn: list[str | None] = Field(default_factory=list)
    tool_errors: list[ToolErrorRecord] = Field(default_factory=list)
    tool_stats: dict[str, ToolStat] = Field(default_factory=dict)
    tools_offered: list[str] = Field(default_factory=list)
    api_calls: int = 0
    usage: Usage = Field(
        default_factory=Usage.zero,
        description="summed over the model calls; None: a call's endpoint did not say",
    )
    recovered_calls: list[str] = Field(
        default_factory=list,
        description="ids of the tool calls the client parsed out of text the endpoint returned as content",
    )
    model_time_s: float = 0.0
    tool_time_s: float = 0.0
    wall_time_s: float = 0.0
    token_traces: list[TokenTrace] = Field(
        default_factory=list, description="one per assistant turn when the backend is token-exact"
    )
    model: str | None = None

    def episode_trace(
        self, template: ChatTemplate | None = None, tools: Sequence[Mapping[str, Any]] | None = None
    ) -> EpisodeTrace:
        """The episode's exact tokens, masks and logprobs (:func:`~trajforge.llm.token_trace.build_episode_trace`).

        ``messages`` are the messages the model saw (the loop's record includes the system
        prompt). Pass the offered tool schemas as ``tools`` for a meaningful drift report.
        """
        return build_episode_trace(self.token_traces, messages=self.messages, template=template, tools=tools)
