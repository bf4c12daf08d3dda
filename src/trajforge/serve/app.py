"""The aiohttp application of ``trajforge serve`` and the ways to run it.

Routes (all JSON unless streamed):

- ``GET /health`` -- ``{"status": "ok", "model", "model_version", "weights_path", "device"}``
- ``GET /v1/models`` -- the one served model, OpenAI list shape
- ``POST /v1/chat/completions`` -- :mod:`trajforge.serve.routes_chat`
- ``POST /v1/completions`` -- :mod:`trajforge.serve.routes_completions`
- ``POST /generate`` -- vLLM and SGLang token-level generation, :mod:`trajforge.serve.routes_generate`
- ``POST /v1/load_weights`` (aliases ``/reload``, SGLang's ``/update_weights_from_disk``) --
  ``{"path": DIR}``: new weights without a restart, swapped in between batches; answers the new
  ``version``.

Every error is OpenAI-shaped: ``{"error": {"message", "type", "param", "code"}}``.

Mutating endpoints (the weight reloads) take ``Authorization: Bearer TOKEN``: a token made for
this server when it starts, compared in constant time, and checked before the body is read.
Loopback is not a boundary (any local user, any process of a sandbox with the network on, reaches
it), so without the token nobody swaps the weights a trainer samples from. The token reaches its
users through a 0600 file (``--token-file``; ``LocalServer`` reads it), never argv or the log.
A refused reload says the same thing, without the path, whether the path is missing, unreadable,
outside ``--weights-dir`` or not a checkpoint of this model: the server's log has the reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import os
import secrets
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web
from aiohttp.typedefs import Handler

from trajforge.llm.parsers import get_parser
from trajforge.serve.config import READY_PREFIX, ServeConfig
from trajforge.serve.context import CTX, ServerContext, read_body
from trajforge.serve.decode import LogitsHook
from trajforge.serve.engine import Engine
from trajforge.serve.errors import EngineError, RequestError
from trajforge.serve.loading import load_tokenizer
from trajforge.serve.protocol import APIError, LoadWeightsRequest
from trajforge.serve.routes_chat import chat_completions
from trajforge.serve.routes_completions import completions
from trajforge.serve.routes_generate import generate

log = logging.getLogger(__name__)

TOKEN = web.AppKey("trajforge_serve_token", str)
WEIGHTS_DIR = web.AppKey("trajforge_serve_weights_dir", Path)
MUTATING = ("/v1/load_weights", "/reload", "/update_weights_from_disk")
_WEIGHTS_REFUSED = (
    "cannot load weights from the given path: it is not a checkpoint of the served model that this "
    "server may load (the server's log says why)"
)


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every failure becomes an OpenAI-shaped JSON error with a message that says what to do."""
    try:
        return await handler(request)
    except APIError as exc:
        return exc.response()
    except RequestError as exc:
        return APIError(400, str(exc)).response()
    except EngineError as exc:
        return APIError(500, str(exc)).response()
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        message = f"{exc.reason}: {request.method} {request.path}"
        if exc.status == 404:
            message += " (routes: /health, /v1/models, /v1/chat/completions, /v1/completions, /generate, /v1/load_weights)"
        return APIError(exc.status, message).response()
    except Exception as exc:
        log.exception("unhandled error in %s %s", request.method, request.path)
        return APIError(500, f"internal server error: {type(exc).__name__}: {exc}").response()


async def _health(request: web.Request) -> web.Response:
    ctx = request.app[CTX]
    running = ctx.engine.running
    return web.json_response(
        {
            "status": "ok" if running else "error",
            "model": ctx.model_name,
            "model_version": ctx.engine.version,
            "weights_path": str(ctx.engine.weights_path) if ctx.engine.weights_path else None,
            "device": str(ctx.engine.device),
            "max_batch": ctx.engine.max_batch,
            "batches": ctx.engine.stats.batches,
            "largest_batch": ctx.engine.stats.largest_batch,
        },
        status=200 if running else 503,
    )


async def _models(request: web.Request) -> web.Response:
    ctx = request.app[CTX]
    card = {
        "id": ctx.model_name,
        "object": "model",
        "created": ctx.created,
        "owned_by": "trajforge",
        "root": str(ctx.engine.weights_path) if ctx.engine.weights_path else None,
        "max_model_len": ctx.engine.context_length,
        "model_version": ctx.engine.version,
    }
    return web.json_response({"object": "list", "data": [card]})


def _require_token(request: web.Request) -> None:
    """401 unless the request carries this server's token (a server without one takes none)."""
    token = request.app.get(TOKEN)
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    if (
        not token
        or scheme.lower() != "bearer"
        or not hmac.compare_digest(given.strip().encode(), token.encode())
    ):
        raise APIError(
            401,
            f"{request.path} needs this server's token: send `Authorization: Bearer TOKEN` with the "
            "content of the token file `trajforge serve` printed at start",
        )


async def _load_weights(request: web.Request) -> web.Response:
    _require_token(request)
    ctx = request.app[CTX]
    body = await read_body(request, LoadWeightsRequest)
    try:
        checked = await asyncio.to_thread(_allowed_weights, body.path, request.app.get(WEIGHTS_DIR))
        version = await ctx.engine.load_weights(checked)
    except Exception as exc:  # one answer for every refusal: whether a path exists is not told
        log.warning("refused to load weights from %r: %s: %s", body.path, type(exc).__name__, exc)
        raise APIError(400, _WEIGHTS_REFUSED, param="path") from None
    path = str(ctx.engine.weights_path)
    return web.json_response(
        {
            "version": version,
            "path": path,
            "model": ctx.model_name,
            "success": True,
            "message": f"loaded weights version {version} from {path}",
        }
    )


def _allowed_weights(path: str, weights_dir: Path | None) -> Path:
    """The checkpoint directory ``path`` names, if the server may load it (inside ``weights_dir``
    when one was given)."""
    resolved = Path(path).resolve()
    if weights_dir is not None and not resolved.is_relative_to(weights_dir.resolve()):
        raise PermissionError(f"{resolved} is outside --weights-dir {weights_dir}")
    return resolved


def create_app(
    ctx: ServerContext, *, token: str | None = None, weights_dir: Path | None = None
) -> web.Application:
    """The routes around an already running engine (the caller owns the engine's lifetime).
    ``token``: what mutating endpoints require (None: they refuse every request)."""
    app = web.Application(middlewares=[_errors], client_max_size=64 * 1024 * 1024)
    app[CTX] = ctx
    if token:
        app[TOKEN] = token
    if weights_dir is not None:
        app[WEIGHTS_DIR] = weights_dir
    app.router.add_get("/health", _health)
    app.router.add_get("/v1/models", _models)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/generate", generate)
    for path in MUTATING:
        app.router.add_post(path, _load_weights)
    return app


@dataclass
class RunningServer:
    """A server listening on ``base_url`` (``http://host:port``, no ``/v1``). ``token`` is what
    its mutating endpoints require; ``token_file`` where it was written (when it was)."""

    base_url: str
    engine: Engine
    app: web.Application
    token: str
    token_file: Path | None = None

    def auth_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    @property
    def ctx(self) -> ServerContext:
        return self.app[CTX]


@contextlib.asynccontextmanager
async def run_server(
    config: ServeConfig, *, logits_hook: LogitsHook | None = None, user_token_file: bool = False
) -> AsyncIterator[RunningServer]:
    """Load the model, start the engine and the HTTP server; stop both on exit.

    ``config.port == 0`` binds a free port; the actual one is in ``base_url``.
    """
    parser = get_parser(config.parser) if config.parser else None
    engine = await Engine.from_config(config, logits_hook=logits_hook)
    tokenizer = await asyncio.to_thread(load_tokenizer, config.model_path)
    ctx = ServerContext(
        engine=engine,
        tokenizer=tokenizer,
        model_name=config.model_name,
        parser=parser,
        model_path=config.model_path,
    )
    token = secrets.token_urlsafe(32)
    app = create_app(ctx, token=token, weights_dir=config.weights_dir)
    async with engine:
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await runner.setup()
        try:
            site = web.TCPSite(runner, config.host, config.port)
            await site.start()
            host, port = _bound_address(runner, config)
            token_file = config.token_file or (default_token_file(port) if user_token_file else None)
            if token_file is not None:
                await asyncio.to_thread(write_token_file, token_file, token)
            try:
                yield RunningServer(
                    base_url=f"http://{host}:{port}",
                    engine=engine,
                    app=app,
                    token=token,
                    token_file=token_file,
                )
            finally:
                if token_file is not None:
                    with contextlib.suppress(OSError):
                        token_file.unlink()
        finally:
            await runner.cleanup()


def write_token_file(path: Path, token: str) -> None:
    """``token`` into a new file only our user can read, in a directory only our user can enter
    (a stale file of that name -- an earlier server on the port -- is replaced, never followed)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")


def default_token_file(port: int) -> Path:
    """Where a user-run server writes its token: ``$XDG_RUNTIME_DIR/trajforge`` (private to the
    user by the spec) or ``~/.cache/trajforge/serve``, one file per port."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    base = Path(runtime) / "trajforge" if runtime else Path.home() / ".cache" / "trajforge" / "serve"
    return base / f"serve-{port}.token"


def _bound_address(runner: web.AppRunner, config: ServeConfig) -> tuple[str, int]:
    for addr in runner.addresses:
        if isinstance(addr, tuple) and len(addr) >= 2:
            host = addr[0]
            return (f"[{host}]" if ":" in host else host), int(addr[1])
    return config.host, config.port


async def serve_until_stopped(
    config: ServeConfig, *, stop: asyncio.Event | None = None, exit_with_stdin: bool = False
) -> None:
    """Run the server until SIGINT/SIGTERM (or ``stop`` is set), printing the ready line first.

    ``exit_with_stdin``: also stop when standard input reaches end of file. A parent that starts
    the server with a pipe as its stdin and never writes to it (``LocalServer``) thereby ties the
    server's life to its own: the kernel closes the pipe when the parent exits however it exits
    (SIGKILL included), where a signal-based stop needs the parent alive to send it -- a killed
    ``rl demo`` left its policy server running (and holding its memory) for hours."""
    import signal
    import threading

    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    if exit_with_stdin:

        def wait_for_eof() -> None:
            with contextlib.suppress(OSError, ValueError):
                while sys.stdin.buffer.read(65536):
                    pass
            loop.call_soon_threadsafe(stop.set)

        threading.Thread(target=wait_for_eof, name="trajforge-serve-parent", daemon=True).start()
    async with run_server(config, user_token_file=True) as server:
        engine = server.engine
        print(
            f"{READY_PREFIX}{server.base_url} (model {config.model_name}, device {engine.device}, "
            f"parser {config.parser or 'none'}, max batch {config.max_batch})",
            flush=True,
        )
        print(
            f"trajforge serve: {', '.join(MUTATING)} need `Authorization: Bearer TOKEN`; the token is "
            f"in {server.token_file} (readable by this user only)",
            flush=True,
        )
        await stop.wait()
