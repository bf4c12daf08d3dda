"""Trajectories: OpenAI messages -> ShareGPT (reference-compatible), think helpers, filters, saving.

This package knows nothing about models or sandboxes: it turns a finished conversation
(``AgentResult.messages``) into training records and judges whether they are fit to train on.
"""

from trajforge.trajectory.filters import (
    FILTER_NAMES,
    HALLUCINATED_TOOL,
    INCOMPLETE_SCRATCHPAD,
    NO_REASONING,
    FilterVerdict,
    ReasoningCoverage,
    evaluate_filters,
    reasoning_coverage,
)
from trajforge.trajectory.save import (
    COMPLETED_FILE,
    FAILED_FILE,
    asave_trajectory,
    save_trajectory,
    trajectory_line,
)
from trajforge.trajectory.sharegpt import (
    ConversionIssue,
    ShareGPTConversion,
    convert,
    format_tools,
    system_prompt,
    to_sharegpt,
)
from trajforge.trajectory.think import (
    has_incomplete_scratchpad,
    has_reasoning,
    message_reasoning,
    scratchpad_to_think,
)

__all__ = [
    "COMPLETED_FILE",
    "FAILED_FILE",
    "FILTER_NAMES",
    "HALLUCINATED_TOOL",
    "INCOMPLETE_SCRATCHPAD",
    "NO_REASONING",
    "ConversionIssue",
    "FilterVerdict",
    "ReasoningCoverage",
    "ShareGPTConversion",
    "asave_trajectory",
    "convert",
    "evaluate_filters",
    "format_tools",
    "has_incomplete_scratchpad",
    "has_reasoning",
    "message_reasoning",
    "reasoning_coverage",
    "save_trajectory",
    "scratchpad_to_think",
    "system_prompt",
    "to_sharegpt",
    "trajectory_line",
]
