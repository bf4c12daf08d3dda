"""Typed configuration of the agent loop."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from trajforge.llm.types import SamplingParams
from trajforge.tools.limits import ToolLimits


class AgentConfig(BaseModel):
    """How one agent session runs. Validated at construction."""

    model_config = ConfigDict(allow_inf_nan=False)  # deadlines are finite numbers

    max_turns: int = Field(30, ge=1, description="model calls allowed before the session stops")
    sandbox_start: Literal["eager", "lazy"] = Field(
        "eager",
        description="eager: the sandbox starts with the first model call (its start-up hidden behind "
        "that call's latency); lazy: at the first tool call (a rollout holds no sandbox while it "
        "waits for its first answer, and one that never calls a tool never builds one: less memory "
        "per live rollout, the start-up added to the first tool call). Setup files force eager",
    )
    sampling: SamplingParams = Field(default_factory=SamplingParams)
    system_prompt: str | None = Field(None, description="system prompt, kept in the lossless record")
    ephemeral_system_prompt: str | None = Field(
        None, description="sent to the model on every call but never saved in trajectories"
    )
    prefill_messages: list[dict[str, Any]] = Field(
        default_factory=list, description="few-shot messages sent after the system prompt, never saved"
    )
    max_parallel_tools: int = Field(8, ge=1, description="concurrent calls of parallel-safe tools")
    session_timeout_s: float | None = Field(None, gt=0, description="deadline for the whole session")
    tool_timeout_s: float | None = Field(None, gt=0, description="deadline for one tool call")
    tool_limits: ToolLimits = Field(
        default_factory=ToolLimits,
        description="the largest durations and sizes the model may set in tool arguments (terminal "
        "timeout, ...): larger values are clamped and the model told, invalid ones are tool errors",
    )
    max_consecutive_parse_errors: int = Field(
        3, ge=1, description="unparseable tool-call turns in a row before the session ends"
    )
    unexecuted_call_parser: str | None = Field(
        "auto",
        description="tool-call parser that looks for call markup left in an answer's text (an endpoint "
        "that did not parse the model's call returns it as content): found, it is told to the model as "
        "a parse error instead of ending the session as a final answer. None: do not look",
    )

    @field_validator("prefill_messages")
    @classmethod
    def _check_prefill(cls, value: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for i, msg in enumerate(value):
            if msg.get("role") not in {"user", "assistant", "system", "tool"}:
                raise ValueError(f"prefill message {i} needs a role of user/assistant/system/tool")
        return value
