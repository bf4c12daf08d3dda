"""``batch --env`` (lines graded in their own sandbox) and ``--samples-per-prompt`` (groups of
samples per row), end to end against the scripted endpoint, real bwrap sandboxes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from trajforge.batch.errors import RunError
from trajforge.batch.runner import run_batch
from trajforge.tasks import generate, generate_mixed, terminal_output
from trajforge.testing.policies import count_assistant_turns
from trajforge.testing.replies import Reply, ToolCallSpec


def _lines(run_dir: Path, name: str = "trajectories.jsonl") -> list[dict[str, Any]]:
    path = run_dir / name
    return [orjson.loads(x) for x in path.read_bytes().splitlines()] if path.exists() else []


def _all_lines(run_dir: Path) -> list[dict[str, Any]]:
    return [*_lines(run_dir), *_lines(run_dir, "failed.jsonl"), *_lines(run_dir, "filtered.jsonl")]


def _first_user(body: dict[str, Any]) -> str:
    return next(str(m["content"]) for m in body["messages"] if m["role"] == "user")


def _expression(prompt: str) -> str:
    if "What is " in prompt:
        return prompt.split("What is ")[-1].split("?")[0]
    for lead in ("Compute ", "Use the terminal to calculate "):
        if prompt.startswith(lead):
            return prompt[len(lead) :].split(" using")[0].rstrip(".")
    return "1 + 1"


def _solver(wrong_every: int = 0) -> Any:
    """Arithmetic: computes in the terminal, answers what it printed. With ``wrong_every`` k, the
    k-th, 2k-th, ... sample of each prompt computes 0 instead (a group with mixed rewards)."""
    started: dict[str, int] = {}

    def policy(body: dict[str, Any]) -> Reply:
        prompt = _first_user(body)
        if count_assistant_turns(body) == 0:
            n = started[prompt] = started.get(prompt, 0) + 1
            expr = "0" if wrong_every and n % wrong_every == 0 else _expression(prompt)
            return Reply(tool_calls=[ToolCallSpec("terminal", {"command": f"python3 -c 'print({expr})'"})])
        tool_out = next(m["content"] for m in reversed(body["messages"]) if m["role"] == "tool")
        return Reply(content=f"The answer is {terminal_output(str(tool_out))}.")

    return policy


async def test_batch_env_grades_every_line_and_statistics_count_solved(
    scripted_server: Any, scripted_batch_config: Any
) -> None:
    rows = [t.to_row() for t in generate("arithmetic", 4, seed=5)]
    rows.append(
        {
            "prompt": "Save 'x y 1' into z.txt.",
            "task_id": "w",
            "family": "write_file",
            "expected": "x y 1",
            "metadata": {"path": "z.txt"},
        }
    )
    srv = await scripted_server(_solver())
    cfg = scripted_batch_config(rows, srv.base_url, env="tiny_tasks", sandbox="bwrap")
    summary = await run_batch(cfg)
    lines = _all_lines(summary.run_dir)
    assert len(lines) == 5
    by_id = {line["metadata"]["row"]["task_id"]: line for line in lines}
    for t in generate("arithmetic", 4, seed=5):
        assert by_id[t.id]["reward"]["value"] == 1.0, by_id[t.id]["reward"]["reason"]
        assert by_id[t.id]["env"] == "tiny_tasks"
    write = by_id["w"]
    assert (
        write["reward"]["value"] == 0.0 and "was not written" in write["reward"]["reason"]
    )  # nothing wrote it
    stats = orjson.loads((summary.run_dir / "statistics.json").read_bytes())
    assert stats["rewards"] == {"graded": 5, "mean": 0.8, "solved": 4, "solved_rate": 0.8, "reward_errors": 0}


async def test_samples_per_prompt_gives_each_sample_its_key_seed_and_sandbox(
    scripted_server: Any, scripted_batch_config: Any
) -> None:
    rows = [t.to_row() for t in generate_mixed(["arithmetic"], 3, seed=2)]
    srv = await scripted_server(_solver())
    cfg = scripted_batch_config(rows, srv.base_url, env="tiny_tasks", samples_per_prompt=3, sandbox="bwrap")
    summary = await run_batch(cfg)
    lines = _all_lines(summary.run_dir)
    assert len(lines) == 9
    groups: dict[int, list[dict[str, Any]]] = {}
    for line in lines:
        groups.setdefault(line["prompt_index"], []).append(line)
    assert sorted(groups) == [0, 1, 2] and all(len(g) == 3 for g in groups.values())
    for group in groups.values():
        assert sorted(line["metadata"]["sample_index"] for line in group) == [0, 1, 2]
        assert len({line["key"] for line in group}) == 3
        assert len({line["metadata"]["seed"] for line in group}) == 3
        assert {line["metadata"]["samples_per_prompt"] for line in group} == {3}
        assert all(line["reward"]["value"] == 1.0 for line in group)
    # resuming the finished run finds nothing to do; changing N is refused (keys would change)
    again = await run_batch(cfg.model_copy(update={"resume": True}))
    assert len(_all_lines(again.run_dir)) == 9
    with pytest.raises(RunError, match="samples_per_prompt"):
        await run_batch(cfg.model_copy(update={"resume": True, "samples_per_prompt": 4}))


async def test_dpo_export_pairs_samples_of_a_prompt_by_reward(
    scripted_server: Any, scripted_batch_config: Any, tmp_path: Path
) -> None:
    """The whole path: N samples per prompt, graded, then the DPO export pairs them by reward."""
    from trajforge.export.formats import export

    rows = [t.to_row() for t in generate("arithmetic", 2, seed=9)]

    srv = await scripted_server(_solver(wrong_every=2))
    cfg = scripted_batch_config(rows, srv.base_url, env="tiny_tasks", samples_per_prompt=4, sandbox="bwrap")
    summary = await run_batch(cfg)
    lines = _all_lines(summary.run_dir)
    assert sorted(line["reward"]["value"] for line in lines) == [0.0] * 4 + [1.0] * 4
    report = export(summary.run_dir, "dpo")
    assert report.rows == 8  # per prompt: 2 right x 2 wrong
    pairs = [orjson.loads(x) for x in report.path.read_bytes().splitlines()]  # noqa: ASYNC240
    # the two part at their first model turn, the call (docs/formats.md, "dpo"): the wrong sample
    # computed 0 there; nothing after it (its result, its answer) is a completion token
    assert all(p["shared_turns"] == 1 and len(p["chosen"]) == len(p["rejected"]) == 1 for p in pairs)
    assert all("print(0)" not in str(p["chosen"]) for p in pairs)
    assert all("print(0)" in str(p["rejected"]) for p in pairs)


async def test_a_bad_env_reference_fails_before_anything_starts(
    scripted_server: Any, scripted_batch_config: Any
) -> None:
    srv = await scripted_server(_solver())
    cfg = scripted_batch_config([{"prompt": "x"}], srv.base_url, env="no_such_env")
    with pytest.raises(RunError, match="--env: unknown env 'no_such_env'"):
        await run_batch(cfg)
    assert not srv.requests


async def test_a_reward_function_file_grades_lines(
    scripted_server: Any, scripted_batch_config: Any, tmp_path: Path
) -> None:
    reward = tmp_path / "my_reward.py"
    reward.write_text(
        "async def reward(item, result, ctx):\n"
        "    res = await ctx.exec(['cat', 'out.txt'])\n"
        "    return 1.0 if res.stdout.strip() == item['want'].encode() else 0.0\n"
    )

    def writer(body: dict[str, Any]) -> Reply:
        if count_assistant_turns(body) == 0:
            return Reply(tool_calls=[ToolCallSpec("terminal", {"command": "echo hello > out.txt"})])
        return Reply(content="done")

    srv = await scripted_server(writer)
    rows = [{"prompt": "a", "want": "hello"}, {"prompt": "b", "want": "bye"}]
    cfg = scripted_batch_config(rows, srv.base_url, env=f"{reward}:reward", sandbox="bwrap")
    summary = await run_batch(cfg)
    by_prompt = {
        line["metadata"]["row"]["want"]: line["reward"]["value"] for line in _all_lines(summary.run_dir)
    }
    assert by_prompt == {"hello": 1.0, "bye": 0.0}


async def test_token_level_batch_lines_carry_exact_tokens_masks_and_logprobs(tmp_path: Path) -> None:
    """``--tokenizer auto`` on the embedded policy (served by `trajforge serve`): every line has
    tokens, masks and logprobs of equal length, sampled positions exactly the completion tokens."""
    from trajforge.batch.config import load_config

    rows = [t.to_row() for t in generate("count_lines", 2, seed=3)]
    dataset = tmp_path / "d.jsonl"
    dataset.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    cfg = load_config(
        None,
        {
            "dataset": dataset,
            "run_name": "tok",
            "output_dir": tmp_path,
            "toolsets": ["terminal", "file"],
            "env": "tiny_tasks",
            "tokenizer": "auto",
            "progress": "none",
            "require_reasoning": False,
            "temperature": 0.0,
        },
    )
    summary = await run_batch(cfg)
    lines = _all_lines(summary.run_dir)
    assert len(lines) == 2
    for line in lines:
        trace = line["trace"]
        assert "error" not in trace
        tokens, masks, logprobs = trace["tokens"], trace["masks"], trace["logprobs"]
        assert len(tokens) == len(masks) == len(logprobs) > 0
        sampled = [i for i, m in enumerate(masks) if m != -100]
        assert sampled and all(masks[i] == tokens[i] for i in sampled)
        assert len(sampled) == line["usage"]["completion_tokens"]
        assert all(logprobs[i] <= 0.0 for i in sampled)
        assert all(logprobs[i] == 1.0 for i in range(len(masks)) if masks[i] == -100)  # Atropos: 1.0
        assert line["reward"]["value"] in (0.0, 1.0)
