"""Running an environment written for the seed system (Hermes Agent's ``environments/``) unchanged.

A seed env file subclasses ``HermesAgentBaseEnv`` (``environments.hermes_base_env``), returns its
config and server configs from ``config_init()``, writes ``setup``/``get_next_item``/
``format_prompt`` and a blocking ``compute_reward(item, result, ctx)``, and the benchmark ones run
their tasks themselves in ``evaluate()`` with ``HermesAgentLoop``, ``ToolContext(task_id)`` and
``tools.terminal_tool``. This package gives each of those names its trajforge meaning
(docs/hermes.md has the full table):

- :mod:`.config`: ``HermesAgentEnvConfig``, the seed's and atroposlib's fields on trajforge's
  ``EnvConfig`` (backend names mapped to a sandbox, each with a note);
- :mod:`.env`: ``HermesAgentBaseEnv``, how ``env eval`` runs one (its rollouts, or its own
  ``evaluate()``) and the seed's hooks (``self.server``, ``evaluate_log``, ``wandb_log``, ...);
- :mod:`.context`: the seed's blocking ``ToolContext`` over the async ``VerifierContext``;
- :mod:`.loop`: ``HermesAgentLoop`` (a trajforge rollout), ``AgentResult``, ``ToolError``;
- :mod:`.server`: ``self.server``, the run's model as atroposlib's ``ServerManager``;
- :mod:`.runtime`: one evaluation's task-keyed state (sandboxes by ``task_id``);
- :mod:`.evaluation`: ``env eval`` of an env whose evaluation is its ``evaluate()``;
- :mod:`.modules`: the stand-in modules a seed file imports.
"""

from trajforge.envs.hermes.config import SEED_BACKENDS, BudgetConfig, HermesAgentEnvConfig
from trajforge.envs.hermes.context import ToolContext
from trajforge.envs.hermes.env import HermesAgentBaseEnv
from trajforge.envs.hermes.loop import AgentResult, HermesAgentLoop, ToolError
from trajforge.envs.hermes.modules import install_seed_modules, seed_imports
from trajforge.envs.hermes.server import SeedServer

__all__ = [
    "SEED_BACKENDS",
    "AgentResult",
    "BudgetConfig",
    "HermesAgentBaseEnv",
    "HermesAgentEnvConfig",
    "HermesAgentLoop",
    "SeedServer",
    "ToolContext",
    "ToolError",
    "install_seed_modules",
    "seed_imports",
]
