"""Synthetic SFT trajectories whose tool outputs are real.

Each trajectory is a generated task solved by its family's reference solution, but every tool
call is actually run by trajforge's own tools in a fresh sandbox, and the final answer is built
from what the sandbox printed. The task's checker must then accept the result, so a broken
sandbox or a wrong reference solution shows up as rejected samples (counted, never hidden)
instead of silently poisoning the training set.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from trajforge.sandbox import create_sandbox_factory
from trajforge.sandbox.types import SandboxConfig
from trajforge.tasks import POLICY_FAMILIES, Task, check, generate_mixed, get_family, setup_task
from trajforge.tasks.families import WORDS
from trajforge.tools.base import ToolContext
from trajforge.tools.builtin import default_registry
from trajforge.tools.registry import ToolRegistry

TRAIN_FAMILIES = POLICY_FAMILIES
BASE_TOOLSETS = ("terminal", "file")
EXTRA_TOOLSETS = ("web", "vision", "moa")
"""Sometimes offered too, so the policy is not thrown by a longer tool list."""


COPY_PROMPTS = ("Repeat exactly: {x}", "Say {x}", "Echo this back: {x}")


def _drill_value(rng: random.Random) -> str:
    kind = rng.randrange(5)
    if kind == 0:
        return str(rng.choice((1, -1)) * rng.randint(0, 10 ** rng.randint(1, 7)))
    if kind == 1:
        return f"{rng.choice(WORDS)}.{rng.choice(('txt', 'conf', 'ini', 'env'))}"
    if kind == 2:
        return f"{rng.choice(WORDS)}={rng.choice((rng.choice(WORDS), str(rng.randint(100, 99999))))}"
    if kind == 3:
        return " ".join(rng.sample(WORDS, rng.randint(2, 4)) + [str(rng.randint(1, 999))])
    return f"{rng.randint(1, 99999)} {rng.choice('+-*')} {rng.randint(1, 99999)}"


def copy_drills(n: int, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` short "repeat this value" conversations (no tools), mixed into the SFT data.

    Why: the task trajectories teach the format quickly, but their copied values (numbers, file
    names, texts) are a small share of the trained tokens, and a tiny model trained on them alone
    plateaus writing plausible-but-wrong values. Short drills whose every answer token is a copy
    of a random value make copying the cheapest way to lower the loss (memorising is impossible),
    at a fraction of the tokens of a full trajectory. They use the same ``<think>`` format.
    """
    rng = random.Random(f"trajforge-tiny-drills:{seed}")
    drills = []
    for i in range(n):
        x = " ".join(_drill_value(rng) for _ in range(rng.randint(1, 2)))
        drills.append(
            {
                "task_id": f"drill-s{seed}-{i}",
                "messages": [
                    {"role": "user", "content": rng.choice(COPY_PROMPTS).format(x=x)},
                    {"role": "assistant", "content": x, "reasoning": f"I will repeat {x}."},
                ],
                "tools": None,
            }
        )
    return drills


@dataclass
class SynthesisReport:
    """What the synthesis produced: kept conversations and every rejected task with its reason."""

    conversations: list[dict[str, Any]] = field(default_factory=list)
    rejected: list[tuple[str, str]] = field(default_factory=list)


def offered_tools(registry: ToolRegistry, rng: random.Random | None = None) -> list[dict[str, Any]]:
    """The tool schemas offered in a trajectory: terminal+file, sometimes a few more toolsets."""
    toolsets = list(BASE_TOOLSETS)
    if rng is not None and rng.random() < 0.25:
        toolsets += rng.sample(EXTRA_TOOLSETS, rng.randint(1, len(EXTRA_TOOLSETS)))
    return registry.schemas(registry.for_toolsets(toolsets))


async def solve_in_sandbox(task: Task, registry: ToolRegistry, ctx: ToolContext) -> list[dict[str, Any]]:
    """Run the reference solution with the real tools; returns the OpenAI messages after the prompt."""
    family = get_family(task.family)
    solution = family.solution(task)
    messages: list[dict[str, Any]] = []
    result = ""
    for i, step in enumerate(solution.steps):
        tool = registry.get(step.tool)
        if tool is None:
            raise LookupError(f"reference solution calls unknown tool {step.tool!r}")
        output = await tool(step.arguments, ctx)
        call_id = f"call_{i}"
        messages.append(
            {
                "role": "assistant",
                "content": "",
                "reasoning": step.thought,
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {
                            "name": step.tool,
                            "arguments": json.dumps(step.arguments, ensure_ascii=False),
                        },
                    }
                ],
            }
        )
        messages.append(
            {"role": "tool", "tool_call_id": call_id, "name": step.tool, "content": output.content}
        )
        result = family.result_from_output(output.content)
    messages.append(
        {
            "role": "assistant",
            "content": solution.answer_template.format(result=result),
            "reasoning": solution.final_thought.format(result=result),
        }
    )
    return messages


async def _one(task: Task, registry: ToolRegistry, factory: Any, seed: int, report: SynthesisReport) -> None:
    sandbox = await factory.create(task.id)
    try:
        await setup_task(task, sandbox)
        ctx = ToolContext(task_id=task.id, sandbox=sandbox)
        messages = await solve_in_sandbox(task, registry, ctx)
        verdict = await check(task, messages[-1]["content"], sandbox)
    finally:
        await sandbox.close()
    if not verdict.success:
        report.rejected.append((task.id, verdict.reason))
        return
    report.conversations.append(
        {
            "task_id": task.id,
            "messages": [{"role": "user", "content": task.prompt}, *messages],
            # Seeded per task, not one shared generator: tasks finish in whatever order the
            # sandboxes allow, and the data (and so the trained model) must not depend on it.
            "tools": offered_tools(registry, random.Random(f"trajforge-tiny-data:{seed}:{task.id}")),
        }
    )


async def synthesize(
    n: int,
    seed: int = 0,
    *,
    families: Sequence[str] = TRAIN_FAMILIES,
    sandbox: SandboxConfig | None = None,
    concurrency: int = 8,
) -> SynthesisReport:
    """Build ``n`` trajectories (fewer if some are rejected; see ``report.rejected``)."""
    tasks = generate_mixed(list(families), n, seed)
    registry = default_registry()
    factory = create_sandbox_factory(sandbox or SandboxConfig(kind="local"))
    report = SynthesisReport()
    gate = asyncio.Semaphore(concurrency)

    async def guarded(task: Task) -> None:
        async with gate:
            await _one(task, registry, factory, seed, report)

    async with asyncio.TaskGroup() as tg:
        for task in tasks:
            tg.create_task(guarded(task))
    order = {t.id: i for i, t in enumerate(tasks)}
    report.conversations.sort(key=lambda c: order[c["task_id"]])
    return report
