"""TRL adapter: an :class:`~trajforge.envs.protocol.AgentEnv` drives ``GRPOTrainer``'s rollouts.

TRL (1.x) has two rollout hooks. ``environment_factory`` runs TRL's *own* tool loop with the
environment's Python methods as tools; ``rollout_func(prompts, trainer)`` hands generation to the
caller, who returns ``prompt_ids`` / ``completion_ids`` / ``logprobs`` (plus ``env_mask``, TRL's
mask of the tokens the model sampled, and any extra fields, which reach the reward functions).
We use ``rollout_func``: rollouts then run exactly as in ``trajforge env eval`` -- our agent
loop, our tools, each rollout in its own sandbox, the reward computed by the env's
``compute_reward`` inside that sandbox before it is reset -- and TRL gets the episode's exact
token trace (every turn's sampled ids with their logprobs; tool results and the template's
text between turns masked out), never a re-tokenization.

The policy that samples is the trainer's own model, through :class:`~trajforge.rl.adapters.hf_policy.
LivePolicy` (the ``trajforge serve`` engine around the live module, on loopback). TRL's
``_generate`` calls ``rollout_func`` between optimizer steps, so every rollout samples the
current weights.

Usage::

    adapter = EnvGRPO(env)                       # bwrap sandboxes, default tools
    trainer = GRPOTrainer(model, reward_funcs=adapter.reward_funcs, args=GRPOConfig(...),
                          train_dataset=adapter.dataset(64), processing_class=tokenizer,
                          rollout_func=adapter.rollout_func)
    trainer.train(); adapter.close()

TRL's ``RepeatSampler`` repeats each dataset row ``num_generations`` times, so the prompts
``rollout_func`` receives already form the GRPO groups (under ``accelerate launch`` each process
receives whole groups of its own items: ``rl/trl_trainer.py`` lays the batch out so); rollout ``k`` of an item gets its own
seed, toolset draw and sandbox. The dataset's ``prompt`` (the env's user prompt) identifies the
item; :meth:`EnvGRPO.dataset` refuses items whose prompts collide. The env's system prompt and
tool schemas are added by the rollout, as in every other trajforge path.

torch/transformers/TRL/datasets are imported only when an adapter is used.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from trajforge.distributions import derive_seed
from trajforge.envs.protocol import AgentEnv
from trajforge.envs.running.episode import RolloutBackends, Rollouts, env_sandbox_config
from trajforge.envs.types import Episode, Item
from trajforge.llm.token_trace import MASKED
from trajforge.sandbox import close_factory, create_sandbox_factory
from trajforge.sandbox.types import SandboxConfig
from trajforge.tools.builtin import default_registry
from trajforge.tools.registry import ToolRegistry

if TYPE_CHECKING:
    from trajforge.rl.adapters.hf_policy import LivePolicy

log = logging.getLogger(__name__)

T = TypeVar("T")

REWARD_FIELD = "env_reward"
"""Extra rollout field holding each episode's reward (read by :attr:`EnvGRPO.reward_funcs`)."""
STATUS_FIELD = "env_status"
"""Extra rollout field: the episode's status (completed|partial|failed)."""


class EnvGRPOError(ValueError):
    """The adapter cannot be used as configured; the message says what to change."""


@dataclass
class RolloutStats:
    """What the adapter has done so far (logged to TRL as ``env/*`` metrics too)."""

    calls: int = 0
    episodes: int = 0
    failed: int = 0
    untraced: int = 0
    reward_errors: int = 0
    sampled_tokens: int = 0
    masked_tokens: int = 0
    last_rewards: list[float] = field(default_factory=list)


class _LoopThread:
    """One event loop on a daemon thread owning every async resource of the adapter.

    TRL calls ``rollout_func`` synchronously from its training thread; sandboxes, the live
    policy's server and the rollouts all live on this loop, across calls.
    """

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="trajforge-envgrpo", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def stop(self) -> None:
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=30)
        if not self.loop.is_running() and not self.loop.is_closed():
            self.loop.close()


def prompt_key(prompt: Any) -> str:
    """The identity of a dataset prompt as TRL hands it back (messages or text)."""
    return json.dumps(prompt, sort_keys=True, ensure_ascii=False, default=str)


class EnvGRPO:
    """Rollouts of ``env`` for TRL's ``GRPOTrainer`` (``rollout_func`` + ``reward_funcs``).

    ``sandbox`` defaults to the env config's backend; ``registry`` to the default tools.
    ``max_batch`` sequences are decoded together by the live policy. Call :meth:`close` (or use
    ``with``) when training is over: it stops the sandboxes, the policy server and the loop.
    """

    def __init__(
        self,
        env: AgentEnv,
        *,
        sandbox: SandboxConfig | None = None,
        registry: ToolRegistry | None = None,
        max_batch: int = 16,
        policy_name: str = "policy",
    ) -> None:
        self.env = env
        self.sandbox_config = sandbox or SandboxConfig(
            kind=env.config.sandbox, command_timeout_s=env.config.command_timeout_s
        )
        self.registry = registry or default_registry()
        self.max_batch = max_batch
        self.policy_name = policy_name
        self.stats = RolloutStats()
        self.last_episodes: list[Episode] = []
        self._items: dict[str, Item] = {}
        self._loop = _LoopThread()
        self._factory: Any = None
        self._policy: LivePolicy | None = None
        self._set_up = False
        self._closed = False

    # ------------------------------------------------------------------ data

    def dataset(self, n: int, *, split: str = "train") -> Any:
        """A ``datasets.Dataset`` of ``n`` env items: ``prompt`` (conversational), ``item_id``."""
        from datasets import Dataset

        if n < 1:
            raise EnvGRPOError(f"dataset size must be at least 1, got {n}")
        items = self._loop.call(self._take_items(n, split))
        rows = []
        for item in items:
            prompt = self._prompt(item)
            key = prompt_key(prompt)
            known = self._items.get(key)
            if known is not None and self.env.item_id(known) != self.env.item_id(item):
                raise EnvGRPOError(
                    f"items {self.env.item_id(known)} and {self.env.item_id(item)} of env {self.env.name!r} "
                    "have the same prompt, so a TRL rollout cannot tell them apart; drop one or make "
                    "format_prompt include what differs"
                )
            self._items[key] = item
            rows.append({"prompt": prompt, "item_id": self.env.item_id(item)})
        return Dataset.from_list(rows)

    async def _take_items(self, n: int, split: str) -> list[Item]:
        await self._setup()
        if split == "eval":
            return list(self.env.eval_items(n))
        if split != "train":
            raise EnvGRPOError(f"split must be 'train' or 'eval', got {split!r}")
        return [await self.env.get_next_item() for _ in range(n)]

    def _prompt(self, item: Item) -> list[dict[str, Any]]:
        prompt = self.env.format_prompt(item)
        if isinstance(prompt, str):
            return [{"role": "user", "content": prompt}]
        return [dict(m) for m in prompt]

    async def _setup(self) -> None:
        if not self._set_up:
            await self.env.setup()
            self._set_up = True

    # ------------------------------------------------------------------ TRL hooks

    @property
    def reward_funcs(self) -> list[Callable[..., list[float]]]:
        """One reward function (named after the env) that returns the rollout's own reward."""
        stats = self.stats

        def reward(prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any) -> list[float]:
            rewards = kwargs.get(REWARD_FIELD)
            if rewards is None or len(rewards) != len(prompts):
                raise EnvGRPOError(
                    f"no {REWARD_FIELD!r} for these completions: pass rollout_func=adapter.rollout_func "
                    "to GRPOTrainer so rollouts (and their rewards) come from the env"
                )
            log_metric = kwargs.get("log_metric")
            if callable(log_metric):
                statuses = kwargs.get(STATUS_FIELD) or []
                log_metric(
                    "env/failed_fraction", sum(s == "failed" for s in statuses) / max(1, len(statuses))
                )
                log_metric("env/untraced_total", float(stats.untraced))
            return [float(r) for r in rewards]

        reward.__name__ = f"{self.env.name}_reward"
        return [reward]

    def rollout_func(self, prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        """TRL's ``rollout_func``: one judged episode per prompt, as exact token sequences."""
        if self._closed:
            raise EnvGRPOError("this EnvGRPO was closed; make a new one")
        items = []
        for prompt in prompts:
            item = self._items.get(prompt_key(prompt))
            if item is None:
                raise EnvGRPOError(
                    "a prompt TRL passed is not one of this adapter's items; build train_dataset "
                    "with adapter.dataset(n)"
                )
            items.append(item)
        model = trainer.accelerator.unwrap_model(trainer.model)
        if hasattr(model, "peft_config") and hasattr(model, "get_base_model"):
            # a LoRA policy: sample from the adapted transformers model inside the peft wrapper
            # (its layers carry the live adapters; the wrapper's forward would not pass the engine's
            # KV cache through under the name this transformers version takes)
            model = model.get_base_model()
        tokenizer = trainer.processing_class
        tokenizer = getattr(tokenizer, "tokenizer", tokenizer)  # a processor wraps its tokenizer
        policy = self._loop.call(self._ensure_policy(model, tokenizer))
        with policy.sampling():
            episodes = self._loop.call(self._run(items))
        self.last_episodes = episodes
        return self._to_trl(episodes, prompts, policy)

    async def _ensure_policy(self, model: Any, tokenizer: Any) -> LivePolicy:
        from trajforge.rl.adapters.hf_policy import LivePolicy

        if self._policy is not None and self._policy.model is model and self._policy.tokenizer is tokenizer:
            return self._policy
        if self._policy is not None:
            await self._policy.aclose()
        default_max = self.env.config.max_tokens or 256
        self._policy = await LivePolicy(
            model,
            tokenizer,
            name=self.policy_name,
            parser=self.env.config.tool_call_parser,
            max_batch=self.max_batch,
            default_max_tokens=default_max,
        ).start()
        return self._policy

    async def _run(self, items: list[Item]) -> list[Episode]:
        await self._setup()
        if self._factory is None:
            self._factory = create_sandbox_factory(env_sandbox_config(self.env, self.sandbox_config))
        assert self._policy is not None
        rollouts = Rollouts(
            self.env,
            RolloutBackends(
                model=self._policy.chat_model,
                factory=self._factory,
                registry=self.registry,
                template=self._policy.template,
            ),
        )
        self.stats.calls += 1
        call = self.stats.calls
        sizes: dict[str, int] = {}
        for item in items:
            sizes[self.env.item_id(item)] = sizes.get(self.env.item_id(item), 0) + 1
        seen: dict[str, int] = {}
        jobs = []
        for item in items:
            item_id = self.env.item_id(item)
            k = seen.get(item_id, 0)
            seen[item_id] = k + 1
            seed = derive_seed(self.env.config.seed, f"trl#{call}#{item_id}#{k}")
            jobs.append(rollouts.episode(item, rollout=k, group_size=sizes[item_id], seed=seed))
        return list(await asyncio.gather(*jobs))

    def _to_trl(
        self, episodes: list[Episode], prompts: list[Any], policy: LivePolicy
    ) -> dict[str, list[Any]]:
        out: dict[str, list[Any]] = {
            "prompt_ids": [],
            "completion_ids": [],
            "logprobs": [],
            "env_mask": [],
            REWARD_FIELD: [],
            STATUS_FIELD: [],
        }
        end_id = policy.template.end_of_turn_id
        stats = self.stats
        for ep, prompt in zip(episodes, prompts, strict=True):
            stats.episodes += 1
            stats.failed += ep.status == "failed"
            stats.reward_errors += ep.reward_failed
            trace = ep.trace
            if trace is not None:
                start = next(i for i, m in enumerate(trace.masks) if m != MASKED)
                prompt_ids = trace.tokens[:start]
                completion_ids = trace.tokens[start:]
                mask = [int(m != MASKED) for m in trace.masks[start:]]
                logprobs = [lp if m else 0.0 for lp, m in zip(trace.logprobs[start:], mask, strict=True)]
            else:
                # No exact trace (the rollout failed before the model sampled, or the backend broke
                # token-exactness): the episode still has its reward (GRPO's group baseline needs
                # it), but contributes no trained token.
                stats.untraced += 1
                log.warning("episode %s has no token trace (%s); trained on no token", ep.key, ep.trace_error)
                prompt_ids = policy.template.prompt_ids(list(prompt))
                completion_ids, mask, logprobs = [end_id], [0], [0.0]
            stats.sampled_tokens += sum(mask)
            stats.masked_tokens += len(mask) - sum(mask)
            out["prompt_ids"].append(prompt_ids)
            out["completion_ids"].append(completion_ids)
            out["logprobs"].append(logprobs)
            out["env_mask"].append(mask)
            out[REWARD_FIELD].append(ep.score)
            out[STATUS_FIELD].append(ep.status)
        stats.last_rewards = list(out[REWARD_FIELD])
        return out

    # ------------------------------------------------------------------ lifecycle

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._loop.call(self._aclose())
        finally:
            self._loop.stop()

    async def _aclose(self) -> None:
        policy, self._policy = self._policy, None
        factory, self._factory = self._factory, None
        if policy is not None:
            await policy.aclose()
        if factory is not None:
            await close_factory(factory)

    def __enter__(self) -> EnvGRPO:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
