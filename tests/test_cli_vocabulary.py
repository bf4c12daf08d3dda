"""One CLI vocabulary: every option of every command of the real app is in docs/cli.md's table,
with the one meaning and the default written there, and every old spelling still works for one
release with a one-line note on stderr."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.core import TyperGroup, TyperOption
from typer.testing import CliRunner

from trajforge.cli.main import app
from trajforge.cli.vocab import RenamedCommand, deprecation_note, modernize

DOCS = Path(__file__).resolve().parents[1] / "docs" / "cli.md"
_NO_DEFAULT = "-"


def walk(group: TyperGroup, ctx: typer.Context, path: tuple[str, ...] = ()) -> Iterator[tuple[str, Any]]:
    """(command path, command) for every leaf command under ``group``, loading each for real."""
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        assert command is not None, name
        if command.hidden:
            continue
        if isinstance(command, TyperGroup):
            yield from walk(command, typer.Context(command, parent=ctx, info_name=name), (*path, name))
        else:
            yield " ".join((*path, name)), command


def commands() -> dict[str, Any]:
    """command path -> command (typer's own click objects), every command of the real app."""
    root = typer.main.get_command(app)
    assert isinstance(root, TyperGroup)
    return dict(walk(root, typer.Context(root, info_name="trajforge")))


def options(command: Any) -> dict[str, TyperOption]:
    """long flag -> option, the command's own (not --help, not hidden ones)."""
    out = {}
    for param in command.params:
        if isinstance(param, TyperOption) and not param.hidden:
            flag = max(param.opts, key=len)
            out[flag] = param
    return out


def table(title: str) -> list[list[str]]:
    """The rows of the markdown table under ``## title`` in docs/cli.md (cells stripped)."""
    text = DOCS.read_text()
    section = text.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")]
    return [[c.strip() for c in row.strip("|").split("|")] for row in rows[2:]]


def _flag_cell(cell: str) -> str:
    """``--network/--no-network``, ``-o/--output`` -> the long flag as click names it."""
    names = re.findall(r"--[a-z0-9-]+", cell)
    return max((n for n in names if not n.startswith("--no-") or len(names) == 1), key=len)


def documented() -> dict[str, tuple[str, str, set[str]]]:
    """flag -> (meaning, default, commands)."""
    out = {}
    for flag, meaning, default, where in table("Flags"):
        out[_flag_cell(flag)] = (meaning, default.strip("`"), {c.strip() for c in where.split(",")})
    return out


def test_every_option_of_every_command_is_in_the_table_and_nothing_else() -> None:
    docs = documented()
    found: dict[str, set[str]] = {}
    for path, command in commands().items():
        for flag in options(command):
            found.setdefault(flag, set()).add(path)
    missing = {f: sorted(c) for f, c in found.items() if f not in docs}
    assert not missing, f"options not in docs/cli.md: {missing}"
    stale = sorted(set(docs) - set(found))
    assert not stale, f"docs/cli.md lists flags no command has: {stale}"
    wrong = {f: (sorted(found[f] ^ docs[f][2])) for f in found if found[f] != docs[f][2]}
    assert not wrong, f"docs/cli.md's commands column differs (symmetric difference): {wrong}"


def test_a_documented_default_is_the_default_of_every_command_with_that_flag() -> None:
    docs = documented()
    for path, command in commands().items():
        for flag, option in options(command).items():
            default = docs[flag][1]
            if default in ("per command", "required"):
                continue
            text = _shown(option)
            assert text == default, f"{path} {flag}: default {text!r}, docs/cli.md says {default!r}"


def _shown(option: TyperOption) -> str:
    """An option's default as docs/cli.md writes it: ``-`` for none, on/off for a switch."""
    value = option.default
    if option.is_flag and isinstance(value, bool):
        return "on" if value else "off"
    if value is None:
        return _NO_DEFAULT
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(getattr(value, "value", value))


def test_each_flag_has_one_meaning_line() -> None:
    for flag, (meaning, _, _) in documented().items():
        assert meaning and "|" not in meaning, flag


def renames() -> dict[tuple[str, str], str]:
    """(command path, old) -> new, from the commands themselves."""
    out = {}
    for path, command in commands().items():
        if isinstance(command, RenamedCommand):
            for old, new in command.renames.items():
                out[(path, old)] = new
    return out


def test_the_deprecated_spellings_are_the_documented_ones_and_map_to_real_options() -> None:
    found = renames()
    docs = {}
    for old, new, where in table("Old spellings (until the next release)"):
        for path in where.split(","):
            docs[(path.strip(), old.strip("`"))] = new.strip("`")
    assert found == docs
    all_commands = commands()
    for (path, _old), new in found.items():
        assert new in options(all_commands[path]), (path, new)


def test_modernize_rewrites_both_forms_and_stops_at_the_double_dash() -> None:
    args, notes = modernize(["--out", "a", "--out=b", "--", "--out"], {"--out": "--output"})
    assert args == ["--output", "a", "--output=b", "--", "--out"]
    assert notes == [deprecation_note("--out", "--output")]


@pytest.mark.parametrize(
    ("argv", "old", "new"),
    [
        (["rl", "list", "--runs-dir", "{tmp}"], "--runs-dir", "--output-dir"),
        (["env", "resize", "{tmp}", "--rollouts", "3"], "--rollouts", "--concurrency"),
        (["parse", "--parser", "hermes"], "--parser", "--tool-call-parser"),
    ],
)
def test_an_old_spelling_works_with_one_note_on_stderr(
    tmp_path: Path, argv: list[str], old: str, new: str
) -> None:
    _env_run(tmp_path)  # env resize takes an env eval run
    result = CliRunner().invoke(app, [a.replace("{tmp}", str(tmp_path)) for a in argv])
    assert result.exit_code == 0, result.output
    notes = [line for line in result.stderr.splitlines() if line.startswith("note:")]
    assert notes == [deprecation_note(old, new)]
    new_spelling = [a.replace("{tmp}", str(tmp_path)).replace(old, new) for a in argv]
    again = CliRunner().invoke(app, new_spelling)
    assert again.exit_code == 0 and "note:" not in again.stderr


def _env_run(run_dir: Path) -> None:
    """An env eval run's directory as it is a moment after the eval started."""
    (run_dir / "run.json").write_text('{"env": "tiny_tasks", "n": 1, "group_size": 1, "config": {}}')


def test_an_old_spelling_reaches_the_option_it_was_renamed_to(tmp_path: Path) -> None:
    _env_run(tmp_path)
    result = CliRunner().invoke(
        app, ["env", "resize", str(tmp_path), "--rollouts", "3", "--tools=2", "--json"]
    )
    assert result.exit_code == 0, result.output
    import json

    assert json.loads(result.stdout) == {"run_dir": str(tmp_path), "concurrency": 3, "max_parallel_tools": 2}
    assert len([line for line in result.stderr.splitlines() if line.startswith("note:")]) == 2


def test_rl_train_run_directory_is_output_dir_slash_run_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """As in batch and env eval; an --output-dir that already holds a run (the old meaning: the
    run directory itself) is resumed in place for one release, with a note."""
    from trajforge.cli.rl_train import run_dir

    assert run_dir(None, None, "rl") is None  # neither given: the config file's or TrainConfig's
    assert run_dir(tmp_path, None, "rl") == tmp_path / "rl"
    assert run_dir(tmp_path, "exp1", "rl") == tmp_path / "exp1"
    assert run_dir(None, "exp1", "rl") == Path("runs") / "exp1"
    old = tmp_path / "old-run"
    old.mkdir()
    (old / "state.json").write_text("{}")
    assert run_dir(old, None, "rl") == old
    assert f"--output-dir {tmp_path} --run-name old-run" in capsys.readouterr().err
    with pytest.raises(typer.Exit):
        run_dir(tmp_path, "a/b", "rl")
