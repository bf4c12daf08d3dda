"""The tools configuration: validation errors, unconfigured tools not offered (said once at the
start of a batch run), `trajforge tools list` and `trajforge tools check` against live backends."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import orjson
import pytest
import yaml
from typer.testing import CliRunner

from trajforge.cli.main import app
from trajforge.testing import Reply
from trajforge.testing.images import ScriptedImageServer
from trajforge.tools.builtin import build_registry, toolset_availability
from trajforge.tools.config import ToolsConfig, ToolsConfigError, load_tools_config, parse_tools_config

runner = CliRunner()


def test_validation_errors_name_the_key_and_what_to_change():
    with pytest.raises(ToolsConfigError, match=r"tools\.vision\.endpoint\.base_url: .*http\(s\) URL"):
        parse_tools_config({"vision": {"endpoint": {"base_url": "ftp://x", "model": "m"}}})
    with pytest.raises(
        ToolsConfigError, match=r"tools\.vision\.endpoint\.api_key_env: .*NAME of an environment"
    ):
        parse_tools_config(
            {"vision": {"endpoint": {"base_url": "http://h/v1", "model": "m", "api_key_env": "sk-1"}}}
        )
    with pytest.raises(
        ToolsConfigError, match=r"tools\.vision\.endpoint\.api_key: secrets never go in the config"
    ):
        parse_tools_config(
            {"vision": {"endpoint": {"base_url": "http://h/v1", "model": "m", "api_key": "sk-1"}}}
        )
    with pytest.raises(
        ToolsConfigError, match=r"tools\.moa: .*needs both reference_models and an aggregator"
    ):
        parse_tools_config({"moa": {"reference_models": [{"base_url": "http://h/v1", "model": "m"}]}})
    with pytest.raises(ToolsConfigError, match="min_references is 3 but only 1"):
        one = {"base_url": "http://h/v1", "model": "m"}
        parse_tools_config({"moa": {"reference_models": [one], "aggregator": one, "min_references": 3}})
    with pytest.raises(ToolsConfigError, match=r"tools\.nope: Extra inputs are not permitted"):
        parse_tools_config({"nope": {}})
    with pytest.raises(ToolsConfigError, match="set the network policy once, as tools.network"):
        parse_tools_config({"web": {"policy": {"allow_cidrs": ["10.0.0.0/8"]}}})
    with pytest.raises(ToolsConfigError, match=r"tools\.network\.allow_cidrs: .*not an address range"):
        parse_tools_config({"network": {"allow_cidrs": ["localhost"]}})


def test_unconfigured_tools_are_not_offered_and_say_why():
    registry = build_registry(ToolsConfig())
    for name in ("vision_analyze", "image_generate", "mixture_of_agents", "web_search", "browser_vision"):
        assert registry.get(name) is None
        assert "configured" in (registry.unavailable_reason(name) or ""), name
    assert [t.name for t in registry.for_toolsets(["vision", "moa", "terminal"])] == ["terminal", "process"]
    # explicit --toolsets naming a toolset with nothing ready: an error that says what to do
    explicit = toolset_availability(registry, ["terminal", "vision"], explicit=True)
    assert explicit.error and "toolset vision" in explicit.error and "tools.vision.endpoint" in explicit.error
    # a distribution that samples them: one warning, the toolset dropped
    sampled = toolset_availability(registry, ["terminal", "vision", "moa"], explicit=False)
    assert sampled.error is None and sampled.warning
    assert "toolset vision" in sampled.warning and "toolset moa" in sampled.warning
    assert toolset_availability(registry, ["terminal", "file"], explicit=True).error is None


def _batch_cfg(tmp_path: Path, **overrides):
    from trajforge.batch.config import load_config

    ds = tmp_path / "d.jsonl"
    ds.write_text('{"prompt": "hi"}\n{"prompt": "ho"}\n')
    settings = dict(
        dataset=ds,
        run_name="r",
        output_dir=tmp_path,
        model="m",
        base_url="http://127.0.0.1:9/v1",
        sandbox="local",
        progress="none",
        require_reasoning=False,
    )
    return load_config(None, {**settings, **overrides})


def test_a_distribution_needing_unconfigured_tools_warns_once_and_runs(tmp_path):
    from trajforge.batch.runner import run_batch
    from trajforge.testing.scripted_model import ScriptedModel

    cfg = _batch_cfg(tmp_path, distribution="image_gen")
    said: list[str] = []
    summary = asyncio.run(run_batch(cfg, model=ScriptedModel(["ok", "ok"]), announce=said.append))
    warnings = [m for m in said if "not offered in this run" in m]
    assert len(warnings) == 1, said  # once at start, not per sample
    assert "toolset image_gen" in warnings[0] and "toolset vision" in warnings[0]
    assert summary.statistics["total_done"] == 2


def test_explicit_toolsets_needing_unconfigured_tools_stop_the_run(tmp_path):
    from trajforge.batch.runner import RunError, run_batch
    from trajforge.testing.scripted_model import ScriptedModel

    cfg = _batch_cfg(tmp_path, toolsets=["terminal", "moa"])
    with pytest.raises(RunError, match="toolset moa .*tools.moa.reference_models"):
        asyncio.run(run_batch(cfg, model=ScriptedModel(["ok"])))
    assert not (tmp_path / "r").exists()  # nothing started


def test_batch_yaml_tools_section_and_tools_config_flag(tmp_path):
    endpoint = {"base_url": "http://127.0.0.1:9/v1", "model": "vis"}
    cfg = _batch_cfg(tmp_path, tools={"vision": {"endpoint": endpoint}})
    assert cfg.tools.vision.endpoint is not None and cfg.tools.vision.endpoint.model == "vis"
    assert cfg.public_dict()["tools"]["vision"]["endpoint"]["model"] == "vis"
    from trajforge.batch.config import ConfigError

    with pytest.raises(ConfigError, match=r"tools\.image_gen: .*needs both base_url and model"):
        _batch_cfg(tmp_path, tools={"image_gen": {"model": "x"}})
    # --tools-config: a file that is the section itself, or a batch config holding one
    (tmp_path / "t.yaml").write_text(yaml.safe_dump({"vision": {"endpoint": endpoint}}))
    (tmp_path / "b.yaml").write_text(
        yaml.safe_dump({"run_name": "x", "tools": {"vision": {"endpoint": endpoint}}})
    )
    assert load_tools_config(tmp_path / "t.yaml") == load_tools_config(tmp_path / "b.yaml") == cfg.tools
    (tmp_path / "bad.yaml").write_text("vision: {endpoint: {model: m}}\n")
    result = runner.invoke(
        app,
        [
            "batch",
            str(tmp_path / "d.jsonl"),
            "--run-name",
            "r2",
            "--tools-config",
            str(tmp_path / "bad.yaml"),
        ],
    )
    assert result.exit_code == 2 and "vision.endpoint.base_url: Field required" in result.output


def test_tools_list_shows_every_tool_with_its_toolset_and_readiness(tmp_path):
    (tmp_path / "t.yaml").write_text(
        yaml.safe_dump(
            {
                "tools": {
                    "moa": {
                        "reference_models": [{"base_url": "http://h/v1", "model": "a"}],
                        "aggregator": {"base_url": "http://h/v1", "model": "b"},
                    }
                }
            }
        )
    )
    result = runner.invoke(app, ["tools", "list", "--json", "--tools-config", str(tmp_path / "t.yaml")])
    assert result.exit_code == 0, result.output
    rows = {r["tool"]: r for r in orjson.loads(result.output)}
    from trajforge.tools.toolsets import TOOL_TO_TOOLSET

    assert set(rows) == set(TOOL_TO_TOOLSET)
    assert all(rows[n]["toolset"] == ts for n, ts in TOOL_TO_TOOLSET.items())
    assert rows["mixture_of_agents"]["status"] == "ready" and rows["terminal"]["status"] == "ready"
    assert (
        rows["vision_analyze"]["status"] == "unavailable"
        and "tools.vision" in rows["vision_analyze"]["reason"]
    )
    # one registry: the rl tools are the real ones over a run manager (--output-dir), not placeholders
    assert rows["rl_list_runs"]["status"] == "ready" and "run manager" in rows["rl_list_runs"]["reason"]
    table = runner.invoke(app, ["tools", "list"])
    assert (
        table.exit_code == 0
        and "image_generate" in table.output
        and "no: no image generation" in table.output
    )


async def test_tools_check_probes_each_configured_backend(tmp_path, scripted_server):
    vision = await scripted_server([Reply(content="x")], model="vis")
    async with ScriptedImageServer(model="img") as images:
        config = {
            "vision": {"endpoint": {"base_url": vision.base_url, "model": "vis"}},
            "image_gen": {"base_url": images.base_url, "model": "img"},
            "moa": {
                "reference_models": [
                    {"base_url": vision.base_url, "model": "vis"},
                    {"base_url": "http://127.0.0.1:9/v1", "model": "down", "max_retries": 0},
                ],
                "aggregator": {"base_url": vision.base_url, "model": "not-served"},
            },
        }
        (tmp_path / "t.yaml").write_text(yaml.safe_dump(config))
        args = [
            "tools",
            "check",
            "--json",
            "--probe-timeout",
            "20",
            "--tools-config",
            str(tmp_path / "t.yaml"),
        ]
        # the command runs its own event loop: in a thread, while the servers answer on this one
        result = await asyncio.to_thread(runner.invoke, app, args)
    assert result.exit_code == 1, result.output  # one backend is down
    results = {r["backend"]: r for r in orjson.loads(result.output)}
    assert results["vision"]["ok"] and "model 'vis' listed" in results["vision"]["detail"]
    assert results["image_gen"]["ok"] and "model 'img' listed" in results["image_gen"]["detail"]
    assert results["moa reference 1"]["ok"]
    assert not results["moa reference 2"]["ok"] and "cannot reach" in results["moa reference 2"]["detail"]
    assert results["moa aggregator"]["ok"] and "NOT listed" in results["moa aggregator"]["detail"]
    assert results["browser"]["ok"] and "Chromium" in results["browser"]["detail"]  # it really launched


def test_tools_list_prints_a_reason_as_written_brackets_and_all(tmp_path):
    """A reason's brackets are text, not rich markup: without playwright the browser's reason is
    "pip install 'trajforge[tools]'", and the table once printed "pip install 'trajforge'"."""
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['playwright'] = None\n"  # playwright not installed
        "from trajforge.cli.main import app\n"
        "app(['tools', 'list', '--output-dir', sys.argv[1]])\n"
    )
    env = {**os.environ, "COLUMNS": "300"}
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, env=env, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert "pip install 'trajforge[tools]'" in out.stdout, out.stdout
