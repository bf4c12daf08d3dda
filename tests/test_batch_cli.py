"""`trajforge batch` / `trajforge export` on the command line: errors, config files, a full run."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from typer.testing import CliRunner

from trajforge.cli.main import app
from trajforge.testing.scripted_server import ScriptedServer, tool_then_answer

runner = CliRunner()


def _dataset(path: Path, lines: list[bytes]) -> Path:
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def test_bad_row_is_reported_with_line_number(tmp_path: Path) -> None:
    ds = _dataset(tmp_path / "d.jsonl", [b'{"prompt": "a"}', b"", b'{"prompt": oops}'])
    result = runner.invoke(
        app,
        [
            "batch",
            str(ds),
            "--run-name",
            "r",
            "--model",
            "m",
            "--base-url",
            "http://127.0.0.1:9/v1",
            "--output-dir",
            str(tmp_path),
        ],
    )
    assert result.exit_code == 2
    assert "line 3: malformed JSON" in result.output and "--skip-bad-rows" in result.output
    assert not (tmp_path / "r").exists()


def test_mutually_exclusive_flags(tmp_path: Path) -> None:
    ds = _dataset(tmp_path / "d.jsonl", [b'{"prompt": "a"}'])
    args = [
        "batch",
        str(ds),
        "--run-name",
        "r",
        "--model",
        "m",
        "--base-url",
        "http://127.0.0.1:9/v1",
        "--distribution",
        "default",
        "--toolsets",
        "web",
    ]
    result = runner.invoke(app, args)
    assert result.exit_code == 2 and "either --distribution or --toolsets" in result.output


def test_api_key_is_not_a_flag(tmp_path: Path) -> None:
    ds = _dataset(tmp_path / "d.jsonl", [b'{"prompt": "a"}'])
    result = runner.invoke(app, ["batch", str(ds), "--run-name", "r", "--model", "m", "--api-key", "sk-123"])
    assert result.exit_code != 0 and "No such option" in result.output


def test_missing_key_env_fails_fast(tmp_path: Path) -> None:
    ds = _dataset(tmp_path / "d.jsonl", [b'{"prompt": "a"}'])
    args = ["batch", str(ds), "--run-name", "r", "--model", "m", "--base-url", "http://127.0.0.1:9/v1"]
    args += ["--api-key-env", "TF_UNSET_KEY_XYZ"]
    result = runner.invoke(app, [*args, "--output-dir", str(tmp_path / "out")])
    assert result.exit_code == 2 and "TF_UNSET_KEY_XYZ" in result.output
    assert not (tmp_path / "out").exists()


def test_config_file_run_and_export(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TF_CLI_KEY", "secret-value-123")
    ds = _dataset(tmp_path / "d.jsonl", [orjson.dumps({"prompt": f"p{i}"}) for i in range(4)])
    with ScriptedServer(tool_then_answer(calls_per_sample=1)).in_thread() as srv:
        config = tmp_path / "batch.yaml"
        config.write_text(
            f"dataset: {ds}\nrun_name: fromyaml\noutput-dir: {tmp_path / 'data'}\nmodel: scripted\n"
            f"base_url: {srv.base_url}\napi_key_env: TF_CLI_KEY\ntoolsets: [terminal]\nsandbox: local\n"
            "concurrency: 2\n"
        )
        result = runner.invoke(
            app,
            [
                "batch",
                "--config",
                str(config),
                "--concurrency",
                "3",
                "--progress",
                "plain",
                "--no-sandbox-reuse",
            ],
        )
        assert result.exit_code == 0, result.output
        assert "4/4 done" in result.output and "statistics.json" in result.output
        assert "5 built, 0 reused" in result.output  # the preflight's sandbox, then one per sample
        # the plain display names each phase before samples finish, never a bare frozen 0/4
        phases = [line for line in result.stderr.splitlines() if line.startswith("[fromyaml] ")]
        assert phases[:2] == ["[fromyaml] reading the dataset", "[fromyaml] preflight: endpoint and sandbox"]
        # which server answers, and in which dialect it is spoken to (issue 37)
        assert phases[2].startswith("[fromyaml] preflight: endpoint http://127.0.0.1:"), phases
        assert "(dialect trajforge: /v1/models owned_by 'trajforge'" in phases[2], phases
        assert phases[3] == "[fromyaml] first samples in flight", phases
        assert all(" 0/4 " not in line or "first samples in flight" in line for line in phases)
    run_dir = tmp_path / "data" / "fromyaml"
    saved = orjson.loads((run_dir / "run.json").read_bytes())
    assert saved["config"]["concurrency"] == 3  # the flag won over the file
    assert saved["config"]["sandbox"] == "local"  # and a flag's default did not
    assert saved["config"]["sandbox_reuse"] is False
    for path in run_dir.rglob("*"):
        if path.is_file():
            assert b"secret-value-123" not in path.read_bytes(), f"API key leaked into {path}"
    result = runner.invoke(app, ["export", str(run_dir), "--format", "sharegpt"])
    assert result.exit_code == 0 and "wrote 4 rows" in result.output
    result = runner.invoke(app, ["export", str(run_dir), "--format", "nope"])
    assert result.exit_code == 2 and "unknown format" in result.output
    result = runner.invoke(app, ["export", str(tmp_path), "--format", "messages"])
    assert result.exit_code == 2 and "is not a run directory trajforge wrote" in result.output


def test_unimplemented_toolsets_are_announced(tmp_path):
    import asyncio

    from trajforge.batch.config import load_config
    from trajforge.batch.runner import run_batch
    from trajforge.testing.scripted_model import ScriptedModel

    ds = tmp_path / "d.jsonl"
    ds.write_text('{"prompt": "hi"}\n')
    cfg = load_config(
        None,
        dict(
            dataset=ds,
            run_name="r",
            output_dir=tmp_path,
            model="m",
            base_url="http://127.0.0.1:9/v1",
            toolsets=["terminal", "rl"],
            sandbox="local",
            progress="none",
            require_reasoning=False,
        ),
    )
    said: list[str] = []
    asyncio.run(run_batch(cfg, model=ScriptedModel(["ok"]), announce=said.append))
    assert any("rl_list_environments" in m and "not implemented" in m for m in said)


def test_every_config_field_is_a_flag_with_its_description() -> None:
    """The options are derived from BatchConfig: a new field is a new flag, with its help (named
    by docs/cli.md's vocabulary where the field says so: ``--network``, ``--group-size``)."""
    from trajforge.batch.config import BatchConfig
    from trajforge.cli.config_flags import flag_of
    from trajforge.cli.main import load_command

    command = load_command("batch")
    params = {p.name: p for p in command.params}
    for name, field in BatchConfig.model_fields.items():
        if name == "tools":  # a nested section: the YAML `tools:` section or --tools-config FILE
            assert params["tools_config"].opts == ["--tools-config"]
            continue
        param = params[name]
        assert field.description and param.help.startswith(field.description), name
        if name != "dataset":
            assert flag_of(name, field) in param.opts, name
    assert "--network" in params["sandbox_network"].opts and params["sandbox_network"].secondary_opts == [
        "--no-network"
    ]
    assert params["samples_per_prompt"].opts == ["--group-size"]
    assert params["fsync"].secondary_opts == ["--no-fsync"] and not params["resume"].secondary_opts
    assert params["no_reasoning"].opts == ["--no-reasoning"] and params["concurrency"].default == 64


def test_list_and_json_flags_are_parsed(tmp_path: Path) -> None:
    ds = _dataset(tmp_path / "d.jsonl", [b'{"prompt": "a"}'])
    args = ["batch", str(ds), "--run-name", "r", "--model", "m", "--base-url", "http://127.0.0.1:9/v1"]
    result = runner.invoke(app, [*args, "--toolsets", " , "])
    assert result.exit_code == 2 and "--toolsets is empty" in result.output
    result = runner.invoke(app, [*args, "--extra-body", "{oops"])
    assert result.exit_code == 2 and "--extra-body is not valid JSON" in result.output


def test_every_bad_row_is_reported_at_once_capped(tmp_path: Path) -> None:
    rows = [b'{"prompt": "ok"}'] + [b"{broken" for _ in range(12)] + [b'{"no_prompt": 1}']
    ds = _dataset(tmp_path / "d.jsonl", rows)
    args = ["batch", str(ds), "--run-name", "r", "--model", "m", "--base-url", "http://127.0.0.1:9/v1"]
    result = runner.invoke(app, [*args, "--output-dir", str(tmp_path)])
    assert result.exit_code == 2
    assert "13 bad rows" in result.output and "line 2: malformed JSON" in result.output
    assert "line 11:" in result.output and "line 12:" not in result.output  # ten shown
    assert "and 3 more" in result.output and "--skip-bad-rows" in result.output
