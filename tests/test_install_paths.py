"""Without the ``ml`` extra, commands that need it say so in one line; ``--version`` works.

The missing extra is simulated with a ``sitecustomize`` on PYTHONPATH whose import hook says torch
is not there, the way an absent one looks; the commands run as real subprocesses.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import trajforge

_NO_TORCH = """
import sys


class _NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ModuleNotFoundError("No module named 'torch'", name=name)
        return None


sys.meta_path.insert(0, _NoTorch())
"""


def _cli(args: list[str], tmp_path: Path, *, without_torch: bool) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if without_torch:
        fake = tmp_path / "no-ml"
        fake.mkdir(exist_ok=True)
        (fake / "sitecustomize.py").write_text(_NO_TORCH)
        env["PYTHONPATH"] = str(fake)
    cmd = [sys.executable, "-c", "from trajforge.cli.main import main; main()", *args]
    return subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)


def test_version(tmp_path: Path) -> None:
    done = _cli(["--version"], tmp_path, without_torch=False)
    assert done.returncode == 0 and done.stdout.strip() == f"trajforge {trajforge.__version__}"


@pytest.mark.parametrize(
    "args",
    [
        ["serve", "--model-path", "some-dir"],
        ["model", "eval", "--max-samples", "1"],
        ["run", "hello", "--sandbox", "local"],
        ["batch", "prompts.jsonl", "--run-name", "r", "--sandbox", "local", "--toolsets", "terminal"],
    ],
    ids=["serve", "model-eval", "run-embedded", "batch-embedded"],
)
def test_commands_that_need_the_ml_extra_say_so_in_one_line(args: list[str], tmp_path: Path) -> None:
    (tmp_path / "prompts.jsonl").write_text('{"prompt": "hi"}\n')
    done = _cli(args, tmp_path, without_torch=True)
    assert done.returncode == 2, (done.stdout, done.stderr)
    # batch's plain progress may say which phase it reached ("[r] reading the dataset") before the
    # error: a progress line, not part of the error, which must still be one line and no traceback
    lines = [line for line in done.stderr.splitlines() if line.strip() and not re.match(r"\[\S+\] ", line)]
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    assert "pip install 'trajforge[ml]'" in lines[0] and "Traceback" not in done.stderr


@pytest.mark.parametrize("command", [["distributions"], ["batch"], ["run"], ["model", "build-tiny"], []])
def test_switches_show_no_value_in_help(command: list[str], tmp_path: Path) -> None:
    """A switch shown as ``--json <bool>`` invites ``--json true``, and ``true`` is then read as
    the next argument (a distribution name). Only typer's own ``--help`` line may still show it."""
    done = _cli([*command, "--help"], tmp_path, without_torch=False)
    assert done.returncode == 0, done.stderr
    shown = [line for line in done.stdout.splitlines() if "<bool>" in line and "--help" not in line]
    assert shown == [], shown
