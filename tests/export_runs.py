"""Real batch runs for the export tests: a scripted endpoint, local sandboxes, real tools.

The conversations are chosen to be hard on exports: tool calls whose argument keys differ from
call to call (``{"command"}``, ``{"command", "timeout"}``, ``{"path", "content"}``), reasoning,
prose next to a call, multi-turn tool use, and a run's own system prompt.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from trajforge.batch.runner import run_batch
from trajforge.testing.policies import count_assistant_turns
from trajforge.testing.scripted_server import Reply, ScriptedServer, ToolCallSpec

SYSTEM = "You are careful."
SCRIPTS: dict[str, list[Reply]] = {
    "make notes": [
        Reply(reasoning="check the directory", tool_calls=[ToolCallSpec("terminal", {"command": "echo hi"})]),
        Reply(tool_calls=[ToolCallSpec("write_file", {"path": "notes.txt", "content": "hi"})]),
        Reply(content="done: notes.txt written", reasoning="it worked"),
    ],
    "list files": [
        Reply(tool_calls=[ToolCallSpec("terminal", {"command": "ls", "timeout": 5})]),
        Reply(content="the directory is empty"),
    ],
    # prose, reasoning and a call in one turn (gpt-oss's template refuses that combination)
    "explain then act": [
        Reply(
            content="Let me look first.",
            reasoning="start with pwd",
            tool_calls=[ToolCallSpec("terminal", {"command": "pwd"})],
        ),
        Reply(content="you are in the sandbox"),
    ],
}
TEMPLATE_SAFE = ("make notes", "list files")


def _policy(body: dict[str, Any]) -> Reply:
    prompt = next(m["content"] for m in body["messages"] if m["role"] == "user")
    return SCRIPTS[prompt][count_assistant_turns(body)]


async def tool_run(
    tmp_path: Path, scripted_batch_config: Any, prompts: tuple[str, ...] = TEMPLATE_SAFE
) -> Path:
    """A finished run of the scripted tool conversations ``prompts``; returns its directory."""
    rows = [{"prompt": p} for p in prompts]
    async with ScriptedServer(_policy, api_key="k") as srv:
        cfg = scripted_batch_config(rows, srv.base_url, toolsets=["terminal", "file"], system_prompt=SYSTEM)
        await run_batch(cfg)
    return Path(cfg.run_dir)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(x) for x in path.read_bytes().splitlines() if x.strip()]


# Malformed calls as models really produce them (tests/test_export_calls.py): the endpoint returns
# the call as text (broken JSON, or valid JSON it did not parse), call markup next to a real call,
# arguments that are not a JSON object. The loop tells the model, never runs them.
BROKEN = '<tool_call>\n{"name": "terminal", "arguments": {"command": "ls"\n</tool_call>'
UNPARSED = 'Let me look.\n<tool_call>\n{"name": "terminal", "arguments": {"command": "ls"}}\n</tool_call>'
MALFORMED: dict[str, list[Reply]] = {
    "broken markup": [
        Reply(content=BROKEN, reasoning="call ls"),
        Reply(tool_calls=[ToolCallSpec("terminal", {"command": "echo fixed"})]),
        Reply(content="it printed fixed"),
    ],
    "markup as text": [Reply(content=UNPARSED), Reply(content="nothing to list")],
    "markup beside a call": [
        Reply(
            content='<tool_call>\n{"name": "terminal"\n</tool_call>',
            tool_calls=[ToolCallSpec("terminal", {"command": "pwd"})],
        ),
        Reply(content="you are in the sandbox"),
    ],
    # a call that ran, its reasoning holding an unclosed call of its own (a T=1.5 run of the
    # embedded model wrote this): the loop ran the real one; the SFT text would teach the other
    "markup in reasoning": [
        Reply(
            reasoning='I will list <tool_call>{"name": "terminal", "argu',
            tool_calls=[ToolCallSpec("terminal", {"command": "ls"})],
        ),
        Reply(content="the directory is empty"),
    ],
    "string arguments": [
        Reply(tool_calls=[ToolCallSpec("terminal", '{"command": "ls"')]),
        Reply(content="gave up on ls"),
    ],
    "list arguments": [
        Reply(tool_calls=[ToolCallSpec("terminal", '["ls"]')]),
        Reply(content="gave up on the list"),
    ],
}
MALFORMED_KIND = {
    "broken markup": "unparsed_call",
    "markup as text": "unparsed_call",
    "markup beside a call": "call_markup_in_text",
    "markup in reasoning": "call_markup_in_text",
    "string arguments": "non_object_arguments",
    "list arguments": "non_object_arguments",
}


def _mixed_policy(body: dict[str, Any]) -> Reply:
    prompt = next(m["content"] for m in body["messages"] if m["role"] == "user")
    return {**SCRIPTS, **MALFORMED}[prompt][count_assistant_turns(body)]


async def mixed_run(tmp_path: Path, scripted_batch_config: Any) -> Path:
    """A finished run of every clean and every malformed conversation above."""
    rows = [{"prompt": p} for p in (*SCRIPTS, *MALFORMED)]
    async with ScriptedServer(_mixed_policy, api_key="k") as srv:
        cfg = scripted_batch_config(rows, srv.base_url, toolsets=["terminal", "file"], system_prompt=SYSTEM)
        await run_batch(cfg)
    return Path(cfg.run_dir)
