"""The run's fixed facts, computed once before anything starts: its tools, prefill and dataset.

An unknown distribution or toolset, an unreadable prefill file or a bad dataset row fails here,
with a :class:`~trajforge.batch.errors.RunError` that says what to change.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from trajforge.batch.config import BatchConfig
from trajforge.batch.dataset import INDEX_FILE, DatasetError, DatasetIndex, index_dataset
from trajforge.batch.errors import RunError
from trajforge.batch.groups import GroupedIndex
from trajforge.distributions import UnknownDistributionError, get_distribution
from trajforge.envs.catalog import UnknownEnvError, load_grader
from trajforge.envs.config import EnvConfigError
from trajforge.tools.builtin import toolset_availability
from trajforge.tools.registry import ToolRegistry
from trajforge.tools.toolsets import UnknownToolsetError, check_toolsets


@dataclass
class Prepared:
    """The run's fixed facts, computed once before any worker starts."""

    rows: DatasetIndex
    """the dataset's rows (what the run directory's saved index keeps)"""
    run_tools: list[str]
    tool_schemas: list[dict[str, Any]]
    prefill: list[dict[str, Any]]
    tools_warning: str | None = None  # said once at start: toolsets sampled but not offered here
    dataset: DatasetIndex | GroupedIndex = field(init=False)
    """the run's samples: the rows, or N samples of each with --group-size"""
    samples_per_prompt: int = 1

    def __post_init__(self) -> None:
        n = self.samples_per_prompt
        self.dataset = GroupedIndex(self.rows, n) if n > 1 else self.rows


def prepare(cfg: BatchConfig, registry: ToolRegistry) -> Prepared:
    toolsets = _toolsets_of_run(cfg)
    # Toolsets whose backend is not configured are not offered: an error when named with
    # --toolsets, a warning (said once, here, not per sample) when a distribution samples them.
    available = toolset_availability(registry, toolsets, explicit=cfg.toolsets is not None)
    if available.error:
        raise RunError(available.error)
    tools = registry.for_toolsets(toolsets)
    prefill = _load_prefill(cfg.prefill_messages)
    try:
        # A resume reuses the keys saved in the run directory for the bytes they were built from.
        dataset = index_dataset(
            cfg.dataset,
            skip_bad_rows=cfg.skip_bad_rows,
            max_samples=cfg.max_samples,
            cache=cfg.run_dir / INDEX_FILE,
            data_root=cfg.data_root,
        )
    except DatasetError as exc:
        raise RunError(str(exc)) from None
    if cfg.env is not None:  # a bad env reference fails here, before any model server starts
        try:
            load_grader(cfg.env)
        except (UnknownEnvError, EnvConfigError) as exc:
            raise RunError(f"--env: {exc}") from None
    return Prepared(
        dataset,
        [t.name for t in tools],
        registry.schemas(tools),
        prefill,
        available.warning,
        samples_per_prompt=cfg.samples_per_prompt,
    )


def unimplemented_tools(registry: ToolRegistry, run_tools: list[str]) -> list[str]:
    """The run's tools that are declared but answer "not implemented" when called."""
    return [name for name in run_tools if not getattr(registry.get(name), "implemented", True)]


def _toolsets_of_run(cfg: BatchConfig) -> list[str]:
    try:
        if cfg.distribution_name is not None:
            return list(get_distribution(cfg.distribution_name).toolsets)
        return check_toolsets(cfg.toolsets or ())
    except (UnknownDistributionError, UnknownToolsetError) as exc:
        raise RunError(str(exc)) from None


def _load_prefill(path: Path | None) -> list[dict[str, Any]]:
    if path is None:
        return []
    try:
        data = orjson.loads(Path(path).read_bytes())
    except (OSError, orjson.JSONDecodeError) as exc:
        raise RunError(f"cannot read --prefill-messages {path}: {exc}") from None
    if not isinstance(data, list) or not all(isinstance(m, dict) and "role" in m for m in data):
        raise RunError(f"--prefill-messages {path} must hold a JSON list of messages with a 'role'")
    return data
