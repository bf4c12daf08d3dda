"""Guided groups (``--guide oracle``): a group with no success gets the env's reference trajectory.

Real parts: the tiny_tasks env, its oracle and verifier, bubblewrap sandboxes, a tiny Qwen2 with a
real (byte-level BPE + Jinja ChatML) tokenizer. The group's other episodes are the do-nothing
agent's (real rollouts that score 0), standing in for a policy that never solves the item.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from trajforge.envs.agents import agent_model_for
from trajforge.envs.catalog import load_env
from trajforge.envs.running.episode import RolloutBackends, Rollouts
from trajforge.envs.types import Episode
from trajforge.llm.chat_template import ChatTemplate
from trajforge.llm.token_trace import MASKED, MASKED_LOGPROB
from trajforge.rl.grpo import Sample, collate, group_advantages, token_logprobs
from trajforge.rl.guide import attach_guided_traces, guide_group
from trajforge.rl.samples import StepRollouts, build_samples, rollout_metrics
from trajforge.sandbox import close_factory, create_sandbox_factory
from trajforge.sandbox.types import SandboxConfig
from trajforge.testing.tiny import IM_END, build_tiny_model, build_tiny_tokenizer
from trajforge.tools.builtin import default_registry

pytestmark = [
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
    pytest.mark.timeout(120),
]

GROUP = 3


def _runs(flags: list[bool]) -> list[tuple[int, int]]:
    """[start, end) of each run of True."""
    out, start = [], None
    for i, f in enumerate([*flags, False]):
        if f and start is None:
            start = i
        elif not f and start is not None:
            out.append((start, i))
            start = None
    return out


def _expected_turn_text(msg: dict[str, Any]) -> list[Any]:
    """What the policy writes for an assistant turn: its reasoning, then tool calls as parsed
    JSON or its content."""
    head = [str(msg.get("reasoning") or "")]
    if msg.get("tool_calls"):
        return head + [
            {"name": tc["function"]["name"], "arguments": json.loads(tc["function"]["arguments"])}
            for tc in msg["tool_calls"]
        ]
    return head + [str(msg.get("content") or "")]


def _parsed_turn(text: str) -> list[Any]:
    assert text.endswith(IM_END), text
    body = text[: -len(IM_END)]
    thought = ""
    if body.startswith("<think>\n"):
        thought, body = body[len("<think>\n") :].split("\n</think>\n", 1)
        body = body.lstrip("\n")
    if body.startswith("<tool_call>"):
        blocks = [b.split("</tool_call>")[0] for b in body.split("<tool_call>")[1:]]
        return [thought, *(json.loads(b) for b in blocks)]
    return [thought, body]


async def test_group_without_success_gets_one_oracle_sample(tmp_path: Path) -> None:
    tokenizer = build_tiny_tokenizer(tmp_path / "m", "chatml")
    model = build_tiny_model(tmp_path / "m", tokenizer)
    template = ChatTemplate(tokenizer, end_of_turn=IM_END)

    env = load_env("tiny_tasks", {"families": ["write_file"], "sandbox": "bwrap"})
    await env.setup()
    item = await env.get_next_item()
    factory = create_sandbox_factory(SandboxConfig(kind="bwrap", command_timeout_s=30))
    registry = default_registry()
    try:
        failing = Rollouts(
            env,
            RolloutBackends(None, factory, registry, model_for=agent_model_for(env, "none")),  # type: ignore[arg-type]
        )
        oracle = Rollouts(
            env,
            RolloutBackends(None, factory, registry, model_for=agent_model_for(env, "oracle")),  # type: ignore[arg-type]
        )
        group = [await failing.episode(item, rollout=r, group_size=GROUP, seed=r + 1) for r in range(GROUP)]
        assert [float(e.reward.value) for e in group] == [0.0] * GROUP  # nothing solved: no signal

        guided_group, guided = await guide_group(group, oracle, item, seed=99)
        assert guided is not None and guided.model == "oracle"
        assert guided_group[:-1] == group[:-1] and guided_group[-1] is guided
        assert float(guided.reward.value) == 1.0 and guided.trace is None

        schemas = registry.schemas(registry.for_toolsets(guided.toolsets))
        attached = attach_guided_traces([guided], model, template, [schemas], temperature=1.0)
        assert attached == 1 and guided.trace is not None

        batch = build_samples(StepRollouts(groups=[guided_group], version=0, weights_step=0, guided=[guided]))
        assert len(batch.samples) == 1 and batch.guided_samples == 1  # the do-nothing turns have no trace
        metrics = rollout_metrics(batch)
        assert metrics["guided_samples"] == 1 and metrics["guided_groups"] == 1
        assert metrics["episodes"] == GROUP - 1 and metrics["reward_mean"] == 0.0  # the policy's own
        sample = batch.samples[0]
        rewards = [float(e.reward.value) for e in guided_group]
        assert sample.advantage == pytest.approx(group_advantages(rewards)[-1]) and sample.advantage > 0

        # The whole sequence is the template's render of the oracle conversation ...
        rendered = template.render(guided.messages, schemas, add_generation_prompt=False)
        assert template.decode(sample.tokens) + "\n" == rendered
        # ... and the trained positions are exactly its assistant turns, each ending at <|im_end|>.
        assistant = [m for m in guided.messages if m.get("role") == "assistant"]
        runs = _runs(sample.sampled)
        assert len(runs) == len(assistant) >= 2  # the tool call(s) and the final answer
        for (start, end), msg in zip(runs, assistant, strict=True):
            assert _parsed_turn(template.decode(sample.tokens[start:end])) == _expected_turn_text(msg)
            gen_prompt = template.encode("<|im_start|>assistant\n")
            assert sample.tokens[start - len(gen_prompt) : start] == gen_prompt
        trace = guided.trace
        assert [m != MASKED for m in trace.masks] == sample.sampled
        assert all(
            lp == MASKED_LOGPROB for lp, s in zip(trace.logprobs, sample.sampled, strict=True) if not s
        )

        # "Sampler" logprobs are the current policy's: the importance ratio starts at 1.
        b = collate([sample], 0)
        with torch.no_grad():
            lp, _ = token_logprobs(model, b)
        assert torch.allclose(lp * b.loss_mask, b.old_logprobs, atol=1e-5)

        # A group that already has a success is left as sampled (the oracle is not run into it).
        solved = [await oracle.episode(item, rollout=r, group_size=2, seed=r + 5) for r in range(2)]
        assert all(isinstance(e, Episode) and float(e.reward.value) == 1.0 for e in solved)
        kept, none = await guide_group(solved, oracle, item, seed=7)
        assert none is None and kept is solved
    finally:
        await close_factory(factory)


@pytest.mark.parametrize("family", ["write_file", "find_value", "count_lines", "arithmetic"])
async def test_oracle_writes_in_the_embedded_policys_own_style(family: str) -> None:
    """A guided sample must differ from what the policy writes only where the policy is wrong.

    The tiny policy was taught on ``models/tiny/data.py``'s conversations (a ``<think>`` block
    per turn, arguments laid out by ``json.dumps``). The tiny_tasks oracle's conversation for the
    same task, rendered by the policy's own chat template, must be the same text; before this was
    so, every guided sample also taught the policy to stop thinking and to write compact JSON
    (the closed loop's count_lines, never trained on, lost 17.5 points). And under the recipe's
    policy -- the closed loop's start, where the guide is used -- only the copied value is
    unlikely: every other sampled token has p > 0.5. (The committed weights, the loop's result,
    are likely everywhere and would not test it.)
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trajforge.endpoint import recipe_weights
    from trajforge.models.tiny.data import solve_in_sandbox
    from trajforge.rl.guide import oracle_trace
    from trajforge.tasks import Task, setup_task
    from trajforge.tools.base import ToolContext

    weights = recipe_weights()
    tokenizer = AutoTokenizer.from_pretrained(weights)
    template = ChatTemplate(tokenizer, end_of_turn=IM_END)
    env = load_env("tiny_tasks", {"families": [family], "sandbox": "bwrap"})
    await env.setup()
    item = await env.get_next_item()
    factory = create_sandbox_factory(SandboxConfig(kind="bwrap", command_timeout_s=30))
    registry = default_registry()
    try:
        oracle = Rollouts(
            env,
            RolloutBackends(None, factory, registry, model_for=agent_model_for(env, "oracle")),  # type: ignore[arg-type]
        )
        ep = await oracle.episode(item, rollout=0, group_size=1, seed=1)
        assert float(ep.reward.value) == 1.0, ep.reward.reason
        task = Task.from_row(item)
        sandbox = await factory.create(task.id)
        try:
            await setup_task(task, sandbox)
            taught = await solve_in_sandbox(task, registry, ToolContext(task_id=task.id, sandbox=sandbox))
        finally:
            await sandbox.close()
    finally:
        await close_factory(factory)

    start = next(i for i, m in enumerate(ep.messages) if m.get("role") == "user")
    head = ep.messages[: start + 1]
    schemas = registry.schemas(registry.for_toolsets(ep.toolsets))
    rendered = template.render([*head, *ep.messages[start + 1 :]], schemas, add_generation_prompt=False)
    assert rendered == template.render([*head, *taught], schemas, add_generation_prompt=False)

    model = AutoModelForCausalLM.from_pretrained(weights).eval()
    tokens, sampled = oracle_trace(ep.messages, template, schemas)
    with torch.no_grad():
        lp, _ = token_logprobs(model, collate([Sample(tokens, sampled, [0.0] * len(tokens), 0.0)], 0))
    unlikely = [
        tokenizer.decode([tokens[i + 1]]) for i, p in enumerate(lp[0].tolist()) if sampled[i + 1] and p < -0.7
    ]
    assert len(unlikely) <= 3, unlikely  # the copied word/key (find_value names its key three times)
