"""The trajectory factory: dataset rows in, training-ready trajectories out, crash-safe.

Pieces, one job each: :mod:`.config` (the validated run config), :mod:`.dataset` (rows ->
samples with content keys), :mod:`.prepare` (the run's tools, prefill and dataset index),
:mod:`.checks` (the run directory: not another run's, writable), :mod:`.lock` (one run per
directory), :mod:`.run_file` (``run.json``; a resume keeps the sampling settings),
:mod:`.backends` (the model and sandbox factory, built once per process), :mod:`.preflight`
(endpoint and sandbox checked before any sample), :mod:`.plan` (what a start still has to do),
:mod:`.ledger` (SQLite: every sample's state), :mod:`.bad_rows` (bad rows recorded as failed
samples), :mod:`.scheduler` (one worker's asyncio engine), :mod:`.processes` (worker processes),
:mod:`.writer` (shards, group commit, repair, merged outputs), :mod:`.records` (status, reason
and output line of a sample), :mod:`.stats` (mergeable statistics), :mod:`.monitor`
(``statistics.json`` and progress while the run goes), :mod:`.progress` (display),
:mod:`.runner` (the orchestration). Exports of a finished run are :mod:`trajforge.export`'s.
"""

from trajforge.batch.config import BatchConfig, ConfigError, load_config
from trajforge.batch.runner import RunError, RunSummary, run_batch

__all__ = [
    "BatchConfig",
    "ConfigError",
    "RunError",
    "RunSummary",
    "load_config",
    "run_batch",
]
