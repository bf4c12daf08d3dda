"""The batched generation engine behind ``trajforge serve``, on a real tiny transformers model."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch

from trajforge.serve.chat import OutputSplitter, StreamSplitter
from trajforge.serve.config import ServeConfig
from trajforge.serve.detok import IncrementalText, StopText
from trajforge.serve.engine import Engine, RequestError
from trajforge.serve.sampling import SamplingSpec, choose, make_generator
from trajforge.serve.scripted import ScriptedLogits
from trajforge.testing.tiny import build_tiny_model, build_tiny_tokenizer


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tiny")
    build_tiny_model(out, build_tiny_tokenizer(out))
    return out


@pytest.fixture
async def engine(model_dir: Path):
    eng = await Engine.from_config(ServeConfig(model_path=model_dir, max_batch=8, batch_wait_ms=0))
    async with eng:
        yield eng


def _prompts(engine: Engine) -> list[list[int]]:
    tok = engine.tokenizer
    texts = ["hello", "Please create a file called hello.txt", "def main():\n    print('hi')", "日本語 🙂 ok"]
    return [tok.encode(t, add_special_tokens=False) for t in texts]


def _forward_logprobs(engine: Engine, prompt: list[int], out: list[int]) -> list[float]:
    """Recompute with one plain forward pass: log_softmax at each position, at the sampled token."""
    with torch.inference_mode():
        logits = engine._model(input_ids=torch.tensor([prompt + out])).logits[0].float()
    lp = torch.log_softmax(logits, dim=-1)
    return [float(lp[len(prompt) - 1 + j, t]) for j, t in enumerate(out)]


async def test_batched_greedy_equals_sequential_and_logprobs_match_forward(engine: Engine) -> None:
    prompts = _prompts(engine)
    spec = SamplingSpec(max_tokens=12, temperature=0.0, ignore_eos=True)
    handles = [engine.submit(p, spec) for p in prompts]  # all queued before the engine looks
    batched = await asyncio.gather(*(h.result() for h in handles))
    assert engine.stats.last_batch == len(prompts)
    for prompt, together in zip(prompts, batched, strict=True):
        alone = await engine.generate(prompt, spec)
        assert engine.stats.last_batch == 1
        assert together.token_ids == alone.token_ids
        assert together.logprobs == pytest.approx(alone.logprobs, abs=1e-4)
        assert together.logprobs == pytest.approx(
            _forward_logprobs(engine, prompt, together.token_ids), abs=1e-4
        )
        assert len(together.token_ids) == 12 and together.finish_reason == "length"


async def test_seeded_sampling_is_the_same_batched_or_alone(engine: Engine) -> None:
    prompts = _prompts(engine)
    specs = [SamplingSpec(max_tokens=10, temperature=1.0, seed=100 + i, ignore_eos=True) for i in range(4)]
    batched = await asyncio.gather(*(engine.generate(p, s) for p, s in zip(prompts, specs, strict=True)))
    for prompt, spec, together in zip(prompts, specs, batched, strict=True):
        alone = await engine.generate(prompt, spec)
        assert together.token_ids == alone.token_ids
        # raw logprobs (vLLM's default): the model's own distribution, not the tempered one
        assert together.logprobs == pytest.approx(
            _forward_logprobs(engine, prompt, together.token_ids), abs=1e-4
        )
    different_seed = await engine.generate(prompts[0], SamplingSpec(max_tokens=10, seed=999, ignore_eos=True))
    assert different_seed.token_ids != batched[0].token_ids


async def test_stop_string_cuts_text_and_stream_never_shows_it(engine: Engine) -> None:
    tok = engine.tokenizer
    script = tok.encode("hello world STOP more text", add_special_tokens=False)
    engine.logits_hook = ScriptedLogits(script)
    handle = engine.submit([1, 2, 3], SamplingSpec(max_tokens=40, temperature=0.0, stop=("STOP",)))
    streamed = "".join([e.text async for e in handle.stream()])
    result = await handle.result()
    assert result.text == "hello world " == streamed
    assert result.finish_reason == "stop" and result.stop_reason == "STOP"
    assert tok.decode(result.token_ids).startswith("hello world STOP")  # ids keep what was sampled


async def test_eos_ends_the_sequence_and_is_kept_in_token_ids(engine: Engine) -> None:
    tok = engine.tokenizer
    script = [*tok.encode("done", add_special_tokens=False), tok.eos_token_id]
    engine.logits_hook = ScriptedLogits(script)
    result = await engine.generate([5, 6], SamplingSpec(max_tokens=40, temperature=0.0))
    assert result.token_ids == script
    assert result.text == "done" and result.finish_reason == "stop" and result.stop_reason is None
    assert all(lp > -1e-3 for lp in result.logprobs)  # the hook's distribution is what is reported


async def test_bad_prompts_are_request_errors(engine: Engine) -> None:
    with pytest.raises(RequestError, match="empty"):
        engine.submit([], SamplingSpec(max_tokens=1))
    with pytest.raises(RequestError, match=r"integers in \[0, "):
        engine.submit([engine.vocab_size + 5], SamplingSpec(max_tokens=1))
    with pytest.raises(RequestError, match="maximum context length"):
        engine.submit([1] * 10, SamplingSpec(max_tokens=engine.context_length))


async def test_cancelled_sequence_aborts(engine: Engine) -> None:
    handle = engine.submit([1, 2, 3], SamplingSpec(max_tokens=500, temperature=0.0, ignore_eos=True))
    handle.cancel()
    result = await handle.result()
    assert result.finish_reason == "abort" and len(result.token_ids) < 500


def test_processed_logprobs_follow_the_sampling_distribution() -> None:
    torch.manual_seed(0)
    logits = torch.randn(50)
    gen = make_generator(3, torch.device("cpu"))
    greedy = choose(logits, SamplingSpec(max_tokens=1, temperature=0.0), gen, "processed")
    assert greedy.token_id == int(torch.argmax(logits)) and greedy.logprob == 0.0
    hot = choose(logits, SamplingSpec(max_tokens=1, temperature=0.5), gen, "processed")
    assert hot.logprob == pytest.approx(float(torch.log_softmax(logits / 0.5, -1)[hot.token_id]), abs=1e-5)
    raw = choose(logits, SamplingSpec(max_tokens=1, temperature=0.5, top_logprobs=3), gen, "raw")
    assert raw.logprob == pytest.approx(float(torch.log_softmax(logits, -1)[raw.token_id]), abs=1e-6)
    assert [t for t, _ in raw.top] == torch.topk(logits, 3).indices.tolist()
    top1 = choose(logits, SamplingSpec(max_tokens=1, temperature=1.0, top_k=1), gen, "raw")
    nucleus = choose(logits, SamplingSpec(max_tokens=1, temperature=1.0, top_p=1e-6), gen, "raw")
    assert top1.token_id == nucleus.token_id == greedy.token_id


def test_incremental_text_reassembles_unicode(model_dir: Path) -> None:
    tok = build_tiny_tokenizer(model_dir / "tok-copy")
    text = "Größe café 日本語 🙂 ✓ <tool_call> end"
    ids = tok.encode(text, add_special_tokens=False)
    inc = IncrementalText(tok)
    pieces = [inc.push(i) for i in ids] + [inc.flush()]
    assert "".join(pieces) == tok.decode(ids) == text
    assert all("\ufffd" not in p for p in pieces)


def test_stop_text_holds_back_partial_stop_strings() -> None:
    st = StopText(stop=("</answer>",))
    assert st.add("the answer </ans") == "the answer "
    assert st.add("wer> tail") == ""
    assert st.text == "the answer " and st.matched == "</answer>"
    keep = StopText(stop=("END",), include_stop=True)
    assert keep.add("xEN") + keep.add("D!") == "xEND"


@pytest.mark.parametrize(
    ("text", "opened"),
    [
        (
            "<think>\nplan it\n</think>\n\nHello there.\n<tool_call>\n"
            '{"name": "terminal", "arguments": {"command": "ls"}}\n</tool_call>',
            False,
        ),
        ("plan first\n</think>\nanswer 42", True),
        ("<think>never closed because max tokens", False),
        ("  plain answer with <b>html</b> and <tool_cal", False),
        ('<tool_call>\n{"name": broken}\n</tool_call> after', False),
        ("<thinking is not a tag> ok", False),
    ],
)
def test_stream_splitter_reassembles_to_the_final_split(text: str, opened: bool) -> None:
    from trajforge.llm.parsers import get_parser

    tools = [{"type": "function", "function": {"name": "terminal", "parameters": {"type": "object"}}}]
    for parser in (get_parser("hermes"), None):
        splitter = OutputSplitter(parser, tools, opened)
        final = splitter.split(text)
        for step in (1, 3, 7):
            stream = StreamSplitter(splitter)
            reasoning = content = ""
            for k in range(0, len(text), step):
                r, c = stream.feed(text[k : k + step])
                reasoning, content = reasoning + r, content + c
            if "</think>" in text:  # a closed think block streams whole before the end
                assert reasoning == final.reasoning
            if parser is not None and "<tool_call>" in text and final.content:
                assert content == final.content.split("<tool_call>")[0].strip()
            r, c = stream.finish(final)
            assert (reasoning + r, content + c) == (final.reasoning or "", final.content or "")
