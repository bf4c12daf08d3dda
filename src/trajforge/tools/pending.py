"""Declared toolsets whose implementations land later (rl).

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
