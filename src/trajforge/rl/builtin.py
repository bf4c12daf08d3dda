"""The ``builtin`` trainer: GRPO in torch on token-exact episodes sampled by ``trajforge serve``.

One step::

    rollouts (server, weights of step w)  ->  groups -> advantages -> samples
    train (a worker thread: forward/backward on sampled tokens, AdamW)
    save checkpoints/step-k  ->  POST /v1/load_weights  ->  the server samples step k's weights

Bounded staleness: the rollouts of step k may start as soon as the server holds the weights of
step ``k - 1 - max_staleness``, so with ``max_staleness = 1`` step k+1's rollouts are sampled
while step k trains (the CPU works on both). The loss's ratio is taken against the logprobs the
server reported when it sampled, so a rollout of older weights is importance-corrected, not
treated as on-policy. Each metric line records the staleness it trained on.

Resumable: ``state.json`` names the last checkpoint with optimizer state; a restarted run loads
it, serves it, skips the items already used and continues at the next step.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trajforge.distributions import derive_seed
from trajforge.envs.catalog import load_env
from trajforge.envs.protocol import AgentEnv
from trajforge.envs.running.episode import RolloutBackends, Rollouts, env_sandbox_config
from trajforge.envs.types import Episode, Item
from trajforge.protocols import SandboxFactory
from trajforge.rl.checkpoint import OPTIMIZER_FILE, RunDir, RunState
from trajforge.rl.config import TrainConfig, TrainConfigError
from trajforge.rl.guide import attach_guided_traces, guide_group
from trajforge.rl.policy_server import PolicyServer
from trajforge.rl.samples import StepRollouts, build_samples, rollout_metrics, span_staleness
from trajforge.rl.update import grpo_update
from trajforge.sandbox import close_factory, create_sandbox_factory
from trajforge.sandbox.types import SandboxConfig
from trajforge.tools.builtin import default_registry

log = logging.getLogger(__name__)

DEFAULT_MAX_TOKENS = 256
"""Max new tokens per model call when neither the run nor the env says."""

StepHook = Callable[[dict[str, Any]], Awaitable[None] | None]
"""Called with each step's metric line after its checkpoint is safe (progress, demos, tests)."""

WarmStartHook = Callable[[Path, dict[str, Any]], Awaitable[None] | None]
"""Called with the warm-started model directory and its report, before GRPO's first step."""


@dataclass
class TrainResult:
    steps_done: int
    last_step: int
    final_checkpoint: Path
    resumed_from: int | None
    metrics: list[dict[str, Any]]
    warm_start: dict[str, Any] | None = None
    """The warm start's report (``warm_start.json``) when the run has one."""


def resolve_device(name: str) -> str:
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise TrainConfigError(f"device {name!r} asked for, but torch sees no CUDA device; use --device cpu")
    return name


UNFILTERED = {"top_p": 1.0, "top_k": 0}
"""Sampling settings of every training rollout: no nucleus or top-k filter. The trainer computes
its logprobs over the whole vocabulary (at the rollout temperature), so the sampler must sample
from that same distribution; a server fills an omitted ``top_p``/``top_k`` from the model's
``generation_config.json`` (Qwen and most chat models ship ``top_p < 1``, ``top_k > 0``), and a
filtered sampler would bias every ratio and every logprob the loss compares."""


def full_distribution(extra_body: dict[str, Any]) -> dict[str, Any]:
    """``extra_body`` with :data:`UNFILTERED` pinned; a filter the user asked for is refused."""
    top_p, top_k = extra_body.get("top_p"), extra_body.get("top_k")
    if (top_p is not None and float(top_p) != 1.0) or (top_k is not None and int(top_k) > 0):
        raise TrainConfigError(
            f"training rollouts sample the full distribution the trainer computes; extra_body sets "
            f"top_p={top_p!r} top_k={top_k!r}: remove them from env_overrides.extra_body"
        )
    return {**extra_body, **UNFILTERED}


def training_env(config: TrainConfig) -> AgentEnv:
    """The env rollouts come from, with the run's sampling settings applied."""
    overrides: dict[str, Any] = dict(config.env_overrides)
    overrides.update({"max_concurrent_rollouts": config.concurrency, "seed": config.seed})
    if config.max_tokens is not None:
        overrides["max_tokens"] = config.max_tokens
    if config.temperature is not None:
        overrides["agent_temperature"] = config.temperature
    if config.max_turns is not None:
        overrides["max_agent_turns"] = config.max_turns
    if config.sandbox is not None:
        overrides["sandbox"] = config.sandbox
    env = load_env(config.env, overrides)
    if env.config.max_tokens is None:
        env.config = env.config.model_copy(update={"max_tokens": DEFAULT_MAX_TOKENS})
    env.config = env.config.model_copy(update={"extra_body": full_distribution(env.config.extra_body)})
    if env.config.agent_temperature <= 0:
        raise TrainConfigError(
            "GRPO needs sampled rollouts: the rollout temperature is 0 (greedy); set --temperature > 0"
        )
    return env


class BuiltinTrainer:
    """``await BuiltinTrainer(config).run()``; see the module doc."""

    def __init__(
        self,
        config: TrainConfig,
        *,
        on_step: StepHook | None = None,
        on_warm_start: WarmStartHook | None = None,
        stop_after: Callable[[dict[str, Any]], bool] | None = None,
    ) -> None:
        self.config = config
        self.on_step = on_step
        self.on_warm_start = on_warm_start
        self.stop_after = stop_after
        """Asked with each step's metric line (after ``on_step``): True ends the run after that
        step, its checkpoint the result (a time budget: ``rl demo``)."""
        self.run_dir = RunDir(config.output_dir)
        self.device = resolve_device(config.device)
        self._loaded_step = 0
        self._loaded = asyncio.Condition()
        self.temperature = 1.0
        self.server: PolicyServer | None = None
        """The rollout server while :meth:`run` runs (a step hook may evaluate through it)."""
        self._oracle: Rollouts | None = None
        """Rollouts of the env's oracle (``guide="oracle"``): reference episodes for guided groups."""
        self._step_of_version: dict[int, int] = {}
        """Server weight version -> the training step whose weights it is (staleness per span)."""

    # ------------------------------------------------------------------ setup

    def _load(self, state: RunState | None, base: Path) -> tuple[Any, Any, Any, Any]:
        """Policy, tokenizer, optimizer and KL reference. ``base`` is the model GRPO starts from
        (the warm start's when there is one): the reference, and the policy of a fresh run. With
        LoRA (``config.lora``) the policy is ``base`` with adapters -- a resumed run's adapters
        from its checkpoint -- and the reference is the same model with its adapters off."""
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from trajforge.rl import fit

        cfg = self.config
        torch.manual_seed(cfg.seed)
        tokenizer = AutoTokenizer.from_pretrained(str(cfg.model))
        checkpoint = self.run_dir.root / state.checkpoint if state else None
        if cfg.lora is not None:
            adapter = fit.adapter_dir(checkpoint) if checkpoint is not None else None
            if checkpoint is not None and adapter is None:
                raise TrainConfigError(
                    f"{checkpoint} has no LoRA adapters ({fit.ADAPTER_DIR}/) to resume; it was trained "
                    "without lora: resume it without lora or pick another --output-dir"
                )
            model = fit.load_policy(cfg, base, self.device, adapter=adapter)
        else:
            model = fit.load_policy(cfg, checkpoint or base, self.device)
        optimizer = torch.optim.AdamW(
            fit.trainable_parameters(model), lr=cfg.lr, weight_decay=cfg.weight_decay
        )
        if state is not None:
            opt_path = self.run_dir.root / state.checkpoint / OPTIMIZER_FILE
            if opt_path.exists():
                optimizer.load_state_dict(torch.load(opt_path, map_location=self.device, weights_only=True))
                for group in optimizer.param_groups:
                    group["lr"] = cfg.lr
        ref: Any = None
        if cfg.kl_coef > 0 and cfg.lora is not None:
            ref = fit.AdapterDisabled(model)
        elif cfg.kl_coef > 0:
            ref = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
            ref = ref.to(self.device)
            ref.eval().requires_grad_(False)
        return model, tokenizer, optimizer, ref

    def _reload_target(self, checkpoint: Path) -> Path:
        """What the server loads after a step: the checkpoint, or with LoRA (``reload: adapter``)
        its adapters, which the server merges onto the base it started from."""
        lora = self.config.lora
        if lora is not None and lora.reload == "adapter":
            return checkpoint / "adapter"
        return checkpoint

    # ------------------------------------------------------------------ the run

    async def run(self) -> TrainResult:
        cfg = self.config
        state = await asyncio.to_thread(self.run_dir.open, cfg)
        if state is not None and state.step >= cfg.steps:
            raise TrainConfigError(
                f"{cfg.output_dir} already finished step {state.step} of {cfg.steps}; raise --steps to "
                "train further or pick another --output-dir"
            )
        env = training_env(cfg)
        factory = create_sandbox_factory(
            env_sandbox_config(
                env, SandboxConfig(kind=env.config.sandbox, command_timeout_s=env.config.command_timeout_s)
            )
        )
        try:
            base, warm_info = await self._warm_start(state, factory)
        except BaseException:
            await close_factory(factory)
            raise
        model, tokenizer, optimizer, ref = await asyncio.to_thread(self._load, state, base)
        start = state.step + 1 if state else 1
        self._loaded_step = start - 1
        self.temperature = float(env.config.agent_temperature)
        serve_from = self.run_dir.root / state.checkpoint if state else base
        adapter_reload = cfg.lora is not None and cfg.lora.reload == "adapter"
        if adapter_reload:
            serve_from = base  # adapters are merged onto the base the server started from
        metrics: list[dict[str, Any]] = []
        last = serve_from
        try:
            await env.setup()
            for _ in range((start - 1) * cfg.groups_per_step):  # items the earlier run already used
                await env.get_next_item()
            async with PolicyServer(
                serve_from,
                cfg.model,
                parser=env.config.tool_call_parser,
                max_batch=cfg.max_batch,
                device=cfg.serve_device,
                dtype=cfg.serve_dtype,
                max_tokens=env.config.max_tokens or DEFAULT_MAX_TOKENS,
                log_path=self.run_dir.root / "serve.log",
            ) as server:
                self.server = server
                if adapter_reload and state is not None:
                    await server.reload(self._reload_target(self.run_dir.root / state.checkpoint))
                self._step_of_version = {server.version: start - 1}
                registry = default_registry()
                rollouts = Rollouts(env, RolloutBackends(server.chat_model, factory, registry))
                self._oracle = None
                if cfg.guide == "oracle":
                    from trajforge.envs.agents import agent_model_for

                    try:
                        oracle_for = agent_model_for(env, "oracle")
                    except ValueError as exc:
                        raise TrainConfigError(f"--guide oracle: {exc}") from None
                    self._oracle = Rollouts(
                        env, RolloutBackends(server.chat_model, factory, registry, model_for=oracle_for)
                    )
                queue: asyncio.Queue[StepRollouts] = asyncio.Queue()
                producer = asyncio.create_task(self._produce(env, rollouts, server, start, queue))
                try:
                    for step in range(start, cfg.steps + 1):
                        batch = await _next(queue, producer)
                        line, last = await self._train_step(
                            step, batch, model, tokenizer, optimizer, ref, server, state
                        )
                        metrics.append(line)
                        if self.on_step is not None:
                            res = self.on_step(line)
                            if asyncio.iscoroutine(res):
                                await res
                        if self.stop_after is not None and step < cfg.steps and self.stop_after(line):
                            break
                finally:
                    producer.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await producer
                    self.server = None
        finally:
            await close_factory(factory)
        return TrainResult(
            steps_done=len(metrics),
            last_step=int(metrics[-1]["step"]) if metrics else start - 1,
            final_checkpoint=last,
            resumed_from=state.step if state else None,
            metrics=metrics,
            warm_start=warm_info,
        )

    async def _warm_start(
        self, state: RunState | None, factory: SandboxFactory
    ) -> tuple[Path, dict[str, Any] | None]:
        """The model GRPO starts from: the warm start's (run now, or found complete from an
        earlier invocation) when the config has one, else ``config.model``."""
        cfg = self.config
        if cfg.warm_start is None:
            return cfg.model, None
        if state is not None and not self.run_dir.warm_start_dir.is_dir():
            raise TrainConfigError(
                f"{self.run_dir.root} resumes at step {state.step} but its warm start "
                f"({self.run_dir.warm_start_dir}) is missing; restore it or pick another --output-dir"
            )
        from trajforge.rl.warm_start import warm_start

        path, info = await warm_start(
            cfg, self.run_dir, device=self.device, factory=factory, registry=default_registry()
        )
        if state is None and self.on_warm_start is not None:
            res = self.on_warm_start(path, info)
            if asyncio.iscoroutine(res):
                await res
        return path, info

    async def _produce(
        self,
        env: AgentEnv,
        rollouts: Rollouts,
        server: PolicyServer,
        start: int,
        queue: asyncio.Queue[StepRollouts],
    ) -> None:
        cfg = self.config
        for step in range(start, cfg.steps + 1):
            need = step - 1 - cfg.max_staleness
            async with self._loaded:
                await self._loaded.wait_for(lambda need=need: self._loaded_step >= need)  # type: ignore[misc]
                weights_step, version = self._loaded_step, server.version
            items = [await env.get_next_item() for _ in range(cfg.groups_per_step)]
            began = time.monotonic()
            results = await asyncio.gather(*(self._group(env, rollouts, step, item) for item in items))
            await queue.put(
                StepRollouts(
                    groups=[g for g, _ in results],
                    version=version,
                    weights_step=weights_step,
                    seconds=time.monotonic() - began,
                    guided=[ep for _, ep in results if ep is not None],
                )
            )

    async def _group(
        self, env: AgentEnv, rollouts: Rollouts, step: int, item: Item
    ) -> tuple[list[Episode], Episode | None]:
        """One item's group and, with ``--guide oracle``, the oracle episode put into it (or None)."""
        cfg = self.config
        item_id = env.item_id(item)
        seeds = [derive_seed(cfg.seed, f"rl#{step}#{item_id}#{r}") for r in range(cfg.group_size)]
        group = list(
            await asyncio.gather(
                *(
                    rollouts.episode(item, rollout=r, group_size=cfg.group_size, seed=s)
                    for r, s in enumerate(seeds)
                )
            )
        )
        if self._oracle is None:
            return group, None
        return await guide_group(group, self._oracle, item, seed=seeds[-1])

    async def _update(
        self,
        model: Any,
        optimizer: Any,
        ref: Any,
        samples: list[Any],
        temperature: float,
        pad_id: int,
        step: int,
    ) -> dict[str, Any]:
        """One step's GRPO updates (``grpo_update``) in a worker thread: the builtin and the
        records trainer share it."""
        return await asyncio.to_thread(
            grpo_update,
            model,
            optimizer,
            samples,
            self.config,
            step=step,
            temperature=temperature,
            pad_id=pad_id,
            device=self.device,
            ref=ref,
        )

    async def _train_step(
        self,
        step: int,
        batch: StepRollouts,
        model: Any,
        tokenizer: Any,
        optimizer: Any,
        ref: Any,
        server: PolicyServer,
        resumed: RunState | None,
    ) -> tuple[dict[str, Any], Path]:
        cfg = self.config
        began = time.monotonic()
        if batch.guided:
            registry = self._oracle.backends.registry if self._oracle is not None else default_registry()
            schemas = [registry.schemas(registry.for_toolsets(ep.toolsets)) for ep in batch.guided]
            await asyncio.to_thread(
                attach_guided_traces,
                batch.guided,
                model,
                server.chat_model.template,
                schemas,
                temperature=self.temperature,
                device=self.device,
            )
        build_samples(batch, scale=cfg.scale_rewards, skip_uniform=cfg.skip_uniform_groups)
        temperature = self.temperature
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        stats = await self._update(model, optimizer, ref, batch.samples, temperature, pad_id, step)
        train_s = time.monotonic() - began
        resumable = step % cfg.checkpoint_every == 0 or step == cfg.steps
        path = await asyncio.to_thread(
            self.run_dir.save,
            step,
            model,
            tokenizer,
            optimizer if resumable else None,
            {"weights_of_step": step},
            merged=resumable or cfg.lora is None or cfg.lora.reload == "merged",
        )
        version = await server.reload(self._reload_target(path))
        self._step_of_version[version] = step
        async with self._loaded:
            self._loaded_step = step
            self._loaded.notify_all()
        if resumable:
            await asyncio.to_thread(
                self.run_dir.write_state,
                RunState(
                    step=step,
                    checkpoint=self.run_dir.relative(path),
                    server_version=version,
                    final=step == cfg.steps,
                ),
            )
        state = await asyncio.to_thread(self.run_dir.read_state)
        protect = {self.run_dir.root / state.checkpoint} if state else set()
        await asyncio.to_thread(self.run_dir.prune, cfg.keep_checkpoints, protect | {path})
        line: dict[str, Any] = {
            "step": step,
            **rollout_metrics(batch),
            **stats,
            "staleness": (step - 1) - batch.weights_step,
            **span_staleness(batch.samples, step, self._step_of_version),
            "kl_ref": stats["kl_ref"] if ref is not None else None,  # not computed without a reference
            "sampled_with_version": batch.version,
            "server_version": version,
            "train_s": round(train_s, 3),
            "step_s": round(time.monotonic() - began + (batch.seconds if cfg.max_staleness == 0 else 0.0), 3),
            "checkpoint": self.run_dir.relative(path),
            "resumable": resumable,
            "device": self.device,
            "time": time.time(),
        }
        if resumed is not None:
            line["resumed_from"] = resumed.step
        await asyncio.to_thread(self.run_dir.append_metrics, line)
        log.info(
            "step %d: reward %.3f pass %.3f kl %.4f clip %.3f staleness %d",
            step,
            line["reward_mean"],
            line["pass_rate"],
            line["kl_sampler"],
            line["clip_fraction"],
            line["staleness"],
        )
        return line, path


async def _next(queue: asyncio.Queue[StepRollouts], producer: asyncio.Task[None]) -> StepRollouts:
    """The next step's rollouts, or the producer's failure if it died first."""
    if not queue.empty():
        return queue.get_nowait()
    getter = asyncio.ensure_future(queue.get())
    await asyncio.wait({getter, producer}, return_when=asyncio.FIRST_COMPLETED)
    if not getter.done():
        await asyncio.sleep(0)  # a put that raced the producer's end
    if getter.done():
        return getter.result()
    getter.cancel()
    exc = producer.exception() if not producer.cancelled() else None
    raise RuntimeError(f"rollouts stopped before the step's batch was ready: {exc!r}") from exc


def train_builtin(config: TrainConfig, *, on_step: StepHook | None = None) -> TrainResult:
    """Blocking entry point (the CLI's)."""
    return asyncio.run(BuiltinTrainer(config, on_step=on_step).run())
