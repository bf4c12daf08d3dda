"""A miniature run of the tiny-policy recipe: real tools, real BPE, real TRL SFT, real generation."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from trajforge.cli.main import app
from trajforge.models.tiny.build import BuildConfig, build_tiny, render_texts, write_model_card
from trajforge.models.tiny.data import copy_drills
from trajforge.models.tiny.evaluate import LocalPolicy
from trajforge.models.tiny.tokenizer import train_tokenizer
from trajforge.models.tiny.train import ModelShape, TrainSettings
from trajforge.tasks import generate
from trajforge.tools.builtin import default_registry

pytestmark = pytest.mark.slow

MINI = BuildConfig(
    examples=6,
    drills=0,  # drills slow format learning in a 160-step run; they have their own test below
    vocab_size=400,
    families=("arithmetic",),
    sandbox_kind="bwrap" if shutil.which("bwrap") else "local",
    shape=ModelShape(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128),
    train=TrainSettings(steps=160, batch_size=6, learning_rate=1e-2, logging_steps=10),
)


@pytest.fixture(scope="module")
def mini_model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object]:
    out = tmp_path_factory.mktemp("tiny")
    report = build_tiny(out, MINI)
    write_model_card(out, report)
    return out, report


def test_loss_falls_and_files_are_written(mini_model: tuple[Path, object]) -> None:
    out, report = mini_model
    assert report.conversations == MINI.examples and not report.rejected
    assert report.drills == MINI.drills
    assert report.first_loss is not None and report.last_loss < 0.5 * report.first_loss
    for name in ("config.json", "model.safetensors", "tokenizer.json", "chat_template.jinja", "README.md"):
        assert (out / name).is_file(), name
    recipe = json.loads((out / "recipe.json").read_text())
    assert recipe["config"]["train"]["steps"] == 160
    assert "Measured quality" not in (out / "README.md").read_text()


async def test_trained_model_emits_a_parseable_hermes_call(mini_model: tuple[Path, object]) -> None:
    out, _ = mini_model
    task = generate("arithmetic", 1, seed=0)[0]  # the first training prompt
    registry = default_registry()
    tools = registry.schemas(registry.for_toolsets(["terminal", "file"]))
    policy = LocalPolicy.load(out)
    turn = await policy.complete([{"role": "user", "content": task.prompt}], tools)
    assert turn.parse_errors == []
    assert [c.name for c in turn.tool_calls] == ["terminal"]
    assert "command" in json.loads(turn.tool_calls[0].arguments)
    assert turn.reasoning  # the <think> block was produced and split off
    assert policy.records[-1].well_formed


def test_cli_eval_runs_the_agent_loop(mini_model: tuple[Path, object]) -> None:
    out, _ = mini_model
    result = CliRunner().invoke(
        app, ["model", "eval", "--model-path", str(out), "--max-samples", "1", "--sandbox", "local"]
    )
    assert result.exit_code == 0, result.output
    assert "well-formed assistant turns" in result.output and "task success" in result.output


def test_cli_eval_rejects_a_non_model_directory(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["model", "eval", "--model-path", str(tmp_path)])
    assert result.exit_code == 2
    assert "not a model directory" in result.output


def test_copy_drills_answer_with_the_exact_value_from_the_prompt() -> None:
    drills = copy_drills(30, seed=3)
    assert drills == copy_drills(30, seed=3)  # reproducible
    values = set()
    for d in drills:
        user, answer = d["messages"]
        assert answer["role"] == "assistant" and answer["content"]
        assert user["content"].endswith(answer["content"])
        assert answer["content"] in answer["reasoning"]
        values.add(answer["content"])
    assert len(values) > 25  # random values: nothing to memorise


def test_tokenizer_gives_a_value_the_same_ids_in_prose_and_in_json() -> None:
    """A copied file name / word must be the same tokens after a space and after a JSON quote."""
    convs = [*copy_drills(40, seed=1)]
    convs.append(
        {
            "messages": [
                {"role": "user", "content": "Save 'paper apple 886' into yellow.txt."},
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [
                        {
                            "type": "function",
                            "function": {
                                "name": "write_file",
                                "arguments": '{"path": "yellow.txt", "content": "paper apple 886"}',
                            },
                        }
                    ],
                },
            ],
            "tools": None,
        }
    )
    tok = train_tokenizer(render_texts(convs * 5), 400)

    def ids(text: str) -> list[int]:
        return tok(text, add_special_tokens=False)["input_ids"]

    assert set(ids("yellow")) <= set(ids(" into yellow.txt")) & set(ids('"path": "yellow.txt"'))
    assert ids("paper apple 886")[-3:] == ids('"paper apple 886"')[-4:-1]  # digits one per token
    assert ids(" into yellow.txt") == ids(" ") + ids("into") + ids(" ") + ids("yellow.txt")


def test_the_recipe_weights_are_the_closed_loops_start_and_differ_only_in_weights() -> None:
    """``rl demo`` starts from the recipe's weights; the committed default is what that loop made
    of them (its ``closed_loop.json`` names them by hash). Same architecture, tokenizer, template."""
    import hashlib

    from trajforge.endpoint import embedded_weights, recipe_weights

    recipe, committed = recipe_weights(), embedded_weights()
    provenance = json.loads((committed / "closed_loop.json").read_text())
    assert (
        hashlib.sha256((recipe / "model.safetensors").read_bytes()).hexdigest() == provenance["base_sha256"]
    )
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        assert (recipe / name).read_bytes() == (committed / name).read_bytes(), name
    assert (recipe / "model.safetensors").read_bytes() != (committed / "model.safetensors").read_bytes()
