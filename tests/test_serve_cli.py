"""``trajforge serve`` as a command: argument errors, and a real child process via ``LocalServer``."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest
from click.testing import Result
from openai import AsyncOpenAI
from typer.testing import CliRunner

from trajforge.cli.main import app
from trajforge.serve.launcher import LocalServer, LocalServerError
from trajforge.testing.tiny import build_tiny_model, build_tiny_tokenizer


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tiny")
    build_tiny_model(out, build_tiny_tokenizer(out))
    return out


def _stderr(result: Result) -> str:
    try:
        return result.stderr
    except ValueError:  # older click: stderr mixed into output
        return result.output


def test_unknown_model_path_is_a_clear_error(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["serve", "--model", str(tmp_path / "missing")])
    assert result.exit_code == 2
    assert "does not exist" in _stderr(result) and "model directory" in _stderr(result)


def test_directory_without_config_is_a_clear_error(tmp_path: Path) -> None:
    for flag in ("--model-path", "--model"):  # directories are --model-path; --model is the old name
        result = CliRunner().invoke(app, ["serve", flag, str(tmp_path)])
        assert result.exit_code == 2 and "config.json" in _stderr(result)


def test_unknown_parser_lists_the_known_ones(model_dir: Path) -> None:
    result = CliRunner().invoke(app, ["serve", "--model", str(model_dir), "--parser", "nosuch"])
    assert result.exit_code == 2 and "hermes" in _stderr(result)


def test_a_busy_port_is_said_before_the_model_loads(tmp_path: Path) -> None:
    """The port is checked first (issue 43: "address in use" came after 16 s of loading): the model
    here could not load at all, and the error is still the port's."""
    import socket

    (tmp_path / "config.json").write_text("{}")  # a model directory that would fail to load
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        result = CliRunner().invoke(app, ["serve", "--model-path", str(tmp_path), "--port", str(port)])
    assert result.exit_code == 2, result.output
    assert f"port {port} on 127.0.0.1 is in use" in _stderr(result) and "--port 0" in _stderr(result)


async def test_local_server_runs_trajforge_serve_as_a_child(model_dir: Path, tmp_path: Path) -> None:
    log = tmp_path / "serve.log"
    server = LocalServer(model_dir, max_batch=4, device="cpu", log_path=log)
    async with server:
        assert server.base_url is not None and server.base_url.startswith("http://127.0.0.1:")
        health = await server.health()
        assert health["status"] == "ok" and health["model"] == model_dir.name
        client = AsyncOpenAI(base_url=server.openai_base_url, api_key="unused")
        reply = await client.chat.completions.create(
            model=server.model_name, messages=[{"role": "user", "content": "hi"}], max_tokens=3, temperature=0
        )
        await client.close()
        assert reply.usage is not None and 1 <= reply.usage.completion_tokens <= 3
        url = server.base_url
    assert server.base_url is None
    async with aiohttp.ClientSession() as session:
        with pytest.raises(aiohttp.ClientConnectionError):
            await session.get(url + "/health")


async def test_local_server_reports_a_child_that_fails(model_dir: Path, tmp_path: Path) -> None:
    server = LocalServer(model_dir, extra_args=("--dtype", "float64"), log_path=tmp_path / "serve.log")
    with pytest.raises(LocalServerError, match="exited with code 2") as info:
        await server.start()
    assert "dtype" in str(info.value)  # the child's own error message, from its log


def test_a_local_server_ends_with_the_process_that_started_it_even_on_sigkill(
    model_dir: Path, tmp_path: Path
) -> None:
    """A parent killed with SIGKILL runs no cleanup; its ``trajforge serve`` child must still go
    (it did not: a killed ``rl demo`` left its policy server running for hours). The child's
    stdin is a pipe only the parent holds; the kernel closes it with the parent."""
    import os
    import signal
    import subprocess
    import sys
    import time

    script = tmp_path / "parent.py"
    script.write_text(
        "import asyncio, sys\n"
        "from pathlib import Path\n"
        "from trajforge.serve.launcher import LocalServer\n"
        "async def main():\n"
        f"    server = LocalServer(Path({str(model_dir)!r}), max_batch=2, device='cpu', "
        f"log_path=Path({str(tmp_path / 'serve.log')!r}))\n"
        "    await server.start()\n"
        "    print(server._proc.pid, flush=True)\n"
        "    await asyncio.sleep(3600)\n"
        "asyncio.run(main())\n"
    )
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        os.kill(child, 0)  # the server runs
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + 60  # a liveness bound, not a timing claim
        while time.monotonic() < deadline:
            try:
                os.kill(child, 0)
            except ProcessLookupError:
                break
            with open(f"/proc/{child}/stat") as f:  # reaped by init only once it has exited
                if f.read().split(") ", 1)[1].startswith("Z"):
                    break
            time.sleep(0.1)
        else:
            os.kill(child, signal.SIGKILL)
            raise AssertionError("trajforge serve outlived the process that started it")
    finally:
        if parent.poll() is None:
            parent.kill()
