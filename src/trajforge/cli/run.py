"""``trajforge run``: one agent session on one prompt, printed and saved as a trajectory."""

from __future__ import annotations

import asyncio
import math
import random
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from trajforge.agent import AgentConfig, AgentResult, run_session
from trajforge.distributions import UnknownDistributionError, get_distribution, sample_toolsets
from trajforge.endpoint import EndpointConfig, open_chat_model
from trajforge.llm.types import ModelError, SamplingParams
from trajforge.sandbox import SandboxUnavailableError, create_sandbox_factory
from trajforge.sandbox.types import SandboxConfig, SandboxKind
from trajforge.tools.limits import DEFAULT_MAX_COMMAND_TIMEOUT_S, ToolLimits
from trajforge.tools.registry import default_registry
from trajforge.tools.toolsets import UnknownToolsetError, check_toolsets
from trajforge.trajectory import save_trajectory, to_sharegpt
from trajforge.trajectory.save import append_jsonl, dumps_line, trajectory_line

_err = Console(stderr=True)

# A session always ends: without a deadline, a command the model keeps alive (or a model that
# never stops calling tools slowly) would hold the sandbox forever.
DEFAULT_SESSION_TIMEOUT_S = 900.0


def choose_toolsets(toolsets: str | None, distribution: str | None, seed: int | None) -> list[str]:
    """Explicit toolsets, or a draw from a distribution (default: terminal and file)."""
    if toolsets and distribution:
        raise typer.BadParameter("give either --toolsets or --distribution, not both")
    if toolsets:
        return check_toolsets([t.strip() for t in toolsets.split(",") if t.strip()])
    if distribution:
        return sample_toolsets(get_distribution(distribution), random.Random(seed))
    return ["terminal", "file"]


def _fail(message: str) -> typer.Exit:
    _err.print(f"[bold red]error:[/] {message}")
    return typer.Exit(code=2)


def _save(result: AgentResult, prompt: str, tools: list, output: Path | None, toolsets: list[str]) -> Path:
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


async def _run(
    prompt: str,
    endpoint: EndpointConfig,
    toolsets: list[str],
    sandbox: SandboxConfig,
    agent: AgentConfig,
    output: Path | None,
) -> int:
    registry = default_registry()
    factory = create_sandbox_factory(sandbox)
    async with open_chat_model(endpoint, announce=lambda m: _err.print(f"[dim]{m}[/]")) as model:
        result = await run_session(
            prompt,
            model=model,
            registry=registry,
            toolsets=toolsets,
            sandbox_factory=factory,
            config=agent,
            task_id="run",
        )
    tools = registry.for_toolsets(toolsets)
    path = _save(result, prompt, tools, output, toolsets)
    if result.final_answer is not None:
        print(result.final_answer)
    _err.print(
        f"[dim]{result.termination.value} after {result.turns_used} turns, {result.api_calls} model calls, "
        f"tools {dict((k, v.count) for k, v in result.tool_stats.items())}; trajectory saved to {path}[/]"
    )
    if result.error:
        _err.print(f"[yellow]{result.error}[/]")
    return 0 if result.finished_naturally else 1


def register(app: typer.Typer) -> None:
    @app.command("run")
    def run(
        prompt: Annotated[str, typer.Argument(help="The task for the agent.")],
        model: Annotated[str | None, typer.Option(help="Model name at the endpoint.")] = None,
        base_url: Annotated[str | None, typer.Option(help="OpenAI-compatible endpoint root.")] = None,
        api_key_env: Annotated[
            str | None,
            typer.Option(help="Env var with the API key (default OPENAI_API_KEY/OPENROUTER_API_KEY)."),
        ] = None,
        toolsets: Annotated[
            str | None, typer.Option(help="Comma-separated toolsets, e.g. terminal,file.")
        ] = None,
        distribution: Annotated[
            str | None, typer.Option(help="Sample toolsets from this distribution.")
        ] = None,
        seed: Annotated[int | None, typer.Option(help="Seed for the distribution draw.")] = None,
        sandbox: Annotated[
            str, typer.Option(help="bwrap (default), local (no isolation) or docker.")
        ] = "bwrap",
        network: Annotated[bool, typer.Option(help="Allow network access inside the sandbox.")] = False,
        max_turns: Annotated[int, typer.Option(help="Model calls allowed.")] = 30,
        system_prompt: Annotated[str | None, typer.Option(help="System prompt.")] = None,
        max_tokens: Annotated[int | None, typer.Option(help="max_tokens per model call.")] = None,
        temperature: Annotated[float | None, typer.Option(help="Sampling temperature.")] = None,
        reasoning_effort: Annotated[str | None, typer.Option(help="low|medium|high.")] = None,
        no_reasoning: Annotated[
            bool, typer.Option("--no-reasoning", help="Ask the provider not to reason.")
        ] = False,
        stream: Annotated[bool, typer.Option(help="Use SSE streaming.")] = False,
        timeout: Annotated[
            float,
            typer.Option(
                help="Deadline for the whole session (s): at it the session ends with termination "
                "'timeout' and its sandbox is killed."
            ),
        ] = DEFAULT_SESSION_TIMEOUT_S,
        max_command_timeout: Annotated[
            float,
            typer.Option(
                help="Longest timeout (s) the model may give one command; longer requests are "
                "clamped (and the model told). Commands without one get min(60, this)."
            ),
        ] = DEFAULT_MAX_COMMAND_TIMEOUT_S,
        output: Annotated[
            Path | None,
            typer.Option(
                help="Append the trajectory here (default: ./trajectory_samples.jsonl or failed_...)."
            ),
        ] = None,
    ) -> None:
        """Run one agent session, print the final answer and save the trajectory."""
        if sandbox not in ("bwrap", "local", "docker"):
            raise _fail(f"unknown sandbox {sandbox!r}; choose bwrap, local or docker")
        kind: SandboxKind = sandbox  # type: ignore[assignment]
        for flag, value in (("--timeout", timeout), ("--max-command-timeout", max_command_timeout)):
            if not math.isfinite(value) or value <= 0:
                raise _fail(f"{flag} must be a number of seconds greater than 0, got {value:g}")
        try:
            chosen = choose_toolsets(toolsets, distribution, seed)
            endpoint = EndpointConfig(model=model, base_url=base_url, api_key_env=api_key_env, stream=stream)
            agent = AgentConfig(
                max_turns=max_turns,
                system_prompt=system_prompt,
                session_timeout_s=timeout,
                tool_limits=ToolLimits(max_command_timeout_s=max_command_timeout),
                sampling=SamplingParams(
                    max_tokens=max_tokens,
                    temperature=temperature,
                    reasoning_effort=reasoning_effort,
                    reasoning_disabled=no_reasoning,
                ),
            )
            box = SandboxConfig(kind=kind, network=network, command_timeout_s=min(60.0, max_command_timeout))
            code = asyncio.run(_run(prompt, endpoint, chosen, box, agent, output))
        except (UnknownToolsetError, UnknownDistributionError, SandboxUnavailableError, ValueError) as exc:
            raise _fail(str(exc)) from None
        except ModelError as exc:
            raise _fail(str(exc)) from None
        sys.stdout.flush()
        raise typer.Exit(code=code)
