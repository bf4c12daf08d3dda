"""``trajforge serve``: an OpenAI-compatible (and vLLM/SGLang token-level) server for a local model."""

from __future__ import annotations

import asyncio
from pathlib import Path

import typer
from pydantic import ValidationError


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code=2)


def register(app: typer.Typer) -> None:
    @app.command("serve")
    def serve(
        model: Path = typer.Option(
            ..., "--model", help="local transformers model directory (config, weights, tokenizer)"
        ),
        host: str = typer.Option("127.0.0.1", "--host", help="interface to bind"),
        port: int = typer.Option(
            8000, "--port", help="port to bind; 0 picks a free one (printed at startup)"
        ),
        parser: str = typer.Option(
            "hermes", "--parser", help="tool-call parser for chat completions ('none' disables)"
        ),
        max_batch: int = typer.Option(8, "--max-batch", help="most sequences generated together"),
        device: str = typer.Option(
            "auto", "--device", help="auto (GPU when torch sees one), cpu, cuda, cuda:N"
        ),
        dtype: str = typer.Option("auto", "--dtype", help="auto, float32, bfloat16, float16"),
        served_model_name: str | None = typer.Option(
            None, "--served-model-name", help="model id clients use (default: the directory name)"
        ),
        batch_wait_ms: float = typer.Option(
            5.0, "--batch-wait-ms", help="how long to wait for more requests"
        ),
        logprobs_mode: str = typer.Option(
            "raw",
            "--logprobs-mode",
            help="raw: model log-softmax (vLLM default); processed: after temperature/top-p",
        ),
    ) -> None:
        """Serve a local model: /v1/chat/completions, /v1/completions, /generate, /v1/load_weights."""
        from trajforge.llm.parsers import get_parser
        from trajforge.serve.config import ServeConfig

        try:
            config = ServeConfig(
                model_path=model,
                host=host,
                port=port,
                parser=parser,
                max_batch=max_batch,
                device=device,
                dtype=dtype,  # type: ignore[arg-type]
                served_model_name=served_model_name,
                batch_wait_ms=batch_wait_ms,
                logprobs_mode=logprobs_mode,  # type: ignore[arg-type]
            )
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first.get("loc", ()))
            raise _fail(
                f"{where}: {first.get('msg')}".removeprefix(": ").replace("Value error, ", "")
            ) from None
        if config.parser is not None:
            try:
                get_parser(config.parser)
            except ValueError as exc:
                raise _fail(str(exc)) from None

        from transformers.utils import logging as hf_logging

        from trajforge.serve.app import serve_until_stopped

        hf_logging.disable_progress_bar()
        try:
            asyncio.run(serve_until_stopped(config))
        except ValueError as exc:  # unloadable model, unusable device
            raise _fail(str(exc)) from None
        except OSError as exc:  # port in use and the like
            raise _fail(f"could not start the server on {host}:{port}: {exc}") from None
