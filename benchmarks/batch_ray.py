"""The Ray backend's overhead per sample against the single-machine engine, same endpoint.

One scripted endpoint in its own process (``batch_throughput.py``'s: 200 ms per call, 3 model calls
and 2 ``terminal`` commands per sample). A one-node Ray cluster is started on loopback beforehand
(``ray start --head``, not timed), so the Ray run has one rollout actor running the same engine at
the same ``--concurrency`` as the local run: the difference is what the backend adds (a call per
sample from the driver to the actor, the line shipped back, Ray's own daemons). Runs alternate
local / ray ``--repeat`` times; per run: trajectories/s over the samples' span (first start to last
finish), the whole machine's CPU per trajectory (/proc/stat, minus the endpoint process: it also
counts Ray's GCS, raylet and agents), and the ray - local difference of that CPU per sample.

    .venv/bin/python benchmarks/batch_ray.py --samples 600 --sandbox bwrap --repeat 2
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from statistics import median

import orjson

sys.path.insert(0, str(Path(__file__).parent))
from batch_throughput import CALLS, _machine_cpu, _process_cpu, _start_server  # noqa: E402

from trajforge.batch.config import load_config  # noqa: E402
from trajforge.batch.runner import run_batch  # noqa: E402

LOOPBACK = "127.0.0.2"  # `ray start` rewrites 127.0.0.1 to the outward address; this one stays local


@contextlib.contextmanager
def local_ray(tmp: Path, cpus: int) -> Iterator[str]:
    """A one-node Ray cluster on loopback for the run (its address), its daemons killed after.
    ``RAY_AUTH_MODE=disabled`` unless set: a token file in ~/.ray would lock the driver out."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    address, group = _start_ray(tmp, cpus)
    try:
        yield address
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGKILL)


def _start_ray(tmp: Path, cpus: int) -> tuple[str, int]:
    port = 26000 + os.getpid() % 1000
    proc = subprocess.run(
        [
            str(Path(sys.executable).with_name("ray")),
            "start",
            "--head",
            "--node-ip-address",
            LOOPBACK,
            "--port",
            str(port),
            "--num-cpus",
            str(cpus),
            "--include-dashboard=false",
            "--disable-usage-stats",
            "--object-store-memory",
            str(200 * 2**20),
            "--temp-dir",
            str(tmp / "ray"),
        ],
        capture_output=True,
        text=True,
        start_new_session=True,  # the head's daemons share this group: killed as one at the end
        check=False,
    )
    if proc.returncode:
        raise SystemExit(f"ray start failed: {proc.stdout}{proc.stderr}")
    group = _group_of(tmp / "ray")
    return f"{LOOPBACK}:{port}", group


def _group_of(temp_dir: Path) -> int:
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            if b"/raylet" in cmd.split(b"\0")[0] and str(temp_dir).encode() in cmd:
                return os.getpgid(int(pid))
    raise SystemExit("no raylet found")


def _run(args: argparse.Namespace, tmp: Path, port: int, server: int, name: str, ray: str | None) -> dict:
    settings: dict[str, object] = {
        "dataset": tmp / "prompts.jsonl",
        "run_name": name,
        "output_dir": tmp / "data",
        "model": "scripted",
        "base_url": f"http://127.0.0.1:{port}/v1",
        "api_key_env": "BENCH_KEY",
        "toolsets": ["terminal"],
        "sandbox": args.sandbox,
        "concurrency": args.concurrency,
        "progress": "none",
    }
    if ray is not None:
        settings |= {"backend": "ray", "ray_address": ray}
    cfg = load_config(None, settings)
    machine0, server0, t0 = _machine_cpu(), _process_cpu(server), time.perf_counter()
    summary = asyncio.run(run_batch(cfg))
    wall = time.perf_counter() - t0
    machine, endpoint = _machine_cpu() - machine0, _process_cpu(server) - server0
    stats = summary.statistics
    n = args.samples
    span = stats["duration_s"]
    ideal = args.concurrency / (CALLS * args.latency)
    return {
        "backend": "ray" if ray else "local",
        "completed": stats["status_counts"].get("completed", 0),
        "wall_s_incl_startup": round(wall, 2),
        "trajectories_per_s": round(n / span, 1),
        "ratio_to_ideal": round(n / span / ideal, 3),
        "machine_cpu_ms_per_traj_minus_endpoint": round((machine - endpoint) / n * 1000, 2),
        "latency_p50_s": stats["latency_s"]["p50"],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--samples", type=int, default=600)
    p.add_argument("--latency", type=float, default=0.2)
    p.add_argument("--sandbox", default="bwrap")
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--repeat", type=int, default=2)
    args = p.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="tfrb", dir="/tmp"))  # short: Ray's socket paths
    server = _start_server(args.latency, tmp / "port")
    runs: list[dict] = []
    try:
        port = int((tmp / "port").read_text())
        (tmp / "prompts.jsonl").write_bytes(
            b"".join(orjson.dumps({"prompt": f"task {i}"}) + b"\n" for i in range(args.samples))
        )
        os.environ.setdefault("BENCH_KEY", "unused")  # before `ray start`: the node inherits it
        with local_ray(tmp, cpus=os.cpu_count() or 1) as address:
            for i in range(args.repeat):
                runs.append(_run(args, tmp, port, server.pid, f"local{i}", None))
                runs.append(_run(args, tmp, port, server.pid, f"ray{i}", address))
    finally:
        server.terminate()
        server.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    pairs = list(zip(runs[::2], runs[1::2], strict=True))
    summary = {
        "runs": runs,
        "ray_over_local_throughput": [
            round(r["trajectories_per_s"] / loc["trajectories_per_s"], 3) for loc, r in pairs
        ],
        "ray_minus_local_cpu_ms_per_traj": [
            round(
                r["machine_cpu_ms_per_traj_minus_endpoint"] - loc["machine_cpu_ms_per_traj_minus_endpoint"], 2
            )
            for loc, r in pairs
        ],
    }
    summary["median_cpu_overhead_ms_per_traj"] = median(summary["ray_minus_local_cpu_ms_per_traj"])
    print(orjson.dumps(summary, option=orjson.OPT_INDENT_2).decode())


if __name__ == "__main__":
    main()
