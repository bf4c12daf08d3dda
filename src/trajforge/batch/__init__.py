"""The trajectory factory: dataset rows in, training-ready trajectories out, crash-safe.

Pieces, one job each: :mod:`.config` (the validated run config), :mod:`.dataset` (rows ->
samples with content keys), :mod:`.ledger` (SQLite: every sample's state), :mod:`.writer`
(shards, group commit, repair, merged outputs), :mod:`.scheduler` (one worker's asyncio engine),
:mod:`.records` (status, reason and output line of a sample), :mod:`.stats` (mergeable
statistics), :mod:`.progress` (display), :mod:`.runner` (checks, workers, finish) and
:mod:`.export` (trainer formats).
"""

from trajforge.batch.config import BatchConfig, ConfigError, load_config
from trajforge.batch.export import ExportError, export_run
from trajforge.batch.runner import RunError, RunSummary, run_batch

__all__ = [
    "BatchConfig",
    "ConfigError",
    "ExportError",
    "RunError",
    "RunSummary",
    "export_run",
    "load_config",
    "run_batch",
]
