"""The seed system's env API, as it was first importable here: :mod:`trajforge.envs.hermes`.

Kept so ``from trajforge.envs.hermes_compat import HermesAgentBaseEnv`` (docs/hermes.md's older
spelling) still works; the package has the code and says what each name does.
"""

from trajforge.envs.hermes import (
    AgentResult,
    HermesAgentBaseEnv,
    HermesAgentEnvConfig,
    HermesAgentLoop,
    ToolContext,
    ToolError,
    install_seed_modules,
    seed_imports,
)

__all__ = [
    "AgentResult",
    "HermesAgentBaseEnv",
    "HermesAgentEnvConfig",
    "HermesAgentLoop",
    "ToolContext",
    "ToolError",
    "install_seed_modules",
    "seed_imports",
]
