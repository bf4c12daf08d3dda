"""The Atropos adapter with real components on 127.0.0.1: atroposlib's ``run-api`` server, a
trajforge env in Atropos ``serve`` mode rolling out against ``trajforge serve`` (a tiny model built
here, token-level ``/generate``) in bubblewrap sandboxes, and a consumer registered the way
atroposlib's example trainer registers, pulling ``/batch``; ``process`` mode offline (token-level
and chat endpoints). The group conversion's rules (failed episodes left out and counted, groups
of another size, Phase 1 marks) are checked on episode records directly.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("atroposlib", reason="the atropos extra is not installed")

from trajforge.envs.types import Episode, TokenRecord  # noqa: E402
from trajforge.record import Reward
from trajforge.rl.adapters.atropos_groups import GroupTally, scored_group  # noqa: E402
from trajforge.serve.launcher import LocalServer  # noqa: E402
from trajforge.testing.tiny import build_tiny_model, build_tiny_tokenizer  # noqa: E402

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")

MAX_TOKENS = 24
OVERRIDES = json.dumps({"max_tokens": MAX_TOKENS, "max_agent_turns": 2, "max_concurrent_rollouts": 2})

# tiny_tasks with a length bonus: a random tiny model never solves a task, so every group would
# score all zeros and Atropos would (rightly) drop it; the bonus makes scores differ.
SCORED_ENV = """
from trajforge.envs.library.tiny_tasks import TinyTasksEnv
from trajforge.envs.types import RewardBreakdown


class LengthScoredTinyTasks(TinyTasksEnv):
    name = "tiny_tasks_len"

    async def compute_reward(self, item, result, ctx):
        base = await super().compute_reward(item, result, ctx)
        text = "".join(str(m.get("content") or "") for m in result.messages if m.get("role") == "assistant")
        bonus = (len(text) % 7) / 10
        return RewardBreakdown(reward=base.reward + bonus, components={"checker": base.reward, "length": bonus})
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_http(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"{url}: process exited {proc.returncode}:\n{log.read_text()[-4000:]}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"{url} not up in {timeout}s:\n{log.read_text()[-4000:]}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tiny")
    build_tiny_model(out, build_tiny_tokenizer(out))
    return out


@pytest.fixture(scope="module")
def served(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``trajforge serve`` on the tiny model: the root URL (``/generate``, ``/v1/...``)."""
    port = _free_port()
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    cmd = LocalServer(model_dir, port=port, device="cpu", max_batch=8).command()
    with log.open("wb") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        _wait_http(f"http://127.0.0.1:{port}/health", proc, log)
        yield f"http://127.0.0.1:{port}"
    finally:
        _stop(proc)


@pytest.fixture
def scored_env(tmp_path: Path) -> str:
    path = tmp_path / "scored_env.py"
    path.write_text(SCORED_ENV)
    return f"{path}:LengthScoredTinyTasks"


def _adapter_cmd(mode: str, env: str, *flags: str) -> list[str]:
    """``trajforge env MODE ENV FLAGS`` (the installed console script of this interpreter)."""
    return [str(Path(sys.executable).with_name("trajforge")), "env", mode, env, *flags]


def _episodes(path: Path) -> dict[str, dict[str, Any]]:
    return {e["key"]: e for e in map(json.loads, path.read_text().splitlines())}


def _teacher_forced_logprobs(model_dir: Path, tokens: list[int]) -> list[float]:
    """log p(tokens[i] | tokens[:i]) under the served weights, recomputed here (raw logits, as
    the server reports them)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32, local_files_only=True)
    with torch.no_grad():
        logits = model(torch.tensor([tokens])).logits[0].float()
    lp = torch.log_softmax(logits, dim=-1)
    return [0.0] + [float(lp[i - 1, tokens[i]]) for i in range(1, len(tokens))]


def _runs(mask: list[int]) -> list[tuple[int, int]]:
    """Maximal spans of sampled (unmasked) positions."""
    spans, start = [], None
    for i, m in enumerate([*mask, -100]):
        if m != -100 and start is None:
            start = i
        elif m == -100 and start is not None:
            spans.append((start, i))
            start = None
    return spans


def _check_token_group(group: dict[str, Any], episodes: dict[str, dict[str, Any]], model_dir: Path) -> int:
    """Equal lengths, masks exactly on sampled tokens, logprobs the server's; returns sequences checked."""
    n = len(group["tokens"])
    assert n == len(group["masks"]) == len(group["inference_logprobs"]) == len(group["scores"]) >= 1
    for i in range(n):
        toks, masks, lps = group["tokens"][i], group["masks"][i], group["inference_logprobs"][i]
        assert len(toks) == len(masks) == len(lps) > 0
        ep = episodes[group["overrides"][i]["episode"]]
        assert ep["status"] != "failed" and ep["reward"]["value"] == group["scores"][i]
        # the adapter's trace, passed through unchanged
        assert (toks, masks, lps) == (ep["trace"]["tokens"], ep["trace"]["masks"], ep["trace"]["logprobs"])
        for t, m, lp in zip(toks, masks, lps, strict=True):
            assert m in (t, -100)
            if m == -100:
                assert lp == 1.0
        # one sampled span per model turn, each at most max_tokens long, the prompt never sampled
        spans = _runs(masks)
        assert len(spans) == ep["turns"] >= 1 and spans[0][0] > 0
        assert all(0 < end - start <= MAX_TOKENS for start, end in spans)
        # the logprob of every sampled token is the model's, recomputed by teacher forcing
        expected = _teacher_forced_logprobs(model_dir, toks)
        for start, end in spans:
            for p in range(start, end):
                assert abs(lps[p] - expected[p]) < 2e-3, (p, lps[p], expected[p])
    return n


def test_serve_mode_feeds_the_atropos_api_and_a_trainer_pulls_exact_tokens(
    served: str, model_dir: Path, scored_env: str, tmp_path: Path
) -> None:
    api_port = _free_port()
    api_url = f"http://127.0.0.1:{api_port}"
    api_log, env_log = tmp_path / "api.log", tmp_path / "env.log"
    run_api = Path(sys.executable).with_name("run-api")
    with api_log.open("wb") as fh:
        api = subprocess.Popen(
            [str(run_api), "--host", "127.0.0.1", "--port", str(api_port)],
            stdout=fh,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    env_proc: subprocess.Popen[bytes] | None = None
    try:
        _wait_http(f"{api_url}/info", api, api_log, timeout=60)
        # the consumer registers as atroposlib's example trainer does, then starts pulling
        reg = httpx.post(
            f"{api_url}/register",
            json={
                "wandb_group": "",
                "wandb_project": "",
                "batch_size": 2,
                "max_token_len": 16384,
                "starting_step": 0,
                "checkpoint_dir": str(tmp_path / "ckpt"),
                "save_checkpoint_interval": 1000,
                "num_steps": 20,
            },
            timeout=10,
        ).json()
        assert "uuid" in reg
        assert httpx.get(f"{api_url}/batch", timeout=10).json()["batch"] is None
        episodes_path = tmp_path / "episodes.jsonl"
        with env_log.open("wb") as fh:
            env_proc = subprocess.Popen(
                _adapter_cmd(
                    "serve",
                    scored_env,
                    "--env.group_size", "2",
                    "--env.rollout_server_url", api_url,
                    "--env.tokenizer_name", str(model_dir),
                    "--env.max_num_workers", "1",
                    "--env.steps_per_eval", "0",
                    "--env.total_steps", "20",
                    "--env.episodes_path", str(episodes_path),
                    "--env.trajforge_overrides", OVERRIDES,
                    "--openai.base_url", served,
                    "--openai.server_type", "vllm",
                    "--openai.model_name", model_dir.name,
                ),
                stdout=fh,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )  # fmt: skip
        batch = None
        deadline = time.monotonic() + 300
        while batch is None and time.monotonic() < deadline:
            assert env_proc.poll() is None, env_log.read_text()[-6000:]
            batch = httpx.get(f"{api_url}/batch", timeout=10).json()["batch"]
            if batch is None:
                time.sleep(1)
        assert batch is not None, env_log.read_text()[-6000:]
        episodes = _episodes(episodes_path)
        checked = sum(_check_token_group(group, episodes, model_dir) for group in batch)
        assert checked == 2  # batch_size sequences
        for group in batch:
            assert len(set(group["scores"])) > 1  # Atropos sends no group whose scores are all equal
            assert group["env_id"] == 0
        # The env keeps producing while we look: it appends episodes, then writes the stats that
        # count them, so stats read first never count more lines than the file holds afterwards.
        stats = json.loads(episodes_path.with_name(episodes_path.name + ".stats.json").read_text())
        assert stats["groups_sent"] >= 1 and stats["episodes"] <= len(_episodes(episodes_path))
        assert stats["groups"] == stats["groups_sent"] + stats["groups_equal_scores"] + stats["groups_empty"]
        assert "use_wandb=False" in env_log.read_text()  # no wandb unless asked
    finally:
        if env_proc is not None:
            _stop(env_proc)
        _stop(api)


def test_process_mode_writes_token_groups_offline(served: str, model_dir: Path, tmp_path: Path) -> None:
    out, episodes_path = tmp_path / "groups.jsonl", tmp_path / "episodes.jsonl"
    res = subprocess.run(
        _adapter_cmd(
            "process",
            "tiny_tasks",
            "--env.group_size", "2",
            "--env.total_steps", "2",
            "--env.tokenizer_name", str(model_dir),
            "--env.data_path_to_save_groups", str(out),
            "--env.episodes_path", str(episodes_path),
            "--env.trajforge_overrides", OVERRIDES,
            "--openai.base_url", served,
            "--openai.server_type", "vllm",
            "--openai.model_name", model_dir.name,
        ),
        capture_output=True,
        text=True,
        timeout=280,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    groups = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(groups) == 2  # process mode keeps groups whose scores are equal (as Atropos does)
    episodes = _episodes(episodes_path)
    assert sum(_check_token_group(g, episodes, model_dir) for g in groups) == 4
    for g in groups:
        assert g["messages"] and g["messages"][0][-1]["role"] == "assistant"  # process mode includes them
    assert "use_wandb=False" in res.stdout  # process mode would turn wandb on; the CLI keeps it off


def test_process_mode_on_a_chat_endpoint_sends_messages_only(
    served: str, model_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "groups.jsonl"
    res = subprocess.run(
        _adapter_cmd(
            "process",
            "tiny_tasks",
            "--env.group_size", "2",
            "--env.total_steps", "1",
            "--env.tokenizer_name", str(model_dir),
            "--env.data_path_to_save_groups", str(out),
            "--env.trajforge_overrides", OVERRIDES,
            "--openai.base_url", served + "/v1",
            "--openai.server_type", "openai",
            "--openai.model_name", model_dir.name,
        ),
        capture_output=True,
        text=True,
        timeout=280,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    (group,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert group["tokens"] == [[], []] and group["masks"] == [[], []]
    assert group["inference_logprobs"] is None
    assert all(o["trainable_on_tokens"] is False and o["set_advantage_to_zero"] for o in group["overrides"])
    roles = [m["role"] for m in group["messages"][0]]
    assert roles[0] == "user" and "assistant" in roles and all("content" in m for m in group["messages"][0])


def test_evaluate_mode_writes_atropos_metrics(served: str, model_dir: Path, tmp_path: Path) -> None:
    evals = tmp_path / "evals"
    res = subprocess.run(
        _adapter_cmd(
            "evaluate",
            "tiny_tasks",
            "--env.eval_n", "2",
            "--env.tokenizer_name", str(model_dir),
            "--env.data_dir_to_save_evals", str(evals),
            "--env.trajforge_overrides", OVERRIDES,
            "--openai.base_url", served,
            "--openai.server_type", "vllm",
            "--openai.model_name", model_dir.name,
        ),
        capture_output=True,
        text=True,
        timeout=280,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    metrics = json.loads((evals / "metrics.json").read_text())["results"]["all"]
    assert metrics["eval/episodes"] == 2.0 and 0.0 <= metrics["eval/mean_reward"] <= 1.0
    samples = [json.loads(line) for line in (evals / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 2 and all(s["trace"] and s["env"] == "tiny_tasks" for s in samples)


def test_cli_refuses_a_key_in_the_server_config(model_dir: Path, tmp_path: Path) -> None:
    res = subprocess.run(
        _adapter_cmd(
            "process",
            "tiny_tasks",
            "--env.tokenizer_name", str(model_dir),
            "--openai.base_url", "http://127.0.0.1:9/v1",
            "--openai.api_key", "sk-secret-value",
            "--env.data_path_to_save_groups", str(tmp_path / "out" / "never.jsonl"),
        ),
        capture_output=True,
        text=True,
        timeout=120,
    )  # fmt: skip
    assert res.returncode == 2 and "api_key_env" in res.stderr
    assert "sk-secret-value" not in res.stdout + res.stderr  # refused before atroposlib prints its config
    assert not (tmp_path / "out").exists()  # and before it opens its output


def test_cli_needs_a_local_tokenizer(tmp_path: Path) -> None:
    res = subprocess.run(
        _adapter_cmd(
            "process",
            "tiny_tasks",
            "--env.tokenizer_name", "NousResearch/some-hub-name",
            "--openai.base_url", "http://127.0.0.1:9/v1",
            "--env.data_path_to_save_groups", str(tmp_path / "g.jsonl"),
        ),
        capture_output=True,
        text=True,
        timeout=120,
    )  # fmt: skip
    assert res.returncode == 2 and "local tokenizer directory" in res.stderr


# ---------------------------------------------------------------------------- the conversion rules


def _ep(rollout: int, reward: float, *, status: str = "completed", trace: bool = True, **kw: Any) -> Episode:
    tokens = [5, 6, 7, 8, 9]
    rec = TokenRecord(tokens=tokens, masks=[-100, -100, 7, 8, -100], logprobs=[1.0, 1.0, -0.5, -0.25, 1.0])
    return Episode(
        env="t",
        item_id="item",
        rollout=rollout,
        group_size=4,
        seed=rollout,
        item={"id": "item"},
        toolsets=[],
        tools=[],
        messages=[{"role": "user", "content": "q"}, {"role": "assistant", "content": None, "tool_calls": []}],
        status=status,
        termination="final_answer" if status != "failed" else kw.pop("termination", "model_error"),
        reward=Reward(value=reward, error=kw.pop("reward_error", None)),
        trace=rec if trace else None,
        **kw,
    )


def test_failed_episodes_are_left_out_counted_and_the_group_resized() -> None:
    eps = [
        _ep(0, 1.0),
        _ep(1, 0.0),
        _ep(2, 0.0, status="failed", termination="not_run", reason="sandbox: gone"),
        _ep(3, 0.0, reward_error="KeyError: x"),
    ]
    res = scored_group(eps, token_level=True, group_size=4, temperature=0.7)
    assert res.group is not None
    assert res.dropped == {"not_run": 1, "reward_error": 1}
    assert res.group["scores"] == [1.0, 0.0]  # nothing was sent as a score of 0 for a failure
    assert res.group["group_overrides"] == {"group_size": 2}  # how Atropos carries a smaller group
    assert res.group["masks"][0] == [-100, -100, 7, 8, -100]
    assert res.group["inference_logprobs"][0] == [1.0, 1.0, -0.5, -0.25, 1.0]
    assert res.group["generation_params"] == {"temperature": 0.7} and res.group["messages"] is None
    tally = GroupTally()
    assert tally.add(res, 4, drop_equal=True)
    assert tally.as_dict()["episodes_dropped"] == {"not_run": 1, "reward_error": 1}


def test_equal_scores_counted_and_token_level_without_trace_dropped() -> None:
    tally = GroupTally()
    same = scored_group([_ep(0, 0.0), _ep(1, 0.0)], token_level=True, group_size=2)
    assert same.group is not None and same.group["group_overrides"] == {}
    assert not tally.add(same, 2, drop_equal=True)  # serve mode: Atropos drops it
    assert tally.add(same, 2, drop_equal=False)  # process mode keeps it
    none_left = scored_group(
        [_ep(0, 1.0, trace=False), _ep(1, 0.0, status="failed")], token_level=True, group_size=2
    )
    assert none_left.group is None and none_left.dropped == {"no_token_trace": 1, "failed": 1}
    assert not tally.add(none_left, 2, drop_equal=True)
    assert tally.as_dict() | {"episodes_dropped": None} == {
        "groups": 3,
        "groups_sent": 1,
        "groups_equal_scores": 1,
        "groups_empty": 1,
        "episodes": 6,
        "episodes_sent": 2,
        "episodes_dropped": None,
    }
    assert tally.metrics()["trajforge/episodes_dropped_no_token_trace"] == 1.0


def test_phase_one_group_is_messages_only_and_marked() -> None:
    res = scored_group([_ep(0, 1.0, trace=False), _ep(1, 0.5, trace=False)], token_level=False, group_size=2)
    assert res.group is not None and res.dropped == {}
    assert res.group["tokens"] == [[], []] and res.group["inference_logprobs"] is None
    assert res.group["messages"][0][1] == {"role": "assistant", "content": None, "tool_calls": []}
    assert all(o["set_advantage_to_zero"] and not o["trainable_on_tokens"] for o in res.group["overrides"])


def test_per_sampled_token_advantages_are_aligned_to_positions() -> None:
    ep = _ep(0, 1.0)
    assert ep.trace is not None
    ep = ep.model_copy(update={"reward": Reward(value=1.0, token_advantages=[0.5, -0.5])})
    with pytest.raises(ValueError, match="some episodes"):
        scored_group([ep, _ep(1, 0.0)], token_level=True, group_size=2)
    ep2 = _ep(1, 0.0)
    assert ep2.trace is not None
    ep2 = ep2.model_copy(update={"reward": Reward(value=0.0, token_advantages=[0.0, 0.0, 1.0, 1.0, 0.0])})
    res = scored_group([ep, ep2], token_level=True, group_size=2)
    assert res.group is not None
    assert res.group["advantages"] == [[0.0, 0.0, 0.5, -0.5, 0.0], [0.0, 0.0, 1.0, 1.0, 0.0]]
