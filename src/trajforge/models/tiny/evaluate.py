"""Measure a tiny policy on generated tasks through the real agent loop, tools and sandbox.

:class:`LocalPolicy` is a minimal in-process ``ChatModel`` (chat template -> ``generate`` in a
worker thread -> hermes parser), so the measurement needs no server and no network; the loop,
the tools, the sandbox and the task checkers are the same ones a batch run uses. Every assistant
turn is recorded with whether its tool-call markup was well formed, which is the format metric.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from trajforge.llm.parsers import get_parser, to_tool_calls
from trajforge.llm.types import AssistantTurn, SamplingParams, Usage
from trajforge.messages import split_think
from trajforge.sandbox.types import SandboxKind
from trajforge.tasks import HELD_OUT_SEED

EVAL_SEED = HELD_OUT_SEED
"""Held-out seed: training data uses small seeds, so these tasks were never trained on."""
EVAL_TOOLSETS = ("terminal", "file")


@dataclass
class TurnRecord:
    """Format verdict of one assistant turn."""

    calls: int
    errors: int
    unknown_tools: int
    stray_markup: bool

    @property
    def well_formed(self) -> bool:
        return self.errors == 0 and self.unknown_tools == 0 and not self.stray_markup


@dataclass
class LocalPolicy:
    """A transformers causal LM + tokenizer behind the ``ChatModel`` protocol (greedy by default)."""

    model: Any
    tokenizer: Any
    max_new_tokens: int = 160
    records: list[TurnRecord] = field(default_factory=list)
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def name(self) -> str:
        return "trajforge-tiny"

    @classmethod
    def load(cls, path: str | Path, **kwargs: Any) -> LocalPolicy:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        model = AutoModelForCausalLM.from_pretrained(str(path), dtype="float32")
        model.eval()  # type: ignore[no-untyped-call]
        return cls(model=model, tokenizer=AutoTokenizer.from_pretrained(str(path)), **kwargs)

    def _generate(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, s: SamplingParams
    ) -> tuple[str, int, int, bool]:
        import torch

        ids = self.tokenizer.apply_chat_template(
            messages,
            tools=tools,
            add_generation_prompt=True,
            tokenize=True,
            return_dict=True,
            return_tensors="pt",
        )["input_ids"]
        temperature = s.temperature or 0.0
        kwargs: dict[str, Any] = {"do_sample": temperature > 0}
        if temperature > 0:
            kwargs.update(temperature=temperature, top_p=s.top_p or 1.0)
            if s.seed is not None:
                torch.manual_seed(s.seed)
        with torch.inference_mode():
            out = self.model.generate(
                ids,
                max_new_tokens=s.max_tokens or self.max_new_tokens,
                attention_mask=torch.ones_like(ids),
                **kwargs,
            )
        new = out[0, ids.shape[1] :].tolist()
        stopped = bool(new) and new[-1] == self.tokenizer.eos_token_id
        return self.tokenizer.decode(new, skip_special_tokens=True), ids.shape[1], len(new), stopped

    async def complete(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        sampling: SamplingParams | None = None,
    ) -> AssistantTurn:
        started = time.perf_counter()
        async with self._lock:  # one generate at a time: torch already uses every core
            text, n_prompt, n_new, stopped = await asyncio.to_thread(
                self._generate, messages, tools, sampling or SamplingParams()
            )
        content, reasoning = split_think(text)
        parsed = get_parser("hermes").parse(content or "", tools)
        offered = {t["function"]["name"] for t in tools or []}
        unknown = sum(1 for c in parsed.calls if c.name not in offered)
        stray = "<tool_call>" in (parsed.content or "") or "</tool_call>" in (parsed.content or "")
        self.records.append(TurnRecord(len(parsed.calls), len(parsed.errors), unknown, stray))
        return AssistantTurn(
            content=parsed.content,
            reasoning=reasoning,
            tool_calls=to_tool_calls(parsed),
            finish_reason=("tool_calls" if parsed.calls else "stop") if stopped else "length",
            usage=Usage(prompt_tokens=n_prompt, completion_tokens=n_new, total_tokens=n_prompt + n_new),
            model=self.name,
            latency_s=time.perf_counter() - started,
            parse_errors=[e.describe() for e in parsed.errors],
        )

    async def aclose(self) -> None:
        return None


class TaskOutcome(BaseModel):
    task_id: str
    family: str
    reward: float
    reason: str
    termination: str
    turns: int


class QualityReport(BaseModel):
    """What ``trajforge model eval`` and the quality benchmark print."""

    model_dir: str
    n_tasks: int
    seed: int
    decoding: str
    assistant_turns: int
    well_formed_turns: int
    tool_call_turns: int
    success_rate: float
    success_by_family: dict[str, float]
    terminations: dict[str, int]
    wall_s: float
    outcomes: list[TaskOutcome]

    @property
    def well_formed_rate(self) -> float:
        return self.well_formed_turns / self.assistant_turns if self.assistant_turns else 0.0


async def _run_task(task: Any, policy: LocalPolicy, registry: Any, factory: Any, config: Any) -> TaskOutcome:
    from trajforge.agent import AgentLoop
    from trajforge.tasks import check, setup_task
    from trajforge.tools.base import ToolContext

    sandbox = await factory.create(task.id)
    try:
        await setup_task(task, sandbox)
        loop = AgentLoop(policy, registry.for_toolsets(EVAL_TOOLSETS), ToolContext(task.id, sandbox), config)
        result = await loop.run([{"role": "user", "content": task.prompt}])
        verdict = await check(task, result.final_answer, sandbox)
    finally:
        await sandbox.close()
    return TaskOutcome(
        task_id=task.id,
        family=task.family,
        reward=verdict.reward,
        reason=verdict.reason,
        termination=str(
            result.termination.value if hasattr(result.termination, "value") else result.termination
        ),
        turns=result.turns_used,
    )


async def evaluate(
    model_dir: str | Path,
    n: int = 100,
    *,
    seed: int = EVAL_SEED,
    families: Sequence[str] | None = None,
    temperature: float = 0.0,
    sandbox_kind: SandboxKind = "bwrap",
    max_turns: int = 4,
) -> QualityReport:
    """Run ``n`` held-out tasks (mixed families) and report format and success rates."""
    from trajforge.agent import AgentConfig
    from trajforge.models.tiny.data import TRAIN_FAMILIES
    from trajforge.sandbox import create_sandbox_factory
    from trajforge.sandbox.types import SandboxConfig
    from trajforge.tasks import generate_mixed
    from trajforge.tools.builtin import default_registry

    started = time.perf_counter()
    policy = await asyncio.to_thread(LocalPolicy.load, model_dir)
    tasks = generate_mixed(list(families or TRAIN_FAMILIES), n, seed)
    registry = default_registry()
    factory = create_sandbox_factory(SandboxConfig(kind=sandbox_kind))
    sampling = SamplingParams(temperature=temperature, seed=seed if temperature > 0 else None)
    config = AgentConfig(max_turns=max_turns, sampling=sampling, max_consecutive_parse_errors=2)
    outcomes = [await _run_task(t, policy, registry, factory, config) for t in tasks]
    by_family: dict[str, list[float]] = {}
    for o in outcomes:
        by_family.setdefault(o.family, []).append(o.reward)
    return QualityReport(
        model_dir=str(model_dir),
        n_tasks=len(outcomes),
        seed=seed,
        decoding="greedy" if temperature <= 0 else f"sampling T={temperature}",
        assistant_turns=len(policy.records),
        well_formed_turns=sum(r.well_formed for r in policy.records),
        tool_call_turns=sum(r.calls > 0 for r in policy.records),
        success_rate=sum(o.reward for o in outcomes) / max(1, len(outcomes)),
        success_by_family={f: sum(v) / len(v) for f, v in sorted(by_family.items())},
        terminations=dict(Counter(o.termination for o in outcomes)),
        wall_s=time.perf_counter() - started,
        outcomes=outcomes,
    )
