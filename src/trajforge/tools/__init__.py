"""What a model may call: the ``Tool`` protocol, toolsets, a registry instance and built-in tools."""

from trajforge.tools.base import FunctionTool, Tool, ToolContext, ToolOutput, openai_schema
from trajforge.tools.builtin import default_registry
from trajforge.tools.limits import ToolLimits
from trajforge.tools.registry import ToolRegistry
from trajforge.tools.toolsets import TOOL_TO_TOOLSET, TOOLSETS, UnknownToolsetError, check_toolsets

__all__ = [
    "TOOLSETS",
    "TOOL_TO_TOOLSET",
    "FunctionTool",
    "Tool",
    "ToolContext",
    "ToolLimits",
    "ToolOutput",
    "ToolRegistry",
    "UnknownToolsetError",
    "check_toolsets",
    "default_registry",
    "openai_schema",
]
