"""The docker backend: real containers where an engine is reachable; a clear refusal where not."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from trajforge.sandbox import SandboxConfig, SandboxUnavailableError, create_sandbox_factory


def _engine_reachable() -> bool:
    if shutil.which("docker") is None:
        return False
    try:
        return subprocess.run(["docker", "info"], capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


ENGINE = _engine_reachable()


@pytest.mark.docker
@pytest.mark.skipif(not ENGINE, reason="no reachable Docker engine")
async def test_docker_sandbox_session_and_files(tmp_path):
    factory = create_sandbox_factory(SandboxConfig(kind="docker", root_dir=str(tmp_path / "sb")))
    sb = await factory.create("t-docker")
    try:
        await sb.exec("mkdir d && cd d && export Z=3")
        assert (await sb.exec('pwd; echo "$Z"')).output == "/workspace/d\n3\n"
        data = os.urandom(50_000)
        await sb.write_bytes("blob", data)
        assert (await sb.exec("stat -c %s /workspace/blob")).output.strip() == "50000"
        assert await sb.read_bytes("/workspace/blob") == data
        assert (await sb.exec("sleep 30", timeout=1)).timed_out
    finally:
        await sb.close()


@pytest.mark.skipif(ENGINE, reason="a Docker engine is reachable")
async def test_docker_without_engine_refuses_clearly(tmp_path):
    factory = create_sandbox_factory(SandboxConfig(kind="docker", root_dir=str(tmp_path / "sb")))
    with pytest.raises(SandboxUnavailableError, match="--sandbox bwrap"):
        await factory.create("t")
    assert not list((tmp_path / "sb").glob("*")) if (tmp_path / "sb").exists() else True
