"""``trajforge serve``: an OpenAI-compatible (and vLLM/SGLang token-level) server for a local model.

The options are :class:`~trajforge.serve.config.ServeConfig`'s fields (cli/config_flags.py), so
each flag's help and default are the config's own.
"""

from __future__ import annotations

import asyncio
import inspect
import typing
from typing import Annotated, Any

import typer
from pydantic import ValidationError

from trajforge.cli import config_flags
from trajforge.cli.errors import fail
from trajforge.cli.vocab import renamed
from trajforge.extras import missing_ml
from trajforge.serve.config import ServeConfig

# Old spellings, kept for one release (docs/cli.md).
RENAMES = {"--model": "--model-path", "--parser": "--tool-call-parser"}

_EXIT_WITH_STDIN = inspect.Parameter(
    "exit_with_stdin",
    inspect.Parameter.KEYWORD_ONLY,
    default=False,
    annotation=Annotated[
        bool,
        typer.Option(
            "--exit-with-stdin",
            hidden=True,
            help="Stop when standard input closes (set by a parent process that owns this server, so "
            "the server ends with it however the parent ends).",
        ),
    ],
)


def serve(**options: Any) -> None:
    """Serve a local model over the OpenAI API and vLLM/SGLang's token-level /generate.

    /v1/chat/completions, /v1/completions, /generate and /v1/load_weights (the last with the token
    the server writes to its token file at start)."""
    exit_with_stdin = bool(options.pop("exit_with_stdin", False))
    problem = missing_ml("`trajforge serve`")
    if problem:
        raise fail(problem)
    config = _config(options)
    _check_parser(config.parser)
    _check_port(config.host, config.port)  # before the model loads (16 s on a CPU), not after
    _serve(config, exit_with_stdin=exit_with_stdin)


def _config(options: dict[str, Any]) -> ServeConfig:
    """The validated settings; the first problem is the error, in one line."""
    try:
        return ServeConfig.model_validate(options)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = [str(p) for p in first.get("loc", ())]
        field = ServeConfig.model_fields.get(loc[0]) if loc else None
        where = config_flags.flag_of(loc[0], field) if field is not None else ".".join(loc)
        raise fail(f"{where}: {first.get('msg')}".removeprefix(": ").replace("Value error, ", "")) from None


def _check_parser(name: str | None) -> None:
    from trajforge.llm.parsers import get_parser

    if name is not None:
        try:
            get_parser(name)
        except ValueError as exc:
            raise fail(str(exc)) from None


def _check_port(host: str, port: int) -> None:
    """Fail now when ``host:port`` cannot be bound (another server holds it), as the server itself
    would bind it (SO_REUSEADDR, every address ``host`` names). Port 0 is a free one: nothing to
    check. A port taken between this check and the server's start still fails there, as before."""
    import errno
    import socket

    if port == 0:
        return
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise fail(f"--host {host}: cannot resolve it ({exc.strerror})") from None
    for family, kind, proto, _, address in infos:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(address)
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    raise fail(
                        f"port {port} on {host} is in use (another server?); pick another --port, "
                        "or --port 0 for a free one"
                    ) from None
                raise fail(f"could not bind {host}:{port}: {exc.strerror or exc}") from None


def _serve(config: ServeConfig, *, exit_with_stdin: bool = False) -> None:
    from transformers.utils import logging as hf_logging

    from trajforge.serve.app import serve_until_stopped

    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    try:
        asyncio.run(serve_until_stopped(config, exit_with_stdin=exit_with_stdin))
    except ValueError as exc:  # unloadable model, unusable device
        raise fail(str(exc)) from None
    except OSError as exc:  # port in use and the like
        raise fail(f"could not start the server on {config.host}:{config.port}: {exc}") from None


def register(app: typer.Typer) -> None:
    params = [*config_flags.options(ServeConfig, required=("model_path",)), _EXIT_WITH_STDIN]
    typing.cast(Any, serve).__signature__ = inspect.Signature(params)
    app.command("serve", cls=renamed(RENAMES))(serve)
