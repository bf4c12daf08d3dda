"""Task generators: seeded, exportable, and checkers that tell right from wrong in a real sandbox."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from trajforge.models.tiny.data import solve_in_sandbox
from trajforge.sandbox import create_sandbox_factory
from trajforge.sandbox.types import SandboxConfig
from trajforge.tasks import (
    FAMILIES,
    Task,
    UnknownFamilyError,
    check,
    generate,
    generate_mixed,
    read_jsonl,
    setup_task,
    write_jsonl,
)
from trajforge.tools.base import ToolContext
from trajforge.tools.builtin import default_registry

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "tasks.jsonl"
needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")


@pytest.mark.parametrize("family", list(FAMILIES))
def test_generation_is_seeded(family: str) -> None:
    first, again, other = (
        generate(family, 6, seed=3),
        generate(family, 6, seed=3),
        generate(family, 6, seed=4),
    )
    assert first == again
    assert [t.prompt for t in first] != [t.prompt for t in other]
    assert len({t.id for t in first}) == 6
    assert all(t.family == family and t.expected for t in first)


def test_unknown_family_names_the_known_ones() -> None:
    with pytest.raises(UnknownFamilyError, match="arithmetic"):
        generate("nope", 1)


def test_mixed_generation_round_robins() -> None:
    tasks = generate_mixed(["arithmetic", "find_value"], 5, seed=1)
    assert [t.family for t in tasks] == ["arithmetic", "find_value"] * 2 + ["arithmetic"]


def test_jsonl_round_trip_and_batch_row(tmp_path: Path) -> None:
    tasks = generate_mixed(list(FAMILIES), 10, seed=2)
    path = tmp_path / "tasks.jsonl"
    assert write_jsonl(tasks, path) == 10
    assert read_jsonl(path) == tasks
    row = tasks[2].to_row()
    assert row["prompt"] == tasks[2].prompt and row["task_id"] == tasks[2].id


def test_bad_jsonl_line_is_named(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "x"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:1: .*task_id"):
        read_jsonl(path)


def test_examples_file_is_a_valid_task_set() -> None:
    tasks = read_jsonl(EXAMPLES)
    assert len(tasks) >= 15
    assert all(t.family in FAMILIES for t in tasks)


async def test_answer_checkers_without_sandbox() -> None:
    task = Task(id="t", family="arithmetic", prompt="What is 2 + 3?", expected="5", metadata={})
    assert (await check(task, "2 + 3 = 5")).reward == 1.0
    assert (await check(task, "It is 1,005")).reward == 0.0
    no_answer = await check(task, None)
    assert no_answer.reward == 0.0 and "no final answer" in no_answer.reason
    value = Task(id="v", family="find_value", prompt="?", expected="lemon", metadata={})
    assert (await check(value, "The value of color is lemon.")).reward == 1.0
    assert (await check(value, "The value of color is lemonade.")).reward == 0.0


async def test_checkers_accept_the_answer_not_a_list_containing_it() -> None:
    """Before: find_value accepted any answer containing the value, so listing every value of the
    file scored 1.0; a number answer was its last integer, so a list ending right passed."""
    task = generate("find_value", 1, seed=3)[0]
    values = [line.split("=", 1)[1] for line in task.setup_files[task.metadata["path"]].splitlines()]
    assert task.expected in values and len(set(values)) > 1
    every = await check(task, "It is one of: " + " ".join(values))
    assert every.reward == 0.0 and "of the file's values" in every.reason
    assert (await check(task, f"The value of {task.metadata['key']} is {task.expected}.")).reward == 1.0
    arith = Task(id="a", family="arithmetic", prompt="What is 12 * 34?", expected="408", metadata={})
    assert (await check(arith, "12 * 34 = 408")).reward == 1.0  # the operands are not candidates
    listed = await check(arith, "407 or 408")
    assert listed.reward == 0.0 and "2 numbers" in listed.reason
    count = generate("count_lines", 1, seed=3)[0]
    assert (await check(count, " ".join(map(str, range(1, 41))))).reward == 0.0
    assert (await check(count, f"It has {count.expected} lines.")).reward == 1.0


@needs_bwrap
@pytest.mark.bwrap
@pytest.mark.parametrize("family", list(FAMILIES))
async def test_reference_solution_scores_one_and_wrong_scores_zero(family: str) -> None:
    """The family's solution, run by the real tools in bubblewrap, is accepted; a wrong one is not."""
    task = generate(family, 1, seed=11)[0]
    registry = default_registry()
    factory = create_sandbox_factory(SandboxConfig(kind="bwrap"))
    sandbox = await factory.create(task.id)
    try:
        await setup_task(task, sandbox)
        messages = await solve_in_sandbox(task, registry, ToolContext(task_id=task.id, sandbox=sandbox))
        good = await check(task, messages[-1]["content"], sandbox)
        assert good.reward == 1.0, good.reason
        if family == "write_file":
            await sandbox.write_bytes(task.metadata["path"], b"something else\n")
            wrong = await check(task, messages[-1]["content"], sandbox)
        else:
            wrong = await check(task, "The answer is 123456789 and nothing else.", sandbox)
        assert wrong.reward == 0.0 and wrong.reason
    finally:
        await sandbox.close()


@needs_bwrap
async def test_write_file_checker_reports_missing_file() -> None:
    task = generate("write_file", 1, seed=5)[0]
    sandbox = await create_sandbox_factory(SandboxConfig(kind="bwrap")).create(task.id)
    try:
        verdict = await check(task, "Done.", sandbox)
    finally:
        await sandbox.close()
    assert verdict.reward == 0.0 and "not written" in verdict.reason
