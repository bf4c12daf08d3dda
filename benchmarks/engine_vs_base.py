"""This tree's run engine against an earlier commit's, on the same endpoint, sandbox and items.

Why: a change to how rollouts are run (issue 40 put ``batch`` and ``env eval`` on one engine)
must not cost throughput or CPU per trajectory. The workload is ``env_vs_batch.py``'s (a scripted
endpoint in its own process with ``--latency`` per call, 3 model calls and 2 ``terminal`` calls
per episode in a reused bwrap sandbox; ``env eval``, ``batch --env`` and plain ``batch``); each
round runs it once with this tree's ``src`` and once with the base commit's (checked out in a
temporary worktree, first on ``PYTHONPATH``), alternating which goes first. Prints, per variant,
the median episodes/s and CPU ms per episode of each side and the ratio this/base (throughput:
above 1 is faster; CPU: below 1 is cheaper), with every round's figures.

    .venv/bin/python benchmarks/engine_vs_base.py --base 1759b75 --rounds 4 --episodes 200
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parent.parent
VARIANTS = ("env_eval", "batch_graded", "batch_ungraded")


@contextlib.contextmanager
def base_tree(rev: str) -> Iterator[Path]:
    """The base commit checked out in a temporary worktree (removed afterwards)."""
    where = Path(tempfile.mkdtemp(prefix="tf-base-")) / "tree"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(where), rev], check=True)
    try:
        yield where
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(where)], check=False)


def one_round(src: Path, args: argparse.Namespace) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(src)}
    cmd = [
        sys.executable,
        str(ROOT / "benchmarks" / "env_vs_batch.py"),
        "--rounds",
        "1",
        "--episodes",
        str(args.episodes),
        "--concurrency",
        str(args.concurrency),
        "--latency",
        str(args.latency),
    ]
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    report = orjson.loads(out[out.index("{") :])
    got: dict[str, Any] = report["rounds"][0]
    return got


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base", required=True, help="the commit to compare with (e.g. the one before a change)")
    p.add_argument("--rounds", type=int, default=4, help="each round runs both sides once")
    p.add_argument("--episodes", type=int, default=200)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--latency", type=float, default=0.2)
    args = p.parse_args()
    sides: dict[str, list[dict[str, Any]]] = {"this": [], "base": []}
    with base_tree(args.base) as base:
        srcs = {"this": ROOT / "src", "base": base / "src"}
        for r in range(args.rounds):
            order = ["this", "base"] if r % 2 == 0 else ["base", "this"]
            for side in order:
                sides[side].append(one_round(srcs[side], args))
                print(f"round {r + 1}/{args.rounds} {side} done", file=sys.stderr)
    summary: dict[str, Any] = {}
    for v in VARIANTS:
        row: dict[str, Any] = {}
        for side, rounds in sides.items():
            row[f"{side}_episodes_per_s"] = statistics.median(x[v]["episodes_per_s"] for x in rounds)
            row[f"{side}_cpu_ms_per_episode"] = statistics.median(x[v]["cpu_ms_per_episode"] for x in rounds)
        row["throughput_this_over_base"] = round(row["this_episodes_per_s"] / row["base_episodes_per_s"], 3)
        row["cpu_this_over_base"] = round(row["this_cpu_ms_per_episode"] / row["base_cpu_ms_per_episode"], 3)
        summary[v] = row
    report = {
        "base": args.base,
        "setup": {k: getattr(args, k) for k in ("rounds", "episodes", "concurrency", "latency")},
        "cpus": os.cpu_count(),
        "summary": summary,
        "rounds": sides,
    }
    print(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode())


if __name__ == "__main__":
    main()
