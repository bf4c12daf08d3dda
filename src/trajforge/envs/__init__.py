"""RL and evaluation environments: the fourth boundary (``AgentEnv``), rollouts judged in their
own sandboxes, the env library and the eval runner.

>>> from trajforge.envs import load_env
>>> env = load_env("tiny_tasks")
"""

from trajforge.engine import ResizableLimiter
from trajforge.engine.books import EvalRun, EvalRunError, read_episodes, write_control
from trajforge.engine.summary import EvalSummary, pass_at_k, summarize
from trajforge.envs.base import BaseEnv, EnvDataError
from trajforge.envs.catalog import LIBRARY, UnknownEnvError, available, env_class, load_env
from trajforge.envs.config import EnvConfig, EnvConfigError, load_env_config, parse_env_config
from trajforge.envs.kept import KeptFiles, snapshot
from trajforge.envs.protocol import AgentEnv
from trajforge.envs.running.episode import RolloutBackends, Rollouts, env_sandbox_config
from trajforge.envs.running.evaluate import run_eval
from trajforge.envs.types import Episode, Item, Reward, RewardBreakdown, TokenRecord
from trajforge.envs.verifier import SearchHit, VerifierContext, VerifierError, VerifierExec

__all__ = [
    "LIBRARY",
    "AgentEnv",
    "BaseEnv",
    "EnvConfig",
    "EnvConfigError",
    "EnvDataError",
    "Episode",
    "EvalRun",
    "EvalRunError",
    "EvalSummary",
    "Item",
    "KeptFiles",
    "ResizableLimiter",
    "Reward",
    "RewardBreakdown",
    "RolloutBackends",
    "Rollouts",
    "SearchHit",
    "TokenRecord",
    "UnknownEnvError",
    "VerifierContext",
    "VerifierError",
    "VerifierExec",
    "available",
    "env_class",
    "env_sandbox_config",
    "load_env",
    "load_env_config",
    "parse_env_config",
    "pass_at_k",
    "read_episodes",
    "run_eval",
    "snapshot",
    "summarize",
    "write_control",
]
