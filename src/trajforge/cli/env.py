"""``trajforge env``: list, show, evaluate, rescore and resize environments.

``env eval ENV`` runs an env's held-out items x a group size through the same agent loop and
sandboxes as ``batch`` and prints mean reward, pass@1, pass@k and per-category results with 95%
intervals; episodes land in ``OUTPUT_DIR/RUN_NAME/episodes.jsonl`` (resumable: run the same
command again). ``env rescore RUN_DIR`` judges stored episodes again from what the env kept,
without the model. ``env serve|process|evaluate`` (the Atropos adapter) live in
:mod:`trajforge.cli.env_atropos`.
"""

from __future__ import annotations

import asyncio
import json
import time
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
import typer
from rich.console import Console
from rich.table import Table

from trajforge.cli import complete
from trajforge.cli.errors import fail
from trajforge.cli.vocab import renamed

if TYPE_CHECKING:
    from trajforge.envs.running.ray_backend import RayEvalConfig

env_app = typer.Typer(
    help="RL and evaluation environments: list, show, eval, rescore, resize, serve, process, evaluate.",
    no_args_is_help=True,
)
_err = Console(stderr=True)


@env_app.command("list")
def list_cmd(json_out: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """The shipped environments, one line each (user envs load from path/to/file.py:ClassName)."""
    from trajforge.envs.catalog import LIBRARY, available, describe

    here = available()
    if json_out:
        rows = [
            {
                "name": name,
                "available": name in here,
                "description": describe(name)[1] if name in here else None,
            }
            for name in LIBRARY
        ]
        typer.echo(json.dumps(rows, indent=2))
        return
    table = Table(title="Environments")
    table.add_column("name")
    table.add_column("description")
    for name in LIBRARY:
        if name in here:
            table.add_row(name, describe(name)[1])
        else:
            table.add_row(name, "[dim](not in this install)[/]")
    Console().print(table)


@env_app.command("show")
def show_cmd(
    env: str = typer.Argument(
        ..., help="Env name or path/to/file.py:ClassName.", autocompletion=complete.env_names
    ),
    json_out: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """An env's default config and an example item."""
    from trajforge.envs import EnvConfigError, UnknownEnvError, load_env

    try:
        instance = load_env(env)
        asyncio.run(instance.setup())
        example = instance.eval_items(1)[0]
    except (UnknownEnvError, EnvConfigError, ValueError) as exc:
        raise fail(str(exc)) from None
    data: dict[str, Any] = {
        "name": instance.name,
        "description": instance.description,
        "config": instance.config.model_dump(mode="json"),
        "example_item": example,
        "example_prompt": instance.format_prompt(example),
    }
    if json_out:
        typer.echo(json.dumps(data, indent=2, default=str))
        return
    typer.echo(f"{data['name']}: {data['description']}\n\nconfig:")
    for key, value in data["config"].items():
        typer.echo(f"  {key}: {json.dumps(value, default=str)}")
    typer.echo(f"\nexample item:\n{json.dumps(example, indent=2, default=str)[:4000]}")
    typer.echo(f"\nexample prompt:\n{data['example_prompt']}")


class Backend(StrEnum):
    """Where ``env eval`` runs its rollouts."""

    local = "local"
    ray = "ray"


# Old spellings, kept for one release (docs/cli.md).
EVAL_RENAMES = {"--n": "--max-samples"}
RESIZE_RENAMES = {"--rollouts": "--concurrency", "--tools": "--max-parallel-tools"}
_AGENTS = ("model", "oracle", "none")


@env_app.command("eval", cls=renamed(EVAL_RENAMES))
def eval_cmd(
    env: str = typer.Argument(
        ..., help="Env name or path/to/file.py:ClassName.", autocompletion=complete.env_names
    ),
    model: str | None = typer.Option(
        None, "--model", help="Endpoint model name (omit with --base-url for embedded)."
    ),
    base_url: str | None = typer.Option(None, "--base-url", help="OpenAI-compatible endpoint root."),
    api_key_env: str | None = typer.Option(None, "--api-key-env", help="Env var holding the API key."),
    tokenizer: str | None = typer.Option(
        None,
        "--tokenizer",
        help="Token level: a local tokenizer dir (records carry tokens/masks/logprobs); 'auto' with the embedded policy.",
    ),
    endpoint_dialect: str = typer.Option(
        "auto",
        "--endpoint-dialect",
        help="Which server --base-url is: auto (probe it), openai, vllm, sglang, llamacpp, llamacpp_python, "
        "ollama, openrouter, trajforge (docs/servers.md).",
    ),
    tool_call_parser: str = typer.Option(
        "auto",
        "--tool-call-parser",
        help="Tool-call format of the model: calls the endpoint returned as text are parsed and run (auto: "
        "detect; off where the server parses calls itself; none: never); with --tokenizer, the parser.",
    ),
    n: int = typer.Option(20, "--max-samples", min=1, help="Held-out items."),
    group_size: int | None = typer.Option(
        None, "--group-size", min=1, help="Rollouts per item (default: env's)."
    ),
    agent: str = typer.Option("model", "--agent", help="model, oracle (the task's own solution) or none."),
    tasks: Path | None = typer.Option(None, "--tasks", help="Task directory for envs that read one."),
    config: Path | None = typer.Option(None, "--config", help="YAML env config (fields of EnvConfig)."),
    temperature: float | None = typer.Option(None, "--temperature", min=0.0, help="Sampling temperature."),
    max_turns: int | None = typer.Option(None, "--max-turns", min=1, help="Model calls per rollout."),
    concurrency: int | None = typer.Option(None, "--concurrency", min=1, help="Rollouts at once."),
    sandbox: str | None = typer.Option(None, "--sandbox", help="bwrap (default), local or docker."),
    seed: int | None = typer.Option(None, "--seed", help="Seeds toolset draws and training items."),
    output_dir: Path = typer.Option(Path("data/env"), "--output-dir", help="Parent of the run directory."),
    run_name: str | None = typer.Option(
        None, "--run-name", help="Run directory name (default: ENV-n-g-time)."
    ),
    backend: Backend = typer.Option(
        Backend.local,
        "--backend",
        help="Where rollouts run: local (this process) or ray (rollout actors on every node of a Ray "
        "cluster, --actors-per-node each; this process keeps the run directory).",
    ),
    ray_address: str | None = typer.Option(
        None,
        "--ray-address",
        help="With --backend ray: the cluster's HOST:PORT (default: a cluster running on this machine, "
        "else a new local one).",
    ),
    actors_per_node: int | None = typer.Option(
        None,
        "--actors-per-node",
        help="With --backend ray: rollout actors on each node (default 1; batch's --workers). "
        "--concurrency stays the cluster's total; the endpoint budget is split over all actors.",
    ),
    progress: str = typer.Option(
        "auto", "--progress", help="auto|rich|plain|none (auto: rich on a terminal, plain lines otherwise)"
    ),
    json_out: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
    verbose: bool = typer.Option(False, "-v", "--verbose", help="On a failure, print the traceback too."),
) -> None:
    """Evaluate ENV: held-out items x group size, judged in their own sandboxes."""
    endpoint = _endpoint(model, base_url, api_key_env, tokenizer, endpoint_dialect, tool_call_parser)
    if agent not in _AGENTS:
        raise fail(f"--agent must be model, oracle or none, not {agent!r}")
    if progress not in ("auto", "rich", "plain", "none"):
        raise fail(f"--progress takes auto, rich, plain or none; got {progress!r}")
    where = _placement(backend, ray_address, actors_per_node)
    settings = _overrides(
        agent_temperature=temperature,
        max_agent_turns=max_turns,
        max_concurrent_rollouts=concurrency,
        sandbox=sandbox,
        seed=seed,
        tasks_dir=str(tasks) if tasks else None,
    )
    instance = _load_for_eval(env, settings, config, tasks, verbose)
    from trajforge.envs.hooks import evaluates_itself

    if where is not None and evaluates_itself(instance):
        raise fail(
            f"{type(instance).__name__}'s evaluation is its own evaluate(), which runs in this process: "
            "run it without --backend ray (--backend ray runs an env's rollouts on rollout actors)"
        )
    for line in _notes(instance, config):
        _err.print(f"note: {line}", markup=False, highlight=False, soft_wrap=True)
    size = group_size or instance.config.group_size
    run_dir = output_dir / (run_name or f"{instance.name}-n{n}-g{size}-{time.strftime('%Y%m%d-%H%M%S')}")
    if run_dir.exists():  # a resume: never an evaluation's files in another kind of run
        from trajforge.record.runs import kind_problem, run_kind

        if run_kind(run_dir) not in (None, "env eval"):
            raise fail(kind_problem(run_dir, ("env eval",), "choose another --run-name / --output-dir") or "")
    run = _run_with_progress(instance, endpoint, run_dir, n, size, agent, (env, where), progress, verbose)
    _show_eval(run, run_dir, json_out)


def _notes(instance: Any, config: Path | None) -> list[str]:
    """What the env says about how it runs here (a seed env: its backend, its server configs),
    and the sections of a ``--config`` file that are not the env's (a seed YAML's ``openai:``)."""
    from trajforge.envs.hooks import notes_hook

    notes = notes_hook(instance)
    lines = list(notes()) if notes is not None else []
    if config is not None:
        import yaml

        try:
            raw = yaml.safe_load(config.read_text()) or {}
        except (OSError, yaml.YAMLError):
            raw = {}
        if isinstance(raw, dict) and "env" in raw:
            other = sorted(str(k) for k in raw if k != "env")
            if other:
                lines.append(
                    f"{config}: section(s) {', '.join(other)} not used (the model is --model/--base-url; "
                    "only env: configures the env)"
                )
    return lines


def _failed(what: str, exc: BaseException, verbose: bool, *, hint: bool = True) -> typer.Exit:
    """One line for a failure (of the env's own code: with a hint); its traceback first with ``-v``."""
    if verbose:
        import traceback

        traceback.print_exception(exc)
    detail = str(exc).strip() or type(exc).__name__
    return fail(f"{what}{detail}{' (-v prints the traceback)' if hint and not verbose else ''}")


def _overrides(**flags: Any) -> dict[str, Any]:
    return {k: v for k, v in flags.items() if v is not None}


def _endpoint(
    model: str | None,
    base_url: str | None,
    api_key_env: str | None,
    tokenizer: str | None,
    endpoint_dialect: str = "auto",
    tool_call_parser: str = "auto",
) -> Any:
    """Which model answers: --model with --base-url, or neither for the embedded policy."""
    from trajforge.endpoint import EndpointConfig, pairing_problem
    from trajforge.llm.dialects import check_dialect_name
    from trajforge.llm.parsers import check_parser_name

    problem = pairing_problem(model, base_url)
    if problem:
        raise fail(problem)
    try:
        check_dialect_name(endpoint_dialect)
        check_parser_name(tool_call_parser)
    except ValueError as exc:
        raise fail(str(exc)) from None
    return EndpointConfig(
        model=model,
        base_url=base_url,
        api_key_env=api_key_env,
        tokenizer=tokenizer,
        endpoint_dialect=endpoint_dialect,
        tool_call_parser=tool_call_parser,
    )


def _placement(
    backend: Backend, ray_address: str | None, actors_per_node: int | None
) -> RayEvalConfig | None:
    """Where the rollouts run: None here, or the Ray cluster's ``RayEvalConfig``."""
    from trajforge.raycluster import missing_ray

    if backend is not Backend.ray:
        if ray_address is not None:
            raise fail("--ray-address needs --backend ray")
        if actors_per_node is not None:
            raise fail("--actors-per-node needs --backend ray")
        return None
    from trajforge.envs.running.ray_backend import RayEvalConfig

    try:
        where = RayEvalConfig.of(ray_address, 1 if actors_per_node is None else actors_per_node)
    except ValueError as exc:
        raise fail(str(exc)) from None
    if missing := missing_ray("--backend ray"):
        raise fail(missing)
    return where


def _load_for_eval(
    env: str, settings: dict[str, Any], config: Path | None, tasks: Path | None, verbose: bool = False
) -> Any:
    """The env, built from its defaults, the ``--config`` file, then the flags. A failure of the
    user's env code (an import, ``config_init``, ``__init__``) is one line, its traceback with -v."""
    from trajforge.envs import (
        EnvConfig,
        EnvConfigError,
        UnknownEnvError,
        env_class,
        load_env,
        load_env_config,
    )

    try:
        cls = env_class(env)
        config_class: type[EnvConfig] = getattr(cls, "config_class", EnvConfig)  # BaseEnv's, if any
        if tasks is not None and "tasks_dir" not in config_class.model_fields:
            raise fail(f"env {env!r} does not read a task directory (--tasks is for envs that do)")
        if config is None:
            return load_env(env, settings)
        defaults = cls.default_config() if hasattr(cls, "default_config") else EnvConfig()
        return load_env(env, settings, config=load_env_config(config, defaults))
    except (UnknownEnvError, EnvConfigError) as exc:
        if verbose:
            import traceback

            traceback.print_exception(exc)
        raise fail(str(exc)) from None
    except typer.Exit:
        raise
    except Exception as exc:  # the env's own code failed while loading
        raise _failed(f"loading env {env!r} failed: {type(exc).__name__}: ", exc, verbose) from None


def _run_with_progress(
    instance: Any,
    endpoint: Any,
    run_dir: Path,
    n: int,
    size: int,
    agent: str,
    placed: tuple[str, RayEvalConfig | None],
    mode: str,
    verbose: bool = False,
) -> Any:
    """Run the evaluation with a live display of its phase, episodes done, rate and ETA."""
    from trajforge.cli.live import LiveProgress
    from trajforge.raycluster import ClusterError

    env_ref, where = placed
    live = LiveProgress(f"env eval {instance.name}", unit="episodes", mode=mode)  # type: ignore[arg-type]
    try:
        with live:
            return asyncio.run(
                _eval(
                    instance, endpoint, run_dir, n, size, agent, live, ray=(env_ref, where) if where else None
                )
            )
    except (ValueError, ClusterError) as exc:
        raise _failed("", exc, verbose, hint=False) from None


def _show_eval(run: Any, run_dir: Path, json_out: bool) -> None:
    if json_out:
        typer.echo(json.dumps(run.summary.model_dump(mode="json"), indent=2))
        return
    _print_summary(run.summary, run_dir)
    if run.summary.requeued:
        earlier = run.summary.requeued - run.requeued
        Console().print(
            f"requeued after a lost rollout actor: {run.summary.requeued} episode(s), each written "
            f"once ({run.summary.actors_lost} actor(s) lost"
            + (f"; {earlier} of them before this invocation" if earlier else "")
            + ")"
        )


async def _eval(
    env: Any,
    endpoint: Any,
    run_dir: Path,
    n: int,
    group_size: int,
    agent: str,
    live: Any,
    *,
    ray: tuple[str, RayEvalConfig] | None = None,
) -> Any:
    """Run the evaluation here, or with ``ray`` = (the env's reference, its ``RayEvalConfig``)
    on rollout actors of a Ray cluster; the ``EvalRun``."""
    from trajforge.envs import run_eval
    from trajforge.envs.running.backends import open_rollout_backends

    rewards: list[float] = []

    def announce(message: str) -> None:
        live.note(message)

    def progress(ep: Any, done: int, total: int) -> None:
        if ep is not None and ep.reward_value is not None:
            rewards.append(ep.reward_value)
        live.phase("rollouts")
        mean = f"mean reward {sum(rewards) / len(rewards):.3f}" if rewards else ""
        live.advance(done, total, mean)

    live.phase("starting")
    if ray is not None:
        from trajforge.envs.running.ray_backend import EnvSpec, run_eval_on_ray

        env_ref, where = ray
        return await run_eval_on_ray(
            env,
            EnvSpec.of(env_ref, env, endpoint, agent),
            run_dir,
            n=n,
            group_size=group_size,
            ray_address=where.address,
            actors_per_node=where.actors_per_node,
            on_episode=progress,
            announce=announce,
        )
    async with open_rollout_backends(env, endpoint, agent, announce=announce) as backends:
        from trajforge.endpoint import preflight_model
        from trajforge.llm.types import ModelError

        try:
            await preflight_model(backends.model, announce)
        except ModelError as exc:  # said once, before any episode (printed as a one-line error)
            raise ValueError(f"endpoint check failed: {exc}") from None
        live.phase("rollouts")
        return await run_eval(
            env,
            backends,
            run_dir,
            n=n,
            group_size=group_size,
            agent=agent,
            on_episode=progress,
            announce=announce,
        )


def _print_summary(summary: Any, run_dir: Path) -> None:
    table = Table(title=f"{summary.env}: {summary.items} items x {summary.group_size} rollouts")
    table.add_column("")
    table.add_column("items", justify="right")
    table.add_column("mean reward [95% CI]", justify="right")
    table.add_column("pass@1 [95% CI]", justify="right")
    table.add_row("all", str(summary.items), str(summary.mean_reward), str(summary.pass_at_1))
    for cat, res in summary.by_category.items():
        table.add_row(f"  {cat}", str(res.items), str(res.mean_reward), str(res.pass_at_1))
    console = Console()
    console.print(table)
    at_k = ", ".join(
        f"pass@{k} {summary.pass_at_k_interval.get(k) or f'{v:.3f}'}" for k, v in summary.pass_at_k.items()
    )
    console.print(
        f"{at_k}; episodes {summary.episodes} (failed to run: {summary.failed}, reward errors: {summary.reward_errors})"
    )
    console.print(f"episodes: {run_dir / 'episodes.jsonl'}")


@env_app.command("rescore")
def rescore_cmd(
    run_dir: Path = typer.Argument(..., help="An `env eval` run directory."),
    env: str | None = typer.Option(None, "--env", help="Env to judge with (default: the run's)."),
    write: bool = typer.Option(False, "--write", help="Rewrite episodes.jsonl with the new rewards."),
    json_out: bool = typer.Option(False, "--json", help="Print the counts (and the new summary) as JSON."),
) -> None:
    """Judge stored episodes again from what the env kept (final files, transcripts); no model."""
    from trajforge.engine.books import EPISODES_FILE, RUN_FILE, write_summary
    from trajforge.envs import EnvConfigError, UnknownEnvError, load_env, read_episodes
    from trajforge.record.runs import kind_problem

    run_file = run_dir / RUN_FILE
    problem = kind_problem(run_dir, ("env eval",), "env rescore judges the episodes of")
    if problem is not None:
        raise fail(problem)
    meta = orjson.loads(run_file.read_bytes())
    try:
        instance = load_env(env or meta["env"], meta.get("config") if env is None else None)
    except (UnknownEnvError, EnvConfigError) as exc:
        raise fail(str(exc)) from None
    episodes = read_episodes(run_dir / EPISODES_FILE)
    changed = same = unable = 0
    new = []
    for ep in episodes:
        old = ep.reward
        verdict = asyncio.run(instance.rescore(ep.item, ep.messages, old.kept if old else {}))
        if verdict is None:
            unable += 1
            new.append(ep)
            continue
        from trajforge.record import Reward

        reward = Reward.of(verdict)
        if abs(reward.score - ep.score) > 1e-9:
            changed += 1
        else:
            same += 1
        if old is not None:  # what the judge kept (and the token scores it gave) stay the rollout's
            scored = reward.token_advantages if reward.token_advantages is not None else old.token_advantages
            carried = {"kept": old.kept, "token_advantages": scored}
            reward = reward.model_copy(update=carried)
        new.append(ep.model_copy(update={"reward": reward}))
    if unable == len(episodes) and episodes:
        raise fail(
            f"env {instance.name!r} cannot rescore without a sandbox (it keeps nothing to judge offline)"
        )
    counts = {"rescored": len(episodes) - unable, "same": same, "changed": changed, "not_rescorable": unable}
    summary = None
    if write:
        tmp = run_dir / (EPISODES_FILE + ".tmp")
        tmp.write_bytes(b"".join(e.line() for e in new))
        tmp.replace(run_dir / EPISODES_FILE)
        summary = write_summary(run_dir, instance.name)
    if json_out:
        data: dict[str, Any] = {**counts, "written": write}
        if summary is not None:
            data["summary"] = summary.model_dump(mode="json")
        typer.echo(json.dumps(data, indent=2))
        return
    typer.echo(
        f"rescored {counts['rescored']} episodes: {same} same reward, {changed} changed, {unable} not rescorable"
    )
    if write:
        typer.echo(f"wrote {run_dir / EPISODES_FILE} and summary.json")


@env_app.command("resize", cls=renamed(RESIZE_RENAMES))
def resize_cmd(
    run_dir: Path = typer.Argument(..., help="A running `env eval` run directory."),
    rollouts: int | None = typer.Option(None, "--concurrency", min=1, help="Rollouts at once."),
    tools: int | None = typer.Option(
        None, "--max-parallel-tools", min=1, help="Tool calls at once within a rollout."
    ),
    json_out: bool = typer.Option(False, "--json", help="Print what was asked as JSON."),
) -> None:
    """Change a running evaluation's concurrency (picked up within a second; see status.json)."""
    from trajforge.envs import write_control

    if rollouts is None and tools is None:
        raise fail("give --concurrency N and/or --max-parallel-tools N")
    from trajforge.record.runs import kind_problem

    problem = kind_problem(run_dir, ("env eval",), "env resize changes a running")
    if problem is not None:
        raise fail(problem)
    write_control(run_dir, max_concurrent_rollouts=rollouts, max_parallel_tools=tools)
    if json_out:
        data = {"run_dir": str(run_dir), "concurrency": rollouts, "max_parallel_tools": tools}
        typer.echo(json.dumps(data, indent=2))
        return
    typer.echo(
        f"asked {run_dir} for concurrency={rollouts} max-parallel-tools={tools}; watch {run_dir / 'status.json'}"
    )


def register(app: typer.Typer) -> None:
    try:
        from trajforge.cli.env_atropos import register as register_atropos
    except ModuleNotFoundError:  # pragma: no cover
        pass
    else:
        register_atropos(env_app)
    app.add_typer(env_app, name="env")
