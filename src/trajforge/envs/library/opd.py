"""``opd``: on-policy distillation. The student's own rollouts, scored token by token by a teacher.

An inner env (``inner_env``, default ``tiny_tasks``) gives the items, prompts, sandbox files and
the task reward. After each rollout the episode's exact token trace (the student must be a
token-level endpoint: ``CompletionChatModel``, ``env eval --tokenizer``) is sent to the teacher,
which returns the log-probability of every token given the ones before it (SGLang's
``/generate`` with ``return_logprob`` and ``logprob_start_len: 0``; ``trajforge serve`` answers
it). Per sampled token: advantage = teacher logprob - student logprob (the negative per-token
reverse KL estimate); 0 where the student did not sample (prompt, tool results). They go in
``RewardBreakdown.token_advantages`` (and so the record's ``reward.token_advantages``), one per trace
token. The scalar reward is the inner task reward (``reward: task``, default) or the mean
advantage over sampled tokens (``reward: mean_advantage``).

Teacher and student must share the tokenizer (ids are sent, not text).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import httpx
from pydantic import Field

from trajforge.envs.base import BaseEnv
from trajforge.envs.config import EnvConfig
from trajforge.envs.hooks import system_prompt_hook
from trajforge.envs.types import Item, RewardBreakdown
from trajforge.llm.token_trace import MASKED

if TYPE_CHECKING:
    from trajforge.agent.result import AgentResult
    from trajforge.envs.protocol import AgentEnv
    from trajforge.envs.verifier import VerifierContext


class TeacherError(RuntimeError):
    """The teacher endpoint gave no usable prompt logprobs (the message says what it answered)."""


class OpdConfig(EnvConfig):
    # the rollout defaults of the default inner env (tiny_tasks)
    enabled_toolsets: list[str] | None = Field(["terminal", "file"], description="toolsets offered")
    max_agent_turns: int = Field(4, ge=1, description="model calls per rollout")
    inner_env: str = Field(
        "tiny_tasks", description="env giving items and the task reward (name or file.py:Class)"
    )
    inner_overrides: dict[str, Any] = Field(
        default_factory=dict, description="config fields of the inner env"
    )
    teacher_base_url: str | None = Field(None, description="teacher server root (SGLang-style /generate)")
    teacher_model: str | None = Field(None, description="teacher model name (informational; ids are sent)")
    teacher_api_key_env: str | None = Field(None, description="env var holding the teacher's key")
    teacher_timeout_s: float = Field(120.0, gt=0, description="deadline of one teacher request")
    reward: Literal["task", "mean_advantage"] = Field("task", description="what the scalar reward is")


class OnPolicyDistillationEnv(BaseEnv[OpdConfig]):
    name: ClassVar[str] = "opd"
    description: ClassVar[str] = (
        "on-policy distillation: student rollouts scored per token by a teacher's logprobs (token advantages)"
    )
    config_class: ClassVar[type[EnvConfig]] = OpdConfig
    scores_tokens: ClassVar[bool] = True
    """Its episodes carry per-token advantages: ``rl train``'s builtin trainer trains on them; the
    TRL path refuses the env (GRPOTrainer has no per-token advantage input)."""

    def __init__(self, config: EnvConfig | None = None) -> None:
        super().__init__(config)
        from trajforge.envs.catalog import load_env

        cfg = self._cfg
        self.inner: AgentEnv = load_env(cfg.inner_env, dict(cfg.inner_overrides) or None)

    @property
    def _cfg(self) -> OpdConfig:
        return self.config

    # ------------------------------------------------------------------ the inner env's items

    async def setup(self) -> None:
        if self._cfg.teacher_base_url is None:
            raise ValueError(
                "opd needs a teacher: set teacher_base_url (a server with SGLang-style /generate, e.g. `trajforge serve`)"
            )
        await self.inner.setup()

    async def get_next_item(self) -> Item:
        return await self.inner.get_next_item()

    def eval_items(self, n: int) -> list[Item]:
        return self.inner.eval_items(n)

    def item_id(self, item: Item) -> str:
        return self.inner.item_id(item)

    def format_prompt(self, item: Item) -> str | list[dict[str, Any]]:
        return self.inner.format_prompt(item)

    def system_prompt(self) -> str | None:
        own = self.config.system_prompt
        inner = system_prompt_hook(self.inner)
        return own or (inner() if inner is not None else None)

    def setup_files(self, item: Item) -> Mapping[str, bytes | str]:
        return self.inner.setup_files(item)

    def verifier_files(self, item: Item) -> Mapping[str, bytes | str]:
        return self.inner.verifier_files(item)

    def category(self, item: Item) -> str | None:
        return self.inner.category(item)

    # ------------------------------------------------------------------ scoring

    async def compute_reward(self, item: Item, result: AgentResult, ctx: VerifierContext) -> RewardBreakdown:
        task = RewardBreakdown.of(await self.inner.compute_reward(item, result, ctx))
        trace = result.episode_trace()  # TraceError (a reward error) when the student is not token-level
        teacher = await self.teacher_logprobs(trace.tokens)
        advantages = token_advantages(trace.masks, trace.logprobs, teacher)
        sampled = [i for i, m in enumerate(trace.masks) if m != MASKED]
        mean_adv = sum(advantages[i] for i in sampled) / len(sampled) if sampled else 0.0
        teacher_mean = sum(float(teacher[i] or 0.0) for i in sampled) / len(sampled) if sampled else 0.0
        reward = task.score if self._cfg.reward == "task" else mean_adv
        return RewardBreakdown(
            value=reward,
            components={
                **{f"task_{k}": v for k, v in task.components.items()},
                "task_reward": task.score,
                "mean_advantage": mean_adv,
                "teacher_logprob_mean": teacher_mean,
                "sampled_tokens": float(len(sampled)),
            },
            reason=f"task: {task.reason}; mean advantage {mean_adv:.4f} over {len(sampled)} sampled tokens",
            token_advantages=advantages,
        )

    async def teacher_logprobs(self, tokens: list[int]) -> list[float | None]:
        """log p_teacher(tokens[i] | tokens[:i]) for every i (None at 0)."""
        cfg = self._cfg
        assert cfg.teacher_base_url is not None
        headers = {}
        if cfg.teacher_api_key_env:
            key = os.environ.get(cfg.teacher_api_key_env)
            if not key:
                raise TeacherError(f"the teacher key variable {cfg.teacher_api_key_env} is not set")
            headers["Authorization"] = f"Bearer {key}"
        body = {
            "input_ids": tokens,
            "sampling_params": {"max_new_tokens": 1, "temperature": 0.0},
            "return_logprob": True,
            "logprob_start_len": 0,
        }
        url = cfg.teacher_base_url.rstrip("/").removesuffix("/v1") + "/generate"
        async with httpx.AsyncClient(timeout=cfg.teacher_timeout_s) as client:
            resp = await client.post(url, json=body, headers=headers)
        if resp.status_code != 200:
            raise TeacherError(f"teacher {url} answered HTTP {resp.status_code}: {resp.text[:300]}")
        data = resp.json()
        entries = (
            (data.get("meta_info") or {}).get("input_token_logprobs") if isinstance(data, dict) else None
        )
        if not isinstance(entries, list) or len(entries) != len(tokens):
            raise TeacherError(
                f"teacher {url} gave no input_token_logprobs for the {len(tokens)} tokens "
                "(it must support SGLang's return_logprob + logprob_start_len)"
            )
        out: list[float | None] = []
        for i, (entry, tok) in enumerate(zip(entries, tokens, strict=True)):
            if entry[1] != tok:
                raise TeacherError(f"teacher scored token {entry[1]} at position {i}, not {tok}")
            out.append(None if entry[0] is None else float(entry[0]))
        return out

    async def keep(self, item: Item, result: AgentResult, ctx: VerifierContext) -> dict[str, Any]:
        return await self.inner.keep(item, result, ctx)


def token_advantages(masks: list[int], student: list[float], teacher: list[float | None]) -> list[float]:
    """teacher - student logprob on sampled positions, 0 elsewhere; one per token."""
    out = []
    for i, (m, s, t) in enumerate(zip(masks, student, teacher, strict=True)):
        if m == MASKED:
            out.append(0.0)
        elif t is None:
            raise TeacherError(f"teacher gave no logprob for sampled position {i}")
        else:
            out.append(t - s)
    return out
