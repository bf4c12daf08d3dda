"""``env eval --backend ray`` against the same evaluation in this process, same endpoint and items.

Why: the Ray path adds one Ray call per episode (driver -> the node's actor), the episode record
shipped back (messages, reward breakdown, kept files), Ray's daemons and the actor's start; this
measures that overhead per episode, the way ``batch_ray.py`` does for the batch backend.

Setup: ``batch_throughput.py``'s scripted endpoint in its own process (``--latency`` per call,
``tool_then_answer``: 2 ``terminal`` calls then the answer, 3 model calls per episode), the
``terminal_test`` env's first ``--n`` eval items x ``--group-size``, bwrap sandboxes (reuse on, as
the CLI builds them), ``--concurrency`` rollouts at once. A one-node Ray cluster is started on
loopback before the timing, so the Ray run has one rollout actor doing what the local run does.
Runs alternate local / ray ``--repeat`` times; per run: episodes/s over the whole call (actor
start-up included: it is part of what a user waits for) and from the first finished episode to
the last (steady state), the machine's CPU per episode minus the endpoint's, and the ray - local
difference.

    flock /tmp/helpers/bench.lock .venv/bin/python benchmarks/env_ray.py --n 100 --group-size 4
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from statistics import median
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).parent))
from batch_ray import local_ray  # noqa: E402
from batch_throughput import _machine_cpu, _process_cpu, _start_server  # noqa: E402

from trajforge.endpoint import EndpointConfig  # noqa: E402
from trajforge.envs import load_env, run_eval  # noqa: E402
from trajforge.envs.running.backends import open_rollout_backends  # noqa: E402
from trajforge.envs.running.ray_backend import EnvSpec, run_eval_on_ray  # noqa: E402


async def _eval(
    args: argparse.Namespace,
    run_dir: Path,
    endpoint: EndpointConfig,
    ray: str | None,
    finish_times: list[float],
) -> int:
    env = load_env("terminal_test", {"sandbox": "bwrap", "max_concurrent_rollouts": args.concurrency})

    def finished(*_: object) -> None:
        finish_times.append(time.perf_counter())

    if ray is not None:
        run = await run_eval_on_ray(
            env,
            EnvSpec.of("terminal_test", env, endpoint, "model"),
            run_dir,
            n=args.n,
            group_size=args.group_size,
            ray_address=ray,
            on_episode=finished,
            announce=lambda _m: None,
        )
    else:
        async with open_rollout_backends(env, endpoint) as backends:
            run = await run_eval(
                env, backends, run_dir, n=args.n, group_size=args.group_size, on_episode=finished
            )
    return run.summary.episodes


def _run(
    args: argparse.Namespace, tmp: Path, endpoint: EndpointConfig, server: int, name: str, ray: str | None
) -> dict[str, Any]:
    machine0, server0, t0 = _machine_cpu(), _process_cpu(server), time.perf_counter()
    finish_times: list[float] = []
    episodes = asyncio.run(_eval(args, tmp / name, endpoint, ray, finish_times))
    wall = time.perf_counter() - t0
    steady = (len(finish_times) - 1) / (finish_times[-1] - finish_times[0])
    machine, endpoint_cpu = _machine_cpu() - machine0, _process_cpu(server) - server0
    return {
        "backend": "ray" if ray else "local",
        "episodes": episodes,
        "wall_s": round(wall, 2),
        "episodes_per_s_incl_startup": round(episodes / wall, 2),
        "episodes_per_s_first_to_last": round(steady, 2),
        "machine_cpu_ms_per_episode_minus_endpoint": round((machine - endpoint_cpu) / episodes * 1000, 1),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=100, help="held-out items")
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--latency", type=float, default=0.2)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--repeat", type=int, default=2)
    args = p.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="tfer", dir="/tmp"))  # short: Ray's socket paths
    server = _start_server(args.latency, tmp / "port")
    runs: list[dict[str, Any]] = []
    try:
        port = int((tmp / "port").read_text())
        endpoint = EndpointConfig(
            model="scripted", base_url=f"http://127.0.0.1:{port}/v1", api_key_env="BENCH_KEY"
        )
        os.environ.setdefault("BENCH_KEY", "unused")  # before `ray start`: the node inherits it
        with local_ray(tmp, cpus=os.cpu_count() or 1) as address:
            for i in range(args.repeat):
                runs.append(_run(args, tmp, endpoint, server.pid, f"local{i}", None))
                runs.append(_run(args, tmp, endpoint, server.pid, f"ray{i}", address))
    finally:
        server.terminate()
        server.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    pairs = list(zip(runs[::2], runs[1::2], strict=True))
    key = "machine_cpu_ms_per_episode_minus_endpoint"
    summary: dict[str, Any] = {
        "runs": runs,
        "ray_over_local_throughput": [
            round(r["episodes_per_s_first_to_last"] / loc["episodes_per_s_first_to_last"], 3)
            for loc, r in pairs
        ],
        "ray_minus_local_cpu_ms_per_episode": [round(r[key] - loc[key], 1) for loc, r in pairs],
    }
    summary["median_cpu_overhead_ms_per_episode"] = median(summary["ray_minus_local_cpu_ms_per_episode"])
    print(orjson.dumps(summary, option=orjson.OPT_INDENT_2).decode())


if __name__ == "__main__":
    main()
