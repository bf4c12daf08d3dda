"""The ``AgentEnv`` boundary: what an RL / evaluation environment is to trajforge.

An environment hands out items, says how an item becomes a prompt, and judges a finished
rollout from inside that rollout's own sandbox. Everything else (toolset draws, sandboxes,
groups, token traces, concurrency, records, trainers) is trajforge's. Implement it structurally,
or subclass :class:`trajforge.envs.BaseEnv`, which gives every optional hook a default. The hooks
an env may add beyond this one (``prepare_sandbox``, ``template_key``, the ``oracle_*`` hooks, ...)
are declared in :mod:`trajforge.envs.hooks`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

from trajforge.envs.config import EnvConfig
from trajforge.envs.types import Item, RewardBreakdown

if TYPE_CHECKING:
    from trajforge.agent.result import AgentResult
    from trajforge.envs.verifier import VerifierContext


@runtime_checkable
class AgentEnv(Protocol):
    """An environment. ``name`` and ``description`` show in ``trajforge env list``."""

    name: ClassVar[str]
    description: ClassVar[str]
    config: EnvConfig

    async def setup(self) -> None:
        """Load data, build task pools; called once before any item is asked for."""
        ...

    async def get_next_item(self) -> Item:
        """The next training item (endless: trainers keep asking)."""
        ...

    def eval_items(self, n: int) -> list[Item]:
        """``n`` held-out items, the same on every call (what `env eval` and `evaluate` run)."""
        ...

    def item_id(self, item: Item) -> str:
        """A stable id of the item (records, resume, rescore)."""
        ...

    def format_prompt(self, item: Item) -> str | list[dict[str, Any]]:
        """The user prompt (or a message list) the agent starts from."""
        ...

    def setup_files(self, item: Item) -> Mapping[str, bytes | str]:
        """Files (workdir-relative path -> content) placed before the rollout starts."""
        ...

    def verifier_files(self, item: Item) -> Mapping[str, bytes | str]:
        """Files placed after the rollout ended, just before ``compute_reward`` (hidden tests,
        expected outputs): the agent can neither see nor plant them."""
        ...

    async def compute_reward(
        self, item: Item, result: AgentResult, ctx: VerifierContext
    ) -> float | RewardBreakdown:
        """Judge the rollout from its sandbox (``ctx``). Raising scores 0 with the reason kept."""
        ...

    async def keep(self, item: Item, result: AgentResult, ctx: VerifierContext) -> dict[str, Any]:
        """What to store with the episode so ``rescore`` can judge it again without the model
        (final files, transcripts). JSON data."""
        ...

    async def rescore(
        self, item: Item, messages: list[dict[str, Any]], kept: dict[str, Any]
    ) -> float | RewardBreakdown | None:
        """The reward from a stored episode alone, or None when this env cannot (it needs a
        sandbox): `env rescore` then says so."""
        ...

    def category(self, item: Item) -> str | None:
        """A group label for per-category results (task family, difficulty)."""
        ...
