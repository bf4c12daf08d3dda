"""``SandboxedEnv``: an agent-written env as an :class:`~trajforge.envs.protocol.AgentEnv` on the
host, whose every hook runs in the env host (:mod:`.host`) -- never in a host interpreter.

Items are plain JSON and come with what the synchronous hooks would say of them (id, prompt,
setup and verifier files, category), checked here and kept in a bounded cache, so
``format_prompt(item)`` on the event loop costs no round trip. An item the cache does not know
(one read back from ``episodes.jsonl``) and ``eval_items`` are one synchronous round trip,
bounded by ``call_timeout_s``. ``compute_reward``/``keep`` run in the env host; the calls its
reward code makes back reach the rollout's own sandbox through the ``VerifierContext`` the judge
gave this proxy.

The config on the host is an :class:`AgentEnvConfig`: ``EnvConfig``'s fields validated here (so
the host decides concurrency, deadlines and the sandbox the rollouts get), the env's own fields
kept as JSON and validated by its config class inside the env host.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from trajforge.envs.base import EnvDataError
from trajforge.envs.config import EnvConfig, EnvConfigError
from trajforge.envs.sandboxed.host import EnvHost, EnvHostCallError, EnvHostConfig
from trajforge.envs.sandboxed.store import AgentEnvError, AgentEnvRef
from trajforge.envs.sandboxed.wire import WireError, files_in
from trajforge.envs.types import Item, RewardBreakdown

if TYPE_CHECKING:
    from trajforge.agent.result import AgentResult
    from trajforge.envs.verifier import VerifierContext

_CACHE_ITEMS = 4096
_ISOLATED = ("bwrap", "docker")


class AgentEnvConfig(EnvConfig):
    """An agent env's config on the host: ``EnvConfig``'s fields checked here, the env's own
    (extra) fields carried as JSON to its config class in the env host."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)


class _Init(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(max_length=200)
    description: str = Field(max_length=4000)
    config: dict[str, Any]
    system_prompt: str | None = Field(None, max_length=200_000)


class _Bundle(BaseModel):
    model_config = ConfigDict(extra="forbid")

    item: dict[str, Any]
    id: str = Field(max_length=1000)
    prompt: str | list[dict[str, Any]]
    setup_files: dict[str, Any]
    verifier_files: dict[str, Any]
    category: str | None = Field(None, max_length=1000)


@dataclass(frozen=True)
class _Info:
    id: str
    prompt: str | list[dict[str, Any]]
    setup_files: dict[str, bytes | str]
    verifier_files: dict[str, bytes | str]
    category: str | None


def _key(item: Item) -> str:
    return hashlib.sha256(json.dumps(item, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _host_failure(label: str, exc: EnvHostCallError) -> Exception:
    if exc.kind == "config":
        return EnvConfigError(f"{label}: {exc}")
    if exc.kind == "data":
        return EnvDataError(f"{label}: {exc}")
    return RuntimeError(f"{label} (in the env sandbox): {exc}")


class SandboxedEnv:
    """An agent-written env behind its env host. Build with :meth:`start` (blocking: it starts
    the sandbox and imports the env file there); end with :meth:`aclose` or :meth:`close` (also
    done when it is garbage collected or the process exits)."""

    config_class: ClassVar[type[EnvConfig]] = AgentEnvConfig
    name: ClassVar[str] = "agent"  # each instance names its env: agent/NAME
    description: ClassVar[str] = "an env written by the RL agent, run in its env host"

    def __init__(self, ref: AgentEnvRef, host: EnvHost, init: Mapping[str, Any]) -> None:
        try:
            answer = _Init.model_validate(init)
        except ValidationError as exc:
            host.close()
            raise AgentEnvError(f"{ref.label}: the env host's init answer is not valid: {exc}") from None
        self.ref = ref
        self.label = ref.label
        self._host = host
        self.name = f"agent/{answer.name}"  # type: ignore[misc]  # provenance in every record
        self.description = answer.description  # type: ignore[misc]
        self._system_prompt = answer.system_prompt
        try:
            self.config: EnvConfig = AgentEnvConfig.model_validate(answer.config)
        except ValidationError as exc:
            host.close()
            raise EnvConfigError(f"{ref.label}: invalid env config: {exc}") from None
        if self.config.sandbox not in _ISOLATED:
            host.close()
            raise EnvConfigError(
                f"{ref.label} asks for sandbox={self.config.sandbox!r}: the rollouts of an agent-written "
                f"env run isolated ({' or '.join(_ISOLATED)}); set sandbox to bwrap"
            )
        self._cache: OrderedDict[str, _Info] = OrderedDict()

    @classmethod
    def default_config(cls) -> EnvConfig:
        """Only EnvConfig's defaults: the env's own come from its code, known once it is started."""
        return AgentEnvConfig()

    @classmethod
    def start(
        cls,
        ref: AgentEnvRef,
        source: bytes,
        *,
        config: EnvConfig | None = None,
        overrides: Mapping[str, Any] | None = None,
        host_config: EnvHostConfig | None = None,
    ) -> SandboxedEnv:
        try:
            host, init = EnvHost.start(
                source=source,
                filename=ref.path.name,
                class_name=ref.class_name,
                config=config.model_dump(mode="json") if config is not None else None,
                overrides={k: v for k, v in (overrides or {}).items() if v is not None} or None,
                host_config=host_config,
            )
        except EnvHostCallError as exc:
            if exc.kind == "config":
                raise EnvConfigError(f"{ref.label}: {exc}") from None
            raise AgentEnvError(f"{ref.label} failed to load in the env sandbox: {exc}") from None
        return cls(ref, host, init)

    # ------------------------------------------------------------------ life
    def close(self) -> None:
        self._host.close()

    async def aclose(self) -> None:
        await asyncio.to_thread(self._host.close)

    @property
    def host(self) -> EnvHost:
        return self._host

    # ------------------------------------------------------------------ items
    def _take(self, value: Any) -> Item:
        try:
            bundle = _Bundle.model_validate(value)
            info = _Info(
                id=bundle.id,
                prompt=bundle.prompt,
                setup_files=files_in(bundle.setup_files),
                verifier_files=files_in(bundle.verifier_files),
                category=bundle.category,
            )
        except (ValidationError, WireError) as exc:
            raise EnvDataError(f"{self.label}: an item from the env host is not valid: {exc}") from None
        key = _key(bundle.item)
        self._cache[key] = info
        self._cache.move_to_end(key)
        while len(self._cache) > _CACHE_ITEMS:
            self._cache.popitem(last=False)
        return bundle.item

    def _info(self, item: Item) -> _Info:
        key = _key(item)
        info = self._cache.get(key)
        if info is None:
            self._take(self._sync("info", item=item))
            info = self._cache[key]
        return info

    def _sync(self, op: str, **fields: Any) -> Any:
        try:
            return self._host.call_sync(op, **fields)
        except EnvHostCallError as exc:
            raise _host_failure(self.label, exc) from None

    async def _async(self, op: str, **fields: Any) -> Any:
        try:
            return await self._host.call(op, **fields)
        except EnvHostCallError as exc:
            raise _host_failure(self.label, exc) from None

    async def setup(self) -> None:
        await self._async("setup")

    async def get_next_item(self) -> Item:
        return self._take(await self._async("next_item"))

    def eval_items(self, n: int) -> list[Item]:
        value = self._sync("eval_items", n=int(n))
        if not isinstance(value, list):
            raise EnvDataError(f"{self.label}: eval_items did not answer a list")
        return [self._take(v) for v in value]

    def item_id(self, item: Item) -> str:
        return self._info(item).id

    def format_prompt(self, item: Item) -> str | list[dict[str, Any]]:
        return self._info(item).prompt

    def setup_files(self, item: Item) -> Mapping[str, bytes | str]:
        return self._info(item).setup_files

    def verifier_files(self, item: Item) -> Mapping[str, bytes | str]:
        return self._info(item).verifier_files

    def category(self, item: Item) -> str | None:
        return self._info(item).category

    def system_prompt(self) -> str | None:
        return self.config.system_prompt or self._system_prompt

    def example_item(self) -> Item:
        return self.eval_items(1)[0]

    # ------------------------------------------------------------------ judging
    def _sandbox_facts(self, ctx: VerifierContext) -> dict[str, str]:
        return {"workdir": ctx.workdir, "task_id": ctx.sandbox.task_id}

    async def compute_reward(
        self, item: Item, result: AgentResult, ctx: VerifierContext
    ) -> float | RewardBreakdown:
        value = await self._async(
            "compute_reward",
            ctx=ctx,
            timeout_s=self.config.reward_timeout_s,
            item=item,
            result=result.model_dump(mode="json"),
            sandbox=self._sandbox_facts(ctx),
        )
        try:
            return RewardBreakdown.model_validate(value)
        except ValidationError as exc:
            raise ValueError(f"{self.label}: the env host's reward is not valid: {exc}") from None

    async def keep(self, item: Item, result: AgentResult, ctx: VerifierContext) -> dict[str, Any]:
        value = await self._async(
            "keep",
            ctx=ctx,
            timeout_s=self.config.reward_timeout_s,
            item=item,
            result=result.model_dump(mode="json"),
            sandbox=self._sandbox_facts(ctx),
        )
        if not isinstance(value, dict):
            raise ValueError(f"{self.label}: keep must return a JSON object")
        return value

    async def rescore(
        self, item: Item, messages: list[dict[str, Any]], kept: dict[str, Any]
    ) -> float | RewardBreakdown | None:
        value = await self._async("rescore", item=item, messages=messages, kept=kept)
        if value is None:
            return None
        try:
            return RewardBreakdown.model_validate(value)
        except ValidationError as exc:
            raise ValueError(f"{self.label}: the env host's rescore is not valid: {exc}") from None


def load_agent_env(
    ref: str,
    overrides: Mapping[str, Any] | None = None,
    config: EnvConfig | None = None,
    *,
    host_config: EnvHostConfig | None = None,
) -> SandboxedEnv:
    """The env an ``agent-env:`` reference names, running in its env host -- only when the store
    records the operator's approval of exactly these bytes (``AgentEnvNotApproved`` otherwise:
    nothing of the file ran). Blocking (starts a sandbox): async callers use a thread."""
    from trajforge.envs.sandboxed.store import AgentEnvStore, parse_ref

    parsed = parse_ref(ref)
    source = AgentEnvStore(parsed.store).read_approved(parsed)
    return SandboxedEnv.start(parsed, source, config=config, overrides=overrides, host_config=host_config)
