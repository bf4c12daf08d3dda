"""``trajforge env eval`` vs ``trajforge batch`` on the same endpoint, sandbox and items.

Why: both paths run the same agent loop in the same sandboxes; env eval adds judging every
episode (and keeping its files), batch ``--env`` adds the same judging to a data run. This
measures what that judging costs (batch graded vs ungraded) and what the env-eval runner costs
over the batch scheduler (env eval vs batch graded), on a latency-bound endpoint where the
difference is pure overhead.

Setup: the scripted OpenAI-compatible endpoint in a SEPARATE process (``python -m
trajforge.testing.server_cli``), ``--latency`` per call (default 200 ms), policy
``tool_then_answer``: 2 ``terminal`` calls (``echo hi``) then the answer, so 3 model calls per
episode. Items: the ``terminal_test`` env's first N eval items; the batch dataset is the same
items as rows (prompt, setup_files, expected_files), toolsets terminal+file as the env's. Same
sandbox (bwrap, reuse on), same concurrency, one worker; batch with fsync off, env eval as it
always runs (it fsyncs its episode file every 32 episodes).

Each round runs, in an order that rotates between rounds:

- ``env_eval``: ``run_eval`` with ``RolloutBackends`` (what ``trajforge env eval`` runs), its
  sandbox factory with reuse on (``--eval-no-reuse`` also runs it as the CLI builds it today);
- ``batch_graded``: ``run_batch`` with ``env="terminal_test"``;
- ``batch_ungraded``: ``run_batch`` without grading.

Prints episodes/s, CPU ms per episode of this process plus its reaped children (sandboxes), the
machine's load, and per round the ratios env_eval/batch_graded and batch_graded/batch_ungraded
(the reward overhead, as a throughput ratio: 1.0 = free).

    .venv/bin/python benchmarks/env_vs_batch.py --episodes 200 --concurrency 32 --rounds 2
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).parent))
from _endpoint import KEY_VAR, scripted_endpoint  # noqa: E402
from _endpoint import own_cpu as _cpu  # noqa: E402

from trajforge.batch.config import load_config  # noqa: E402
from trajforge.batch.runner import run_batch  # noqa: E402
from trajforge.endpoint import EndpointConfig, open_chat_model  # noqa: E402
from trajforge.envs import RolloutBackends, load_env, run_eval  # noqa: E402
from trajforge.sandbox import close_factory, create_sandbox_factory, factory_counts  # noqa: E402
from trajforge.sandbox.types import SandboxConfig  # noqa: E402
from trajforge.tools.builtin import default_registry  # noqa: E402

ENV = "terminal_test"
TOOL_CALLS = 2


def _env(args: argparse.Namespace) -> Any:
    return load_env(ENV, {"max_concurrent_rollouts": args.concurrency, "sandbox": "bwrap"})


async def _env_eval(args: argparse.Namespace, base_url: str, run_dir: Path, *, reuse: bool) -> dict[str, Any]:
    """What ``trajforge env eval`` runs (cli/env.py ``_eval``), with the sandbox reuse chosen."""
    env = _env(args)
    factory = create_sandbox_factory(
        SandboxConfig(kind="bwrap", command_timeout_s=env.config.command_timeout_s, reuse=reuse)
    )
    registry = default_registry()
    endpoint = EndpointConfig(model="scripted", base_url=base_url, api_key_env=KEY_VAR)
    try:
        async with open_chat_model(endpoint) as model:
            run = await run_eval(
                env, RolloutBackends(model, factory, registry), run_dir, n=args.episodes, group_size=1
            )
    finally:
        await close_factory(factory)
        await registry.aclose()
    s = run.summary
    return {
        "episodes": s.episodes,
        "failed": s.failed,
        "reward_errors": s.reward_errors,
        "mean_reward": s.mean_reward.value,
        "sandboxes": factory_counts(factory),
    }


def _batch(args: argparse.Namespace, base_url: str, tmp: Path, name: str, *, graded: bool) -> dict[str, Any]:
    cfg = load_config(
        None,
        {
            "dataset": tmp / "items.jsonl",
            "run_name": name,
            "output_dir": tmp / "batch",
            "model": "scripted",
            "base_url": base_url,
            "api_key_env": KEY_VAR,
            "toolsets": ["terminal", "file"],
            "sandbox": "bwrap",
            "sandbox_reuse": True,
            "concurrency": args.concurrency,
            "workers": 1,
            "fsync": False,
            "progress": "none",
            "env": ENV if graded else None,
        },
    )
    stats = asyncio.run(run_batch(cfg)).statistics
    return {
        "statuses": stats["status_counts"],
        "rewards": stats["rewards"],
        "sandboxes": stats["sandboxes"],
        "runner_reported_per_s": stats["session"]["throughput_per_s"],
    }


def _timed(fn: Any) -> tuple[dict[str, Any], float, float]:
    cpu0, t0 = _cpu(), time.perf_counter()
    result = fn()
    return result, time.perf_counter() - t0, _cpu() - cpu0


def _round(args: argparse.Namespace, base_url: str, tmp: Path, r: int) -> dict[str, Any]:
    runs: dict[str, Any] = {
        "env_eval": lambda: asyncio.run(_env_eval(args, base_url, tmp / "env" / f"reuse-{r}", reuse=True)),
        "batch_graded": lambda: _batch(args, base_url, tmp, f"graded-{r}", graded=True),
        "batch_ungraded": lambda: _batch(args, base_url, tmp, f"ungraded-{r}", graded=False),
    }
    if args.eval_no_reuse:
        runs["env_eval_no_reuse"] = lambda: asyncio.run(
            _env_eval(args, base_url, tmp / "env" / f"noreuse-{r}", reuse=False)
        )
    names = list(runs)
    order = names[r % len(names) :] + names[: r % len(names)]  # rotate: no variant always goes first
    out: dict[str, Any] = {"order": order, "load_before": round(os.getloadavg()[0], 1)}
    for name in order:
        result, wall, cpu = _timed(runs[name])
        out[name] = {
            "episodes_per_s": round(args.episodes / wall, 1),
            "cpu_ms_per_episode": round(1000 * cpu / args.episodes, 1),
            "wall_s": round(wall, 2),
            **result,
        }
    out["load_after"] = round(os.getloadavg()[0], 1)
    rate = {k: out[k]["episodes_per_s"] for k in names}
    out["env_eval_over_batch_graded"] = round(rate["env_eval"] / rate["batch_graded"], 3)
    out["batch_graded_over_ungraded"] = round(rate["batch_graded"] / rate["batch_ungraded"], 3)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--episodes", type=int, default=200)
    p.add_argument("--latency", type=float, default=0.2)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--rounds", type=int, default=2, help="each round runs every variant once")
    p.add_argument(
        "--eval-no-reuse",
        action="store_true",
        help="also run env eval without sandbox reuse (how `trajforge env eval` builds its factory)",
    )
    args = p.parse_args()

    with scripted_endpoint(args.latency, prefix="tf-envbatch-", tool_calls=TOOL_CALLS) as endpoint:
        tmp = endpoint.tmp
        items = _env(args).eval_items(args.episodes)
        (tmp / "items.jsonl").write_bytes(b"".join(orjson.dumps(item) + b"\n" for item in items))
        rounds = [_round(args, endpoint.base_url, tmp, r) for r in range(args.rounds)]
    ideal = args.concurrency / ((TOOL_CALLS + 1) * args.latency)
    report = {
        "setup": {
            "episodes": args.episodes,
            "concurrency": args.concurrency,
            "latency_s": args.latency,
            "model_calls_per_episode": TOOL_CALLS + 1,
            "ideal_episodes_per_s": round(ideal, 1),
            "cpus": os.cpu_count(),
        },
        "rounds": rounds,
        "median_env_eval_over_batch_graded": statistics.median(
            r["env_eval_over_batch_graded"] for r in rounds
        ),
        "median_batch_graded_over_ungraded": statistics.median(
            r["batch_graded_over_ungraded"] for r in rounds
        ),
    }
    print(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode())


if __name__ == "__main__":
    main()
