"""The closed-loop figure: training reward per step (all, and per family) and held-out success.

matplotlib (the ``rl`` extra) is imported here only; the demo runs without it and says so.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def progress_x(report: dict[str, Any]) -> list[float]:
    """Where each held-out evaluation of ``report["progress"]`` sits on the step axis. The warm
    start (supervised, before GRPO's step 1) gets a stretch of its own left of step 0, so its jump
    is not drawn as a vertical line on top of GRPO's first point: the evaluation before it at
    minus a quarter of the GRPO steps, the one after it at 0."""
    prog = report["progress"]
    if not report.get("after_warm_start"):
        return [float(p["step"]) for p in prog]
    return [-max(1.0, 0.25 * prog[-1]["step"])] + [float(p["step"]) for p in prog[1:]]


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
    before, after = report["before"], report["after"]
    warm = report.get("after_warm_start") or {}
    xs = progress_x(report)
    x_before, last = xs[0], xs[-1]
    x_warm = xs[1] if warm else None  # the evaluation after the warm start (step 0)
    ax2.plot(xs, [p["pass"] for p in prog], "o-", color="tab:blue", label="held-out pass@1 (greedy)")
    if x_warm is not None:
        updates = (report.get("warm_start") or {}).get("updates")
        ax2.axvspan(x_before, x_warm, color="tab:orange", alpha=0.08)
        ax2.text((x_before + x_warm) / 2, 0.02, f"warm start\n({updates} updates)", ha="center", fontsize=8)
        ax2.plot(
            [x_warm],
            [warm["all"]["pass"]["value"]],
            "s",
            color="tab:orange",
            ms=8,
            label="after the warm start",
        )
    for fam in sorted(k for k in before if k != "all"):
        fx, fy = [x_before, last], [before[fam]["pass"]["value"], after[fam]["pass"]["value"]]
        if x_warm is not None and fam in warm:
            fx.insert(1, x_warm)
            fy.insert(1, warm[fam]["pass"]["value"])
        ax2.plot(fx, fy, "--", lw=1, alpha=0.7, label=fam)
    points = [(x_before, before["all"]["pass"]), (last, after["all"]["pass"])]
    if x_warm is not None:
        points.insert(1, (x_warm, warm["all"]["pass"]))
    for x, res in points:
        ax2.errorbar(
            [x],
            [res["value"]],
            yerr=[[res["value"] - res["low"]], [res["high"] - res["value"]]],
            color="tab:blue",
            capsize=4,
        )
    ax2.set_xlabel("GRPO step" + (" (left of 0: before, the warm start)" if warm else ""))
    ax2.set_ylabel("held-out success")
    ax2.set_ylim(-0.02, 1.02)
    ax2.set_title(f"held-out tiny_tasks ({before['all']['items']} items, 95% CI)")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
