"""``tiny_tasks``: the generated task families of :mod:`trajforge.tasks` as an environment.

The training env of the embedded policy. Held-out items are exactly the tasks ``trajforge model
eval`` runs (same families, same seed), so the two measurements agree; training items come from
other seeds. The reward is the family's own checker: the final answer, and for file tasks the
file the rollout left in its sandbox.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any, ClassVar

from trajforge.envs.base import BaseEnv
from trajforge.envs.config import EnvConfig
from trajforge.envs.kept import KeptFiles, snapshot
from trajforge.envs.types import Item, RewardBreakdown
from trajforge.tasks import FAMILIES, HELD_OUT_SEED, POLICY_FAMILIES, Task, check, generate_mixed, get_family

if TYPE_CHECKING:
    from trajforge.agent.result import AgentResult
    from trajforge.envs.verifier import VerifierContext


class TinyTasksConfig(EnvConfig):
    families: list[str] = list(POLICY_FAMILIES)
    eval_seed: int = HELD_OUT_SEED


class TinyTasksEnv(BaseEnv[TinyTasksConfig]):
    name: ClassVar[str] = "tiny_tasks"
    description: ClassVar[str] = (
        "generated arithmetic/file/counting tasks with exact checkers (trains the embedded policy)"
    )
    config_class: ClassVar[type[EnvConfig]] = TinyTasksConfig

    @classmethod
    def default_config(cls) -> EnvConfig:
        return TinyTasksConfig(
            enabled_toolsets=["terminal", "file"], max_agent_turns=4, agent_temperature=1.0
        )

    @property
    def families(self) -> list[str]:
        fams = self.config.families
        for fam in fams:
            get_family(fam)  # raises naming the known families
        return list(fams)

    def generate(self, index: int, *, split: str) -> Item:
        fams = self.families
        family = fams[index % len(fams)]
        rng = random.Random(f"tiny_tasks:{split}:{self.config.seed}:{index}")
        return _item(FAMILIES[family].make(rng, f"{family}-t{self.config.seed}-{index}"))

    def eval_items(self, n: int) -> list[Item]:
        seed = self.config.eval_seed
        return [_item(t) for t in generate_mixed(self.families, n, seed)]

    def format_prompt(self, item: Item) -> str:
        return str(item["prompt"])

    def setup_files(self, item: Item) -> dict[str, str]:
        return dict(item.get("setup_files") or {})

    async def compute_reward(self, item: Item, result: AgentResult, ctx: VerifierContext) -> RewardBreakdown:
        verdict = await check(Task.from_row(item), result.final_answer, ctx.sandbox)
        return RewardBreakdown(value=verdict.reward, reason=verdict.reason)

    async def keep(self, item: Item, result: AgentResult, ctx: VerifierContext) -> dict[str, Any]:
        return await snapshot(ctx)

    async def rescore(
        self, item: Item, messages: list[dict[str, Any]], kept: dict[str, Any]
    ) -> RewardBreakdown:
        answer = next(
            (
                m.get("content")
                for m in reversed(messages)
                if m.get("role") == "assistant" and not m.get("tool_calls")
            ),
            None,
        )
        verdict = await check(Task.from_row(item), answer, KeptFiles(kept))  # type: ignore[arg-type]
        return RewardBreakdown(value=verdict.reward, reason=verdict.reason)

    def oracle_calls(self, item: Item) -> list[tuple[str, dict[str, Any]]]:
        """The family's reference solution, as tool calls (what `--agent oracle` makes)."""
        task = Task.from_row(item)
        return [(step.tool, step.arguments) for step in get_family(task.family).solution(task).steps]

    def oracle_answer(self, item: Item, messages: list[dict[str, Any]]) -> str:
        """The reference answer, filled from the last tool output (what the sandbox printed)."""
        task = Task.from_row(item)
        return get_family(task.family).solution(task).answer_template.format(result=_result(task, messages))

    def oracle_reasoning(self, item: Item, messages: list[dict[str, Any]]) -> str:
        """The reasoning of the next oracle turn, as the embedded policy was taught to write it
        (``models/tiny/data.py``: each step's thought, then the final thought with the result), so
        an oracle trajectory used as a guided RL sample is in the policy's own style."""
        task = Task.from_row(item)
        solution = get_family(task.family).solution(task)
        turn = sum(m.get("role") == "assistant" for m in messages)
        if turn < len(solution.steps):
            return str(solution.steps[turn].thought)
        return solution.final_thought.format(result=_result(task, messages))

    def category(self, item: Item) -> str | None:
        return str(item.get("family"))


def _result(task: Task, messages: list[dict[str, Any]]) -> str:
    """What the family reads from the last tool output of ``messages`` (its answer's ``result``)."""
    last = next((str(m.get("content") or "") for m in reversed(messages) if m.get("role") == "tool"), "")
    return get_family(task.family).result_from_output(last)


def _item(task: Task) -> dict[str, Any]:
    row = task.to_row()
    row["id"] = task.id
    return row
