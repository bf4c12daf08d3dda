"""``BaseEnv``: defaults for every optional hook of :class:`~trajforge.envs.protocol.AgentEnv`.

A concrete env usually writes ``items`` (or ``eval_items``), ``format_prompt`` when the prompt is
not ``item[config.prompt_field]``, and ``compute_reward``. Items for training come from
``dataset_file`` / ``dataset_name`` when configured, else from :meth:`generate` with a seeded
counter, so ``get_next_item`` is deterministic per seed.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Generic, cast

from typing_extensions import TypeVar

from trajforge.envs.config import EnvConfig
from trajforge.envs.types import Item, RewardBreakdown

if TYPE_CHECKING:
    from trajforge.agent.result import AgentResult
    from trajforge.envs.verifier import VerifierContext


class EnvDataError(ValueError):
    """The env's items cannot be loaded; the message names the source and what to do."""


ConfigT = TypeVar("ConfigT", bound=EnvConfig, default=EnvConfig)


class BaseEnv(Generic[ConfigT]):
    """Generic over its config type: ``class SweEnv(BaseEnv[SweConfig])`` reads ``self.config``
    as a ``SweConfig``, checked once here (a plain ``EnvConfig`` handed in is validated into
    ``config_class``, so an env never asserts its config's type where it uses it)."""

    name: ClassVar[str] = "base"
    description: ClassVar[str] = ""
    config_class: ClassVar[type[EnvConfig]] = EnvConfig
    default_system_prompt: ClassVar[str | None] = None

    def __init__(self, config: EnvConfig | None = None) -> None:
        self.config: ConfigT = self._own_config(config if config is not None else self.default_config())
        self._items: list[Item] | None = None
        self._cursor = 0
        self._lock = asyncio.Lock()

    @classmethod
    def default_config(cls) -> EnvConfig:
        return cls.config_class()

    def _own_config(self, config: EnvConfig) -> ConfigT:
        """``config`` as this env's config class (its fields validated again when it is a
        plainer class: unknown ones for this env are refused there, with the field's name)."""
        wanted = self.config_class
        if not isinstance(config, wanted):
            config = wanted.model_validate(config.model_dump(exclude_unset=True))
        return cast(ConfigT, config)

    # ---------------------------------------------------------------- items

    async def setup(self) -> None:
        if self.config.dataset_file or self.config.dataset_name:
            self._items = await asyncio.to_thread(self._load_dataset)

    def generate(self, index: int, *, split: str) -> Item:
        """The ``index``-th generated item of ``split`` ("train" or "eval"); envs without a
        dataset override this."""
        raise EnvDataError(
            f"env {self.name!r} has no item generator: set dataset_file (a local JSONL) or dataset_name"
        )

    async def get_next_item(self) -> Item:
        async with self._lock:
            i = self._cursor
            self._cursor += 1
        if self._items is not None:
            if not self._items:
                raise EnvDataError(f"env {self.name!r}: the dataset has no items")
            return self._items[i % len(self._items)]
        return self.generate(i, split="train")

    def eval_items(self, n: int) -> list[Item]:
        if self._items is not None:
            return self._items[:n]
        return [self.generate(i, split="eval") for i in range(n)]

    def item_id(self, item: Item) -> str:
        for key in ("id", "task_id", "item_id"):
            if key in item:
                return str(item[key])
        import hashlib

        return hashlib.sha256(json.dumps(item, sort_keys=True, default=str).encode()).hexdigest()[:16]

    def _load_dataset(self) -> list[Item]:
        if self.config.dataset_file:
            return _read_items(Path(self.config.dataset_file))
        from datasets import load_dataset  # the user's local Hugging Face cache; nothing downloads in tests

        assert self.config.dataset_name is not None
        try:
            ds = load_dataset(self.config.dataset_name, split=self.config.dataset_split)
        except Exception as exc:
            raise EnvDataError(f"cannot load dataset {self.config.dataset_name!r}: {exc}") from None
        return [dict(row) for row in ds]

    # ---------------------------------------------------------------- rollouts

    def format_prompt(self, item: Item) -> str | list[dict[str, Any]]:
        field = self.config.prompt_field
        if field not in item:
            raise EnvDataError(f"item {self.item_id(item)} has no {field!r} field (set prompt_field)")
        return str(item[field])

    def system_prompt(self) -> str | None:
        return self.config.system_prompt or self.default_system_prompt

    def setup_files(self, item: Item) -> Mapping[str, bytes | str]:
        return {}

    def verifier_files(self, item: Item) -> Mapping[str, bytes | str]:
        return {}

    async def compute_reward(
        self, item: Item, result: AgentResult, ctx: VerifierContext
    ) -> float | RewardBreakdown:
        raise NotImplementedError(f"env {self.name!r} does not define compute_reward")

    async def keep(self, item: Item, result: AgentResult, ctx: VerifierContext) -> dict[str, Any]:
        return {}

    async def rescore(
        self, item: Item, messages: list[dict[str, Any]], kept: dict[str, Any]
    ) -> float | RewardBreakdown | None:
        return None

    def category(self, item: Item) -> str | None:
        value = item.get("category") or item.get("family")
        return str(value) if value is not None else None

    def example_item(self) -> Item:
        return self.eval_items(1)[0] if self._items is None else (self._items[:1] or [{}])[0]


def _read_items(path: Path) -> list[Item]:
    """Items from a local JSONL / JSON list / Parquet file; a bad line names its number."""
    if not path.is_file():
        raise EnvDataError(f"dataset_file {path} does not exist")
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return [dict(r) for r in pq.read_table(path).to_pylist()]
    text = path.read_text()
    if path.suffix == ".json":
        data = json.loads(text)
        if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
            raise EnvDataError(f"{path}: a .json dataset must be a list of objects")
        return data
    items = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise EnvDataError(f"{path}:{n}: not JSON ({exc.msg}); fix or remove the line") from None
        if not isinstance(row, dict):
            raise EnvDataError(f"{path}:{n}: each line must be a JSON object")
        items.append(row)
    return items
