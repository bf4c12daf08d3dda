"""Upper bounds on what a model may ask of a tool (durations and sizes it sets in its arguments).

A model can ask ``terminal`` for a timeout of ``1e9`` seconds, ``process`` for a terabyte of
output or ``read_file`` for a billion lines. Tools read such arguments through
:mod:`trajforge.tools._args`: a value that is not a finite number in the allowed range is a tool
error that states the range (and the tool does not run); a value above the maximum is clamped to
it, and the tool's result tells the model so.

One :class:`ToolLimits` belongs to a rollout's :class:`~trajforge.tools.base.ToolContext`; the
agent loop gets it from :attr:`trajforge.agent.AgentConfig.tool_limits`.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

DEFAULT_MAX_COMMAND_TIMEOUT_S = 600.0


class ToolLimits(BaseModel):
    """The largest duration or size a model may set in a tool call's arguments."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    max_command_timeout_s: float = Field(
        DEFAULT_MAX_COMMAND_TIMEOUT_S,
        gt=0,
        allow_inf_nan=False,
        description="longest timeout (s) a model may give one command: terminal's `timeout` and "
        "process's wait `timeout`. Longer requests run with this timeout and the result says so. "
        "Commands without a `timeout` get the sandbox's command_timeout_s",
    )
    max_tail_bytes: int = Field(
        1_000_000,
        ge=1,
        description="most bytes of a background command's log process read/wait may return "
        "(`tail_bytes`); the sandbox's output cap still applies to what the model sees",
    )
    max_read_lines: int = Field(100_000, ge=1, description="most lines read_file returns (`limit`)")
    max_search_results: int = Field(
        1_000, ge=1, description="most matches search_files returns (`max_results`)"
    )
