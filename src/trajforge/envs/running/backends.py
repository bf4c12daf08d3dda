"""What an env's rollouts run on, built from settings: the model, the sandbox factory, the tools.

One builder for every place an evaluation runs: ``env eval`` on this machine and each rollout
actor of ``env eval --backend ray`` (which receives only the settings, never a live client or a
key, and builds its own here). Whatever it builds it also closes.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable

from trajforge.endpoint import EndpointConfig, open_chat_model
from trajforge.envs.hooks import tool_registry_hook
from trajforge.envs.protocol import AgentEnv
from trajforge.envs.running.episode import RolloutBackends, env_sandbox_config
from trajforge.raycluster import share_count, share_rate
from trajforge.sandbox import close_factory, create_sandbox_factory
from trajforge.sandbox.types import SandboxConfig
from trajforge.tools.builtin import default_registry
from trajforge.tools.registry import ToolRegistry

AGENTS = ("model", "oracle", "none")


@contextlib.asynccontextmanager
async def open_rollout_backends(
    env: AgentEnv,
    endpoint: EndpointConfig,
    agent: str = "model",
    *,
    shares: int = 1,
    announce: Callable[[str], None] = lambda _msg: None,
) -> AsyncIterator[RolloutBackends]:
    """The backends of ``env``'s rollouts with ``agent`` (``model``: the endpoint's client;
    ``oracle``/``none``: see :mod:`~trajforge.envs.agents`). ``shares``: how many processes
    split the endpoint's budget (requests in flight and per second); this one holds one share."""
    from trajforge.envs.agents import agent_model_for

    if agent not in AGENTS:
        raise ValueError(f"--agent must be model, oracle or none, not {agent!r}")
    factory = create_sandbox_factory(
        env_sandbox_config(
            env,
            SandboxConfig(
                kind=env.config.sandbox,
                command_timeout_s=env.config.command_timeout_s,
                reuse=env.config.sandbox == "bwrap",  # reset and verified between rollouts: ~1.6x episodes/s
            ),
        )
    )
    registry = env_registry(env)
    try:
        if agent != "model":
            model_for = agent_model_for(env, agent)
            yield RolloutBackends(model_for(env, {}), factory, registry, model_for=model_for)
            return
        shared = endpoint.model_copy(
            update={
                "max_concurrency": share_count(endpoint.max_concurrency, shares),
                "requests_per_second": share_rate(endpoint.requests_per_second, shares),
            }
        )
        async with open_chat_model(shared, announce=announce) as model:
            yield RolloutBackends(model, factory, registry)
    finally:
        await close_factory(factory)
        await registry.aclose()


def env_registry(env: AgentEnv) -> ToolRegistry:
    """The env's own registry when it needs configured tools (web_research: a search provider),
    else the default one."""
    make_registry = tool_registry_hook(env)
    registry = make_registry() if make_registry is not None else default_registry()
    assert isinstance(registry, ToolRegistry)
    return registry
