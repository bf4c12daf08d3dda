"""Token-exact episodes: tiny real tokenizers, a scripted /generate server, real HTTP on loopback.

The multi-turn episodes go through :class:`CompletionChatModel` exactly as the agent loop uses
it (the whole history each turn, ``turn.to_message()`` appended), for every endpoint kind and
for a template that keeps reasoning (ChatML) and one that strips earlier ``<think>`` (Qwen3).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from trajforge.agent import AgentConfig, AgentLoop
from trajforge.agent.result import AgentResult
from trajforge.llm.chat_template import ChatTemplate, template_messages
from trajforge.llm.completion_model import CompletionChatModel, CompletionModelConfig
from trajforge.llm.token_trace import (
    MASKED,
    MASKED_LOGPROB,
    TraceError,
    build_episode_trace,
)
from trajforge.llm.types import SamplingParams, TokenTrace
from trajforge.testing.tiny import CHATML_TEMPLATE, build_tiny_model, build_tiny_tokenizer
from trajforge.testing.token_server import ScriptedReply, TokenServer, TorchSampler
from trajforge.tools.base import FunctionTool, ToolContext, ToolOutput

ENDPOINTS = ["vllm_generate", "sglang_generate", "openai_completions"]

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "terminal",
            "description": "Run a shell command.",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "write_file",
            "description": "Write a file.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
            },
        },
    },
]


def call_text(name: str, args: dict[str, Any]) -> str:
    """A Hermes call exactly as the tiny templates render one (so ChatML re-renders identically)."""
    payload = json.dumps({"name": name, "arguments": args}, ensure_ascii=False)
    return f"<tool_call>\n{payload}\n</tool_call>"


TURN0 = "<think>\nI should list the files first.\n</think>\n\nLet me look.\n" + call_text(
    "terminal", {"command": "ls -la"}
)
TURN1 = (
    "<think>\nNow write two files.\n</think>\n\n"
    + call_text("write_file", {"path": "café.txt", "content": "日本語 🙂"})
    + "\n"
    + call_text("write_file", {"path": "b.txt", "content": "x"})
)
TURN2 = "<think>\nDone.\n</think>\n\nAll files are written. The answer is 42."


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("tiny")
    out = {}
    for name in ("chatml", "qwen3"):
        build_tiny_tokenizer(root / name, name)
        out[name] = str(root / name)
    return out


def make_model(path: str, base_url: str, endpoint: str, **kw: Any) -> CompletionChatModel:
    cfg = CompletionModelConfig(
        tokenizer_path=path, base_url=base_url, endpoint=endpoint, backoff_base_s=0, **kw
    )
    return CompletionChatModel(cfg)


async def run_episode(model: CompletionChatModel) -> tuple[list[dict[str, Any]], list[TokenTrace]]:
    """What the agent loop does: whole history in, to_message() appended, tool results after."""
    traces: list[TokenTrace] = []
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Please create the files."},
    ]
    for step in range(3):
        turn = await model.complete(messages, TOOLS, SamplingParams(temperature=1.0, max_tokens=512))
        assert turn.token_trace is not None
        traces.append(turn.token_trace)
        messages.append(turn.to_message())
        for call in turn.tool_calls:
            messages.append({"role": "tool", "tool_call_id": call.id, "content": f"ok {call.name}"})
        if step == 1:  # a later user turn in the middle of the episode
            messages.append({"role": "user", "content": "Thanks, now finish."})
    return messages, traces


@pytest.mark.parametrize("endpoint", ENDPOINTS)
@pytest.mark.parametrize("template_name", ["chatml", "qwen3"])
async def test_multi_turn_episode_is_token_exact(
    tiny_dirs: dict[str, str], endpoint: str, template_name: str
) -> None:
    path = tiny_dirs[template_name]
    tok = AutoTokenizer.from_pretrained(path)
    template = ChatTemplate(tok)
    async with TokenServer(tok, [TURN0, TURN1, TURN2]) as server:
        model = make_model(path, server.base_url, endpoint)
        try:
            messages, traces = await run_episode(model)
        finally:
            await model.aclose()
    assert [len(m.get("tool_calls") or []) for m in messages if m["role"] == "assistant"] == [1, 2, 0]
    assert messages[-1]["content"] == "All files are written. The answer is 42."
    assert messages[2]["reasoning"] == "I should list the files first."

    served = server.served
    ep = build_episode_trace(traces, messages=messages, template=template, tools=TOOLS)
    # The concatenation rule: each turn's prompt is exactly the tokens before its span.
    for k, (span, s) in enumerate(zip(ep.spans, served, strict=True)):
        assert ep.tokens[: span.start] == s.prompt_ids, f"turn {k} prompt"
        assert ep.tokens[span.start : span.end] == s.ids
        assert ep.logprobs[span.start : span.end] == s.logprobs
    # Masks cover exactly the sampled tokens; logprobs are 1.0 everywhere else.
    sampled = {i for span in ep.spans for i in range(span.start, span.end)}
    assert len(ep.tokens) == len(ep.masks) == len(ep.logprobs)
    for i, (t, m, lp) in enumerate(zip(ep.tokens, ep.masks, ep.logprobs, strict=True)):
        if i in sampled:
            assert m == t and lp != MASKED_LOGPROB
        else:
            assert m == MASKED and lp == MASKED_LOGPROB
    assert ep.num_sampled == sum(len(s.ids) for s in served)
    # The first prompt is the template's own rendering; every segment between turns is template text.
    assert served[0].prompt_ids == template.prompt_ids(messages[:2], TOOLS)
    # decode(tokens) is the whole conversation as the model saw it: the ChatML rendering (which
    # keeps every turn's reasoning) minus the trailing newline the model never samples.
    full = tok.apply_chat_template(
        template_messages(messages), tools=TOOLS, tokenize=False, chat_template=CHATML_TEMPLATE
    )
    assert template.decode(ep.tokens) == full.removesuffix("\n")

    assert ep.drift is not None
    if template_name == "chatml":
        assert ep.drift.reproduces is True and ep.drift.first_diff_index is None
    else:  # Qwen3-style re-rendering drops turn 0's <think>: the first difference is where it began
        assert ep.drift.reproduces is False
        assert ep.drift.first_diff_index == ep.spans[0].start
        assert ep.tokens[ep.spans[0].start] == tok.convert_tokens_to_ids("<think>")
        assert "<think>" in ep.drift.trace_context and "<think>" not in ep.drift.rendered_context


async def test_sampled_ids_are_never_retokenized(tiny_dirs: dict[str, str]) -> None:
    """A non-canonical split of sampled text survives into every later prompt, unchanged."""
    path = tiny_dirs["chatml"]
    tok = AutoTokenizer.from_pretrained(path)
    head, tail = TURN0.split("Let me look.")
    odd = [i for ch in "Let me look." for i in tok.encode(ch, add_special_tokens=False)]
    ids = tok.encode(head, add_special_tokens=False) + odd + tok.encode(tail, add_special_tokens=False)
    assert ids != tok.encode(TURN0, add_special_tokens=False)  # really not the canonical tokenization
    assert tok.decode(ids) == TURN0
    async with TokenServer(tok, [ScriptedReply(ids=ids), TURN1, TURN2]) as server:
        model = make_model(path, server.base_url, "vllm_generate")
        messages, traces = await run_episode(model)
        await model.aclose()
    assert messages[2]["content"] == "Let me look."
    first = server.served[0]
    for later in server.served[1:]:
        assert later.prompt_ids[: len(first.prompt_ids) + len(first.ids)] == first.prompt_ids + first.ids
    ep = build_episode_trace(traces, messages=messages, template=ChatTemplate(tok), tools=TOOLS)
    # Re-rendering tokenizes the text canonically, so it drifts exactly where the odd split starts.
    assert ep.drift is not None and not ep.drift.reproduces
    canonical = tok.encode(TURN0, add_special_tokens=False)
    odd_at = next(i for i, (a, b) in enumerate(zip(ids, canonical, strict=False)) if a != b)
    assert odd_at >= len(tok.encode(head, add_special_tokens=False))
    assert ep.drift.first_diff_index == ep.spans[0].start + odd_at


async def test_turn_cut_off_before_end_of_turn_gets_a_masked_marker(tiny_dirs: dict[str, str]) -> None:
    """No sampled <|im_end|> (max_tokens / stop string): the template's marker is inserted, masked."""
    path = tiny_dirs["chatml"]
    tok = AutoTokenizer.from_pretrained(path)
    eot = tok.convert_tokens_to_ids("<|im_end|>")
    cut = ScriptedReply(TURN0, end_turn=False, finish_reason="length")
    async with TokenServer(tok, [cut, TURN1, TURN2]) as server:
        model = make_model(path, server.base_url, "sglang_generate")
        messages, traces = await run_episode(model)
        await model.aclose()
    assert server.served[0].ids[-1] != eot
    ep = build_episode_trace(traces, messages=messages, template=ChatTemplate(tok), tools=TOOLS)
    end0 = ep.spans[0].end
    assert ep.tokens[end0] == eot and ep.masks[end0] == MASKED and ep.logprobs[end0] == MASKED_LOGPROB
    assert ep.spans[0].finish_reason == "length"
    assert ep.drift is not None and ep.drift.reproduces  # the text is the same; only who wrote it differs


def test_traces_that_do_not_extend_each_other_are_refused() -> None:
    ok = TokenTrace(prompt_ids=[1, 2, 3], completion_ids=[4, 5], completion_logprobs=[-0.1, -0.2])
    rerendered = TokenTrace(prompt_ids=[1, 2, 3, 9, 5, 6], completion_ids=[7], completion_logprobs=[-0.3])
    with pytest.raises(TraceError, match=r"turn 1: .*index 3"):
        build_episode_trace([ok, rerendered])
    bad = TokenTrace(prompt_ids=[1], completion_ids=[2, 3], completion_logprobs=[-0.1])
    with pytest.raises(TraceError, match="2 sampled ids but 1 logprobs"):
        build_episode_trace([bad])
    with pytest.raises(TraceError, match="not token-exact"):
        build_episode_trace([])
    ep = build_episode_trace(
        [ok, TokenTrace(prompt_ids=[1, 2, 3, 4, 5, 6], completion_ids=[7], completion_logprobs=[-0.3])]
    )
    assert ep.tokens == [1, 2, 3, 4, 5, 6, 7]
    assert ep.masks == [MASKED, MASKED, MASKED, 4, 5, MASKED, 7]
    assert ep.logprobs == [1.0, 1.0, 1.0, -0.1, -0.2, 1.0, -0.3]
    assert [(s.start, s.end) for s in ep.spans] == [(3, 5), (6, 7)]


async def test_agent_loop_result_gives_an_exact_episode(tiny_dirs: dict[str, str]) -> None:
    """The real AgentLoop, unchanged, collects token traces that assemble into one exact episode."""
    path = tiny_dirs["qwen3"]
    tok = AutoTokenizer.from_pretrained(path)

    async def handler(args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        return ToolOutput(content=f"ran {json.dumps(args, ensure_ascii=False)}")

    tools = [
        FunctionTool(
            name=t["function"]["name"],
            toolset="test",
            description=t["function"]["description"],
            parameters=t["function"]["parameters"],
            handler=handler,
        )
        for t in TOOLS
    ]
    bad_call = "<think>\nOops.\n</think>\n\n<tool_call>\n{not json\n</tool_call>"
    async with TokenServer(tok, [TURN0, bad_call, TURN1, TURN2]) as server:
        model = make_model(path, server.base_url, "openai_completions")
        loop = AgentLoop(
            model,
            tools,
            ToolContext(task_id="t", sandbox=None),
            AgentConfig(system_prompt="You are a helpful assistant.", max_turns=6),
        )
        result = await loop.run([{"role": "user", "content": "Please create the files."}])
        await model.aclose()
    assert result.finished_naturally, result.error
    assert len(result.token_traces) == 4 and result.tool_errors[0].tool_name == "<parse>"
    ep = AgentResult.model_validate(result.model_dump()).episode_trace(ChatTemplate(tok), TOOLS)
    assert [ep.tokens[s.start : s.end] for s in ep.spans] == [s.ids for s in server.served]
    assert ep.drift is not None and not ep.drift.reproduces
    assert ep.drift.first_diff_index == ep.spans[0].start


async def test_real_tiny_model_sampling_logprobs_line_up(tmp_path: Any) -> None:
    """With a real (random) model behind the server, the trace's logprobs are the model's own."""
    tok = build_tiny_tokenizer(tmp_path / "tok", "chatml")
    model_dir = tmp_path / "model"
    lm = build_tiny_model(model_dir, tok, hidden=32, layers=2)
    reloaded = AutoModelForCausalLM.from_pretrained(str(model_dir)).eval()
    sampler = TorchSampler(reloaded, stop_ids=[tok.eos_token_id])
    async with TokenServer(tok, sampler=sampler) as server:
        model = make_model(str(model_dir), server.base_url, "vllm_generate")
        turn = await model.complete(
            [{"role": "user", "content": "hi"}], None, SamplingParams(max_tokens=6, seed=3)
        )
        await model.aclose()
    trace = turn.token_trace
    assert trace is not None and 1 <= len(trace.completion_ids) <= 6
    ids = trace.prompt_ids + trace.completion_ids
    with torch.no_grad():
        logp = torch.log_softmax(lm(torch.tensor([ids])).logits[0].float(), dim=-1)
    n = len(trace.prompt_ids)
    expected = [float(logp[n + i - 1, t]) for i, t in enumerate(trace.completion_ids)]
    assert trace.completion_logprobs == pytest.approx(expected, abs=1e-4)


def test_tiny_tokenizer_round_trips_offline(tiny_dirs: dict[str, str]) -> None:
    tok = AutoTokenizer.from_pretrained(tiny_dirs["chatml"], local_files_only=True)
    text = 'Größe 日本語 🙂 <tool_call>\n{"a": [1, 2]}\n</tool_call><|im_end|>'
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids) == text
    for marker in ("<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>", "</tool_response>"):
        assert len(tok.encode(marker, add_special_tokens=False)) == 1, marker
    assert tok.eos_token == "<|im_end|>" and tok.pad_token is not None
    # Only the Qwen3-style template drops the reasoning of an assistant turn that is not last.
    msgs = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "a", "reasoning_content": "secret"},
        {"role": "user", "content": "q2"},
    ]
    assert "secret" in tok.apply_chat_template(msgs, tokenize=False)
    qwen = AutoTokenizer.from_pretrained(tiny_dirs["qwen3"], local_files_only=True)
    assert "secret" not in qwen.apply_chat_template(msgs, tokenize=False)
    assert "secret" in qwen.apply_chat_template(msgs[:2], tokenize=False)
    with pytest.raises(ValueError, match="unknown template"):
        build_tiny_tokenizer(tiny_dirs["chatml"] + "-x", "llama")  # type: ignore[arg-type]
