"""Values shell completion offers (``trajforge --install-completion``): each is the command's own
list, read lazily when the shell asks, so ``--format <TAB>`` offers the export formats and
``env show <TAB>`` the library's envs. Nothing here is imported before a completion is asked for
beyond this module, which imports no command.
"""

from __future__ import annotations

from pathlib import Path

import typer


def _starting(values: list[str], incomplete: str) -> list[str]:
    return [v for v in values if v.startswith(incomplete)]


def export_formats(incomplete: str) -> list[str]:
    from trajforge.export.formats import FORMATS

    return _starting(list(FORMATS), incomplete)


def progress_modes(incomplete: str) -> list[str]:
    return _starting(["auto", "rich", "plain", "none"], incomplete)


def env_names(incomplete: str) -> list[str]:
    from trajforge.envs.catalog import LIBRARY

    return _starting(sorted(LIBRARY), incomplete)


def parser_names(incomplete: str) -> list[str]:
    from trajforge.llm.parsers import list_parsers

    return _starting(list_parsers(), incomplete)


def run_files(incomplete: str) -> list[str]:
    """``--include``'s files, comma-separated: the next one after the last comma."""
    head, _, last = incomplete.rpartition(",")
    prefix = f"{head}," if head else ""
    return [prefix + name for name in ("trajectories", "filtered", "failed") if name.startswith(last)]


def run_ids(ctx: typer.Context, incomplete: str) -> list[str]:
    """The runs under the command line's ``--output-dir`` (``runs`` when it gives none)."""
    from trajforge.record.runs import runs_in

    folder = ctx.params.get("runs_dir") or Path("runs")
    return _starting([path.name for path, _ in runs_in(Path(folder))], incomplete)
