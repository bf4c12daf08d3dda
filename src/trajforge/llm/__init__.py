"""Talking to models: chat clients, token-exact clients and tool-call parsers."""

from trajforge.llm.types import (
    AssistantTurn,
    ModelError,
    ModelErrorKind,
    SamplingParams,
    TokenTrace,
    ToolCall,
    Usage,
)

__all__ = [
    "AssistantTurn",
    "ModelError",
    "ModelErrorKind",
    "SamplingParams",
    "TokenTrace",
    "ToolCall",
    "Usage",
]
