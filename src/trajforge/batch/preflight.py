"""Fail fast, before any sample starts, on an unreachable endpoint, a bad key, or a sandbox
backend that cannot start -- using the very model and factory the run goes on with."""

from __future__ import annotations

from trajforge.batch.backends import Backends
from trajforge.batch.errors import RunError
from trajforge.protocols import ChatModel, SandboxFactory, SupportsPreflight

PREFLIGHT_TASK_ID = "trajforge-preflight"


async def preflight(backends: Backends, sandbox_kind: str) -> None:
    await check_endpoint(backends.model)
    await check_sandbox(backends.sandbox_factory, sandbox_kind)


async def check_endpoint(model: ChatModel) -> None:
    if not isinstance(model, SupportsPreflight):
        return
    try:
        await model.check()
    except Exception as exc:
        raise RunError(f"endpoint check failed: {exc}") from None


async def check_sandbox(factory: SandboxFactory, sandbox_kind: str) -> None:
    """Start and close one sandbox (with reuse on, the first sample gets it back after a reset)."""
    try:
        sandbox = await factory.create(PREFLIGHT_TASK_ID)
        await sandbox.close()
    except Exception as exc:
        raise RunError(
            f"sandbox backend {sandbox_kind!r} cannot start: {exc}; choose another with --sandbox"
        ) from None
