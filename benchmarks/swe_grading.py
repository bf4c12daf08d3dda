"""What grading ``swe`` episodes with the swebench package costs, against the inline scoring it
replaced, measured in one run.

Two costs: the one-time import of ``swebench.harness.grading`` (in a fresh interpreter: wall
seconds and the resident memory it adds, since it imports swebench.harness whole: docker, modal,
datasets), and the per-episode grading (:func:`swe_grading.grade` over a runner result the size
of a shipped task's, median of many calls) as a ratio to the old inline comparison of the same
results (``baseline``, reproduced here).

    PYTHONPATH=src python benchmarks/swe_grading.py [--calls 300]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
from typing import Any

from trajforge.envs.library.swe_grading import grade, runner_log

IMPORT_PROBE = """
import resource, time, json
def rss():
    with open('/proc/self/status') as f:
        return next(int(l.split()[1]) for l in f if l.startswith('VmRSS:')) / 1024
before = rss(); t = time.perf_counter()
import swebench.harness.grading
print(json.dumps({"s": time.perf_counter() - t, "rss_mib": rss() - before, "before_mib": before}))
"""


def baseline(item: dict[str, Any], results: dict[str, str]) -> float:
    """The inline scoring swe used before (all listed tests passed -> 1.0)."""
    f2p, p2p = item["fail_to_pass"], item["pass_to_pass"]
    failed = [t for t in [*f2p, *p2p] if results.get(t) != "passed"]
    return 0.0 if failed else 1.0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=300)
    args = ap.parse_args()
    probe = subprocess.run([sys.executable, "-c", IMPORT_PROBE], capture_output=True, text=True, check=True)
    imported = json.loads(probe.stdout)
    ids = [f"tests/test_hidden.py::test_{i}" for i in range(6)]
    item = {"id": "t", "fail_to_pass": ids[:3], "pass_to_pass": ids[3:]}
    results = {i: "passed" for i in ids}
    errors: dict[str, str] = {}
    spec = {
        "instance_id": "t",
        "fail_to_pass": ids[:3],
        "pass_to_pass": ids[3:],
        "log_parser": "parse_log_pytest",
    }

    async def run() -> tuple[list[float], list[float]]:
        await grade(spec, runner_log(results, errors), partial_credit=False)  # warm: the import
        new, old = [], []
        for _ in range(args.calls):
            t = time.perf_counter()
            got = await grade(spec, runner_log(results, errors), partial_credit=False)
            new.append(time.perf_counter() - t)
            t = time.perf_counter()
            ref = baseline(item, results)
            old.append(time.perf_counter() - t)
            assert got.reward == ref == 1.0
        return new, old

    new, old = asyncio.run(run())
    med_new, med_old = statistics.median(new), statistics.median(old)
    print(
        json.dumps(
            {
                "import_s": round(imported["s"], 3),
                "import_rss_mib": round(imported["rss_mib"], 1),
                "grade_median_ms": round(med_new * 1e3, 3),
                "baseline_median_ms": round(med_old * 1e3, 5),
                "ratio": round(med_new / med_old, 1),
                "calls": args.calls,
            }
        )
    )


if __name__ == "__main__":
    main()
