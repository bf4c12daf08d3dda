"""The one record: every line trajforge writes is a :class:`~trajforge.record.Record`.

* the reader upgrades the lines of version 1 (the committed fixture runs in
  ``tests/fixtures/runs_v1/``, written by the code before the record existed): such runs still
  export, report, rescore and resume;
* ``batch --env`` and ``env eval`` run the same items through the same rollout step and write the
  same records, apart from timings (which hold the worker that ran it): the same key, seed,
  prompt index and sampling, two rollouts per item included;
* ``rl train --records`` trains a step on the records a token-level ``batch`` wrote.

Real parts only: the scripted endpoint on loopback, bubblewrap sandboxes, ``trajforge serve`` and
torch for the RL step.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import orjson
import pytest

from conftest import SCRIPTED_KEY_ENV
from trajforge.batch.runner import run_batch
from trajforge.engine.books import read_episodes
from trajforge.envs import load_env
from trajforge.envs.running.episode import RolloutBackends
from trajforge.envs.running.evaluate import run_eval
from trajforge.export.formats import export
from trajforge.record import SCHEMA_VERSION, Record, RecordError, Reward, load, read
from trajforge.record.keys import prompt_keys, rollout_key
from trajforge.record.upgrade import FLAT_REWARD
from trajforge.report.build import build_report
from trajforge.tasks import terminal_output
from trajforge.testing.policies import count_assistant_turns
from trajforge.testing.replies import Reply, ToolCallSpec
from trajforge.tools.builtin import default_registry

FIXTURES = Path(__file__).parent / "fixtures" / "runs_v1"
OUTPUTS = ("trajectories.jsonl", "filtered.jsonl", "failed.jsonl")
BOOKKEEPING = {"timings"}
"""What two runs of the same rollout may differ in: when it ran, how long it took and which
worker ran it (``timings.worker``: a batch's process, none in an env eval). Its key, prompt
index, seed and sampling are named by what was asked (``trajforge.record.keys``), not by the
command that asked it."""

needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")


def _raw_lines(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(x) for x in path.read_bytes().splitlines() if x.strip()] if path.exists() else []


def _records(run_dir: Path, names: tuple[str, ...] = OUTPUTS) -> list[Record]:
    return [r for name in names for r in read(run_dir / name)]


def _fields(record: Record) -> dict[str, Any]:
    """The record's own fields but the bookkeeping (a batch line's reference view left out)."""
    dumped = record.model_dump(exclude=BOOKKEEPING)
    return {k: v for k, v in dumped.items() if k in Record.model_fields}


def _expression(prompt: str) -> str:
    if "What is " in prompt:
        return prompt.split("What is ")[-1].split("?")[0]
    for lead in ("Compute ", "Use the terminal to calculate "):
        if prompt.startswith(lead):
            return prompt[len(lead) :].split(" using")[0].rstrip(".")
    return "1 + 1"


def _solver() -> Any:
    """Arithmetic in the terminal, then the answer it printed; call ids fixed by the prompt, so
    two runs of one prompt get the same conversation."""

    def policy(body: dict[str, Any]) -> Reply:
        prompt = next(str(m["content"]) for m in body["messages"] if m["role"] == "user")
        if count_assistant_turns(body) == 0:
            command = f"python3 -c 'print({_expression(prompt)})'"
            return Reply(tool_calls=[ToolCallSpec("terminal", {"command": command}, id="call_calc")])
        tool_out = next(m["content"] for m in reversed(body["messages"]) if m["role"] == "tool")
        return Reply(content=f"The answer is {terminal_output(str(tool_out))}.")

    return policy


# ---------------------------------------------------------------------------------- the reader


def test_both_version_1_shapes_read_as_records() -> None:
    batch = _raw_lines(FIXTURES / "batch" / "run" / "trajectories.jsonl")
    failed = _raw_lines(FIXTURES / "batch" / "run" / "failed.jsonl")
    episodes = _raw_lines(FIXTURES / "env" / "run" / "episodes.jsonl")
    assert batch and failed and episodes and not any("schema_version" in x for x in batch + episodes)
    for line in batch:
        rec = load(line)
        assert rec.schema_version == SCHEMA_VERSION and rec.status == "completed"
        assert (
            rec.reward.value == 1.0 and rec.env == "tiny_tasks" and rec.prompt_index == line["prompt_index"]
        )
        assert rec.messages[0]["role"] == "user" and rec.messages[-1]["role"] == "assistant"
        assert any(m.get("tool_calls") for m in rec.messages)  # the call that ran, as a call
        assert rec.tool_stats["terminal"].count == line["tool_stats"]["terminal"]["count"] == 1
        assert rec.toolsets == line["toolsets_used"] and rec.seed == line["metadata"]["seed"]
        assert rec.timings.wall_s == line["timings"]["wall_s"]
        assert rec.model_extra and rec.model_extra["conversations"] == line["conversations"]  # view kept
        assert rec.reward == Reward(value=1.0, reason=line["reward_reason"])
        assert not {*FLAT_REWARD, "reward_breakdown"} & set(rec.model_extra)
    bad = [load(x) for x in failed if x["reason"].startswith("bad_row")]
    assert (
        bad
        and bad[0].reward is not None
        and bad[0].reward.value is None
        and bad[0].score == 0.0
        and bad[0].termination == "not_run"
    )
    for line in episodes:
        rec = load(line)
        assert rec.key == f"{line['item_id']}#{line['rollout']}" and rec.env == "terminal_test"
        assert rec.timings.wall_s == line["wall_s"] and rec.reward.value == line["reward"] == 1.0
        assert rec.messages == line["messages"] and rec.reward.components == line["reward_components"]
        assert rec.reward.reason == line["reward_reason"] and rec.reward.kept == line["kept"] != {}
        assert not set(FLAT_REWARD) & set(rec.model_extra or {})  # nothing flat rides along
        called = sum(len(m.get("tool_calls") or ()) for m in line["messages"])
        assert sum(s.count for s in rec.tool_stats.values()) == called > 0


def test_the_reader_refuses_what_is_no_record_and_what_is_newer() -> None:
    with pytest.raises(RecordError, match="newer than this trajforge reads"):
        load({"schema_version": SCHEMA_VERSION + 1, "key": "k", "status": "completed"})
    with pytest.raises(RecordError, match="neither a record"):
        load({"hello": "world"})
    with pytest.raises(RecordError, match="status"):
        load({"schema_version": SCHEMA_VERSION, "key": "k", "status": "maybe"})
    with pytest.raises(RecordError, match="a JSON object"):
        load(["not", "a", "dict"])  # type: ignore[arg-type]


def test_a_version_2_line_reads_with_its_worker_in_timings() -> None:
    """Version 2 kept ``worker`` beside the rollout's identity; version 3 moved it into
    ``timings`` (execution provenance). Everything else of the line is read as it was."""
    v2 = {
        "schema_version": 2,
        "key": "0123-0#1",
        "prompt_index": 4,
        "rollout": 1,
        "group_size": 2,
        "status": "completed",
        "seed": 9,
        "sampling": {"temperature": 0.5},
        "timings": {"wall_s": 1.5, "finished_at": "2026-01-01T00:00:00.000+00:00"},
        "worker": 3,
        "metadata": {"batch_num": 3},
        "reward": 0.5,
        "reward_reason": "half",
        "reward_components": {"a": 0.5},
    }
    rec = load(v2)
    assert rec.schema_version == SCHEMA_VERSION == 4 and rec.timings.worker == 3 and rec.timings.wall_s == 1.5
    assert rec.reward == Reward(value=0.5, reason="half", components={"a": 0.5})  # then on to version 4
    assert (rec.key, rec.prompt_index, rec.seed, rec.sampling) == ("0123-0#1", 4, 9, {"temperature": 0.5})
    assert "worker" not in orjson.loads(rec.line()) and orjson.loads(rec.line())["timings"]["worker"] == 3
    assert load({**v2, "worker": None}).timings.worker is None
    v1 = _raw_lines(FIXTURES / "batch" / "run" / "trajectories.jsonl")[0]
    assert load(v1).timings.worker == v1["metadata"]["batch_num"]


def test_a_record_line_reads_back_as_itself() -> None:
    rec = load(_raw_lines(FIXTURES / "env" / "run" / "episodes.jsonl")[0])
    again = load(orjson.loads(rec.line()))
    assert again == rec and orjson.loads(rec.line())["schema_version"] == SCHEMA_VERSION


# ------------------------------------------------------------------ version-1 runs still work


def _copy(name: str, tmp_path: Path) -> Path:
    shutil.copytree(FIXTURES / name, tmp_path / name)
    return tmp_path / name / "run"


def test_version_1_runs_export_and_report(tmp_path: Path) -> None:
    batch_dir, env_dir = _copy("batch", tmp_path), _copy("env", tmp_path)
    for fmt in ("messages", "sharegpt", "hermes"):
        report = export(batch_dir, fmt)
        assert report.rows == 2 and report.read == 2, (fmt, report)
    hermes = _raw_lines(batch_dir / "export" / "hermes.jsonl")
    v1 = _raw_lines(batch_dir / "trajectories.jsonl")
    assert [h["conversations"][1:] for h in hermes] == [x["conversations"][1:] for x in v1]
    rows = _raw_lines(batch_dir / "export" / "messages.jsonl")
    assert all(r["reward"] == 1.0 and r["messages"][-1]["role"] == "assistant" for r in rows)
    env_rows = export(env_dir, "messages")  # an env run exports too now
    assert env_rows.rows == 4 and env_rows.read == 4
    for run_dir, lines in ((batch_dir, 3), (env_dir, 4)):
        summary = build_report(run_dir)
        assert summary.lines == lines and summary.embedded == lines


def test_version_1_env_run_rescores_and_resumes(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from trajforge.cli.main import app

    env_dir = _copy("env", tmp_path)
    out = CliRunner().invoke(app, ["env", "rescore", str(env_dir), "--write"])
    assert out.exit_code == 0, out.output
    assert "rescored 4 episodes: 4 same reward" in out.output
    assert all("schema_version" in x for x in _raw_lines(env_dir / "episodes.jsonl"))  # rewritten as v2
    # resume: the last episode is lost (as after a kill); the run asks for it again, appends a v2 record
    env_dir = tmp_path / "again"
    shutil.copytree(FIXTURES / "env" / "run", env_dir)
    lines = (env_dir / "episodes.jsonl").read_bytes().splitlines(keepends=True)
    (env_dir / "episodes.jsonl").write_bytes(b"".join(lines[:-1]))
    args = ["env", "eval", "terminal_test", "--agent", "oracle", "--max-samples", "2", "--group-size", "2"]
    out = CliRunner().invoke(app, [*args, "--output-dir", str(tmp_path), "--run-name", "again"])
    assert out.exit_code == 0, out.output
    raw = _raw_lines(env_dir / "episodes.jsonl")
    assert len(raw) == 4 and "schema_version" not in raw[0] and raw[-1]["schema_version"] == SCHEMA_VERSION
    episodes = read_episodes(env_dir / "episodes.jsonl")
    assert sorted(e.key for e in episodes) == sorted({e.key for e in episodes}) and len(episodes) == 4
    assert all(e.reward.value == 1.0 for e in episodes)
    # the 3 kept episodes keep their ITEM_ID#ROLLOUT keys (and were not run again); the one run
    # now is keyed by record.keys, as its item's place in the list
    assert [e.key for e in episodes[:3]] == [f"{x['item_id']}#{x['rollout']}" for x in raw[:3]]
    lost = orjson.loads(lines[-1])
    env = load_env("terminal_test")
    items = env.eval_items(2)
    place = next(i for i, item in enumerate(items) if env.item_id(item) == lost["item_id"])
    assert episodes[3].key == rollout_key(prompt_keys(items)[place], lost["rollout"], 2)
    assert (episodes[3].item_id, episodes[3].rollout, episodes[3].prompt_index) == (
        lost["item_id"],
        lost["rollout"],
        place,
    )


async def _resume_batch_fixture(run_dir: Path, scripted_server: Any, scripted_batch_config: Any) -> list[Any]:
    """Resume a fixture's ``batch --env tiny_tasks`` run with this code (its rows, the scripted
    solver); every raw line of its outputs afterwards."""
    srv = await scripted_server(_solver())
    dataset = (run_dir.parent / "dataset.jsonl").read_bytes()
    rows = [orjson.loads(x) for x in dataset.splitlines() if x.startswith(b'{"')]
    cfg = scripted_batch_config(
        rows,
        srv.base_url,
        env="tiny_tasks",
        resume=True,
        skip_bad_rows=True,
        output_dir=run_dir.parent,
        dataset=run_dir.parent / "dataset.jsonl",
    )
    await run_batch(cfg)
    return [x for name in OUTPUTS for x in _raw_lines(run_dir / name)]


@needs_bwrap
async def test_version_1_batch_run_resumes_and_its_mixed_files_read(
    scripted_server: Any, scripted_batch_config: Any, tmp_path: Path
) -> None:
    """The fixture stopped after 3 of its 5 rows (one bad); the resume runs the other 2 with
    this code, and export, report and the RL reader take the files holding both versions."""
    run_dir = _copy("batch", tmp_path)
    raw = await _resume_batch_fixture(run_dir, scripted_server, scripted_batch_config)
    assert len(raw) == 5
    versions = sorted(x.get("schema_version", 1) for x in raw)
    assert versions == [1, 1, 1, SCHEMA_VERSION, SCHEMA_VERSION]
    records = _records(run_dir)
    assert sorted(r.status for r in records) == ["completed"] * 4 + ["failed"]
    assert all(r.reward is not None and r.reward.value == 1.0 for r in records if r.status == "completed")
    assert export(run_dir, "messages").rows == 4
    assert export(run_dir, "parquet").rows == 4
    assert build_report(run_dir).lines == 5
    new = [r for r in raw if "schema_version" in r]
    assert all(x["conversations"][0]["from"] == "system" and x["completed"] for x in new)  # the view


# ------------------------------------------------------------------ version-3 runs still work
# (tests/fixtures/runs_v3/: written by the code before the one Reward, flat reward fields)

FIXTURES_V3 = Path(__file__).parent / "fixtures" / "runs_v3"


def _copy_v3(name: str, tmp_path: Path) -> Path:
    shutil.copytree(FIXTURES_V3 / name, tmp_path / "v3" / name)
    return tmp_path / "v3" / name / "run"


def test_version_3_lines_read_with_their_reward_as_one_object() -> None:
    """Every flat reward field of a version-3 line lands in the one ``reward``: the value, the
    components, the reason, the error, what the env kept, and the token advantages the trace held."""
    episodes = _raw_lines(FIXTURES_V3 / "env" / "run" / "episodes.jsonl")
    assert episodes and all(x["schema_version"] == 3 for x in episodes)
    for line in episodes:
        rec = load(line)
        assert rec.schema_version == SCHEMA_VERSION == 4
        assert rec.reward == Reward(
            value=line["reward"],
            components=line["reward_components"],
            reason=line["reward_reason"],
            error=line["reward_error"],
            kept=line["kept"],
        )
        assert rec.reward.kept["files_b64"] and not set(FLAT_REWARD) & set(rec.model_extra or {})
        dumped = orjson.loads(rec.line())
        assert dumped["reward"]["value"] == 1.0 and not set(FLAT_REWARD[1:]) & set(dumped)
    for line in _raw_lines(FIXTURES_V3 / "opd" / "episodes.jsonl"):
        rec = load(line)
        assert rec.trace is not None and "token_advantages" not in rec.trace.model_dump()
        assert rec.reward is not None and rec.reward.token_advantages == line["trace"]["token_advantages"]
        assert (
            len(rec.reward.token_advantages) == len(rec.trace.tokens)
            and rec.trace.tokens == line["trace"]["tokens"]
        )
        assert rec.reward.components == line["reward_components"] and rec.reward.value == line["reward"]
    bad = [load(x) for x in _raw_lines(FIXTURES_V3 / "batch" / "run" / "failed.jsonl")]
    assert [r.reason_kind for r in bad] == ["bad_row"]
    assert bad[0].reward is not None and bad[0].reward.value is None and bad[0].score == 0.0
    assert bad[0].reward.reason.startswith("not judged: bad_row")
    # a line of a batch without --env had no judge: no reward object at all (not a 0)
    plain = {**_raw_lines(FIXTURES_V3 / "batch" / "run" / "trajectories.jsonl")[0], "env": None}
    plain.update(reward=None, reward_components={}, reward_reason="", reward_error=None, kept={})
    assert load(plain).reward is None and load(plain).score == 0.0
    with pytest.raises(RecordError, match="not a boolean"):
        load({**episodes[0], "reward": True})


def test_version_3_token_advantages_train_as_they_did() -> None:
    """The opd episodes of version 3 carried their per-token advantages in the trace; read into
    ``reward.token_advantages``, they reach the GRPO samples and the Atropos groups position for
    position as the trace held them."""
    from trajforge.rl.adapters.atropos_groups import scored_group
    from trajforge.rl.samples import StepRollouts, build_samples

    raw = _raw_lines(FIXTURES_V3 / "opd" / "episodes.jsonl")
    records = [load(x) for x in raw]
    groups = [[r, r.model_copy(update={"rollout": 1})] for r in records]
    built = build_samples(StepRollouts(groups=groups, version=0, weights_step=0))
    assert [s.token_advantages for s in built.samples] == [
        x["trace"]["token_advantages"] for x in raw for _ in (0, 1)
    ]
    assert built.uniform_groups == 2 and len(built.samples) == 4  # uniform rewards, trained on the tokens
    group = scored_group(records, token_level=True, group_size=2).group
    assert group is not None and group["advantages"] == [x["trace"]["token_advantages"] for x in raw]


def test_version_3_env_run_rescores_resumes_and_reads_mixed(tmp_path: Path) -> None:
    """A run directory written by version 3 resumes with this code: its last episode lost (as
    after a kill), the run appends a version-4 line, and the file of both versions reads back,
    exports, reports and rescores."""
    from typer.testing import CliRunner

    from trajforge.cli.main import app

    env_dir = _copy_v3("env", tmp_path)
    lines = (env_dir / "episodes.jsonl").read_bytes().splitlines(keepends=True)
    (env_dir / "episodes.jsonl").write_bytes(b"".join(lines[:-1]))
    args = ["env", "eval", "terminal_test", "--agent", "oracle", "--max-samples", "2", "--group-size", "2"]
    out = CliRunner().invoke(app, [*args, "--output-dir", str(env_dir.parent), "--run-name", "run"])
    assert out.exit_code == 0, out.output
    raw = _raw_lines(env_dir / "episodes.jsonl")
    assert [x["schema_version"] for x in raw] == [3, 3, 3, SCHEMA_VERSION]
    assert isinstance(raw[-1]["reward"], dict) and "reward_reason" not in raw[-1] and "kept" not in raw[-1]
    episodes = read_episodes(env_dir / "episodes.jsonl")
    assert len(episodes) == len({e.key for e in episodes}) == 4
    assert all(e.reward is not None and e.reward.value == 1.0 and e.reward.kept for e in episodes)
    lost = orjson.loads(lines[-1])
    assert (episodes[3].key, episodes[3].reward.components) == (lost["key"], lost["reward_components"])
    assert export(env_dir, "messages").rows == 4 and export(env_dir, "parquet").rows == 4
    rows = _raw_lines(env_dir / "export" / "messages.jsonl")
    assert [r["reward"] for r in rows] == [1.0] * 4  # the export's scalar, whatever the line's version
    assert build_report(env_dir).lines == 4
    out = CliRunner().invoke(app, ["env", "rescore", str(env_dir), "--write"])
    assert out.exit_code == 0 and "rescored 4 episodes: 4 same reward" in out.output, out.output
    again = _raw_lines(env_dir / "episodes.jsonl")
    assert [x["schema_version"] for x in again] == [SCHEMA_VERSION] * 4
    assert [x["reward"]["kept"] for x in again] == [x["kept"] for x in raw[:3]] + [raw[3]["reward"]["kept"]]


@needs_bwrap
async def test_version_3_batch_run_resumes_and_its_mixed_files_read(
    scripted_server: Any, scripted_batch_config: Any, tmp_path: Path
) -> None:
    """The version-3 batch fixture stopped after 3 of its 5 rows (one bad); this code runs the
    other 2 into the same files, and every reader takes them."""
    run_dir = _copy_v3("batch", tmp_path)
    raw = await _resume_batch_fixture(run_dir, scripted_server, scripted_batch_config)
    assert sorted(x["schema_version"] for x in raw) == [3, 3, 3, SCHEMA_VERSION, SCHEMA_VERSION]
    records = _records(run_dir)
    assert sorted(r.status for r in records) == ["completed"] * 4 + ["failed"]
    assert [r.reward_value for r in records if r.status == "completed"] == [1.0] * 4
    assert all(
        r.reward is not None and r.reward.reason.startswith("answer")
        for r in records
        if r.status == "completed"
    )
    assert export(run_dir, "messages").rows == 4 and export(run_dir, "parquet").rows == 4
    assert build_report(run_dir).lines == 5


# ------------------------------------------------- batch --env and env eval: the same records


@needs_bwrap
async def test_batch_env_and_env_eval_write_the_same_records(
    scripted_server: Any, scripted_batch_config: Any, bwrap: Any, tmp_path: Path
) -> None:
    """The same 3 items, 2 rollouts each, run by ``batch --env --group-size 2`` (the items as
    dataset rows) and by ``env eval --group-size 2``: every rollout's record is the same but
    for ``timings``. Both commands are given the same base seed (7, not their shared default
    0, so the seed is shown to follow it) and the same sampling settings; the key is the one
    rule of ``record.keys`` (the item's content key, ``#ROLLOUT``), the seed is derived from it,
    ``prompt_index`` is the item's place in the list and ``sampling`` what every call sent."""
    from trajforge.distributions import derive_seed
    from trajforge.llm.openai_client import OpenAIChatModel, OpenAIModelConfig

    settings = {"families": ["arithmetic"], "seed": 7, "agent_temperature": 0.5, "max_tokens": 300}
    env = load_env("tiny_tasks", settings)
    items = env.eval_items(3)
    srv = await scripted_server(_solver())
    cfg = scripted_batch_config(
        items,
        srv.base_url,
        env="tiny_tasks",
        sandbox="bwrap",
        toolsets=["terminal", "file"],
        max_turns=4,
        samples_per_prompt=2,
        seed=7,
        temperature=0.5,
        max_tokens=300,
    )
    batch = {r.key: r for r in _records((await run_batch(cfg)).run_dir)}

    model = OpenAIChatModel(
        OpenAIModelConfig(base_url=srv.base_url, model="scripted", api_key_env=SCRIPTED_KEY_ENV)
    )
    await run_eval(
        env, RolloutBackends(model, bwrap, default_registry()), tmp_path / "eval", n=3, group_size=2
    )
    evaluated = {r.key: r for r in read_episodes(tmp_path / "eval" / "episodes.jsonl")}

    prompts = prompt_keys(items)
    expected = {rollout_key(prompts[i], r, 2) for i in range(3) for r in range(2)}
    assert len(expected) == 6 and set(batch) == set(evaluated) == expected
    for key, rec in batch.items():
        twin = evaluated[key]
        assert rec.reward.value == twin.reward.value == 1.0 and rec.status == "completed"
        assert rec.trace is None and rec.tool_stats["terminal"].count == 1
        assert rec.key == twin.key == rollout_key(prompts[rec.prompt_index or 0], rec.rollout, 2)
        assert rec.prompt_index == twin.prompt_index is not None and rec.item == twin.item
        assert (rec.rollout, rec.group_size) == (twin.rollout, twin.group_size) and rec.group_size == 2
        assert rec.seed == twin.seed == derive_seed(7, key)
        sent = {"temperature": 0.5, "max_tokens": 300, "seed": rec.seed, "reasoning_disabled": False}
        assert rec.sampling == twin.sampling == {**sent, "extra_body": {}}
        assert _fields(rec) == _fields(twin)
        assert rec.timings.wall_s > 0 and twin.timings.wall_s > 0
        assert rec.timings.worker == 0 and twin.timings.worker is None  # provenance, in timings
    seeds = {r.seed for r in batch.values()}
    assert len(seeds) == 6  # each rollout its own seed, two rollouts of an item included
    sent_seeds = {body.get("seed") for body in srv.requests}
    assert sent_seeds == seeds  # what the record says was sent was sent, by both commands


# ------------------------------------------------------ rl train on records written by batch


def test_batch_rows_and_env_items_are_keyed_by_one_rule(tmp_path: Path) -> None:
    """``batch`` keys its dataset rows and ``env eval`` its items with ``record.keys``: the same
    rows give the same keys, key order does not matter, a prompt given twice is two prompts, and
    an item JSON cannot hold (bytes) is keyed too."""
    from trajforge.batch.dataset import load_dataset
    from trajforge.record.keys import key_of

    rows: list[dict[str, Any]] = [
        {"prompt": "What is 2 + 2?", "answer": 4},
        {"answer": 4, "prompt": "What is 2 + 2?"},  # the same row, keys in another order
        {"prompt": "What is 3 + 3?", "answer": 6},
    ]
    dataset = tmp_path / "d.jsonl"
    dataset.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    keys = prompt_keys(rows)
    assert [s.key for s in load_dataset(dataset).samples] == keys
    assert keys[0].endswith("-0") and keys[1] == keys[0][:-1] + "1" and keys[2].endswith("-0")
    assert key_of(rows[1]) == keys[0] and rollout_key(keys[0], 1, 2) == keys[0] + "#1"
    assert rollout_key(keys[0], 0, 1) == keys[0]
    assert key_of({"prompt": "p", "blob": b"\x00"}) != key_of({"prompt": "p", "blob": b"\x01"})


@needs_bwrap
@pytest.mark.timeout(900)
def test_rl_train_trains_a_step_on_batch_records(tiny_chatml_model: Path, tmp_path: Path) -> None:
    """``batch --env --tokenizer`` against ``trajforge serve`` writes records with exact tokens;
    ``rl train --records`` groups them by prompt and takes an optimizer step on them."""
    import asyncio

    import torch
    from safetensors.torch import load_file
    from typer.testing import CliRunner

    from trajforge.batch.config import load_config
    from trajforge.cli.main import app
    from trajforge.serve.launcher import LocalServer

    env_ref = str(Path(__file__).parent / "test_rl_train.py") + ":LettersEnv"
    rows = [
        {"prompt": f"Write words with the letters of {w}.", "word": w, "id": w} for w in ("apple", "river")
    ]
    dataset = tmp_path / "d.jsonl"
    dataset.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))

    async def generate() -> Path:
        async with LocalServer(tiny_chatml_model, device="cpu", max_batch=8) as server:
            cfg = load_config(
                None,
                {
                    "dataset": dataset,
                    "run_name": "sft",
                    "output_dir": tmp_path,
                    "model": server.model_name,
                    "base_url": server.openai_base_url,
                    "tokenizer": str(tiny_chatml_model),
                    "toolsets": ["file"],
                    "env": env_ref,
                    "samples_per_prompt": 4,
                    "max_turns": 1,
                    "max_tokens": 12,
                    "temperature": 1.0,
                    "progress": "none",
                    "require_reasoning": False,
                },
            )
            return (await run_batch(cfg)).run_dir

    run_dir = asyncio.run(generate())
    records = _records(run_dir)
    assert len(records) == 8 and all(r.trace is not None for r in records), [r.trace_error for r in records]
    assert len({r.reward_value for r in records}) > 1  # something to learn from
    out = tmp_path / "rl"
    args = [env_ref, "--model-path", str(tiny_chatml_model), "--records", str(run_dir), "--steps", "1"]
    args += [
        "--group-size",
        "4",
        "--groups",
        "2",
        "--lr",
        "5e-3",
        "--device",
        "cpu",
        "--output-dir",
        str(tmp_path),
        "--run-name",
        "rl",
    ]
    result = CliRunner().invoke(app, ["rl", "train", *args])
    assert result.exit_code == 0, (result.output, result.exception)
    assert "step 1/1" in result.output  # the live line, as every rl train shows it
    metrics = [orjson.loads(x) for x in (out / "metrics.jsonl").read_bytes().splitlines()]
    assert len(metrics) == 1 and metrics[0]["episodes"] == 8 and metrics[0]["trained_episodes"] > 0
    before = load_file(str(tiny_chatml_model / "model.safetensors"))
    after = load_file(str(out / metrics[0]["checkpoint"] / "model.safetensors"))
    assert any(not torch.equal(before[k], after[k]) for k in before)
