"""Many concurrent rollouts at a realistic model latency: throughput against the latency bound and
memory per live rollout.

The scripted endpoint runs in its own process (``_endpoint.py``) with ``--latency`` per
call (default 3 s); every sample makes 3 model calls and 2 ``terminal`` commands in its own
sandbox. One worker runs ``--concurrency`` rollouts. While it runs, a process of its own samples memory every
``--every`` seconds: the machine's used memory (MemTotal - MemAvailable, minus what was used
before the run: it counts the kernel's share of each sandbox too, namespaces, page tables, cgroups)
and the PSS of this process and every process under it (sandboxes: bwrap and the exec agent). The
peaks divided by ``--concurrency`` are the memory per live rollout (every slot is busy at the peak).

Printed: trajectories/s over the samples' span, the bound ``concurrency / (calls x latency)`` and
the ratio, CPU per trajectory of this process and everything under it (sandboxes, their commands:
a cpuacct cgroup, as root) and of the whole machine (/proc/stat, minus the endpoint process; it
also counts other jobs on a shared machine, and not the memory sampler, a process of its own),
the memory figures,
the PSS by process name at the peak, and the sandbox counters.

    .venv/bin/python benchmarks/scale_latency.py --concurrency 1024 --samples 2048
    .venv/bin/python benchmarks/scale_latency.py --concurrency 4096 --samples 8192
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import sys
import time
from collections import Counter
from multiprocessing.connection import Connection
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


def pss_by_name(root: int, skip: int = 0) -> Counter[str]:
    """PSS (KiB) of ``root`` and its descendants (but ``skip``), summed by process name."""
    by: Counter[str] = Counter()
    for pid in process_tree(root):
        if pid == skip:
            continue
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                text = f.read()
            with open(f"/proc/{pid}/comm") as f:
                name = f.read().strip()
        except OSError:
            continue
        by[name if pid != root else "trajforge (this process)"] += int(text.split("\nPss:")[1].split()[0])
    return by


def _sample(root: int, every_s: float, base: int, conn: Connection) -> None:
    """The memory sampler's process: peaks of the machine's used memory (minus ``base``) and of the
    PSS under ``root`` (without itself), every ``every_s`` until told to stop, then sent back."""
    me, peak_used, peak_pss, peak_by = os.getpid(), 0, 0, Counter[str]()
    while not conn.poll(every_s):
        peak_used = max(peak_used, used_kib() - base)
        by = pss_by_name(root, skip=me)
        if sum(by.values()) > peak_pss:
            peak_pss, peak_by = sum(by.values()), by
    conn.send((peak_used, peak_pss, dict(peak_by)))


class MemorySampler:
    """Samples memory from a process of its own: reading every sandbox's smaps each second takes
    ~3 ms of CPU per trajectory at N = 1024, and in a thread of ours it held the GIL the event loop
    needs (measured). Started before the run's CPU is counted; its CPU is subtracted from the
    machine's."""

    def __init__(self, every_s: float) -> None:
        self._conn, theirs = multiprocessing.Pipe()
        ctx = multiprocessing.get_context("spawn")
        self._proc = ctx.Process(target=_sample, args=(os.getpid(), every_s, used_kib(), theirs), daemon=True)
        self._proc.start()
        self.pid = self._proc.pid
        self.peak_used, self.peak_pss, self.peak_by = 0, 0, Counter[str]()

    def stop(self) -> None:
        self._conn.send("stop")
        self.peak_used, self.peak_pss, by = self._conn.recv()
        self.peak_by = Counter(by)
        self._proc.join()


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
            "sandbox_start": args.sandbox_start,
            **({"sandbox_agent": args.agent} if args.agent else {}),
            "concurrency": args.concurrency,
            "workers": 1,
            "request_timeout": 600,
            "sample_timeout": 3600,
            "progress": "none",
        },
    )
    sampler = MemorySampler(args.every)  # before the cgroup: not counted as ours
    with TreeCpu() as tree:
        tree0, sampling0 = tree.seconds(), process_cpu(sampler.pid)
        cpu0, machine0, server0, t0 = own_cpu(), machine_cpu(), process_cpu(server), time.perf_counter()
        summary = asyncio.run(run_batch(cfg))
        wall, rusage = time.perf_counter() - t0, own_cpu() - cpu0
        machine, endpoint = machine_cpu() - machine0, process_cpu(server) - server0
        tree1, sampling = tree.seconds(), process_cpu(sampler.pid) - sampling0
    sampler.stop()
    ours = tree1 - tree0 if tree0 is not None and tree1 is not None else None
    stats = summary.statistics
    n = args.samples
    rate = n / stats["duration_s"]
    bound = args.concurrency / (CALLS * args.latency)
    mib = 1024.0
    return {
        "concurrency": args.concurrency,
        "sandbox_start": args.sandbox_start,
        "agent": args.agent or "the batch default",
        "latency_s": args.latency,
        "samples": n,
        "status_counts": stats["status_counts"],
        "failure_reasons": stats["failure_reasons"],
        "wall_s": round(wall, 1),
        "trajectories_per_s": round(rate, 1),
        "bound_per_s": round(bound, 1),
        "ratio_to_bound": round(rate / bound, 3),
        # this process and everything under it (sandboxes, commands; a cgroup)
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
    p.add_argument("--sandbox-start", default="lazy", choices=("eager", "lazy"), help="batch's default: lazy")
    p.add_argument(
        "--agent",
        default=None,
        choices=("auto", "native"),
        help="the sandboxes' exec agent (default: batch's)",
    )
    p.add_argument("--every", type=float, default=1.0, help="memory sampling interval, s")
    args = p.parse_args()
    args.samples = args.samples or 2 * args.concurrency

    with scripted_endpoint(args.latency, prefix="tf-scale-", prompts=args.samples) as endpoint:
        result = run(args, endpoint)
    print(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode())


if __name__ == "__main__":
    main()
