"""``trajforge env serve|process|evaluate ENV [ATROPOS FLAGS]``: atroposlib's own CLI modes on a
trajforge env (the ``atropos`` extra).

Everything after ENV goes to atroposlib's CLI unchanged (``--env.group_size 4``,
``--openai.base_url URL``, ``--openai.server_type vllm``, ``--env.tokenizer_name DIR``,
``--config file.yaml`` ...; ``trajforge env serve ENV --help`` lists them). atroposlib reads
``sys.argv`` itself, so the command rewrites it to what atroposlib expects. wandb stays off
unless ``--env.use_wandb true`` is given (atroposlib's process/evaluate modes would turn it on).

Run standalone as ``python -m trajforge.cli.env_atropos MODE ENV ...`` too.
"""

from __future__ import annotations

import sys
from typing import Any

import typer
from typer.core import TyperCommand

from trajforge.cli.errors import fail
from trajforge.extras import missing_ml

_MODES = {
    "serve": "Run ENV as an Atropos environment server: register with the Atropos API (run-api) and push scored groups.",
    "process": "Run ENV's groups offline and write them as Atropos JSONL (--env.data_path_to_save_groups, --env.total_steps groups).",
    "evaluate": "Evaluate ENV through atroposlib's evaluate mode (--env.eval_n items, --env.data_dir_to_save_evals DIR).",
}
_PASS_THROUGH = {"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []}


def atropos_argv(mode: str, args: list[str]) -> list[str]:
    """The argv atroposlib's CLI sees: its subcommand, the user's flags, wandb off unless asked."""
    argv = ["trajforge env", mode, *args]
    if not any(a == "--env.use_wandb" or a.startswith("--env.use_wandb=") for a in args) and not (
        {"-h", "--help"} & set(args)
    ):
        argv += ["--env.use_wandb", "false"]
    return argv


_KEY_FLAGS = ("--openai.api_key", "--api_key")


def key_in_argv(args: list[str]) -> bool:
    """Whether the flags carry an API key (``--openai.api_key X`` / ``=X``, or per server)."""
    return any(a.split("=", 1)[0].endswith(_KEY_FLAGS) for a in args)


def run_mode(mode: str, env: str, args: list[str]) -> None:
    # Refused before atroposlib sees it: it prints (and saves) its whole config, key included,
    # before any of our code runs. A key in argv is also visible in /proc/*/cmdline.
    if key_in_argv(args):
        raise fail(
            "an API key on the command line would be printed, saved with the config and visible in the "
            "process list: put it in an environment variable and pass --env.api_key_env NAME instead of "
            "--openai.api_key"
        )
    problem = missing_ml(f"trajforge env {mode}")
    if problem:
        raise fail(problem)
    try:
        from trajforge.rl.adapters.atropos import atropos_env_class
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.split(".")[0] in {"atroposlib", "wandb", "pydantic_cli"}:
            raise fail(f"trajforge env {mode} needs atroposlib: pip install 'trajforge[atropos]'") from None
        raise
    from trajforge.envs.catalog import UnknownEnvError
    from trajforge.rl.adapters.atropos import AtroposAdapterError

    try:
        cls = atropos_env_class(env)
    except UnknownEnvError as exc:
        raise fail(str(exc)) from None
    sys.argv = atropos_argv(mode, args)
    try:
        cls.cli()  # exits
    except AtroposAdapterError as exc:
        raise fail(str(exc)) from None


_HELP = ("--help", "-h")


def _command(mode: str):  # type: ignore[no-untyped-def]
    def command(
        ctx: typer.Context,
        env: str | None = typer.Argument(
            None, metavar="ENV", help="env name (trajforge env list) or path/to/file.py:ClassName"
        ),
    ) -> None:
        # --help before ENV is ours (no env to ask atroposlib about); after ENV it is atroposlib's.
        if env is None or env in _HELP:
            if env in _HELP or set(_HELP) & set(ctx.args):
                typer.echo(ctx.get_help())
                raise typer.Exit()
            raise fail(f"give ENV: trajforge env {mode} ENV [ATROPOS FLAGS] (trajforge env list names them)")
        run_mode(mode, env, list(ctx.args))

    command.__doc__ = _MODES[mode] + " Flags after ENV go to atroposlib (ENV --help lists them)."
    return command


class _PassThrough(TyperCommand):
    """Usage shows ENV as required and the flags that follow it (ENV is optional to click only so
    that ``--help`` works without one)."""

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        pieces = [p for p in super().collect_usage_pieces(ctx) if p not in ("[OPTIONS]", "[ENV]")]
        return [*pieces, "ENV", "[ATROPOS FLAGS]..."]


def register(env_app: typer.Typer) -> None:
    """Add ``serve``, ``process`` and ``evaluate`` to the ``trajforge env`` group."""
    for mode in _MODES:
        env_app.command(mode, cls=_PassThrough, context_settings=dict(_PASS_THROUGH))(_command(mode))


def main() -> None:
    app = typer.Typer(add_completion=False, no_args_is_help=True, help="Atropos modes of trajforge envs.")
    register(app)
    app()


if __name__ == "__main__":
    main()
