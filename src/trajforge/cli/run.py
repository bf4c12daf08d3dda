"""``trajforge run``: one agent session on one prompt, printed and saved as a trajectory."""

from __future__ import annotations

import asyncio
import math
import random
import sys
import typing
from pathlib import Path
from typing import Annotated, TypeGuard

import typer
from rich.console import Console
from rich.table import Table

from trajforge.agent import AgentConfig, AgentResult, run_session
from trajforge.cli.errors import fail
from trajforge.cli.vocab import renamed
from trajforge.distributions import UnknownDistributionError, get_distribution, sample_toolsets
from trajforge.endpoint import EndpointConfig, open_chat_model
from trajforge.llm.dialects import check_dialect_name
from trajforge.llm.parsers import check_parser_name
from trajforge.llm.types import ModelError, SamplingParams
from trajforge.sandbox import SandboxUnavailableError, create_sandbox_factory
from trajforge.sandbox.types import SandboxConfig, SandboxKind
from trajforge.tools.base import Tool
from trajforge.tools.builtin import build_registry, toolset_availability
from trajforge.tools.config import ToolsConfig
from trajforge.tools.limits import DEFAULT_MAX_COMMAND_TIMEOUT_S, ToolLimits
from trajforge.tools.toolsets import UnknownToolsetError, check_toolsets
from trajforge.trajectory import save_trajectory, to_sharegpt
from trajforge.trajectory.save import append_jsonl, dumps_line, trajectory_line

_err = Console(stderr=True)

# A session always ends: without a deadline, a command the model keeps alive (or a model that
# never stops calling tools slowly) would hold the sandbox forever.
# The same default as batch's --sample-timeout (docs/cli.md: one flag, one default).
DEFAULT_SESSION_TIMEOUT_S = 600.0
_SANDBOX_KINDS: tuple[str, ...] = typing.get_args(SandboxKind)

# The options of `trajforge run`, one line each.
Prompt = Annotated[str, typer.Argument(help="The task for the agent.")]
Model = Annotated[str | None, typer.Option(help="Model name at the endpoint.")]
BaseUrl = Annotated[str | None, typer.Option(help="OpenAI-compatible endpoint root.")]
ApiKeyEnv = Annotated[
    str | None, typer.Option(help="Env var with the API key (default OPENAI_API_KEY/OPENROUTER_API_KEY).")
]
Toolsets = Annotated[str | None, typer.Option(help="Comma-separated toolsets, e.g. terminal,file.")]
Distribution = Annotated[str | None, typer.Option(help="Sample toolsets from this distribution.")]
Seed = Annotated[int | None, typer.Option(help="Seed for the distribution draw.")]
Sandbox = Annotated[str, typer.Option(help="bwrap (default), local (no isolation) or docker.")]
Network = Annotated[bool, typer.Option(help="Allow network access inside the sandbox.")]
MaxTurns = Annotated[int, typer.Option(help="Model calls allowed.")]
SystemPrompt = Annotated[str | None, typer.Option(help="System prompt.")]
MaxTokens = Annotated[int | None, typer.Option(help="max_tokens per model call.")]
Temperature = Annotated[float | None, typer.Option(help="Sampling temperature.")]
ReasoningEffort = Annotated[str | None, typer.Option(help="low|medium|high.")]
NoReasoning = Annotated[bool, typer.Option("--no-reasoning", help="Ask the provider not to reason.")]
Stream = Annotated[bool, typer.Option(help="Use SSE streaming.")]
EndpointDialect = Annotated[
    str,
    typer.Option(
        help="Which server --base-url is: auto (probe it), openai, vllm, sglang, llamacpp, llamacpp_python, "
        "ollama, openrouter, trajforge (docs/servers.md)."
    ),
]
ToolCallParser = Annotated[
    str,
    typer.Option(
        help="Tool calls the endpoint returned as text are parsed with this family and run: auto (detect; "
        "off where the server parses calls itself), a family (trajforge parse --help), or none."
    ),
]
Timeout = Annotated[
    float,
    typer.Option(
        "--sample-timeout",
        help="Deadline for the whole session (s), as batch's --sample-timeout: at it the session ends "
        "with termination 'timeout' and its sandbox is killed.",
    ),
]
MaxCommandTimeout = Annotated[
    float,
    typer.Option(
        help="Longest timeout (s) the model may give one command; longer requests are "
        "clamped (and the model told). Commands without one get min(60, this)."
    ),
]
ToolsConfigFile = Annotated[
    Path | None,
    typer.Option(
        "--tools-config", help="YAML file with the tools section (web, browser, vision, ... backends)."
    ),
]
Output = Annotated[
    Path | None,
    typer.Option(
        "--output",
        "-o",
        help="Append the trajectory here (default: ./trajectory_samples.jsonl or failed_...).",
    ),
]
JsonOut = Annotated[
    bool,
    typer.Option("--json", help="Print the result as JSON (final answer, termination, trajectory path)."),
]


def run(
    prompt: Prompt,
    model: Model = None,
    base_url: BaseUrl = None,
    api_key_env: ApiKeyEnv = None,
    toolsets: Toolsets = None,
    distribution: Distribution = None,
    seed: Seed = None,
    sandbox: Sandbox = "bwrap",
    network: Network = False,
    max_turns: MaxTurns = 30,
    system_prompt: SystemPrompt = None,
    max_tokens: MaxTokens = None,
    temperature: Temperature = None,
    reasoning_effort: ReasoningEffort = None,
    no_reasoning: NoReasoning = False,
    stream: Stream = False,
    endpoint_dialect: EndpointDialect = "auto",
    tool_call_parser: ToolCallParser = "auto",
    timeout: Timeout = DEFAULT_SESSION_TIMEOUT_S,
    max_command_timeout: MaxCommandTimeout = DEFAULT_MAX_COMMAND_TIMEOUT_S,
    output: Output = None,
    tools_config: ToolsConfigFile = None,
    json_out: JsonOut = False,
) -> None:
    """Run one agent session, print the final answer and save the trajectory."""
    from trajforge.cli.tools import load_tools_option

    kind = sandbox_kind(sandbox)
    tools_cfg = load_tools_option(tools_config)
    _check_seconds(sample_timeout=timeout, max_command_timeout=max_command_timeout)
    try:
        box = SandboxConfig(kind=kind, network=network, command_timeout_s=min(60.0, max_command_timeout))
        chosen = choose_toolsets(toolsets, distribution, seed)
        check_dialect_name(endpoint_dialect)
        check_parser_name(tool_call_parser)
        endpoint = EndpointConfig(
            model=model,
            base_url=base_url,
            api_key_env=api_key_env,
            stream=stream,
            endpoint_dialect=endpoint_dialect,
            tool_call_parser=tool_call_parser,
        )
        sampling = SamplingParams(
            max_tokens=max_tokens,
            temperature=temperature,
            reasoning_effort=reasoning_effort,
            reasoning_disabled=no_reasoning,
        )
        agent = _agent_config(max_turns, system_prompt, timeout, max_command_timeout, sampling)
        code = asyncio.run(
            _run(prompt, endpoint, chosen, box, agent, output, tools_cfg, toolsets is not None, json_out)
        )
    except (UnknownToolsetError, UnknownDistributionError, SandboxUnavailableError, ValueError) as exc:
        raise fail(str(exc)) from None
    except ModelError as exc:
        raise fail(str(exc)) from None
    sys.stdout.flush()
    raise typer.Exit(code=code)


def _agent_config(
    max_turns: int,
    system_prompt: str | None,
    timeout: float,
    max_command_timeout: float,
    sampling: SamplingParams,
) -> AgentConfig:
    return AgentConfig(
        max_turns=max_turns,
        system_prompt=system_prompt,
        session_timeout_s=timeout,
        tool_limits=ToolLimits(max_command_timeout_s=max_command_timeout),
        sampling=sampling,
    )


def _check_seconds(**seconds: float) -> None:
    for name, value in seconds.items():
        if not math.isfinite(value) or value <= 0:
            flag = "--" + name.replace("_", "-")
            raise fail(f"{flag} must be a number of seconds greater than 0, got {value:g}")


def _is_sandbox_kind(name: str) -> TypeGuard[SandboxKind]:
    return name in _SANDBOX_KINDS


def sandbox_kind(name: str) -> SandboxKind:
    """``--sandbox``'s value as a backend name, or a clear error naming the ones there are."""
    if not _is_sandbox_kind(name):
        raise fail(f"unknown sandbox {name!r}; choose bwrap, local or docker")
    return name


def choose_toolsets(toolsets: str | None, distribution: str | None, seed: int | None) -> list[str]:
    """Explicit toolsets, or a draw from a distribution (default: terminal and file)."""
    if toolsets and distribution:
        raise typer.BadParameter("give either --toolsets or --distribution, not both")
    if toolsets:
        return check_toolsets([t.strip() for t in toolsets.split(",") if t.strip()])
    if distribution:
        return sample_toolsets(get_distribution(distribution), random.Random(seed))
    return ["terminal", "file"]


async def _run(
    prompt: str,
    endpoint: EndpointConfig,
    toolsets: list[str],
    sandbox: SandboxConfig,
    agent: AgentConfig,
    output: Path | None,
    tools_config: ToolsConfig,
    explicit: bool,
    json_out: bool = False,
) -> int:
    registry = build_registry(tools_config)
    try:
        available = toolset_availability(registry, toolsets, explicit=explicit)
        if available.error:
            raise ValueError(available.error)
        if available.warning:
            _err.print(available.warning, markup=False, highlight=False)
        tools = registry.for_toolsets(toolsets)
        factory = create_sandbox_factory(sandbox)
        async with open_chat_model(endpoint, announce=lambda m: _err.print(f"[dim]{m}[/]")) as model:
            result = await run_session(
                prompt, model=model, tools=tools, sandbox_factory=factory, config=agent, task_id="run"
            )
    finally:
        await registry.aclose()
    path = _save(result, prompt, tools, output, toolsets)
    _report(result, path, json_out)
    return 0 if result.finished_naturally else 1


def _result_json(result: AgentResult, path: Path) -> str:
    import orjson

    data = {
        "final_answer": result.final_answer,
        "finished": result.finished_naturally,
        "termination": result.termination.value,
        "turns": result.turns_used,
        "api_calls": result.api_calls,
        "tool_stats": {k: v.model_dump() for k, v in result.tool_stats.items() if v.count},
        "error": result.error,
        "trajectory": str(path),
    }
    return orjson.dumps(data, option=orjson.OPT_INDENT_2).decode()


def _report(result: AgentResult, path: Path, json_out: bool = False) -> None:
    if json_out:
        print(_result_json(result, path))
    elif result.final_answer is not None:
        print(result.final_answer)
    _err.print(
        f"[dim]{result.termination.value} after {result.turns_used} turns, {result.api_calls} model calls; "
        f"trajectory saved to {path}[/]"
    )
    used = {name: stat for name, stat in result.tool_stats.items() if stat.count}
    if used:
        table = Table("tool", "calls", "ok", "failed", box=None, header_style="dim")
        for name, stat in used.items():
            table.add_row(name, str(stat.count), str(stat.success), str(stat.failure))
        _err.print(table)
    if result.error:
        _err.print(f"[yellow]{result.error}[/]")


def _save(
    result: AgentResult, prompt: str, tools: list[Tool], output: Path | None, toolsets: list[str]
) -> Path:
    conversations = to_sharegpt(result.messages, tools, prompt=prompt)
    extra = {
        "termination": result.termination.value,
        "toolsets_used": toolsets,
        "tool_stats": {k: v.model_dump() for k, v in result.tool_stats.items()},
        "api_calls": result.api_calls,
        "usage": result.usage.model_dump(),
    }
    model = result.model or "unknown"
    if output is None:
        return save_trajectory(".", conversations, model, result.finished_naturally, result.messages, extra)
    output.parent.mkdir(parents=True, exist_ok=True)
    line = trajectory_line(conversations, model, result.finished_naturally, result.messages, extra)
    append_jsonl(output, dumps_line(line))
    return output


def register(app: typer.Typer) -> None:
    app.command("run", cls=renamed({"--timeout": "--sample-timeout"}))(run)
