"""``trajforge rl``: train (:mod:`trajforge.cli.rl_train`), manage runs, and the RL agent.

``rl start`` launches ``rl train`` as a managed run (``OUTPUT_DIR/RUN_NAME/``) and returns once the
trainer wrote its first metrics line; ``status``, ``stop``, ``results``, ``list`` and ``logs``
work from any later process, because the run's state is on disk. ``rl agent "TASK"`` or
``rl agent --interactive`` runs the RL agent (terminal, file, web and rl tools).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from trajforge.cli import complete
from trajforge.cli.errors import fail
from trajforge.cli.vocab import renamed

rl_app = typer.Typer(
    help="Reinforcement learning: train, demo, start/status/stop/results/list/logs, the RL agent.",
    no_args_is_help=True,
)
_err = Console(stderr=True)
RunsDir = typer.Option(
    Path("runs"), "--output-dir", help="Where runs live: the parent of each run directory."
)
JsonOut = typer.Option(False, "--json", help="Print the result as JSON.")
# Old spellings, kept for one release (docs/cli.md).
RUNS_RENAMES = {"--runs-dir": "--output-dir"}
START_RENAMES = {**RUNS_RENAMES, "--model": "--model-path", "--run-id": "--run-name"}
AGENT_RENAMES = {**RUNS_RENAMES, "--max-iterations": "--max-turns"}


def _manager(runs_dir: Path) -> Any:
    from trajforge.rl.runs.manager import Manager

    return Manager(runs_dir)


@rl_app.command("start", cls=renamed(START_RENAMES))
def start_cmd(
    env: str = typer.Argument(
        ..., help="Env name or path/to/file.py:ClassName.", autocompletion=complete.env_names
    ),
    model: Path | None = typer.Option(
        None, "--model-path", help="Local model directory (default: the embedded policy)."
    ),
    trainer: str | None = typer.Option(None, "--trainer", help="builtin or trl."),
    steps: int | None = typer.Option(None, "--steps", min=1, help="Optimizer steps."),
    group_size: int | None = typer.Option(None, "--group-size", min=2, help="Rollouts per item."),
    lr: float | None = typer.Option(None, "--lr", help="Learning rate."),
    config: Path | None = typer.Option(None, "--config", help="YAML/JSON of trainer config fields."),
    runs_dir: Path = RunsDir,
    run_id: str | None = typer.Option(
        None, "--run-name", help="Run directory name (default: time-train-random)."
    ),
    ready_timeout: float = typer.Option(900.0, "--ready-timeout", help="Seconds for the first metrics line."),
    json_out: bool = JsonOut,
) -> None:
    """Start a managed training run; returns once the trainer wrote its first metrics."""
    from trajforge.rl.config import TrainConfigError, load_config_file
    from trajforge.rl.runs.run_config import train_run_spec
    from trajforge.rl.runs.schema import RunError

    try:
        fields: dict[str, Any] = load_config_file(config) if config else {}
        fields.pop("output_dir", None)
        flags: dict[str, Any] = {"env": env, "model": str(model) if model else None, "trainer": trainer}
        flags |= {"steps": steps, "group_size": group_size, "lr": lr}
        fields.update({k: v for k, v in flags.items() if v is not None})
        if "model" not in fields:
            from trajforge.endpoint import embedded_weights

            fields["model"] = str(embedded_weights())
        spec = train_run_spec(fields, ready_timeout_s=ready_timeout)
        if run_id:
            spec.run_id = run_id
        state = asyncio.run(_manager(runs_dir).start(spec))
    except (TrainConfigError, RunError, FileNotFoundError, ValueError) as exc:
        raise fail(str(exc)) from None
    _print_state(state, json_out)
    if state.status == "failed":
        raise typer.Exit(1)


def _overviews(runs_dir: Path) -> list[Any]:
    """One overview per run under ``runs_dir``, of every kind trajforge writes (managed runs
    reconciled with their processes first)."""
    from trajforge.record.runs import runs_in
    from trajforge.rl.runs.schema import RunError, managed_overview, overview

    manager = _manager(runs_dir)
    out = []
    for path, kind in runs_in(runs_dir):
        if kind == "rl run":
            try:
                out.append(managed_overview(asyncio.run(manager.status(path.name))))
                continue
            except (RunError, ValueError):  # a damaged state.json: shown as what its files say
                pass
        out.append(overview(path, kind))
    return out


def _kind_of(runs_dir: Path, run_id: str, accepts: tuple[str, ...], what: str) -> str:
    """The kind of run ``run_id`` is, when ``accepts`` takes it; else the plain error."""
    from trajforge.record.runs import kind_problem, run_kind

    path = runs_dir / run_id
    problem = kind_problem(path, accepts, what)
    if problem is not None:
        if not path.exists():
            known = ", ".join(o.id for o in _overviews(runs_dir)[-10:]) or "none"
            problem = f"no run {run_id!r} in {runs_dir} (runs: {known})"
        raise fail(problem)
    kind = run_kind(path)
    assert kind is not None
    return kind


RL_KINDS = ("rl run", "rl train", "rl demo")


@rl_app.command("status", cls=renamed(RUNS_RENAMES))
def status_cmd(
    run_id: str | None = typer.Argument(
        None,
        autocompletion=complete.run_ids,
        help="Run id (`trajforge rl list`); none: one line per run under --output-dir.",
    ),
    runs_dir: Path = RunsDir,
    json_out: bool = JsonOut,
) -> None:
    """A run's status: each process, how it ended and why (an rl train or rl demo run: how far it got)."""
    from trajforge.rl.runs.schema import RunError, overview

    if run_id is None:
        _print_overviews(_overviews(runs_dir), json_out)
        return
    kind = _kind_of(runs_dir, run_id, RL_KINDS, "rl status reads RL runs")
    if kind != "rl run":
        view = overview(runs_dir / run_id, kind)  # type: ignore[arg-type]
        if json_out:
            typer.echo(view.model_dump_json(indent=2))
            return
        typer.echo(
            f"run {view.id} ({view.kind}): {view.status}  {view.dir}"
            + (f"\n  {view.detail}" if view.detail else "")
        )
        return
    try:
        state = asyncio.run(_manager(runs_dir).status(run_id))
    except RunError as exc:
        raise fail(str(exc)) from None
    _print_state(state, json_out)


@rl_app.command("stop", cls=renamed(RUNS_RENAMES))
def stop_cmd(
    run_id: str = typer.Argument(..., autocompletion=complete.run_ids, help="Run id (`trajforge rl list`)."),
    runs_dir: Path = RunsDir,
    grace: float = typer.Option(10.0, "--grace", help="Seconds between SIGTERM and SIGKILL."),
    json_out: bool = JsonOut,
) -> None:
    """Stop a run: SIGTERM to each process group, then SIGKILL after --grace seconds."""
    from trajforge.rl.runs.schema import RunError

    _kind_of(runs_dir, run_id, ("rl run",), "rl stop stops runs `trajforge rl start` made")
    try:
        state = asyncio.run(_manager(runs_dir).stop(run_id, grace_s=grace))
    except RunError as exc:
        raise fail(str(exc)) from None
    _print_state(state, json_out)


def _results(runs_dir: Path, run_id: str, kind: str) -> Any:
    from trajforge.rl.runs.schema import demo_results, train_results

    if kind == "rl train":
        return train_results(runs_dir / run_id)
    if kind == "rl demo":
        return demo_results(runs_dir / run_id)
    manager = _manager(runs_dir)
    asyncio.run(manager.status(run_id))
    return manager.results(run_id)


@rl_app.command("results", cls=renamed(RUNS_RENAMES))
def results_cmd(
    run_id: str | None = typer.Argument(
        None,
        autocompletion=complete.run_ids,
        help="Run id (`trajforge rl list`); none: one line per run under --output-dir.",
    ),
    runs_dir: Path = RunsDir,
    json_out: bool = JsonOut,
) -> None:
    """Metrics summary, the last metrics line and checkpoint paths of a run."""
    from trajforge.rl.runs.schema import RunError

    if run_id is None:
        views = _overviews(runs_dir)
        if json_out:
            typer.echo(json.dumps([v.model_dump(mode="json") for v in views], indent=2))
            return
        _print_overviews(views, False, title="results")
        return
    kind = _kind_of(runs_dir, run_id, RL_KINDS, "rl results reads RL runs")
    try:
        results = _results(runs_dir, run_id, kind)
    except RunError as exc:
        raise fail(str(exc)) from None
    if json_out:
        typer.echo(results.model_dump_json(indent=2))
        return
    console = Console()
    console.print(
        f"run {results.run_id}: {results.status}" + (f" ({results.reason})" if results.reason else ""),
        markup=False,
    )
    table = Table(
        "metric", "first", "last", "min", "max", "mean", title=f"{results.metric_lines} metric lines"
    )
    for name, m in results.metrics.items():
        table.add_row(name, *(f"{v:.4g}" for v in (m.first, m.last, m.min, m.max, m.mean)))
    console.print(table)
    for path in results.checkpoints:
        console.print(f"checkpoint: {path}", markup=False)


@rl_app.command("list", cls=renamed(RUNS_RENAMES))
def list_cmd(runs_dir: Path = RunsDir, json_out: bool = JsonOut) -> None:
    """Every run under --output-dir with its kind and status (managed, rl train, rl demo, env eval, batch)."""
    _print_overviews(_overviews(runs_dir), json_out)


@rl_app.command("logs", cls=renamed(RUNS_RENAMES))
def logs_cmd(
    run_id: str = typer.Argument(..., autocompletion=complete.run_ids, help="Run id (`trajforge rl list`)."),
    runs_dir: Path = RunsDir,
    process: str | None = typer.Option(None, "--process", help="One process (default: all)."),
    lines: int = typer.Option(50, "--lines", min=1, help="Last lines of each log."),
    json_out: bool = JsonOut,
) -> None:
    """The last lines of a run's process logs."""
    from trajforge.rl.runs.schema import RunError

    _kind_of(
        runs_dir, run_id, ("rl run",), "rl logs reads the process logs of runs `trajforge rl start` made"
    )
    try:
        logs = _manager(runs_dir).logs(run_id, process, lines)
    except RunError as exc:
        raise fail(str(exc)) from None
    if json_out:
        typer.echo(json.dumps(logs, indent=2))
        return
    for name, text in logs.items():
        typer.echo(f"==> {name} <==\n{text}")


def _print_overviews(views: list[Any], json_out: bool, title: str = "runs") -> None:
    """One line per run: plain lines off a terminal (every run on one line, whatever the width)."""
    if json_out:
        typer.echo(json.dumps([v.model_dump(mode="json") for v in views], indent=2))
        return
    if not views:
        typer.echo(f"no runs ({title})")
        return
    for v in views:
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(v.created_at)) if v.created_at else "-"
        typer.echo(f"{v.id}  {v.kind}  {v.status}  {started}" + (f"  {v.detail}" if v.detail else ""))


def print_runs(states: list[Any], console: Console | None = None) -> None:
    table = Table(title=f"{len(states)} runs")
    table.add_column("run", no_wrap=True)
    for name in ("kind", "status", "started", "reason"):
        table.add_column(name)
    for s in states:
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(s.created_at))
        reason = (s.reason or "").splitlines()[0][:80] if s.reason else ""
        table.add_row(s.id, s.kind, s.status, started, reason)
    (console or Console()).print(table)


def _print_state(state: Any, json_out: bool = False) -> None:
    if json_out:
        typer.echo(state.model_dump_json(indent=2))
        return
    console = Console()
    console.print(f"run {state.id} ({state.kind}): [bold]{state.status}[/]  {state.dir}")
    for p in state.processes:
        end = f" exit {p.exit_code}" if p.exit_code is not None else (f" {p.signal}" if p.signal else "")
        console.print(f"  {p.name}: {p.status} pid {p.pid}{end}" + (f" url {p.url}" if p.url else ""))
    if state.reason and state.status in {"failed", "stopped"}:
        console.print(f"reason: {state.reason}")


@rl_app.command("agent", cls=renamed(AGENT_RENAMES))
def agent_cmd(
    task: str | None = typer.Argument(None, help='The task, e.g. "Train a model on tiny_tasks".'),
    interactive: bool = typer.Option(False, "--interactive", "-i", help="A REPL; 'status' lists runs."),
    model: str | None = typer.Option(None, "--model", help="Model name at the endpoint."),
    base_url: str | None = typer.Option(None, "--base-url", help="OpenAI-compatible endpoint root."),
    api_key_env: str | None = typer.Option(None, "--api-key-env", help="Env var holding the API key."),
    max_iterations: int = typer.Option(200, "--max-turns", min=1, help="Model calls per task."),
    toolsets: str | None = typer.Option(
        None,
        "--toolsets",
        help="Toolsets offered (default terminal,file,web,rl; rl only for the embedded model).",
    ),
    sandbox: str = typer.Option(
        "bwrap", "--sandbox", help="Where terminal/file tools run: bwrap, local, docker."
    ),
    runs_dir: Path = RunsDir,
    envs_dir: Path = typer.Option(
        Path("envs"), "--envs-dir", help="The operator's env files, listed next to the library."
    ),
    agent_envs_dir: Path | None = typer.Option(
        None,
        "--agent-envs-dir",
        help="Where env files the agent writes are kept (default OUTPUT_DIR/agent_envs); never imported.",
    ),
    trust_agent_envs: bool = typer.Option(
        False,
        "--trust-agent-envs",
        help="Let every env the agent writes run (in its sandbox) without asking. Default: the "
        "interactive REPL asks you for each; without --interactive none runs unless approved with "
        "`trajforge rl agent-envs --approve NAME`.",
    ),
    save_trajectories: Path | None = typer.Option(
        None,
        "--save-trajectories",
        help="Append each task's conversation as a trajectory line: to PATH if it ends in .jsonl, else "
        "to trajectory_samples.jsonl / failed_trajectories.jsonl in the directory PATH.",
    ),
) -> None:
    """The RL agent: discovers, configures, tests, trains and evaluates through the rl tools."""
    from trajforge.endpoint import EndpointConfig, pairing_problem
    from trajforge.llm.types import ModelError
    from trajforge.rl.agent import RLAgentConfig
    from trajforge.rl.runs.tools import RLToolSettings

    problem = pairing_problem(model, base_url)
    if problem:
        raise fail(problem)
    if not interactive and not task:
        raise fail('give a TASK ("Train a model on tiny_tasks") or --interactive')
    from trajforge.rl.prompt import COMPACT_PROMPT, SYSTEM_PROMPT

    endpoint = EndpointConfig(model=model, base_url=base_url, api_key_env=api_key_env)
    # The embedded policy's 1024-token context holds the rl tools and a compact prompt, not more.
    compact = endpoint.embedded and toolsets is None
    if compact:
        _err.print("[dim]embedded model: offering the rl toolset only, with a compact prompt[/]")
    chosen = "rl" if compact else (toolsets or "terminal,file,web,rl")
    try:
        config = RLAgentConfig(
            max_iterations=max_iterations,
            toolsets=[t.strip() for t in chosen.split(",") if t.strip()],
            sandbox=sandbox,  # type: ignore[arg-type]  # validated by pydantic
            system_prompt=COMPACT_PROMPT if compact else SYSTEM_PROMPT,
            save_trajectories=save_trajectories,
        )
    except ValueError as exc:
        raise fail(str(exc)) from None
    try:
        settings = RLToolSettings(
            envs_dir=envs_dir,
            agent_envs_dir=agent_envs_dir or runs_dir / "agent_envs",
            inference_dir=runs_dir / "_inference",
            trust_agent_envs=trust_agent_envs,
        )
    except ValueError as exc:
        raise fail(str(exc)) from None
    approver = _ask_operator if interactive and not trust_agent_envs else None
    try:
        code = asyncio.run(_agent(endpoint, runs_dir, settings, config, task, interactive, approver))
    except (ModelError, ValueError) as exc:
        raise fail(str(exc)) from None
    raise typer.Exit(code)


async def _ask_operator(review: Any) -> bool:
    """The REPL's question before an env the agent wrote first runs (one content, one answer)."""
    classes = ", ".join(str(c.get("class")) for c in review.classes) or "none found"
    _err.print(
        f"\n[bold yellow]The agent wants to run an env it wrote: {review.label}[/]\n"
        f"  file   {review.path}  ({review.size} bytes, sha256 {review.sha256})\n"
        f"  classes {classes}\n"
        "  Read the file before you answer. If approved it runs in its own sandbox (no network, no "
        "host files but trajforge and Python, read-only), and its rewards train and grade your models."
    )
    answer = await asyncio.to_thread(input, "Run it? [y/N] ")
    return answer.strip().lower() in {"y", "yes"}


async def _agent(
    endpoint: Any,
    runs_dir: Path,
    settings: Any,
    config: Any,
    task: str | None,
    interactive: bool,
    approver: Any = None,
) -> int:
    from trajforge.endpoint import open_chat_model
    from trajforge.rl.agent import RLAgent
    from trajforge.rl.runs.manager import Manager

    async with (
        open_chat_model(endpoint, announce=lambda m: _err.print(f"[dim]{m}[/]")) as chat_model,
        RLAgent(chat_model, Manager(runs_dir), settings, config, approver=approver) as agent,
    ):
        code = 0
        if task:
            code = _show(await agent.ask(task))
        if not interactive:
            return code
        _err.print("[dim]RL agent: type a message, 'status' to list runs, 'exit' to quit.[/]")
        while True:
            try:
                line = await asyncio.to_thread(input, "rl> ")
            except EOFError:
                return code
            text = line.strip()
            if text in {"exit", "quit"}:
                return code
            if text == "status":
                print_runs(await agent.runs())
            elif text:
                code = _show(await agent.ask(text))


@rl_app.command("agent-envs", cls=renamed(RUNS_RENAMES))
def agent_envs_cmd(
    runs_dir: Path = RunsDir,
    agent_envs_dir: Path | None = typer.Option(
        None, "--agent-envs-dir", help="The agent env store (default OUTPUT_DIR/agent_envs)."
    ),
    approve: str | None = typer.Option(
        None,
        "--approve",
        help="Approve the latest content of agent env NAME (or NAME@SHA16 for one version) to run in "
        "its sandbox. Read its file first (the list shows where it is).",
    ),
    json_out: bool = JsonOut,
) -> None:
    """Envs the RL agent wrote: their files, sha256 and whether you approved them to run."""
    from trajforge.envs.sandboxed.store import AgentEnvError, AgentEnvStore

    store = AgentEnvStore(agent_envs_dir or runs_dir / "agent_envs")
    try:
        if approve:
            name, _, sha16 = approve.removeprefix("agent/").partition("@")
            latest = {v.name: v for v in store.latest()}
            version = store.version(name, sha16) if sha16 else latest.get(name)
            if version is None:
                raise AgentEnvError(f"no agent env {name!r} in {store.dir}")
            store.approve(version.name, version.sha256, by="trajforge rl agent-envs --approve")
            _err.print(f"approved agent/{version.name} sha256 {version.sha256} ({version.path})")
        versions = store.latest()
    except AgentEnvError as exc:
        raise fail(str(exc)) from None
    if json_out:
        rows = [
            {
                "name": f"agent/{v.name}",
                "classes": [c.get("class") for c in v.classes],
                "sha256": v.sha256,
                "approved": v.approved,
                "file": str(v.path),
            }
            for v in versions
        ]
        typer.echo(json.dumps(rows, indent=2))
        return
    table = Table(title=f"agent envs in {store.dir}")
    for column in ("name", "classes", "sha256", "approved", "file"):
        table.add_column(column, no_wrap=column in ("name", "file"))
    for v in versions:
        classes = ", ".join(str(c.get("class")) for c in v.classes)
        table.add_row(f"agent/{v.name}", classes, v.sha256[:16], "yes" if v.approved else "no", str(v.path))
    Console().print(table)


def _show(result: Any) -> int:
    for m in result.messages[-2 * result.turns_used :] if result.turns_used else []:
        for call in m.get("tool_calls") or []:
            fn = call.get("function", {})
            _err.print(f"[dim]-> {fn.get('name')}({fn.get('arguments', '')[:200]})[/]")
    if result.final_answer is not None:
        print(result.final_answer)
        sys.stdout.flush()
    _err.print(f"[dim]{result.termination.value} after {result.turns_used} model calls[/]")
    if result.error:
        _err.print(f"[yellow]{result.error}[/]")
    return 0 if result.finished_naturally else 1


def register(app: typer.Typer) -> None:
    try:
        from trajforge.cli import rl_train
    except ModuleNotFoundError as exc:  # the trainer command is being written
        if exc.name != "trajforge.cli.rl_train":
            raise
    else:
        rl_train.register(rl_app)
    app.add_typer(rl_app, name="rl")
