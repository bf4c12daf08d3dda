"""Many concurrent rollouts at a realistic model latency: throughput against the latency bound and
memory per live rollout.

The scripted endpoint runs in its own process (``_endpoint.py``) with ``--latency`` per
call (default 3 s); every sample makes 3 model calls and 2 ``terminal`` commands in its own
sandbox. One worker runs ``--concurrency`` rollouts. While it runs, a thread samples memory every
``--every`` seconds: the machine's used memory (MemTotal - MemAvailable, minus what was used
before the run: it counts the kernel's share of each sandbox too, namespaces, page tables, cgroups)
and the PSS of this process and every process under it (sandboxes: bwrap and the exec agent). The
peaks divided by ``--concurrency`` are the memory per live rollout (every slot is busy at the peak).

Printed: trajectories/s over the samples' span, the bound ``concurrency / (calls x latency)`` and
the ratio, CPU per trajectory of this process and everything under it (sandboxes, their commands:
a cpuacct cgroup, as root) and of the whole machine (/proc/stat, minus the endpoint process; it
also counts other jobs on a shared machine), both without the memory sampler's own CPU (reading
every process's smaps each second), the memory figures,
the PSS by process name at the peak, and the sandbox counters.

    .venv/bin/python benchmarks/scale_latency.py --concurrency 1024 --samples 2048
    .venv/bin/python benchmarks/scale_latency.py --concurrency 4096 --samples 8192
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).parent))
from _endpoint import CALLS, KEY_VAR, Endpoint, TreeCpu, machine_cpu, own_cpu, process_cpu, scripted_endpoint  # noqa: E402

from trajforge.batch.config import load_config  # noqa: E402
from trajforge.batch.runner import run_batch  # noqa: E402


def used_kib() -> int:
    info = {}
    with open("/proc/meminfo") as f:
        for line in f:
            key, value = line.split(":", 1)
            info[key] = int(value.split()[0])
    return info["MemTotal"] - info["MemAvailable"]


def process_tree(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(name))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, ()))
    return found


def pss_by_name(root: int) -> Counter[str]:
    """PSS (KiB) of ``root`` and its descendants, summed by process name."""
    by: Counter[str] = Counter()
    for pid in process_tree(root):
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                text = f.read()
            with open(f"/proc/{pid}/comm") as f:
                name = f.read().strip()
        except OSError:
            continue
        by[name if pid != root else "trajforge (this process)"] += int(text.split("\nPss:")[1].split()[0])
    return by


class MemorySampler(threading.Thread):
    def __init__(self, every_s: float) -> None:
        super().__init__(daemon=True)
        self.every_s = every_s
        self.base = used_kib()
        self.peak_used = 0
        self.peak_pss = 0
        self.peak_by: Counter[str] = Counter()
        self.stop = threading.Event()
        self.cpu_s = 0.0  # its own: reading every process's smaps is not the run's cost

    def run(self) -> None:
        while not self.stop.wait(self.every_s):
            self.peak_used = max(self.peak_used, used_kib() - self.base)
            by = pss_by_name(os.getpid())
            total = sum(by.values())
            if total > self.peak_pss:
                self.peak_pss, self.peak_by = total, by
            self.cpu_s = time.thread_time()


def run(args: argparse.Namespace, endpoint: Endpoint) -> dict[str, object]:
    server, tmp = endpoint.pid, endpoint.tmp
    cfg = load_config(
        None,
        {
            "dataset": endpoint.dataset,
            "run_name": f"c{args.concurrency}",
            "output_dir": tmp / "data",
            "model": "scripted",
            "base_url": endpoint.base_url,
            "api_key_env": KEY_VAR,
            "toolsets": ["terminal"],
            "sandbox": args.sandbox,
            "concurrency": args.concurrency,
            "workers": 1,
            "request_timeout": 600,
            "sample_timeout": 3600,
            "progress": "none",
        },
    )
    with TreeCpu() as tree:
        sampler = MemorySampler(args.every)
        sampler.start()
        tree0 = tree.seconds()
        cpu0, machine0, server0, t0 = own_cpu(), machine_cpu(), process_cpu(server), time.perf_counter()
        summary = asyncio.run(run_batch(cfg))
        wall, rusage = time.perf_counter() - t0, own_cpu() - cpu0
        machine, endpoint = machine_cpu() - machine0, process_cpu(server) - server0
        tree1 = tree.seconds()
        sampler.stop.set()
        sampler.join()
    sampling = sampler.cpu_s
    ours = tree1 - tree0 - sampling if tree0 is not None and tree1 is not None else None
    stats = summary.statistics
    n = args.samples
    rate = n / stats["duration_s"]
    bound = args.concurrency / (CALLS * args.latency)
    mib = 1024.0
    return {
        "concurrency": args.concurrency,
        "latency_s": args.latency,
        "samples": n,
        "status_counts": stats["status_counts"],
        "failure_reasons": stats["failure_reasons"],
        "wall_s": round(wall, 1),
        "trajectories_per_s": round(rate, 1),
        "bound_per_s": round(bound, 1),
        "ratio_to_bound": round(rate / bound, 3),
        # this process and everything under it (sandboxes, commands; a cgroup), minus the sampler
        "our_cpu_ms_per_traj": round(ours / n * 1000, 1) if ours is not None else None,
        "getrusage_cpu_ms_per_traj": round(rusage / n * 1000, 1),  # "our CPU" before: no sandboxes
        "sampler_cpu_ms_per_traj": round(sampling / n * 1000, 1),
        "machine_cpu_ms_per_traj_minus_endpoint_and_sampler": round(
            (machine - endpoint - sampling) / n * 1000, 1
        ),
        "machine_busy_fraction": round(machine / (wall * (os.cpu_count() or 1)), 3),
        "latency_p50_s": stats["latency_s"]["p50"],
        "peak_used_mib_per_live_rollout": round(sampler.peak_used / mib / args.concurrency, 2),
        "peak_pss_mib_per_live_rollout": round(sampler.peak_pss / mib / args.concurrency, 2),
        "peak_pss_mib_by_process": {k: round(v / mib, 1) for k, v in sampler.peak_by.most_common(6)},
        "sandboxes": stats["sandboxes"],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--concurrency", type=int, default=1024)
    p.add_argument("--samples", type=int, default=None, help="default: 2 x concurrency")
    p.add_argument("--latency", type=float, default=3.0)
    p.add_argument("--sandbox", default="bwrap")
    p.add_argument("--every", type=float, default=1.0, help="memory sampling interval, s")
    args = p.parse_args()
    args.samples = args.samples or 2 * args.concurrency

    with scripted_endpoint(args.latency, prefix="tf-scale-", prompts=args.samples) as endpoint:
        result = run(args, endpoint)
    print(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode())


if __name__ == "__main__":
    main()
