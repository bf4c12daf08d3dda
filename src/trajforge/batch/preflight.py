"""Fail fast, before any sample starts, on an unreachable endpoint, a bad key, or a sandbox
backend that cannot start -- using the very model and factory the run goes on with."""

from __future__ import annotations

from collections.abc import Callable

from trajforge.batch.backends import Backends
from trajforge.batch.config import BatchConfig
from trajforge.batch.errors import RunError
from trajforge.endpoint import preflight_model
from trajforge.protocols import ChatModel, SandboxFactory

PREFLIGHT_TASK_ID = "trajforge-preflight"


async def preflight(
    backends: Backends, sandbox_kind: str, announce: Callable[[str], None] = lambda _msg: None
) -> None:
    """``announce`` gets the endpoint's line: which server, which dialect (``--endpoint-dialect``)."""
    await check_endpoint(backends.model, announce)
    await check_sandbox(backends.sandbox_factory, sandbox_kind)


async def check_endpoint(model: ChatModel, announce: Callable[[str], None] = lambda _msg: None) -> None:
    try:
        await preflight_model(model, announce)
    except Exception as exc:
        raise RunError(f"endpoint check failed: {exc}") from None


async def check_sandbox(factory: SandboxFactory, sandbox_kind: str) -> None:
    """Start and close one sandbox (with reuse on, the first sample gets it back after a reset)."""
    try:
        sandbox = await factory.create(PREFLIGHT_TASK_ID)
        await sandbox.close()
    except Exception as exc:
        raise RunError(sandbox_problem(sandbox_kind, exc)) from None


def sandbox_problem(sandbox_kind: str, exc: BaseException) -> str:
    """One sentence: which backend, why, what to do (said once, even when the backend's own
    message already names the --sandbox choice)."""
    text = str(exc) or type(exc).__name__
    hint = "" if "--sandbox" in text else "; choose another with --sandbox"
    return f"sandbox backend {sandbox_kind!r} cannot start: {text}{hint}"


async def check_backend(cfg: BatchConfig) -> None:
    """Ask the configured sandbox backend whether it can run here, before a model server starts."""
    from trajforge.sandbox import create_sandbox_factory

    factory = create_sandbox_factory(cfg.sandbox_config())
    check = getattr(factory, "check", None)
    if check is None:
        return
    try:
        await check()
    except Exception as exc:
        raise RunError(sandbox_problem(cfg.sandbox, exc)) from None
