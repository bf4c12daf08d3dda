"""``trajforge tools list`` and ``trajforge tools check``: what can run here, and do its backends answer.

Both read the same ``tools:`` configuration a batch run does (``--tools-config FILE``: a YAML file
that is either the ``tools:`` section itself or a batch config holding one).
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import orjson
import typer

from trajforge.cli.errors import fail
from trajforge.cli.vocab import renamed

if TYPE_CHECKING:
    from trajforge.tools.config import ToolsConfig
    from trajforge.tools.registry import ToolRegistry

tools_app = typer.Typer(
    name="tools", help="The tools a model may call: readiness and backend checks.", no_args_is_help=True
)

_CONFIG_HELP = "YAML file with the tools section (or a batch config holding one)"


def load_tools_option(path: Path | None) -> ToolsConfig:
    """The ``--tools-config`` of a command (``trajforge tools``, ``trajforge run``): the empty
    config when not given; a file that cannot be used is one ``error:`` line, exit 2."""
    from trajforge.tools.config import ToolsConfig, ToolsConfigError, load_tools_config

    if path is None:
        return ToolsConfig()
    try:
        return load_tools_config(path)
    except ToolsConfigError as exc:
        raise fail(str(exc)) from None


def with_rl_tools(registry: ToolRegistry, runs_dir: Path) -> ToolRegistry:
    """``registry`` with the real ``rl_*`` tools over a run manager in ``runs_dir`` in place of the
    declared placeholders (the rl tools sit above ``tools/``: assembled here, never imported there)."""
    from trajforge.rl.runs.manager import Manager
    from trajforge.rl.runs.tools import RLToolSettings, rl_tools

    settings = RLToolSettings(agent_envs_dir=runs_dir / "agent_envs", inference_dir=runs_dir / "_inference")
    for tool in rl_tools(Manager(runs_dir), settings):
        registry.replace(tool)
    return registry


@tools_app.command("list")
def list_tools(
    tools_config: Path | None = typer.Option(None, "--tools-config", help=_CONFIG_HELP),
    runs_dir: Path = typer.Option(
        Path("runs"), "--output-dir", help="Where runs live: the rl tools' run manager (as `rl agent`)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """Every tool with its toolset and whether it is ready here (and why not)."""
    from dataclasses import replace

    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from trajforge.tools.builtin import build_registry
    from trajforge.tools.probe import tools_status

    registry = with_rl_tools(build_registry(load_tools_option(tools_config)), runs_dir)
    where = f"with the run manager in {runs_dir} (trajforge rl agent)"
    rows = [
        replace(r, reason=where) if r.toolset == "rl" and r.status == "ready" else r
        for r in tools_status(registry)
    ]
    if as_json:
        data = [{"tool": r.name, "toolset": r.toolset, "status": r.status, "reason": r.reason} for r in rows]
        typer.echo(orjson.dumps(data, option=orjson.OPT_INDENT_2).decode())
        return
    table = Table(title="Tools")
    table.add_column("tool", style="bold cyan", no_wrap=True)
    table.add_column("toolset", no_wrap=True)
    table.add_column("ready here")
    for r in rows:
        text = ("yes" if r.status == "ready" else "no") + (f": {r.reason}" if r.reason else "")
        # plain text: a reason's own brackets ("pip install 'trajforge[tools]'") are not rich markup
        table.add_row(Text(r.name), Text(r.toolset), Text(text))
    Console(file=sys.stdout, width=max(120, Console().width)).print(table)


@tools_app.command("check", cls=renamed({"--timeout": "--probe-timeout"}))
def check_tools(
    tools_config: Path | None = typer.Option(None, "--tools-config", help=_CONFIG_HELP),
    timeout: float = typer.Option(30.0, "--probe-timeout", help="deadline of each probe, s"),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of lines."),
) -> None:
    """Probe every configured backend (model endpoints, image endpoint, search, browser).
    Exit code 1 when one fails."""
    from trajforge.tools.probe import probe_backends

    results = asyncio.run(probe_backends(load_tools_option(tools_config), timeout_s=timeout))
    if as_json:
        data = [{"backend": r.backend, "target": r.target, "ok": r.ok, "detail": r.detail} for r in results]
        typer.echo(orjson.dumps(data, option=orjson.OPT_INDENT_2).decode())
    elif not results:
        typer.echo("no backend is configured: only terminal and file tools (and web_extract) run here")
    for r in results if not as_json else ():
        typer.echo(f"{'ok  ' if r.ok else 'FAIL'}  {r.backend}: {r.target}: {r.detail}")
    if any(not r.ok for r in results):
        raise typer.Exit(code=1)


def register(app: typer.Typer) -> None:
    app.add_typer(tools_app, name="tools")
