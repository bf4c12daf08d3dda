"""Public test helpers: a scripted OpenAI-compatible server and an in-process scripted model.

Imported lazily so ``python -m trajforge.testing.server_cli`` runs cleanly, and importing
:class:`ScriptedModel` or the reply vocabulary (:class:`Reply`, policies) does not pull in the
aiohttp server.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trajforge.testing.images import ScriptedImageServer
    from trajforge.testing.policies import echo_policy, tool_then_answer
    from trajforge.testing.replies import FaultConfig, Reply, ToolCallSpec
    from trajforge.testing.scripted_model import ScriptedCall, ScriptedModel, answer, tool_turn
    from trajforge.testing.scripted_server import RequestRecord, ScriptedServer

_EXPORTS = {
    "ScriptedModel": "trajforge.testing.scripted_model",
    "ScriptedCall": "trajforge.testing.scripted_model",
    "answer": "trajforge.testing.scripted_model",
    "tool_turn": "trajforge.testing.scripted_model",
    "ScriptedServer": "trajforge.testing.scripted_server",
    "RequestRecord": "trajforge.testing.scripted_server",
    "ScriptedImageServer": "trajforge.testing.images",
    "Reply": "trajforge.testing.replies",
    "ToolCallSpec": "trajforge.testing.replies",
    "FaultConfig": "trajforge.testing.replies",
    "echo_policy": "trajforge.testing.policies",
    "tool_then_answer": "trajforge.testing.policies",
}

__all__ = [
    "FaultConfig",
    "Reply",
    "RequestRecord",
    "ScriptedCall",
    "ScriptedImageServer",
    "ScriptedModel",
    "ScriptedServer",
    "ToolCallSpec",
    "answer",
    "echo_policy",
    "tool_then_answer",
    "tool_turn",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'trajforge.testing' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
