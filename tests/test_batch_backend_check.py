"""A sandbox backend that cannot run here is reported first: before the embedded model server
starts, in one sentence that names the choice once."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from trajforge.batch.config import load_config
from trajforge.batch.errors import RunError
from trajforge.batch.runner import run_batch


def _docker_runs() -> bool:
    if shutil.which("docker") is None:
        return False
    return subprocess.run(["docker", "info"], capture_output=True, check=False).returncode == 0


@pytest.mark.skipif(_docker_runs(), reason="a Docker engine runs here: the backend is available")
async def test_unavailable_docker_backend_fails_before_the_model_server(tmp_path: Path) -> None:
    dataset = tmp_path / "d.jsonl"
    dataset.write_text('{"prompt": "hi"}\n')
    cfg = load_config(
        None,
        {
            "dataset": dataset,
            "run_name": "r",
            "output_dir": tmp_path,
            "sandbox": "docker",
            "progress": "none",
            "toolsets": ["terminal"],
        },
    )
    said: list[str] = []
    with pytest.raises(RunError) as info:
        await run_batch(cfg, announce=said.append)
    message = str(info.value)
    assert message.startswith("sandbox backend 'docker' cannot start: ")
    assert message.count("--sandbox") == 1
    assert not any("embedded tiny policy" in m for m in said)  # no server was started
