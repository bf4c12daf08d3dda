"""The closed-loop figure: training reward per step (all, and per family) and held-out success.

matplotlib (the ``rl`` extra) is imported here only; the demo runs without it and says so.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def plot_closed_loop(report: dict[str, Any], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = report["metrics"]
    steps = [m["step"] for m in metrics]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    ax1.plot(steps, [m["reward_mean"] for m in metrics], color="black", lw=2, label="all (training mix)")
    families = sorted({k for m in metrics for k in m.get("reward_by_category", {})})
    for fam in families:
        ys = [m.get("reward_by_category", {}).get(fam) for m in metrics]
        ax1.plot(steps, ys, lw=1, alpha=0.8, label=fam)
    ax1.set_xlabel("GRPO step")
    ax1.set_ylabel("mean reward of the step's rollouts (T=1)")
    ax1.set_ylim(-0.02, 1.02)
    ax1.set_title("training reward")
    ax1.legend(fontsize=8)

    prog = report["progress"]
    ax2.plot(
        [p["step"] for p in prog],
        [p["pass"] for p in prog],
        "o-",
        color="tab:blue",
        label="held-out pass@1 (greedy)",
    )
    for p in prog:
        if p.get("stage") == "warm start":  # the supervised stage, before GRPO's step 1
            ax2.plot([p["step"]], [p["pass"]], "s", color="tab:orange", ms=8, label="after the warm start")
    before, after = report["before"], report["after"]
    warm = report.get("after_warm_start") or {}
    for fam in sorted(k for k in before if k != "all"):
        xs = [prog[0]["step"], prog[-1]["step"]]
        ys = [before[fam]["pass"]["value"], after[fam]["pass"]["value"]]
        if fam in warm:  # the warm start's jump happens before GRPO's step 1
            xs.insert(1, prog[0]["step"])
            ys.insert(1, warm[fam]["pass"]["value"])
        ax2.plot(xs, ys, "--", lw=1, alpha=0.7, label=fam)
    last = prog[-1]["step"]
    for x, res in ((prog[0]["step"], before["all"]["pass"]), (last, after["all"]["pass"])):
        ax2.errorbar(
            [x],
            [res["value"]],
            yerr=[[res["value"] - res["low"]], [res["high"] - res["value"]]],
            color="tab:blue",
            capsize=4,
        )
    ax2.set_xlabel("GRPO step")
    ax2.set_ylabel("held-out success")
    ax2.set_ylim(-0.02, 1.02)
    ax2.set_title(f"held-out tiny_tasks ({before['all']['items']} items, 95% CI)")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
