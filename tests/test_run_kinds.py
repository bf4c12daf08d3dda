"""Every command that reads runs, over every kind of run folder trajforge writes (issue 43).

One ``--output-dir`` gets a run of each kind, each made by really running the command, small:
``batch`` (a scripted endpoint on loopback), ``env eval`` (the oracle agent), ``rl train`` (the
embedded policy, one step), ``rl demo`` (one held-out item, one GRPO step) and ``rl start`` (a
managed one-step training). Then every reading command is walked over every folder: it either
does its job (exit 0) or says in one line what the folder is and what reads it (exit 2) -- never
a traceback (``rl list`` once crashed with a 73-line pydantic error on an ``rl train`` run, whose
``state.json`` it read as the run manager's).

``parse`` reads a model output from stdin, not a run folder: it has no place here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from trajforge.cli.main import app

pytestmark = [pytest.mark.slow, pytest.mark.bwrap, pytest.mark.timeout(2400)]

KINDS = {
    "b": "batch",
    "ev": "env eval",
    "rl2": "rl train",
    "demo": "rl demo",
    "managed": "rl run (train)",
}
READERS = {  # which kinds each command reads (the others are refused, plainly)
    "export": {"batch", "env eval"},
    "report": {"batch", "env eval"},
    "env rescore": {"env eval"},
    "env resize": {"env eval"},
    "rl status": {"rl train", "rl demo", "rl run (train)"},
    "rl results": {"rl train", "rl demo", "rl run (train)"},
    "rl logs": {"rl run (train)"},
    "rl stop": {"rl run (train)"},
}


def _trajforge(*args: str, timeout: float = 1200) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, "-m", "trajforge.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "TRAJFORGE_KINDS_KEY": "k", "COLUMNS": "200"},
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 0, (args, result.stdout[-2000:], result.stderr[-4000:])
    return result


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("kinds")
    out = root / "runs"
    dataset = root / "prompts.jsonl"
    dataset.write_text("".join(json.dumps({"prompt": f"say {i}"}) + "\n" for i in range(2)))
    server = subprocess.Popen(
        [sys.executable, "-m", "trajforge.testing.server_cli", "--policy", "echo"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        base_url = server.stdout.readline().split()[1]  # READY <base_url>
        _trajforge(
            "batch", str(dataset), "--output-dir", str(out), "--run-name", "b", "--model", "scripted",
            "--base-url", base_url, "--api-key-env", "TRAJFORGE_KINDS_KEY", "--toolsets", "terminal",
            "--no-require-reasoning", "--progress", "none",
        )  # fmt: skip
    finally:
        server.terminate()
        server.wait(30)
    _trajforge("env", "eval", "tiny_tasks", "--agent", "oracle", "--max-samples", "2", "--output-dir", str(out),
               "--run-name", "ev", "--progress", "none")  # fmt: skip
    _trajforge("rl", "train", "tiny_tasks", "--steps", "1", "--group-size", "2", "--groups", "1",
               "--output-dir", str(out), "--run-name", "rl2", "--progress", "plain")  # fmt: skip
    small = root / "small.yaml"
    small.write_text("group_size: 2\ngroups_per_step: 1\n")
    _trajforge("rl", "demo", "--output-dir", str(out), "--run-name", "demo", "--max-samples", "1",
               "--eval-k", "1", "--steps", "1", "--control", "none",
               "--config", str(small))  # fmt: skip
    _trajforge("rl", "start", "tiny_tasks", "--steps", "1", "--group-size", "2", "--output-dir", str(out),
               "--run-name", "managed")  # fmt: skip
    for _ in range(600):  # the managed run goes on after `rl start` returns: let it finish
        state = json.loads(_trajforge("rl", "status", "managed", "--output-dir", str(out), "--json").stdout)
        if state["status"] in ("finished", "failed"):
            break
        time.sleep(1)
    return out


def _invoke(*args: str) -> Any:
    return CliRunner().invoke(app, list(args), env={"COLUMNS": "200"})


def _plain_refusal(result: Any, run: Path, kind: str) -> None:
    """Exit 2, one ``error:`` line that names the folder and its kind; no traceback."""
    assert result.exit_code == 2, (result.exit_code, result.output)
    assert "Traceback" not in result.output and "validation error" not in result.output, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and str(run) in errors[0] and kind.split(" (")[0] in errors[0], result.output


def test_rl_list_status_and_results_show_every_run_one_line_each(runs: Path) -> None:
    for words in (["rl", "list"], ["rl", "status"], ["rl", "results"]):
        result = _invoke(*words, "--output-dir", str(runs))
        assert result.exit_code == 0, result.output
        lines = result.output.strip().splitlines()
        assert [line.split("  ")[:2] for line in lines] == [
            [name, kind] for name, kind in sorted(KINDS.items())
        ]
        assert "Traceback" not in result.output
    listed = json.loads(_invoke("rl", "list", "--output-dir", str(runs), "--json").output)
    assert {r["id"]: r["status"] for r in listed} == {
        "b": "finished", "demo": "finished", "ev": "finished", "managed": "finished", "rl2": "finished"
    }  # fmt: skip


@pytest.mark.parametrize("command", sorted(READERS))
def test_every_reading_command_reads_its_kinds_and_refuses_the_others_plainly(
    runs: Path, tmp_path: Path, command: str
) -> None:
    for name, kind in KINDS.items():
        run = runs / name
        words = command.split()
        if words[0] == "rl":
            args = [*words, name, "--output-dir", str(runs)]
        elif command == "env resize":
            args = [*words, str(run), "--concurrency", "2"]
        elif command in ("export", "report"):
            args = [*words, str(run), "-o", str(tmp_path / f"{name}.out")]
        else:
            args = [*words, str(run)]
        result = _invoke(*args)
        if kind in READERS[command]:
            assert result.exit_code == 0, (command, name, result.output)
        else:
            _plain_refusal(result, run, kind)


def test_an_rl_demo_stage_is_an_env_eval_run_that_exports_and_reports(runs: Path, tmp_path: Path) -> None:
    refused = _invoke("export", str(runs / "demo"))
    stage = next(iter(sorted((runs / "demo").glob("eval-*/*/episodes.jsonl")))).parent
    assert str(stage) in refused.output  # the refusal names the runs that do export
    assert _invoke("export", str(stage), "-o", str(tmp_path / "stage.jsonl")).exit_code == 0
    assert _invoke("report", str(stage), "-o", str(tmp_path / "stage.html")).exit_code == 0


def test_commands_that_write_a_run_never_write_into_another_kind(runs: Path, tmp_path: Path) -> None:
    dataset = tmp_path / "d.jsonl"
    dataset.write_text(json.dumps({"prompt": "say 0"}) + "\n")
    for name, kind in KINDS.items():
        run = runs / name
        before = sorted(p.name for p in run.iterdir())
        if kind != "batch":
            _plain_refusal(
                _invoke("batch", str(dataset), "--output-dir", str(runs), "--run-name", name, "--resume"),
                run,
                kind,
            )
            _plain_refusal(
                _invoke("batch", str(dataset), "--output-dir", str(runs), "--run-name", name), run, kind
            )
        if kind != "env eval":
            env = _invoke("env", "eval", "tiny_tasks", "--agent", "oracle", "--max-samples", "2",
                          "--output-dir", str(runs), "--run-name", name, "--progress", "none")  # fmt: skip
            _plain_refusal(env, run, kind)
        if kind != "rl train":
            _plain_refusal(
                _invoke("rl", "train", "tiny_tasks", "--output-dir", str(runs), "--run-name", name), run, kind
            )
        if kind not in ("batch", "env eval"):
            records = _invoke("rl", "train", "tiny_tasks", "--records", str(run),
                              "--output-dir", str(tmp_path), "--run-name", f"r-{name}")  # fmt: skip
            _plain_refusal(records, run, kind)
        assert sorted(p.name for p in run.iterdir()) == before, name  # nothing written into it
    again = _invoke("env", "eval", "tiny_tasks", "--agent", "oracle", "--max-samples", "2",
                    "--output-dir", str(runs), "--run-name", "ev", "--progress", "none")  # fmt: skip
    assert again.exit_code == 0, again.output  # its own kind: resumed, nothing left to run
