"""Any trajforge :class:`~trajforge.envs.protocol.AgentEnv` as an Atropos environment
(``atroposlib==0.4.0``, the ``atropos`` extra).

:func:`atropos_env_class` makes an ``atroposlib.envs.base.BaseEnv`` subclass bound to one env
reference; atroposlib's own CLI modes then run on it (``serve``: register with the Atropos API
and push ``/scored_data``; ``process``: write groups to JSONL offline; ``evaluate``). A group is
``Rollouts.group`` -- each rollout in its own sandbox, judged there -- turned into a
``ScoredDataGroup`` by :mod:`trajforge.rl.adapters.atropos_groups`.

Inference does not go through atroposlib's server classes: each ``APIServerConfig`` of the
(list of) server configs becomes a trajforge model, so token-level endpoints give exact traces
(Phase 2) and chat endpoints messages only (Phase 1). Rollouts take the servers in turn.

Offline by construction: the tokenizer must be a local directory, wandb is off unless asked
(``--env.use_wandb true``), and API keys are read from the environment variable named by
``api_key_env`` (a key in ``APIServerConfig.api_key`` is refused: configs get logged and dumped).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal

from atroposlib.envs.base import APIServer, APIServerConfig, BaseEnvConfig, ServerBaseline
from atroposlib.envs.base import BaseEnv as AtroposBaseEnv
from pydantic import Field, field_validator

from trajforge.engine.summary import summarize
from trajforge.envs.catalog import load_env
from trajforge.envs.hooks import env_name
from trajforge.envs.protocol import AgentEnv
from trajforge.envs.running.episode import RolloutBackends, Rollouts, env_sandbox_config
from trajforge.envs.types import Episode, Item
from trajforge.protocols import ChatModel
from trajforge.rl.adapters.atropos_groups import GroupTally, describe_phase, scored_group

log = logging.getLogger(__name__)

InferenceEndpoint = Literal["auto", "chat", "openai_completions", "vllm_generate", "sglang_generate"]
EndpointKind = Literal["chat", "openai_completions", "vllm_generate", "sglang_generate"]
_BY_SERVER_TYPE: dict[str, EndpointKind] = {"vllm": "vllm_generate", "sglang": "sglang_generate"}
_KEY_PLACEHOLDERS = {"", "x", "empty", "none", "dummy", "unused", "sk-no-key-required"}
MAX_EMPTY_GROUPS_IN_A_ROW = 3


class AtroposAdapterError(ValueError):
    """The adapter cannot run as configured; the message says what to change."""


class AtroposEnvConfig(BaseEnvConfig):  # type: ignore[misc]  # atroposlib ships no type information
    """Atropos's env config plus what the trajforge side needs (all settable as ``--env.FIELD``)."""

    trajforge_env: str = Field(
        "tiny_tasks", description="trajforge env: library name or path/to/file.py:Class"
    )
    # ``| str``: atroposlib's CLI copies field types without validators, so a JSON string must pass there.
    trajforge_overrides: dict[str, Any] | str = Field(
        default_factory=dict, description="trajforge EnvConfig fields to override (JSON object on the CLI)"
    )
    inference_endpoint: InferenceEndpoint = Field(
        "auto",
        description="how rollouts call the servers: chat (/v1/chat/completions, messages only), "
        "openai_completions | vllm_generate | sglang_generate (token-exact, local tokenizer); "
        "auto: vllm/sglang server_type -> their /generate, else chat",
    )
    api_key_env: str | None = Field(None, description="environment variable holding the servers' API key")
    episodes_path: str | None = Field(
        None, description="append every episode record (dropped ones too) here as JSONL; stats next to it"
    )
    eval_n: int = Field(8, ge=0, description="items of the env's eval split that `evaluate` runs")

    @field_validator("trajforge_overrides", mode="before")
    @classmethod
    def _json_object(cls, value: Any) -> Any:
        if isinstance(value, str):  # from the command line
            try:
                value = json.loads(value)
            except json.JSONDecodeError as exc:
                raise ValueError(f"trajforge_overrides must be a JSON object: {exc.msg}") from None
            if not isinstance(value, dict):
                raise ValueError("trajforge_overrides must be a JSON object of EnvConfig fields")
        return value

    def overrides(self) -> dict[str, Any]:
        value = self.trajforge_overrides
        return dict(value) if isinstance(value, dict) else {}


def endpoint_kind(server: Any, configured: InferenceEndpoint) -> EndpointKind:
    """How rollouts call ``server``: the configured kind, or by its ``server_type``."""
    if configured != "auto":
        return configured
    return _BY_SERVER_TYPE.get(str(server.server_type), "chat")


def build_model(server: Any, cfg: AtroposEnvConfig, parser: str) -> ChatModel:
    """One trajforge model for one ``APIServerConfig``."""
    if not server.base_url:
        raise AtroposAdapterError(
            "a server config has no base_url: pass --openai.base_url URL (or list servers under "
            "`openai:` in the YAML --config)"
        )
    if str(server.api_key or "").strip().lower() not in _KEY_PLACEHOLDERS:
        raise AtroposAdapterError(
            "an API key in the server config would be logged and saved: put it in an environment "
            "variable and pass --env.api_key_env NAME instead of --openai.api_key"
        )
    kind = endpoint_kind(server, cfg.inference_endpoint)
    model_name = None if server.model_name in ("", "default") else str(server.model_name)
    if kind == "chat":
        from trajforge.llm.openai_client import OpenAIChatModel, OpenAIModelConfig

        return OpenAIChatModel(
            OpenAIModelConfig(
                base_url=server.base_url,
                model=model_name or "default",
                api_key_env=cfg.api_key_env,
                request_timeout_s=float(server.timeout),
                max_concurrency=int(server.num_max_requests_at_once),
            )
        )
    from trajforge.llm.completion_model import CompletionChatModel, CompletionModelConfig

    tokenizer = cfg.tokenizer_name if server.tokenizer_name in ("", "none") else server.tokenizer_name
    _require_local_tokenizer(tokenizer, "the server's tokenizer_name (or --env.tokenizer_name)")
    return CompletionChatModel(
        CompletionModelConfig(
            tokenizer_path=str(tokenizer),
            base_url=server.base_url,
            endpoint=kind,
            model=model_name,
            parser=parser,
            api_key_env=cfg.api_key_env,
            request_timeout_s=float(server.timeout),
            max_concurrency=int(server.num_max_requests_at_once),
        )
    )


def _require_local_tokenizer(path: str, what: str) -> None:
    if not path or not Path(path).is_dir():
        raise AtroposAdapterError(
            f"{what} must be a local tokenizer directory (nothing is downloaded), got {path!r}"
        )


class ConfigOnlyServer(APIServer):  # type: ignore[misc]  # atroposlib ships no type information
    """What atroposlib's ``ServerManager`` holds for each server config: the config (for its
    logs and metrics) and no client. atroposlib's own server classes would build an OpenAI client
    that wants a key and, for vLLM, load a tokenizer by model name from the Hub; trajforge's
    models do the inference instead, so any call here is a bug and says so."""

    def __init__(self, config: Any, reasoning_config: Any = None) -> None:
        super().__init__(config, reasoning_config=reasoning_config)

    async def check_server_status_task(self, chat_completion: bool = True) -> None:
        self.server_healthy = True

    async def _refuse(self, **kwargs: Any) -> Any:
        raise RuntimeError(
            "inference of a trajforge env goes through trajforge's models, not atroposlib's servers"
        )

    _chat_completion_wrapper = _refuse
    _completion_wrapper = _refuse
    _tokens_and_logprobs_completion_wrapper = _refuse


class _InTurn:
    """``RolloutBackends.model_for``: rollouts take the servers in turn."""

    def __init__(self, models: Sequence[ChatModel]) -> None:
        self._next = itertools.cycle(models)

    def __call__(self, env: AgentEnv, item: Item) -> ChatModel:
        return next(self._next)


class AtroposAgentEnv(AtroposBaseEnv):  # type: ignore[misc]  # atroposlib ships no type information
    """Atropos ``BaseEnv`` running a trajforge env's groups. Bind it to an env with
    :func:`atropos_env_class` (atroposlib's CLI builds configs from class attributes)."""

    name: ClassVar[str | None] = None
    env_config_cls: ClassVar[type] = AtroposEnvConfig
    server_cls: ClassVar[type] = ConfigOnlyServer
    trajforge_env_ref: ClassVar[str] = "tiny_tasks"

    def __init__(
        self,
        config: AtroposEnvConfig,
        server_configs: Any,
        slurm: bool = False,
        testing: bool = False,
    ) -> None:
        _require_local_tokenizer(config.tokenizer_name, "--env.tokenizer_name")
        self.server_list = _as_list(server_configs)
        super().__init__(config, self.server_list, slurm=slurm, testing=testing)
        self.agent_env: AgentEnv = load_env(config.trajforge_env, config.overrides() or None)
        self.token_level = endpoint_kind(self.server_list[0], config.inference_endpoint) != "chat"
        if any(
            (endpoint_kind(s, config.inference_endpoint) != "chat") != self.token_level
            for s in self.server_list
        ):
            raise AtroposAdapterError(
                "mix of chat and token-level servers: a group must be all tokens or all messages; "
                "give every server the same server_type (or set --env.inference_endpoint)"
            )
        self.tally = GroupTally()
        self.rollouts: Rollouts | None = None
        self._models: list[ChatModel] = []
        self._factory: Any = None
        self._write_lock = asyncio.Lock()

    @classmethod
    def config_init(cls) -> tuple[AtroposEnvConfig, list[Any]]:
        from trajforge.endpoint import embedded_weights

        try:
            tokenizer = str(embedded_weights())
        except FileNotFoundError:
            tokenizer = ""
        env_cls_config = load_env(cls.trajforge_env_ref).config
        cfg = AtroposEnvConfig(
            trajforge_env=cls.trajforge_env_ref,
            tokenizer_name=tokenizer,
            use_wandb=False,
            wandb_name=cls.name,
            group_size=env_cls_config.group_size,
            ensure_scores_are_not_same=True,
        )
        return cfg, [APIServerConfig(base_url="", model_name="default", api_key="", server_type="openai")]

    # ------------------------------------------------------------------ lifecycle

    async def setup(self) -> None:
        from trajforge.sandbox import create_sandbox_factory
        from trajforge.sandbox.types import SandboxConfig
        from trajforge.tools.builtin import default_registry

        if self.rollouts is not None:
            return
        await self.agent_env.setup()
        parser = self.agent_env.config.tool_call_parser
        self._models = [build_model(s, self.config, parser) for s in self.server_list]
        self._factory = create_sandbox_factory(
            env_sandbox_config(
                self.agent_env,
                SandboxConfig(
                    kind=self.agent_env.config.sandbox,
                    command_timeout_s=self.agent_env.config.command_timeout_s,
                ),
            )
        )
        backends = RolloutBackends(
            model=self._models[0],
            factory=self._factory,
            registry=default_registry(),
            model_for=_InTurn(self._models) if len(self._models) > 1 else None,
        )
        self.rollouts = Rollouts(self.agent_env, backends)
        log.info(
            "atropos adapter: env %s, %d server(s), groups of %d as %s",
            self.agent_env.name,
            len(self._models),
            self.config.group_size,
            describe_phase(self.token_level),
        )

    async def aclose(self) -> None:
        """Close the models and the sandbox pool (atroposlib has no teardown hook; its CLI modes
        end the process)."""
        from trajforge.sandbox import close_factory

        for model in self._models:
            closer = getattr(model, "aclose", None)
            if closer is not None:
                await closer()
        if self._factory is not None:
            await close_factory(self._factory)
        self._models, self._factory, self.rollouts = [], None, None

    async def env_manager(self) -> None:
        try:
            await super().env_manager()
        finally:
            await self.aclose()

    async def process_manager(self) -> None:
        try:
            await super().process_manager()
        finally:
            await self.aclose()

    async def _run_evaluate(self) -> None:
        try:
            await super()._run_evaluate()
        finally:
            await self.aclose()

    # ------------------------------------------------------------------ atroposlib hooks

    async def get_next_item(self) -> Item:
        return await self.agent_env.get_next_item()

    async def collect_trajectories(self, item: Item) -> tuple[dict[str, Any] | None, list[Item]]:
        if self.rollouts is None:
            await self.setup()
        assert self.rollouts is not None
        episodes = await self.rollouts.group(item, self.config.group_size)
        result = scored_group(
            episodes,
            token_level=self.token_level,
            group_size=self.config.group_size,
            include_messages=bool(self.config.include_messages),
            temperature=self.agent_env.config.agent_temperature,
        )
        sent = self.tally.add(result, len(episodes), drop_equal=bool(self.config.ensure_scores_are_not_same))
        if result.dropped:
            log.warning("group of %s: episodes left out: %s", self.agent_env.item_id(item), result.dropped)
        if result.group is not None and not sent:
            log.info(
                "group of %s: all scores equal (%s): Atropos drops it",
                self.agent_env.item_id(item),
                result.group["scores"][0],
            )
        await self._record(episodes)
        if self.tally.consecutive_empty >= MAX_EMPTY_GROUPS_IN_A_ROW:
            raise AtroposAdapterError(
                f"{self.tally.consecutive_empty} groups in a row had no usable episode "
                f"({dict(self.tally.dropped)}); check the servers and the sandbox"
            )
        return result.group, []

    async def wandb_log(self, wandb_metrics: dict[str, Any] | None = None) -> None:
        metrics = dict(wandb_metrics or {})
        metrics.update(self.tally.metrics())
        await super().wandb_log(metrics)

    async def evaluate(self, *args: Any, **kwargs: Any) -> dict[str, float]:
        """The env's eval items, one rollout each; metrics saved with atroposlib's
        ``evaluate_log`` (when ``data_dir_to_save_evals`` is set) and wandb when on."""
        if self.rollouts is None:
            await self.setup()
        assert self.rollouts is not None
        items = self.agent_env.eval_items(self.config.eval_n)
        start = time.time()
        episodes = list(await asyncio.gather(*(self.rollouts.episode(it) for it in items)))
        end = time.time()
        summary = summarize(episodes, self.agent_env.name)
        metrics = {
            "eval/mean_reward": summary.mean_reward.value,
            "eval/pass@1": summary.pass_at_1.value,
            "eval/episodes": float(summary.episodes),
            "eval/failed": float(summary.failed),
            "eval/reward_errors": float(summary.reward_errors),
        }
        await self._record(episodes)
        await self.evaluate_log(
            metrics,
            start_time=start,
            end_time=end,
            samples=[ep.model_dump(mode="json") for ep in episodes],
            generation_parameters={"temperature": self.agent_env.config.agent_temperature},
        )
        if self.config.use_wandb:
            await super().wandb_log(metrics)
        return metrics

    # ------------------------------------------------------------------ records

    async def _record(self, episodes: Sequence[Episode]) -> None:
        if not self.config.episodes_path:
            return
        path = Path(self.config.episodes_path)
        lines = "".join(ep.model_dump_json() + "\n" for ep in episodes)
        stats = json.dumps(self.tally.as_dict(), indent=1)
        async with self._write_lock:
            await asyncio.to_thread(_append_and_stats, path, lines, stats)


def _append_and_stats(path: Path, lines: str, stats: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as fh:
        fh.write(lines)
    stats_path = path.with_name(path.name + ".stats.json")
    tmp = stats_path.with_name(stats_path.name + ".tmp")
    tmp.write_text(stats)
    tmp.replace(stats_path)


def _as_list(server_configs: Any) -> list[Any]:
    if isinstance(server_configs, APIServerConfig):
        return [server_configs]
    if isinstance(server_configs, ServerBaseline):
        raise AtroposAdapterError(
            "server configs must name their endpoints: pass --openai.base_url URL (and server_type), "
            "or a list under `openai:` in the YAML --config"
        )
    servers = list(server_configs)
    if not servers:
        raise AtroposAdapterError("no server configs: pass --openai.base_url URL")
    return servers


def atropos_env_class(ref: str) -> type[AtroposAgentEnv]:
    """An Atropos env class bound to the trajforge env ``ref`` (its ``cli()`` runs serve/process/evaluate)."""
    env = load_env(ref)  # fails early, naming the known envs
    name = env_name(env, ref)
    return type(
        f"Atropos_{''.join(c if c.isalnum() else '_' for c in name)}",
        (AtroposAgentEnv,),
        {"name": name, "trajforge_env_ref": ref},
    )


__all__ = [
    "AtroposAdapterError",
    "AtroposAgentEnv",
    "AtroposEnvConfig",
    "atropos_env_class",
    "build_model",
    "endpoint_kind",
]
