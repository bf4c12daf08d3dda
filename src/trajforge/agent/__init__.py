"""The agent loop: model turns, tool dispatch, budgets and a structured result."""

from trajforge.agent.config import AgentConfig
from trajforge.agent.loop import AgentLoop
from trajforge.agent.result import AgentResult, Termination, ToolErrorRecord, ToolStat
from trajforge.agent.session import run_session

__all__ = [
    "AgentConfig",
    "AgentLoop",
    "AgentResult",
    "Termination",
    "ToolErrorRecord",
    "ToolStat",
    "run_session",
]
