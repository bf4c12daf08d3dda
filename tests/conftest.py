"""Shared fixtures: kept small and generic (anything specific lives in its test file)."""

from __future__ import annotations

import os

# The xdist workers share this machine's cores; torch (and every trainer or `trajforge serve` a test
# starts, which inherit this) would otherwise run one OpenMP thread per core in each, and the
# oversubscribed threads spin against each other: the torch-heavy files took 2.5x as long
# (93 s against 38 s for test_tiny_recipe + test_export_hot_batch on two workers). A user's own
# setting wins. The product sets nothing: one trainer and its rollout server, alone on a machine,
# ran as fast with one thread each as with the default (rl_train's builtin-trainer test).
os.environ.setdefault("OMP_NUM_THREADS", "1")

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from typing import Any

import pytest

from trajforge.llm.keys import DEFAULT_KEY_ENVS
from trajforge.testing.scripted_server import ScriptedServer


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Files with a ``slow`` test first: xdist hands out whole files (``--dist loadfile``) in
    collection order, and a long file started last is a tail the other workers wait out idle."""
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow_files)  # stable: the rest keep their order


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


@pytest.fixture
async def bwrap() -> AsyncIterator[Any]:
    """A bubblewrap sandbox factory with reuse on (what env rollouts run on), closed after the test."""
    from trajforge.sandbox import close_factory, create_sandbox_factory
    from trajforge.sandbox.types import SandboxConfig

    factory = create_sandbox_factory(SandboxConfig(kind="bwrap", reuse=True))
    try:
        yield factory
    finally:
        await close_factory(factory)


@pytest.fixture
async def factory(tmp_path: Any) -> AsyncIterator[Any]:
    """A bubblewrap sandbox factory whose sandboxes live under ``tmp_path/sb``, closed after the test
    (a test file with another backend defines its own ``factory``)."""
    from trajforge.sandbox import close_factory, create_sandbox_factory
    from trajforge.sandbox.types import SandboxConfig

    f = create_sandbox_factory(SandboxConfig(kind="bwrap", root_dir=str(tmp_path / "sb")))
    try:
        yield f
    finally:
        await close_factory(f)


@pytest.fixture
def kill_agent() -> Callable[[Any], Awaitable[None]]:
    """``await kill_agent(sandbox)``: SIGKILL the sandbox's process from the host and wait until its
    death is seen. Until then, on a loaded machine, the agent inside may still answer a call before
    the kernel tears its namespaces down: a race no test of a dead sandbox is about."""
    import asyncio
    import signal

    async def kill(sandbox: Any) -> None:
        os.kill(sandbox.agent.pid, signal.SIGKILL)
        for _ in range(1000):
            if not sandbox.agent.alive():
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"the sandbox process {sandbox.agent.pid} was killed but never seen dead")

    return kill


SCRIPTED_KEY_ENV = "TF_SCRIPTED_TEST_KEY"


@pytest.fixture
def scripted_batch_config(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> Callable[..., Any]:
    """Factory: a ``BatchConfig`` for a small run against a scripted endpoint, in ``tmp_path``:
    ``cfg = scripted_batch_config(rows, base_url, **overrides)``. Local sandboxes, one toolset,
    no progress output, reasoning not required; every override is a BatchConfig field."""
    import orjson

    from trajforge.batch.config import load_config

    monkeypatch.setenv(SCRIPTED_KEY_ENV, "k")

    def make(rows: list[dict[str, Any]], base_url: str, **overrides: Any) -> Any:
        dataset = tmp_path / "d.jsonl"
        dataset.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
        settings = {
            "dataset": dataset,
            "run_name": "run",
            "output_dir": tmp_path / "data",
            "model": "scripted",
            "base_url": base_url,
            "api_key_env": SCRIPTED_KEY_ENV,
            "toolsets": ["terminal"],
            "sandbox": "local",
            "progress": "none",
            "require_reasoning": False,
            "retry_backoff": 0.01,
        }
        return load_config(None, {**settings, **overrides})

    return make


@pytest.fixture(scope="session")
def tiny_chatml_model(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A tiny random Qwen2 (hidden 32, 2 layers) with a real byte-level BPE + ChatML tokenizer,
    saved as a servable model directory: the policy the RL trainer tests train (built once)."""
    from trajforge.testing.tiny import build_tiny_model, build_tiny_tokenizer

    root = tmp_path_factory.mktemp("rl-policy")
    tok = build_tiny_tokenizer(root / "tok", "chatml")
    build_tiny_model(root / "model", tok, hidden=32, layers=2, seed=0)
    return root / "model"


@pytest.fixture(scope="session")
def docker_engine_session() -> Any:
    """A real Docker engine (tests/docker_engine.py): a private dockerd started for the session
    (and stopped after it, unless one was already running) plus the locally built Debian base
    image. Skips only where the engine cannot run on this machine, saying exactly why. Sets no
    environment: tests that use it take ``docker_engine``."""
    import docker_engine as engine

    reason = engine.why_not()
    if reason:
        pytest.skip(f"no Docker engine can run here: {reason}")
    host = engine.acquire()
    try:
        with pytest.MonkeyPatch.context() as patch:  # for the base image build only
            patch.setenv("DOCKER_HOST", host)
            base = engine.base_image()
        yield engine.Engine(host=host, base=base)
    finally:
        engine.release()


@pytest.fixture
def docker_engine(docker_engine_session: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The session's engine, with ``DOCKER_HOST`` pointing the docker CLI at it for this test
    only (other tests in the worker must not find an engine they did not ask for)."""
    monkeypatch.setenv("DOCKER_HOST", docker_engine_session.host)
    return docker_engine_session
