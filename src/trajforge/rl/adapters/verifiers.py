"""verifiers adapter: an :class:`~trajforge.envs.protocol.AgentEnv` as a ``verifiers`` (0.4.0) environment.

verifiers 0.4 splits an environment into a **taskset** (data: ``Taskset.load()`` yields typed
``Task`` s whose ``@vf.reward`` methods score a finished ``Trace``) and a **harness** (the agent
program; every model call goes through verifiers' interception server at ``endpoint`` with a
per-rollout bearer ``secret``, which records the trace). Its own docs allow a harness to run its
loop in-process, "as long as every model call goes through endpoint + secret".

So trajforge plugs in as both halves:

- :class:`EnvTaskset` loads the env's items (``eval_items`` or ``get_next_item``) as
  :class:`EnvTask` s; each task's data carries the item and which env judges it.
- :class:`EnvHarness` runs the rollout exactly as ``trajforge env eval`` does -- our agent loop
  and tools, the rollout in its own trajforge sandbox (bwrap by default), the env's
  ``compute_reward`` in that sandbox before it is reset -- with an OpenAI client pointed at the
  interception endpoint (the secret is handed over in memory, never through the process
  environment or argv). It records the episode's reward on the trace.
- :meth:`EnvTask.env_reward` is the task's ``@vf.reward``: the reward the env computed.

verifiers finds tasksets by importing a *top-level* module that exports one ``Taskset`` (and
optionally one ``Harness``, which becomes the default) via ``__all__``. A two-line module
anywhere on ``sys.path`` is enough::

    # trajforge_env.py
    from trajforge.rl.adapters.verifiers import EnvHarness, EnvTaskset
    __all__ = ["EnvTaskset", "EnvHarness"]

    $ vf-eval trajforge_env --env.taskset.env tiny_tasks --env.agent.runtime.type subprocess \\
        -m MODEL --client.base-url http://127.0.0.1:8000/v1 -n 20 -r 4 --no-push

``--env.taskset.env`` is a library name or ``path/to/file.py:ClassName``;
``--env.taskset.overrides`` are EnvConfig fields. The ``subprocess`` runtime is right because
the harness runs in-process and isolates the agent in trajforge's own sandbox.

Importing this module imports verifiers (an optional extra: ``pip install 'trajforge[verifiers]'``).
"""

from __future__ import annotations

import json
from typing import Any, ClassVar, Literal

import verifiers.v1 as vf
from pydantic import Field

from trajforge.distributions import derive_seed
from trajforge.envs.catalog import load_env
from trajforge.envs.protocol import AgentEnv
from trajforge.envs.running.episode import RolloutBackends, Rollouts, env_sandbox_config
from trajforge.envs.types import Episode, Item
from trajforge.record import Reward

REWARD_METRIC = "trajforge_reward"
"""Trace metric holding the env's reward (read by :meth:`EnvTask.env_reward`)."""
_KEY_NAME = "VERIFIERS_INTERCEPTION_KEY"
"""Name the interception secret goes by in the in-memory mapping handed to the client."""

_INFRA_FAILURES = frozenset({"not_run", "model_error"})
"""Terminations that are not the policy's doing: verifiers records the rollout as errored."""

__all__ = ["EnvHarness", "EnvTaskset"]


class EnvTaskData(vf.TaskData):  # type: ignore[misc]  # verifiers ships no type information
    """A task's wire data: the env item, and which env (with which overrides) judges it."""

    item: dict[str, Any] = Field(default_factory=dict)
    env_ref: str = "tiny_tasks"
    env_overrides: dict[str, Any] = Field(default_factory=dict)


class EnvTask(vf.Task[EnvTaskData]):  # type: ignore[misc]  # verifiers ships no type information
    """One env item. The reward is the env's own, computed by the harness in the rollout's sandbox."""

    @property
    def key(self) -> str:
        return str(self.data.id or self.hash)

    @vf.reward  # type: ignore[untyped-decorator]  # verifiers ships no type information
    async def env_reward(self, trace: vf.Trace) -> float:
        value = trace.metrics.get(REWARD_METRIC)
        if value is None:
            raise vf.TaskError(
                "no trajforge reward on this trace: run the task with the trajforge harness "
                "(the taskset module's EnvHarness; do not pin --env.agent.harness.id to another)"
            )
        return float(value)


class EnvTasksetConfig(vf.TasksetConfig):  # type: ignore[misc]  # verifiers ships no type information
    env: str = "tiny_tasks"
    """trajforge env: a library name (`trajforge env list`) or path/to/file.py:ClassName."""
    overrides: dict[str, Any] = Field(default_factory=dict)
    """EnvConfig fields to override (e.g. {"max_agent_turns": 4})."""
    split: Literal["eval", "train"] = "eval"
    """eval: the env's held-out items; train: its training stream (get_next_item)."""
    size: int = Field(100, ge=1)
    """How many items to load."""


class EnvTaskset(vf.Taskset[EnvTask, EnvTasksetConfig]):  # type: ignore[misc]  # verifiers ships no type information
    """The items of a trajforge env as verifiers tasks."""

    def load(self) -> list[EnvTask]:
        import asyncio
        from concurrent.futures import ThreadPoolExecutor

        env = load_env(self.config.env, dict(self.config.overrides))
        # load() is synchronous but may be called from verifiers' running event loop; the env's
        # async setup gets a loop of its own on a worker thread.
        with ThreadPoolExecutor(max_workers=1) as pool:
            items = pool.submit(asyncio.run, _items(env, self.config.split, self.config.size)).result()
        return [self._task(env, item) for item in items]

    def _task(self, env: AgentEnv, item: Item) -> EnvTask:
        prompt = env.format_prompt(item)
        data = EnvTaskData(
            id=env.item_id(item),
            name=env.item_id(item),
            prompt=prompt if isinstance(prompt, str) else json.dumps(prompt),
            item=json.loads(json.dumps(item, default=str)),
            env_ref=self.config.env,
            env_overrides=dict(self.config.overrides),
        )
        return EnvTask(data, self.config.task)


async def _items(env: AgentEnv, split: str, n: int) -> list[Item]:
    await env.setup()
    if split == "eval":
        return list(env.eval_items(n))
    return [await env.get_next_item() for _ in range(n)]


class EnvHarnessConfig(vf.HarnessConfig):  # type: ignore[misc]  # verifiers ships no type information
    sandbox: Literal["bwrap", "local", "docker"] | None = None
    """trajforge sandbox backend of each rollout (None: the env config's)."""


class EnvHarness(vf.Harness[EnvHarnessConfig]):  # type: ignore[misc]  # verifiers ships no type information
    """Runs a trajforge rollout in-process; every model call goes through verifiers' interception."""

    APPENDS_SYSTEM_PROMPT: ClassVar[bool] = True  # the env's system prompt is applied by the rollout
    SUPPORTS_MCP: ClassVar[bool] = False
    EXECUTES_CODE: ClassVar[bool] = True
    NEEDS_CONTAINER: ClassVar[bool] = False  # the agent runs in trajforge's own sandbox

    def __init__(self, config: EnvHarnessConfig) -> None:
        super().__init__(config)
        self._envs: dict[str, AgentEnv] = {}
        self._factories: dict[str, Any] = {}

    async def _env(self, data: EnvTaskData) -> AgentEnv:
        key = json.dumps([data.env_ref, data.env_overrides], sort_keys=True, default=str)
        env = self._envs.get(key)
        if env is None:
            env = load_env(data.env_ref, dict(data.env_overrides))
            await env.setup()
            self._envs[key] = env
        return env

    def _factory(self, env: AgentEnv) -> Any:
        from trajforge.sandbox import create_sandbox_factory
        from trajforge.sandbox.types import SandboxConfig

        kind = self.config.sandbox or env.config.sandbox
        factory = self._factories.get(kind)
        if factory is None:
            factory = create_sandbox_factory(
                env_sandbox_config(
                    env, SandboxConfig(kind=kind, command_timeout_s=env.config.command_timeout_s)
                )
            )
            self._factories[kind] = factory
        return factory

    async def launch(
        self,
        ctx: vf.ModelContext,
        trace: vf.Trace,
        runtime: vf.Runtime,
        endpoint: str,
        secret: str,
        mcp_urls: dict[str, str],
        data: vf.TaskData,
        tool_interception_url: str | None = None,
    ) -> vf.ProgramResult:
        from trajforge.llm.openai_client import OpenAIChatModel, OpenAIModelConfig
        from trajforge.tools.builtin import default_registry

        if not isinstance(data, EnvTaskData):
            data = EnvTaskData.model_validate(data.model_dump())
        env = await self._env(data)
        model = OpenAIChatModel(
            OpenAIModelConfig(base_url=endpoint, model=ctx.model, api_key_env=_KEY_NAME, max_retries=0),
            environ={_KEY_NAME: secret},
        )
        rollouts = Rollouts(
            env, RolloutBackends(model=model, factory=self._factory(env), registry=default_registry())
        )
        seed = derive_seed(env.config.seed, f"verifiers#{trace.id}")
        try:
            episode = await rollouts.episode(dict(data.item), seed=seed)
        finally:
            await model.aclose()
        return _program_result(trace, episode)


def _program_result(trace: vf.Trace, episode: Episode) -> vf.ProgramResult:
    """Record the episode on the trace; a rollout that failed (not the policy's doing) is an error."""
    reward = episode.reward or Reward.not_judged("")
    trace.info["trajforge"] = {
        "status": episode.status,
        "reason": episode.reason,
        "termination": episode.termination,
        "reward_reason": reward.reason,
        "reward_error": reward.error,
        "reward_components": dict(reward.components),
        "toolsets": episode.toolsets,
        "turns": episode.turns,
    }
    if episode.termination in _INFRA_FAILURES:
        return vf.ProgramResult(exit_code=1, stdout="", stderr=f"trajforge rollout failed: {episode.reason}")
    trace.record_metric(REWARD_METRIC, episode.score)
    for name, value in reward.components.items():
        trace.record_metric(f"trajforge/{name}", value)
    return vf.ProgramResult(exit_code=0, stdout="", stderr="")
