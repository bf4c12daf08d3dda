"""Declared toolsets whose implementations land later (rl; browser until wired in).

They are real entries in the registry, with the schemas the model will see, so distributions and
filters treat them like any tool; calling one returns a clear failure instead of pretending.
"""

from __future__ import annotations

from typing import Any

from trajforge.tools.base import FunctionTool, Handler, ToolContext, ToolOutput
from trajforge.tools.toolsets import TOOL_TO_TOOLSET


def _obj(required: list[str], **props: str) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {name: {"type": "string", "description": desc} for name, desc in props.items()},
        "required": required,
    }


_SPECS: dict[str, tuple[str, dict[str, Any]]] = {
    "browser_navigate": ("Open a URL in the browser.", _obj(["url"], url="Address to open.")),
    "browser_snapshot": ("Return the accessibility snapshot of the current page.", _obj([])),
    "browser_click": (
        "Click an element of the page.",
        _obj(["ref"], ref="Element reference from a snapshot."),
    ),
    "browser_type": (
        "Type text into an element.",
        _obj(["ref", "text"], ref="Element reference.", text="Text to type."),
    ),
    "browser_scroll": ("Scroll the page.", _obj(["direction"], direction="up or down.")),
    "browser_back": ("Go back in history.", _obj([])),
    "browser_press": ("Press a key.", _obj(["key"], key="Key name, e.g. Enter.")),
    "browser_get_images": ("List images on the page.", _obj([])),
    "browser_vision": (
        "Ask a question about a screenshot of the page.",
        _obj(["question"], question="Question."),
    ),
    "browser_console": ("Read the page's console messages.", _obj([])),
    "rl_list_environments": ("List the available RL environments.", _obj([])),
    "rl_select_environment": ("Select an RL environment.", _obj(["name"], name="Environment name.")),
    "rl_get_current_config": ("Show the current training config.", _obj([])),
    "rl_edit_config": (
        "Change a training config field.",
        _obj(["field", "value"], field="Field.", value="Value."),
    ),
    "rl_start_training": ("Start a training run.", _obj([])),
    "rl_check_status": ("Check a training run.", _obj(["run_id"], run_id="Run id.")),
    "rl_stop_training": ("Stop a training run.", _obj(["run_id"], run_id="Run id.")),
    "rl_get_results": ("Get a run's results.", _obj(["run_id"], run_id="Run id.")),
    "rl_list_runs": ("List training runs.", _obj([])),
    "rl_test_inference": ("Try the environment with a few rollouts.", _obj([])),
}


def _pending_handler(name: str, toolset: str) -> Handler:
    async def handler(args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        return ToolOutput.failure(
            f"tool {name!r} (toolset {toolset!r}) is not implemented in this version of trajforge; "
            "solve the task with the other tools offered."
        )

    return handler


def pending_tools() -> list[FunctionTool]:
    return [
        FunctionTool(
            name=name,
            toolset=TOOL_TO_TOOLSET[name],
            description=desc,
            parameters=schema,
            handler=_pending_handler(name, TOOL_TO_TOOLSET[name]),
            implemented=False,
        )
        for name, (desc, schema) in _SPECS.items()
    ]
