"""``trajforge serve``'s mutating endpoints: only the holder of the server's token swaps weights.

Before (53e87f8) anyone who reached loopback could POST /v1/load_weights: another local user
swapped the weights of a root-run trainer's policy server ("before: assert 200 == 401"), and the
error told them whether a path existed ("does not exist" vs "has no config.json"). Each refusal
below is checked to leave the served weights exactly as they were.
"""

from __future__ import annotations

import asyncio
import json
import os
import stat
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from trajforge.serve.app import RunningServer, create_app, run_server
from trajforge.serve.config import ServeConfig
from trajforge.serve.launcher import LocalServer
from trajforge.testing.tiny import build_tiny_model, build_tiny_tokenizer

RELOADS = ["/v1/load_weights", "/reload", "/update_weights_from_disk"]


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two checkpoints of one model, one of another vocabulary, and things that are not checkpoints."""
    root = tmp_path_factory.mktemp("weights")
    first, second, other = root / "ckpt" / "a", root / "ckpt" / "b", root / "other-vocab"
    tok = build_tiny_tokenizer(first)
    build_tiny_model(first, tok, seed=0)
    build_tiny_model(second, tok, seed=1)
    build_tiny_model(other, build_tiny_tokenizer(other, vocab_size=700), seed=2)
    no_config = root / "no-config"
    no_config.mkdir()
    a_file = root / "file.txt"
    a_file.write_text("x")
    garbage = root / "garbage"
    garbage.mkdir()
    (garbage / "config.json").write_text("{not json")
    outside = root / "outside"
    build_tiny_model(outside, tok, seed=3)
    return {
        "first": first,
        "second": second,
        "other": other,
        "no_config": no_config,
        "file": a_file,
        "garbage": garbage,
        "outside": outside,
        "root": root,
    }


@pytest.fixture
async def server(dirs: dict[str, Path]) -> AsyncIterator[RunningServer]:
    config = ServeConfig(model_path=dirs["first"], port=0, device="cpu", max_batch=2, batch_wait_ms=1)
    async with run_server(config) as srv:
        yield srv


async def _post(url: str, body: Any, headers: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as s, s.post(url, json=body, headers=headers) as resp:
        return resp.status, await resp.json(content_type=None)


async def _served(server: RunningServer) -> tuple[int, str]:
    async with aiohttp.ClientSession() as s, s.get(server.base_url + "/health") as resp:
        health = await resp.json()
    return health["model_version"], health["weights_path"]


@pytest.mark.parametrize("path", RELOADS)
@pytest.mark.parametrize(
    "headers",
    [
        None,
        {"Authorization": "Bearer wrong"},
        {"Authorization": "Basic x"},
        {"Authorization": "Bearer "},
        {"X-Api-Key": "anything"},
    ],
    ids=["none", "wrong", "basic", "empty", "other-header"],
)
async def test_a_reload_without_the_token_is_refused_and_the_weights_stay(
    server: RunningServer, dirs: dict[str, Path], path: str, headers: dict[str, str] | None
) -> None:
    before = await _served(server)
    status, body = await _post(server.base_url + path, {"path": str(dirs["second"])}, headers)
    assert status == 401 and "token" in body["error"]["message"]
    assert str(dirs["root"]) not in json.dumps(body)
    assert await _served(server) == before == (0, str(dirs["first"].resolve()))
    # a prefix of the right token is not the token
    status, _ = await _post(
        server.base_url + path,
        {"path": str(dirs["second"])},
        {"Authorization": f"Bearer {server.token[:-1]}"},
    )
    assert status == 401 and await _served(server) == before


async def test_the_token_reloads_and_every_refusal_reads_the_same_without_a_path(
    server: RunningServer, dirs: dict[str, Path]
) -> None:
    url = server.base_url + "/v1/load_weights"
    status, loaded = await _post(url, {"path": str(dirs["second"])}, server.auth_headers())
    assert status == 200 and loaded["version"] == 1
    refusals = {}
    for name in ("no_config", "file", "garbage", "other"):
        refusals[name] = await _post(url, {"path": str(dirs[name])}, server.auth_headers())
    refusals["missing"] = await _post(url, {"path": str(dirs["root"] / "no-such")}, server.auth_headers())
    refusals["relative"] = await _post(url, {"path": "../../etc"}, server.auth_headers())
    first = refusals["missing"]
    assert first[0] == 400
    for name, answer in refusals.items():
        assert answer == first, name  # the same status and body whatever the path is
        assert str(dirs["root"]) not in json.dumps(answer) and "/" not in answer[1]["error"]["message"]
    assert await _served(server) == (1, str(dirs["second"].resolve()))


async def test_weights_dir_confines_what_a_token_holder_may_load(dirs: dict[str, Path]) -> None:
    config = ServeConfig(
        model_path=dirs["first"],
        port=0,
        device="cpu",
        max_batch=2,
        batch_wait_ms=1,
        weights_dir=dirs["root"] / "ckpt",
    )
    async with run_server(config) as srv:
        url = srv.base_url + "/v1/load_weights"
        outside = await _post(url, {"path": str(dirs["outside"])}, srv.auth_headers())
        missing = await _post(url, {"path": str(dirs["root"] / "nope")}, srv.auth_headers())
        assert (
            outside == missing
            and outside[0] == 400
            and await _served(srv) == (0, str(dirs["first"].resolve()))
        )
        dotted = await _post(url, {"path": str(dirs["root"] / "ckpt" / ".." / "outside")}, srv.auth_headers())
        assert dotted == missing
        status, _ = await _post(url, {"path": str(dirs["second"])}, srv.auth_headers())
        assert status == 200 and (await _served(srv))[0] == 1


async def test_an_app_without_a_token_takes_no_reloads(server: RunningServer, dirs: dict[str, Path]) -> None:
    """The trainer's live policy (rl/adapters/hf_policy.py) serves the same routes without a token: none reloads."""
    app = create_app(server.ctx)
    for path in RELOADS:
        assert any(r.resource is not None and r.resource.canonical == path for r in app.router.routes())
    from aiohttp.test_utils import TestClient, TestServer

    async with TestClient(TestServer(app)) as client:
        resp = await client.post(
            "/v1/load_weights", json={"path": str(dirs["second"])}, headers={"Authorization": "Bearer "}
        )
        assert resp.status == 401
    assert await _served(server) == (0, str(dirs["first"].resolve()))


async def test_local_server_hands_the_token_over_a_private_file_never_argv_or_log(
    dirs: dict[str, Path], tmp_path: Path
) -> None:
    log = tmp_path / "serve.log"
    server = LocalServer(dirs["first"], device="cpu", max_batch=2, log_path=log)
    async with server:
        assert server.token and server._proc is not None
        token_dir = server._token_dir
        assert token_dir is not None
        token_file = token_dir / "token"
        assert stat.S_IMODE(os.stat(token_dir).st_mode) == 0o700
        assert stat.S_IMODE(os.stat(token_file).st_mode) == 0o600
        cmdline = await asyncio.to_thread(Path(f"/proc/{server._proc.pid}/cmdline").read_bytes)
        assert server.token.encode() not in cmdline
        url = server.base_url + "/v1/load_weights"  # type: ignore[operator]
        assert (await _post(url, {"path": str(dirs["second"])}))[0] == 401
        status, body = await _post(url, {"path": str(dirs["second"])}, server.auth_headers())
        assert status == 200 and body["version"] == 1
        token = server.token
    assert token.encode() not in log.read_bytes()
    assert not token_dir.exists()
