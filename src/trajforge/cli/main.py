"""Entry point of the ``trajforge`` command.

Each command lives in its own module under :mod:`trajforge.cli` and exposes ``register(app)``.
This module imports none of them up front: the root group knows each command's name, module and
one-line help from a fixed table, and imports a module only when its command runs (or its own
``--help`` is asked for). ``trajforge --help`` and ``--version`` so load typer and click, not
torch, transformers, datasets, aiohttp or openai (``tests/test_cli_help.py`` checks that;
``benchmarks/cli_startup.py`` measures it).
"""

from __future__ import annotations

import importlib
from typing import Any

import typer
from typer.core import TyperCommand, TyperGroup

# Fixed map of commands (no import-time registry): name -> (module with ``register(app)``, help
# line of the root listing). The help line is the command's own first line (a test holds them equal).
COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("trajforge.cli.run", "Run one agent session, print the final answer and save the trajectory."),
    "distributions": (
        "trajforge.cli.distributions",
        "List the toolset distributions (each toolset is drawn independently with its chance).",
    ),
    "parse": (
        "trajforge.cli.parse",
        "Parse a model output read from stdin and print content, calls and errors as JSON.",
    ),
    "batch": (
        "trajforge.cli.batch",
        "Generate trajectories for every prompt of DATASET into OUTPUT_DIR/RUN_NAME (resumable).",
    ),
    "export": (
        "trajforge.cli.export",
        "Export a run for a trainer: TRL, ShareGPT, LLaMA-Factory, Axolotl, Parquet, DPO pairs.",
    ),
    "report": (
        "trajforge.cli.report",
        "Write a run report: statistics, charts and a trajectory browser, in one HTML file.",
    ),
    "serve": (
        "trajforge.cli.serve",
        "Serve a local model over the OpenAI API and vLLM/SGLang's token-level /generate.",
    ),
    "model": ("trajforge.cli.model", "Build and evaluate the embedded tiny tool-calling policy."),
    "tools": ("trajforge.cli.tools", "The tools a model may call: readiness and backend checks."),
    "env": (
        "trajforge.cli.env",
        "RL and evaluation environments: list, show, eval, rescore, resize, serve, process, evaluate.",
    ),
    "rl": (
        "trajforge.cli.rl",
        "Reinforcement learning: train, demo, start/status/stop/results/list/logs, the RL agent.",
    ),
}


def load_command(name: str) -> Any:
    """The click command (or group) ``name`` (typer's own click), its module imported now."""
    module = importlib.import_module(COMMANDS[name][0])
    holder = typer.Typer()
    module.register(holder)
    command = typer.main.get_group(holder).commands[name]
    quiet_switches(command)
    return command


def quiet_switches(command: Any) -> None:
    """Show no value type for a switch: typer's help prints ``<bool>`` after ``--json``,
    ``--network/--no-network`` and ``--help`` itself, although a switch takes no value. And
    name arguments as usage lines do (``RUN_DIR``, ``[RUN_ID]``): typer 0.29 writes a required
    one as ``{run_dir}``, which reads as a template left unfilled."""
    help_option = command.get_help_option(typer.Context(command, **(command.context_settings or {})))
    for param in [*command.params, *([help_option] if help_option is not None else [])]:
        _no_metavar(param)
        if getattr(param, "param_type_name", "") == "argument":  # typer's own (vendored) click
            _usage_name(param)
    for sub in getattr(command, "commands", {}).values():
        quiet_switches(sub)


def _usage_name(param: Any) -> None:
    name = (param.metavar or param.name or "arg").upper()
    if param.metavar is None:
        param.metavar = name
    shown = name if param.required else f"[{name}]"
    shown += "..." if param.nargs != 1 else ""
    param.get_usage_pieces = lambda ctx: [shown]


def _no_metavar(param: Any) -> None:
    if getattr(param, "is_flag", False) and param.metavar is None:
        param.metavar = ""


class LazyRoot(TyperGroup):
    """The root group: commands listed from :data:`COMMANDS`, each built on first use."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._loaded: dict[str, Any] = {}
        self._listing = False

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        # `trajforge` alone: the help, as no_args_is_help does (typer's error handler would print
        # nothing, taking it for rich help already shown), and click's exit code 2.
        if not args and not ctx.resilient_parsing:
            typer.echo(ctx.get_help())
            raise typer.Exit(code=2)
        return super().parse_args(ctx, args)

    def get_params(self, ctx: Any) -> Any:
        params = super().get_params(ctx)
        for param in params:  # the root's own switches: --version, completion (added after init)
            _no_metavar(param)
        return params

    def list_commands(self, ctx: Any) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        if cmd_name not in COMMANDS:
            return None
        if self._listing:  # the root --help: the fixed help line, nothing imported
            return TyperCommand(cmd_name, help=COMMANDS[cmd_name][1], short_help=COMMANDS[cmd_name][1])
        if cmd_name not in self._loaded:
            self._loaded[cmd_name] = load_command(cmd_name)
        return self._loaded[cmd_name]

    def format_help(self, ctx: Any, formatter: Any) -> None:
        # Plain click formatting here: typer's rich help imports rich's markdown and syntax
        # modules (about as long as everything else `trajforge --help` does); each command's own
        # --help keeps the rich panels.
        self.rich_markup_mode = None
        self._listing = True
        try:
            super().format_help(ctx, formatter)
        finally:
            self._listing = False


app = typer.Typer(
    name="trajforge",
    cls=LazyRoot,
    help="Agent trajectory factory and RL environments for tool-using LLMs.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        from trajforge import __version__

        typer.echo(f"trajforge {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """Agent trajectory factory and RL environments for tool-using LLMs."""
    from trajforge.cli import dump

    dump.install()  # `kill -USR1 <pid>` prints where a command is (cli/dump.py)


def main() -> None:  # pragma: no cover - console script shim
    app()


if __name__ == "__main__":  # pragma: no cover - python -m trajforge.cli.main
    main()
