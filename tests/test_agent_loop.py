"""AgentLoop: termination reasons, tool dispatch, error reporting, accounting."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from trajforge.agent import AgentConfig, AgentLoop, Termination, run_session
from trajforge.llm.types import AssistantTurn, ModelError, ModelErrorKind, Usage
from trajforge.sandbox import create_sandbox_factory
from trajforge.sandbox.types import SandboxConfig
from trajforge.testing.scripted_model import ScriptedModel, answer, tool_turn
from trajforge.tools import ToolContext, ToolOutput, default_registry
from trajforge.tools.base import FunctionTool


@pytest.fixture
async def sandbox():
    sb = await create_sandbox_factory(SandboxConfig(kind="local")).create("loop-test")
    try:
        yield sb
    finally:
        await sb.close()


@pytest.fixture(scope="module")
def registry():
    return default_registry()


def make_loop(model, sandbox, registry, toolsets=("terminal", "file"), **cfg):
    tools = registry.for_toolsets(toolsets)
    return AgentLoop(model, tools, ToolContext(task_id="t", sandbox=sandbox), AgentConfig(**cfg))


async def test_tool_call_then_final_answer(sandbox, registry):
    turn = tool_turn(("terminal", {"command": "echo 6*7=$((6*7))"}), reasoning="compute it")
    turn.usage = Usage(prompt_tokens=10, completion_tokens=5, total_tokens=15)
    final = answer("42", reasoning="read the output")
    final.usage = Usage(prompt_tokens=30, completion_tokens=2, total_tokens=32)
    model = ScriptedModel([turn, final])
    loop = make_loop(model, sandbox, registry, system_prompt="be brief")
    result = await loop.run([{"role": "user", "content": "what is 6*7?"}])

    assert result.termination is Termination.FINAL_ANSWER and result.finished_naturally
    assert result.final_answer == "42"
    assert result.turns_used == 2 and result.api_calls == 2
    assert result.reasoning_per_turn == ["compute it", "read the output"]
    assert [m["role"] for m in result.messages] == ["system", "user", "assistant", "tool", "assistant"]
    tool_msg = result.messages[3]
    assert orjson.loads(tool_msg["content"])["output"] == "6*7=42\n"
    assert tool_msg["tool_call_id"] == result.messages[2]["tool_calls"][0]["id"]
    assert result.tool_stats["terminal"].count == 1 and result.tool_stats["terminal"].success == 1
    assert (result.usage.prompt_tokens, result.usage.total_tokens) == (40, 47)
    assert result.usage.reasoning_tokens is None  # neither call said: unknown, not 0
    assert result.tools_offered == ["terminal", "process", "read_file", "write_file", "patch", "search_files"]
    # the model saw the tool schemas of exactly the offered tools
    assert [t["function"]["name"] for t in model.calls[0].tools] == result.tools_offered


async def test_unknown_tool_and_invalid_json_are_reported_not_run(sandbox, registry):
    model = ScriptedModel(
        [
            tool_turn(("web_search", {"query": "x"}), ("terminal", '{"command": "touch ran.txt"')),
            answer("gave up"),
        ]
    )
    loop = make_loop(model, sandbox, registry)
    result = await loop.run([{"role": "user", "content": "go"}])
    assert result.termination is Termination.FINAL_ANSWER
    errors = {e.tool_name: e for e in result.tool_errors}
    assert "unknown tool 'web_search'" in errors["web_search"].error
    assert "not valid JSON" in errors["terminal"].error
    assert errors["terminal"].arguments == '{"command": "touch ran.txt"'
    # the invalid call did NOT run the tool
    with pytest.raises(FileNotFoundError):
        await sandbox.read_bytes("ran.txt")
    # both errors went back to the model as tool messages
    tool_msgs = [m["content"] for m in model.calls[1].messages if m["role"] == "tool"]
    assert any("unknown tool" in c for c in tool_msgs) and any("not valid JSON" in c for c in tool_msgs)
    assert "web_search" not in result.tool_stats  # hallucinated tools are not counted as tool usage
    assert result.tool_stats["terminal"].failure == 1


async def test_max_turns(sandbox, registry):
    model = ScriptedModel(lambda m, t, s: tool_turn(("terminal", {"command": "true"})))
    result = await make_loop(model, sandbox, registry, max_turns=3).run([{"role": "user", "content": "loop"}])
    assert result.termination is Termination.MAX_TURNS and not result.finished_naturally
    assert result.turns_used == 3 and result.tool_stats["terminal"].count == 3


@pytest.mark.parametrize(
    ("kind", "termination"),
    [
        (ModelErrorKind.TRANSIENT, Termination.MODEL_ERROR),
        (ModelErrorKind.AUTH, Termination.MODEL_ERROR),
        (ModelErrorKind.CONTEXT_LENGTH, Termination.CONTEXT_LENGTH),
    ],
)
async def test_model_errors_end_the_session_with_a_reason(sandbox, registry, kind, termination):
    err = ModelError("boom at http://x (status 500)", kind=kind, endpoint="http://x", status=500)
    model = ScriptedModel([tool_turn(("terminal", {"command": "echo hi"})), err])
    result = await make_loop(model, sandbox, registry).run([{"role": "user", "content": "q"}])
    assert result.termination is termination
    assert result.error_kind == kind.value and "boom" in result.error
    assert result.turns_used == 1  # the work before the failure is kept
    assert result.messages[-1]["role"] == "tool"


async def test_parse_errors_are_told_to_the_model_and_bounded(sandbox, registry):
    bad = AssistantTurn(content="<tool_call>{oops", parse_errors=["unclosed <tool_call>: {oops"])
    model = ScriptedModel([bad, answer("fixed")])
    result = await make_loop(model, sandbox, registry).run([{"role": "user", "content": "q"}])
    assert result.termination is Termination.FINAL_ANSWER
    assert result.tool_errors[0].tool_name == "<parse>"
    feedback = model.calls[1].messages[-1]
    assert feedback["role"] == "user" and "could not be parsed" in feedback["content"]

    model = ScriptedModel(lambda m, t, s: bad)
    result = await make_loop(model, sandbox, registry, max_consecutive_parse_errors=2).run(
        [{"role": "user", "content": "q"}]
    )
    assert result.termination is Termination.TOOL_PARSE_ERROR and result.turns_used == 2


async def test_truncated_final_answer_is_not_natural(sandbox, registry):
    model = ScriptedModel([AssistantTurn(content="The answer is 4", finish_reason="length")])
    result = await make_loop(model, sandbox, registry).run([{"role": "user", "content": "q"}])
    assert result.termination is Termination.TRUNCATED and not result.finished_naturally


async def test_session_deadline_keeps_partial_work(sandbox, registry):
    model = ScriptedModel([tool_turn(("terminal", {"command": "sleep 5"})), answer("late")])
    loop = make_loop(model, sandbox, registry, session_timeout_s=0.5)
    result = await loop.run([{"role": "user", "content": "q"}])
    assert result.termination is Termination.TIMEOUT
    assert result.turns_used == 1 and "deadline" in result.error


async def test_ephemeral_prompt_and_prefill_are_sent_not_saved(sandbox, registry):
    model = ScriptedModel([answer("ok")])
    prefill = [{"role": "user", "content": "example q"}, {"role": "assistant", "content": "example a"}]
    loop = make_loop(
        model,
        sandbox,
        registry,
        system_prompt="SYS",
        ephemeral_system_prompt="EPHEMERAL",
        prefill_messages=prefill,
    )
    result = await loop.run([{"role": "user", "content": "real q"}])
    sent = model.calls[0].messages
    assert sent[0] == {"role": "system", "content": "SYS\n\nEPHEMERAL"}
    assert sent[1:3] == prefill and sent[3]["content"] == "real q"
    saved = orjson.dumps(result.messages).decode()
    assert "EPHEMERAL" not in saved and "example q" not in saved and "SYS" in saved


async def test_parallel_safe_calls_run_concurrently_and_keep_order(sandbox):
    running = 0
    peak = 0

    async def slow(args, ctx):
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.05)
        running -= 1
        return ToolOutput(content=f"r{args['i']}")

    async def crash(args, ctx):
        raise RuntimeError("kaput")

    tools = [
        FunctionTool("slow", "custom", "", {"type": "object"}, slow, parallel_safe=True),
        FunctionTool("crash", "custom", "", {"type": "object"}, crash),
    ]
    calls = [("slow", {"i": i}) for i in range(4)] + [("crash", {})]
    model = ScriptedModel([tool_turn(*calls), answer("done")])
    loop = AgentLoop(model, tools, ToolContext(task_id="t", sandbox=sandbox), AgentConfig())
    result = await loop.run([{"role": "user", "content": "q"}])
    contents = [m["content"] for m in result.messages if m["role"] == "tool"]
    assert contents[:4] == ["r0", "r1", "r2", "r3"]
    assert "crashed: RuntimeError: kaput" in contents[4]
    assert peak == 4
    assert result.tool_stats["crash"].failure == 1


async def test_run_session_uses_a_fresh_sandbox_and_closes_it(registry):
    model = ScriptedModel(
        [tool_turn(("write_file", {"path": "note.txt", "content": "hi"})), answer("written")]
    )
    factory = create_sandbox_factory(SandboxConfig(kind="bwrap"))
    result = await run_session(
        "write a note",
        model=model,
        registry=registry,
        toolsets=["file"],
        sandbox_factory=factory,
        task_id="sess",
    )
    assert result.finished_naturally and result.tool_stats["write_file"].success == 1
    assert result.tools_offered == ["read_file", "write_file", "patch", "search_files"]


async def test_run_session_writes_setup_files_before_the_first_turn(registry):
    model = ScriptedModel([tool_turn(("read_file", {"path": "data/in.txt"})), answer("read it")])
    result = await run_session(
        "read the file",
        model=model,
        registry=registry,
        toolsets=["file"],
        sandbox_factory=create_sandbox_factory(SandboxConfig(kind="local")),
        setup_files={"data/in.txt": "hello from the row"},
    )
    assert result.messages[-2]["content"] == "hello from the row"


class _FailingFactory:
    async def create(self, task_id, *, image=None, cwd=None):
        raise OSError("no room for another sandbox")


class _SlowFactory:
    """Counts creations/closes and takes a while to start, like a busy machine."""

    def __init__(self):
        self.inner = create_sandbox_factory(SandboxConfig(kind="local"))
        self.closed = 0
        self.started = asyncio.Event()

    async def create(self, task_id, *, image=None, cwd=None):
        self.started.set()
        await asyncio.sleep(0.2)
        sandbox = await self.inner.create(task_id)
        factory = self
        close = sandbox.close

        async def counted_close():
            factory.closed += 1
            await close()

        sandbox.close = counted_close
        return sandbox


async def _one_tool_call(registry, factory, config=None, setup_files=None):
    """A session whose model (with latency, like any endpoint) calls the terminal once and then
    answers; returns the result and, per model call, whether the sandbox had started by then."""
    seen_started = []

    async def policy(messages, tools, sampling):
        seen_started.append(factory.started.is_set())
        if len(seen_started) == 1:
            return tool_turn(("terminal", {"command": "echo ok"}))
        return answer("done")

    result = await run_session(
        "go",
        model=ScriptedModel(policy, delay_s=0.05),
        registry=registry,
        toolsets=["terminal"],
        sandbox_factory=factory,
        config=config,
        setup_files=setup_files,
    )
    return result, seen_started


async def test_sandbox_start_overlaps_the_first_model_call(registry):
    factory = _SlowFactory()
    result, seen_started = await _one_tool_call(registry, factory)
    assert seen_started[0] is True  # the sandbox was starting while the first model call was in flight
    assert result.finished_naturally and result.tool_stats["terminal"].success == 1
    assert factory.closed == 1

    # no tool call at all: the start that is no longer needed is cancelled, nothing is left open
    result = await run_session(
        "hi",
        model=ScriptedModel([answer("hello")]),
        registry=registry,
        toolsets=["terminal"],
        sandbox_factory=factory,
    )
    assert result.finished_naturally and factory.closed == 1


async def test_lazy_sandbox_start_waits_for_the_first_tool_call(registry):
    """``sandbox_start: lazy``: no sandbox while the first answer is awaited, none at all for a
    rollout that calls no tool; setup files still force a start before the first turn."""
    factory = _SlowFactory()
    lazy = AgentConfig(sandbox_start="lazy")
    result, seen_started = await _one_tool_call(registry, factory, lazy)
    assert seen_started == [False, True]  # built for the tool call, after the first answer
    assert result.finished_naturally and result.tool_stats["terminal"].success == 1
    assert factory.closed == 1

    factory = _SlowFactory()
    result = await run_session(
        "hi",
        model=ScriptedModel([answer("hello")]),
        registry=registry,
        toolsets=["terminal"],
        sandbox_factory=factory,
        config=lazy,
    )
    assert result.finished_naturally and not factory.started.is_set() and factory.closed == 0

    # a reward inspection needs the sandbox even when no tool ran: it is started for it
    inspected = []

    async def inspect(result, sandbox):
        inspected.append((await sandbox.exec("echo seen")).output)

    await run_session(
        "hi",
        model=ScriptedModel([answer("hello")]),
        registry=registry,
        toolsets=["terminal"],
        sandbox_factory=factory,
        config=lazy,
        inspect=inspect,
    )
    assert inspected == ["seen\n"] and factory.closed == 1

    _, seen_started = await _one_tool_call(registry, _SlowFactory(), lazy, setup_files={"task.txt": "data"})
    assert seen_started[0] is True  # the task's files are in place before the model could look


async def test_sandbox_start_failure_is_infrastructure_not_a_tool_error(registry):
    from trajforge.sandbox import SandboxStartError

    model = ScriptedModel([tool_turn(("terminal", {"command": "echo ok"})), answer("unreachable")])
    with pytest.raises(SandboxStartError, match="no room for another sandbox"):
        await run_session(
            "go", model=model, registry=registry, toolsets=["terminal"], sandbox_factory=_FailingFactory()
        )
    # a session that never needs the sandbox is not failed by it
    result = await run_session(
        "hi",
        model=ScriptedModel([answer("fine")]),
        registry=registry,
        toolsets=["terminal"],
        sandbox_factory=_FailingFactory(),
    )
    assert result.finished_naturally
