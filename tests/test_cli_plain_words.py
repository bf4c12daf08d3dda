"""What the command line prints says what is so, in words a user reads without a guess (issue 43):
usage lines name arguments as usage lines do, completion offers the values a flag takes, and a
missing run or an empty parse is said plainly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from trajforge.cli.main import COMMANDS, app, load_command

runner = CliRunner()


def _commands() -> list[tuple[str, ...]]:
    out: list[tuple[str, ...]] = []
    for name in COMMANDS:
        command = load_command(name)
        subs = getattr(command, "commands", {})
        out += [(name, sub) for sub in subs] if subs else [(name,)]
    return out


@pytest.mark.parametrize("words", _commands(), ids=" ".join)
def test_usage_names_arguments_in_capitals_never_braces(words: tuple[str, ...]) -> None:
    result = runner.invoke(app, [*words, "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    usage = next(line for line in result.output.splitlines() if "Usage:" in line)
    assert "{" not in usage, usage  # typer 0.29 wrote `{run_dir}` for a required argument
    rest = usage.split(" ".join(("trajforge", *words)), 1)[1].split()
    for word in rest:
        assert word.strip("[].") == word.strip("[].").upper(), usage


def _complete(words: str) -> list[str]:
    cword = len(words.split()) - (0 if words.endswith(" ") else 1)
    env = {"_TRAJFORGE_COMPLETE": "complete_bash", "COMP_WORDS": words, "COMP_CWORD": str(cword)}
    result = runner.invoke(app, [], prog_name="trajforge", env=env)
    assert result.exit_code == 0, result.output
    return result.output.split()


def test_completion_offers_the_values_a_flag_or_argument_takes(tmp_path: Path) -> None:
    assert _complete("trajforge export RUN --format ") == [
        "messages", "sharegpt", "llamafactory", "axolotl", "hermes", "parquet", "dpo"
    ]  # fmt: skip
    assert _complete("trajforge export RUN --include trajectories,f") == [
        "trajectories,filtered",
        "trajectories,failed",
    ]
    assert "tiny_tasks" in _complete("trajforge env show ")
    assert _complete("trajforge env show tiny") == ["tiny_tasks"]
    assert _complete("trajforge parse --tool-call-parser herm") == ["hermes"]
    (tmp_path / "r1").mkdir()
    (tmp_path / "r1" / "state.json").write_text(json.dumps({"step": 1, "checkpoint": "c"}))
    (tmp_path / "not-a-run").mkdir()
    assert _complete(f"trajforge rl status --output-dir {tmp_path} ") == ["r1"]


def test_parse_names_its_parser_and_says_when_it_found_no_markup() -> None:
    result = runner.invoke(app, ["parse"], input="just an answer")
    data = json.loads(result.stdout)
    assert data["parser"] == "auto" and "no tool-call markup" in data["note"] and data["calls"] == []
    found = json.loads(
        runner.invoke(
            app, ["parse"], input='<tool_call>\n{"name": "t", "arguments": {}}\n</tool_call>'
        ).stdout
    )
    assert found["parser"] == "hermes" and "note" not in found


def test_a_run_that_is_not_there_is_said_to_be_missing(tmp_path: Path) -> None:
    for words in (["export"], ["report"], ["env", "rescore"]):
        result = runner.invoke(app, [*words, str(tmp_path / "nosuch")])
        assert result.exit_code == 2 and f"{tmp_path / 'nosuch'} does not exist" in result.output, words
        assert "run.json" not in result.output.split("does not exist")[0]
