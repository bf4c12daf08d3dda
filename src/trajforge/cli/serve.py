"""``trajforge serve``: an OpenAI-compatible (and vLLM/SGLang token-level) server for a local model."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from pydantic import ValidationError

from trajforge.cli.errors import fail
from trajforge.extras import missing_ml

if TYPE_CHECKING:
    from trajforge.serve.config import ServeConfig

# The options of `trajforge serve`, one line each.
Model = Annotated[
    Path,
    typer.Option(
        "--model-path",
        "--model",
        help="local transformers model directory (config, weights, tokenizer); --model is the old name",
    ),
]
Host = Annotated[str, typer.Option("--host", help="interface to bind")]
Port = Annotated[int, typer.Option("--port", help="port to bind; 0 picks a free one (printed at startup)")]
Parser = Annotated[
    str, typer.Option("--parser", help="tool-call parser for chat completions ('none' disables)")
]
MaxBatch = Annotated[int, typer.Option("--max-batch", help="most sequences generated together")]
Device = Annotated[str, typer.Option("--device", help="auto (GPU when torch sees one), cpu, cuda, cuda:N")]
Dtype = Annotated[str, typer.Option("--dtype", help="auto, float32, bfloat16, float16")]
ServedName = Annotated[
    str | None,
    typer.Option("--served-model-name", help="model id clients use (default: the directory name)"),
]
BatchWait = Annotated[float, typer.Option("--batch-wait-ms", help="how long to wait for more requests")]
TokenFile = Annotated[
    Path | None,
    typer.Option(
        "--token-file",
        help="where to write the token /v1/load_weights requires (0600; default "
        "$XDG_RUNTIME_DIR/trajforge/serve-PORT.token or ~/.cache/trajforge/serve/serve-PORT.token)",
    ),
]
WeightsDir = Annotated[
    Path | None,
    typer.Option("--weights-dir", help="load_weights accepts only checkpoints inside this directory"),
]
LogprobsMode = Annotated[
    str,
    typer.Option(
        "--logprobs-mode", help="raw: model log-softmax (vLLM default); processed: after temperature/top-p"
    ),
]


def serve(
    model: Model,
    host: Host = "127.0.0.1",
    port: Port = 8000,
    parser: Parser = "hermes",
    max_batch: MaxBatch = 8,
    device: Device = "auto",
    dtype: Dtype = "auto",
    served_model_name: ServedName = None,
    batch_wait_ms: BatchWait = 5.0,
    logprobs_mode: LogprobsMode = "raw",
    token_file: TokenFile = None,
    weights_dir: WeightsDir = None,
    exit_with_stdin: bool = typer.Option(
        False,
        "--exit-with-stdin",
        hidden=True,
        help="Stop when standard input closes (set by a parent process that owns this server, so "
        "the server ends with it however the parent ends).",
    ),
) -> None:
    """Serve a local model: /v1/chat/completions, /v1/completions, /generate, /v1/load_weights
    (the last with the token the server writes to its token file at start)."""
    problem = missing_ml("`trajforge serve`")
    if problem:
        raise fail(problem)
    config = _config(
        dict(
            model_path=model,
            host=host,
            port=port,
            parser=parser,
            max_batch=max_batch,
            device=device,
            dtype=dtype,
            served_model_name=served_model_name,
            batch_wait_ms=batch_wait_ms,
            logprobs_mode=logprobs_mode,
            token_file=token_file,
            weights_dir=weights_dir,
        )
    )
    _check_parser(config.parser)
    _serve(config, exit_with_stdin=exit_with_stdin)


def _config(options: dict[str, Any]) -> ServeConfig:
    """The validated settings; the first problem is the error, in one line."""
    from trajforge.serve.config import ServeConfig

    try:
        return ServeConfig.model_validate(options)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        raise fail(f"{where}: {first.get('msg')}".removeprefix(": ").replace("Value error, ", "")) from None


def _check_parser(name: str | None) -> None:
    from trajforge.llm.parsers import get_parser

    if name is not None:
        try:
            get_parser(name)
        except ValueError as exc:
            raise fail(str(exc)) from None


def _serve(config: ServeConfig, *, exit_with_stdin: bool = False) -> None:
    from transformers.utils import logging as hf_logging

    from trajforge.serve.app import serve_until_stopped

    hf_logging.disable_progress_bar()
    try:
        asyncio.run(serve_until_stopped(config, exit_with_stdin=exit_with_stdin))
    except ValueError as exc:  # unloadable model, unusable device
        raise fail(str(exc)) from None
    except OSError as exc:  # port in use and the like
        raise fail(f"could not start the server on {config.host}:{config.port}: {exc}") from None


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)
