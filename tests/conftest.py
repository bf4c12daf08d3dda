"""Shared fixtures: kept small and generic (anything specific lives in its test file)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from typing import Any

import pytest

from trajforge.llm.keys import DEFAULT_KEY_ENVS
from trajforge.testing.scripted_server import ScriptedServer


@pytest.fixture(autouse=True)
def _no_api_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests never see the developer's real API keys (and never send them anywhere)."""
    for name in DEFAULT_KEY_ENVS:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
async def scripted_server() -> AsyncIterator[Callable[..., Awaitable[ScriptedServer]]]:
    """Factory: ``srv = await scripted_server(policy, **kwargs)``; every server stops at teardown."""
    async with AsyncExitStack() as stack:

        async def start(policy: Any, **kwargs: Any) -> ScriptedServer:
            return await stack.enter_async_context(ScriptedServer(policy, **kwargs))

        yield start
