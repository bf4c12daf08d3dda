"""Help and scripting: every --help works (and is clean), `trajforge --help`/`--version` import
nothing heavy, every command that prints a result has --json, shell completion is generated."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.core import TyperGroup
from typer.testing import CliRunner

from test_cli_vocabulary import commands, options
from trajforge.cli.main import COMMANDS, app, load_command

HEAVY = ("torch", "transformers", "datasets", "aiohttp", "openai", "pyarrow", "numpy", "ray", "trl")
# Commands that print a result (a table, counts, a path): each has --json.
RESULT_COMMANDS = {
    "run", "batch", "export", "report", "distributions", "model build-tiny", "model eval",
    "tools list", "tools check",
    "env list", "env show", "env eval", "env rescore", "env resize",
    "rl train", "rl start", "rl status", "rl stop", "rl results", "rl list", "rl logs", "rl agent-envs",
}  # fmt: skip


def _modules_after(argv: list[str]) -> tuple[str, set[str]]:
    """Run the real entry point in a fresh interpreter; its output and every module it imported."""
    code = (
        "import sys\n"
        "from trajforge.cli.main import main\n"
        f"sys.argv = ['trajforge', *{argv!r}]\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "sys.stderr.write('\\nMODULES ' + ' '.join(sorted(sys.modules)))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    out, _, mods = proc.stderr.rpartition("\nMODULES ")
    return proc.stdout + out, set(mods.split())


@pytest.mark.parametrize("argv", [["--help"], ["--version"], []])
def test_root_help_and_version_import_nothing_heavy(argv: list[str]) -> None:
    text, modules = _modules_after(argv)
    heavy = sorted(m for m in modules if m.split(".")[0] in HEAVY)
    assert not heavy, f"`trajforge {' '.join(argv)}` imported {heavy[:10]}"
    assert not any(
        m.startswith("trajforge.") and m.split(".")[1] not in ("cli",) for m in modules if m != "trajforge"
    )
    if argv == ["--version"]:
        assert text.startswith("trajforge ")
    else:
        for name in COMMANDS:
            assert name in text


def test_the_root_listing_is_each_commands_own_first_line() -> None:
    for name, (_, line) in COMMANDS.items():
        command = load_command(name)
        first = " ".join((command.help or "").split("\n\n")[0].split())
        assert first.startswith(line.rstrip(".")), (name, first, line)


def _every_help() -> list[list[str]]:
    paths = [[]] + [p.split() for p in commands()]
    groups = {" ".join(p.split()[:-1]) for p in commands() if " " in p}
    return paths + [g.split() for g in sorted(groups)]


def test_every_help_works_and_shows_no_stray_metavar() -> None:
    runner = CliRunner()
    for path in _every_help():
        result = runner.invoke(app, [*path, "--help"], terminal_width=200)
        assert result.exit_code == 0, (path, result.output)
        assert "<bool>" not in result.output and "BOOLEAN" not in result.output, (path, result.output)
        assert "Usage:" in result.output


@pytest.mark.parametrize("mode", ["serve", "process", "evaluate"])
def test_env_atropos_modes_help_without_an_env(mode: str) -> None:
    result = CliRunner().invoke(app, ["env", mode, "--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert "ENV" in result.output and "atroposlib" in result.output
    missing = CliRunner().invoke(app, ["env", mode])
    assert missing.exit_code == 2 and "give ENV" in missing.stderr


def test_the_env_groups_help_names_every_subcommand() -> None:
    result = CliRunner().invoke(app, ["env", "--help"], terminal_width=200)
    group = load_command("env")
    assert isinstance(group, TyperGroup)
    subcommands = group.list_commands(typer.Context(group))
    assert len(subcommands) == 8
    summary = (group.help or "").split("\n")[0]
    for name in subcommands:
        assert name in summary and name in result.output, name


def test_batch_usage_shows_dataset_required_and_says_how_to_give_it(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["batch", "--help"], terminal_width=200)
    usage = next(line for line in result.output.splitlines() if "Usage:" in line)
    assert "DATASET" in usage and "[DATASET]" not in usage
    missing = CliRunner().invoke(app, ["batch", "--run-name", "x", "--output-dir", str(tmp_path)])
    assert missing.exit_code == 2
    assert "DATASET" in missing.stderr and "--dataset" not in missing.stderr
    assert not (tmp_path / "x").exists()


def test_every_command_that_prints_a_result_has_json() -> None:
    all_commands = commands()
    assert set(all_commands) >= RESULT_COMMANDS
    lacking = sorted(p for p in RESULT_COMMANDS if "--json" not in options(all_commands[p]))
    assert not lacking, lacking


def test_json_output_parses(tmp_path: Path) -> None:
    runner = CliRunner()
    envs = json.loads(runner.invoke(app, ["env", "list", "--json"]).stdout)
    assert {"name", "available", "description"} <= set(envs[0]) and any(
        e["name"] == "tiny_tasks" for e in envs
    )
    assert (
        json.loads(runner.invoke(app, ["rl", "list", "--json", "--output-dir", str(tmp_path)]).stdout) == []
    )
    tools = json.loads(runner.invoke(app, ["tools", "list", "--json", "--output-dir", str(tmp_path)]).stdout)
    rl = [t for t in tools if t["toolset"] == "rl"]
    assert len(rl) == 10 and all(t["status"] == "ready" for t in rl)
    assert all("run manager" in (t["reason"] or "") for t in rl)


def test_shell_completion_script_is_generated_and_completes_commands(monkeypatch: pytest.MonkeyPatch) -> None:
    # typer's own switch for tests: --show-completion takes the shell instead of detecting it
    monkeypatch.setenv("_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION", "1")
    runner = CliRunner()
    script = runner.invoke(app, ["--show-completion", "bash"], prog_name="trajforge")
    assert script.exit_code == 0, script.output
    assert "_TRAJFORGE_COMPLETE" in script.stdout and "complete" in script.stdout
    env = {"_TRAJFORGE_COMPLETE": "complete_bash", "COMP_WORDS": "trajforge ba", "COMP_CWORD": "1"}
    done = runner.invoke(app, [], prog_name="trajforge", env=env)
    assert "batch" in done.stdout, done.output
    env = {"_TRAJFORGE_COMPLETE": "complete_bash", "COMP_WORDS": "trajforge env ev", "COMP_CWORD": "2"}
    assert "eval" in runner.invoke(app, [], prog_name="trajforge", env=env).stdout
    env = {"_TRAJFORGE_COMPLETE": "complete_bash", "COMP_WORDS": "trajforge report --out", "COMP_CWORD": "2"}
    assert "--output" in runner.invoke(app, [], prog_name="trajforge", env=env).stdout


def test_typer_root_is_the_lazy_group() -> None:
    root = typer.main.get_command(app)
    assert isinstance(root, TyperGroup) and set(root.list_commands(typer.Context(root))) == set(COMMANDS)


@pytest.mark.parametrize("command", [["model", "eval"], ["model", "build-tiny", "--model-path", "x"]])
def test_an_unknown_sandbox_is_one_line_naming_the_backends(command: list[str]) -> None:
    """``model eval`` took any ``--sandbox`` and failed inside pydantic with a traceback."""
    pytest.importorskip("torch")
    result = CliRunner().invoke(app, [*command, "--sandbox", "firecracker"], terminal_width=200)
    assert result.exit_code != 0 and not isinstance(result.exception, ValueError), result.output
    assert "unknown sandbox 'firecracker'; choose bwrap, local or docker" in result.output
