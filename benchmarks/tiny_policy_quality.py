"""Quality of the embedded tiny policy on held-out generated tasks.

Runs the committed policy (or ``--model DIR``) through the real agent loop, the real terminal and
file tools and a real sandbox on tasks generated with a seed never used for training, and
reports: the fraction of assistant turns whose tool-call markup is well formed (target >= 95%)
and the task success rate (target 40-70%: real, with room left for RL). Greedy decoding unless
``--temperature`` is given; the decoding used is printed with the numbers.

    .venv/bin/python benchmarks/tiny_policy_quality.py --n 100 [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from trajforge.models.tiny import weights_path
from trajforge.models.tiny.evaluate import EVAL_SEED, evaluate


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=None, help="model directory (default: the embedded policy)")
    ap.add_argument("--n", type=int, default=100, help="held-out tasks (mixed families)")
    ap.add_argument("--seed", type=int, default=EVAL_SEED)
    ap.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    ap.add_argument("--sandbox", default="bwrap", choices=["bwrap", "local"])
    ap.add_argument("--json", type=Path, default=None, help="also write the full report (per-task outcomes)")
    args = ap.parse_args(argv)
    model = args.model or weights_path()
    report = asyncio.run(
        evaluate(model, args.n, seed=args.seed, temperature=args.temperature, sandbox_kind=args.sandbox)
    )
    print(f"model: {report.model_dir}")
    print(f"tasks: {report.n_tasks} held-out (seed {report.seed}), decoding: {report.decoding}")
    print(
        f"well-formed assistant turns: {report.well_formed_rate:.1%} "
        f"({report.well_formed_turns}/{report.assistant_turns}; target >= 95%)"
    )
    print(f"task success: {report.success_rate:.1%} (target 40-70%)")
    for fam, rate in report.success_by_family.items():
        print(f"  {fam:12s} {rate:.1%}")
    print(f"terminations: {report.terminations}; wall {report.wall_s:.0f} s")
    if args.json:
        args.json.write_text(report.model_dump_json(indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
