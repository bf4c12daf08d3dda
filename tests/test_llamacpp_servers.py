"""trajforge against the llama.cpp servers people run (issue 37), built from PyPI's source.

llama.cpp's ``llama-server`` and llama-cpp-python's server (``tests/llamacpp.py``: ``make llamacpp``
builds both and converts the embedded tiny policy to GGUF) serve the same weights as
``trajforge serve``. Against each: the shipped chat template renders as transformers renders it,
the tokenizer splits as ours, ``batch`` and ``env eval`` run every tool call the model writes and
solve what ``trajforge serve`` solves, the token-exact path gives ``trajforge serve``'s tokens and
logprobs on llama-server and is refused at preflight, with the reason, on llama-cpp-python.
Greedy sampling throughout, so the servers' own arithmetic is the only difference.

Where llama.cpp could not be built, every test here skips saying why.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from typer.testing import CliRunner

import llamacpp
from trajforge.cli.main import app
from trajforge.endpoint import EndpointConfig, build_token_model, embedded_weights, preflight_model
from trajforge.llm.openai_client import OpenAIChatModel, OpenAIModelConfig
from trajforge.llm.types import ModelError, ModelErrorKind
from trajforge.models.tiny.template import CHAT_TEMPLATE
from trajforge.tasks import generate_mixed
from trajforge.tasks.generate import POLICY_FAMILIES
from trajforge.tools.builtin import default_registry

pytestmark = pytest.mark.slow

ROWS = 8  # tiny_tasks rows each batch runs (benchmarks/servers.py measures 30)
SERVERS = ("llama-server", "llama-cpp-python")


@pytest.fixture(scope="module")
def built() -> llamacpp.Built:
    reason = llamacpp.why_not()
    if reason:
        pytest.skip(f"llama.cpp servers unavailable: {reason}")
    return llamacpp.built()


@pytest.fixture(scope="module")
def servers(built: llamacpp.Built, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """Both servers on loopback for the module: name -> ``.../v1`` base URL."""
    logs = tmp_path_factory.mktemp("llamacpp-logs")
    with contextlib.ExitStack() as stack:
        yield {name: stack.enter_context(llamacpp.serve(name, logs)) for name in SERVERS}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("rows") / "tasks.jsonl"
    rows = [t.to_row() for t in generate_mixed(POLICY_FAMILIES, ROWS, seed=37)]
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return path


def _batch(
    dataset: Path, out: Path, name: str, base_url: str | None = None, **settings: Any
) -> list[dict[str, Any]]:
    import asyncio

    return asyncio.run(llamacpp.tiny_tasks_batch(dataset, out, name, base_url, concurrency=4, **settings))


@pytest.fixture(scope="module")
def reference(dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """The same rows through ``trajforge serve`` (the embedded policy), token level: the yardstick."""
    return _batch(dataset, tmp_path_factory.mktemp("ref"), "ref", tokenizer="auto")


# --------------------------------------------------------------------------------------------
# The template and the tokenizer


def _conversations() -> list[tuple[list[dict[str, Any]], list[dict[str, Any]] | None]]:
    registry = default_registry()
    tools = registry.schemas(registry.for_toolsets(["terminal", "file"]))
    call = {
        "id": "c1",
        "type": "function",
        "function": {"name": "terminal", "arguments": '{"command": "ls"}'},
    }
    read = {
        "id": "c2",
        "type": "function",
        "function": {"name": "read_file", "arguments": '{"path": "é.txt"}'},
    }
    return [
        ([{"role": "user", "content": "hi"}], None),
        ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "count a.txt"}], tools),
        (
            [
                {"role": "user", "content": "What is 2 + 2? Use the terminal."},
                {
                    "role": "assistant",
                    "content": "",
                    "reasoning_content": "I should add",
                    "tool_calls": [call, read],
                },
                {"role": "tool", "tool_call_id": "c1", "content": '{"output": "4\\n", "exit_code": 0}'},
                {"role": "tool", "tool_call_id": "c2", "content": "déjà vu\n"},
                {"role": "assistant", "content": "Checking.", "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c1", "content": "4"},
                {"role": "assistant", "content": "4", "reasoning_content": "It printed 4."},
                {"role": "user", "content": "thanks"},
            ],
            tools,
        ),
    ]


def _post(url: str, body: dict[str, Any]) -> Any:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as resp:  # noqa: S310 (loopback)
        return json.load(resp)


def test_the_shipped_template_renders_identically_in_transformers_and_both_llama_cpp_engines(
    built: llamacpp.Built, servers: dict[str, str]
) -> None:
    """llama-server's own Jinja engine (``/apply-template``) and llama-cpp-python's (jinja2 with its
    ``{% generation %}`` pass-through) give the prompt transformers gives, byte for byte."""
    from transformers.utils.chat_template_utils import render_jinja_template

    root = servers["llama-server"].removesuffix("/v1")
    script = (
        "import json, sys; from llama_cpp.llama_chat_format import Jinja2ChatFormatter as F; "
        "t, cases = json.load(sys.stdin); "
        "print(json.dumps([F(t, eos_token='<|im_end|>', bos_token='<|endoftext|>')"
        "(messages=m, tools=tl).prompt for m, tl in cases]))"
    )
    cases = _conversations()
    done = subprocess.run(
        [str(built.python), "-c", script],
        env=built.python_env(),
        input=json.dumps([CHAT_TEMPLATE, cases]),
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    by_python_engine = json.loads(done.stdout)
    for (messages, tools), other in zip(cases, by_python_engine, strict=True):
        ours = render_jinja_template(
            [messages], tools=tools, chat_template=CHAT_TEMPLATE, add_generation_prompt=True
        )
        expected = ours[0][0]
        assert _post(f"{root}/apply-template", {"messages": messages, "tools": tools})["prompt"] == expected
        assert other == expected


def test_llama_server_tokenizes_the_policys_texts_as_our_tokenizer(servers: dict[str, str]) -> None:
    """The GGUF's pre-tokenizer (trajforge.models.tiny.gguf: llama.cpp's starcoder) splits as ours."""
    from transformers import AutoTokenizer
    from transformers.utils.chat_template_utils import render_jinja_template

    tok = AutoTokenizer.from_pretrained(str(embedded_weights()))
    root = servers["llama-server"].removesuffix("/v1")
    texts = [
        render_jinja_template([m], tools=t, chat_template=CHAT_TEMPLATE)[0][0] for m, t in _conversations()
    ]
    texts += [t.prompt for t in generate_mixed(POLICY_FAMILIES, 40, seed=1)]
    texts += ["  two  spaces,\ttab\n\n\nnewlines 1234567 3.14 don't  \n", "é ü 日本 🚀 12٣"]
    for text in texts:
        theirs = _post(f"{root}/tokenize", {"content": text, "add_special": False, "parse_special": True})
        assert theirs["tokens"] == tok.encode(text, add_special_tokens=False), text


# --------------------------------------------------------------------------------------------
# The agent: batch and env eval


def _calls_written(line: dict[str, Any]) -> int:
    return sum(len(m.get("tool_calls") or ()) for m in line["messages"] if m["role"] == "assistant")


@pytest.mark.parametrize("server", SERVERS)
def test_batch_runs_every_tool_call_and_solves_what_trajforge_serve_solves(
    server: str, servers: dict[str, str], dataset: Path, reference: list[dict[str, Any]], tmp_path: Path
) -> None:
    lines = _batch(dataset, tmp_path, server, servers[server])
    assert [line["status"] for line in lines] == ["completed"] * ROWS, [line.get("reason") for line in lines]
    for line in lines:
        ran = sum(s["count"] for s in line["tool_stats"].values())
        assert ran == _calls_written(line) > 0, line["messages"]
        assert line["tool_error_counts"].get("<parse>", 0) == 0
        assert all("<tool_call>" not in (m.get("content") or "") for m in line["messages"])
    solved, ref_solved = (
        sum(line["reward"]["value"] == 1.0 for line in lines),
        sum(r["reward"]["value"] == 1.0 for r in reference),
    )
    assert abs(solved - ref_solved) <= 2, (solved, ref_solved)
    recovered = sum(len(line["recovered_calls"]) for line in lines)
    if server == "llama-cpp-python":  # it has no parser for Hermes calls: every call was recovered
        assert recovered == sum(_calls_written(line) for line in lines)
        # and it drops unknown message fields: the reasoning of earlier turns went back inline
    else:  # llama-server parsed them itself (--jinja, a Hermes template)
        assert recovered == 0


@pytest.mark.parametrize("server", SERVERS)
def test_env_eval_on_each_server(server: str, servers: dict[str, str], tmp_path: Path) -> None:
    out = CliRunner().invoke(
        app,
        [
            *("env", "eval", "tiny_tasks", "--model", "tiny", "--base-url", servers[server]),
            *("--max-samples", "4", "--group-size", "1", "--temperature", "0"),
            *("--output-dir", str(tmp_path), "--run-name", "e", "--json"),
        ],
        env={"OPENAI_API_KEY": "", "OPENROUTER_API_KEY": ""},
    )
    assert out.exit_code == 0, out.output
    episodes = [orjson.loads(x) for x in (tmp_path / "e" / "episodes.jsonl").read_bytes().splitlines()]
    assert len(episodes) == 4 and all(e["status"] == "completed" for e in episodes)
    assert all(sum(s["count"] for s in e["tool_stats"].values()) == _calls_written(e) for e in episodes)
    assert sum(e["reward"]["value"] for e in episodes) >= 3  # trajforge serve solves 4 of these 4 greedily


# --------------------------------------------------------------------------------------------
# Token level


def test_token_exact_on_llama_server_is_trajforge_serves(
    servers: dict[str, str], dataset: Path, reference: list[dict[str, Any]], tmp_path: Path
) -> None:
    """Through llama-server's /v1/completions (logprobs.content[{id, logprob}]): the same tokens as
    ``trajforge serve --tokenizer``, logprobs within 1e-3."""
    lines = _batch(dataset, tmp_path, "tok", servers["llama-server"], tokenizer=str(embedded_weights()))
    assert len(lines) == len(reference) == ROWS
    worst = 0.0
    for line, ref in zip(lines, reference, strict=True):
        assert line["trace"] is not None, line.get("trace_error")
        assert line["trace"]["tokens"] == ref["trace"]["tokens"]
        assert line["trace"]["masks"] == ref["trace"]["masks"]
        diffs = [abs(a - b) for a, b in zip(line["trace"]["logprobs"], ref["trace"]["logprobs"], strict=True)]
        worst = max(worst, *diffs)
    assert worst < 1e-3


async def test_token_exact_is_refused_at_preflight_on_llama_cpp_python(servers: dict[str, str]) -> None:
    model = build_token_model(
        EndpointConfig(model="tiny", base_url=servers["llama-cpp-python"], tokenizer=str(embedded_weights()))
    )
    try:
        with pytest.raises(ModelError) as info:
            await preflight_model(model)
    finally:
        await model.aclose()
    text = str(info.value)
    assert info.value.kind is ModelErrorKind.PERMANENT  # its 500 is a validation error: not retried
    assert "token-exact preflight" in text and "cannot sample from token ids" in text
    assert "llama-cpp-python" in text and "takes no token-id prompts" in text


# --------------------------------------------------------------------------------------------
# Usage


@pytest.mark.parametrize(("server", "known"), [("llama-server", True), ("llama-cpp-python", False)])
async def test_streamed_usage_is_what_the_server_said(
    server: str, known: bool, servers: dict[str, str]
) -> None:
    """llama-cpp-python ignores stream_options.include_usage: its streams' usage is unknown, not 0."""
    model = OpenAIChatModel(
        OpenAIModelConfig(base_url=servers[server], model="tiny", stream=True, api_key_env=None)
    )
    try:
        turn = await model.complete([{"role": "user", "content": "hi"}])
    finally:
        await model.aclose()
    assert (turn.usage.total_tokens is not None) is known
    if known:
        assert turn.usage.completion_tokens and turn.usage.total_tokens > turn.usage.completion_tokens
    else:
        assert turn.usage.prompt_tokens is None and turn.usage.completion_tokens is None
