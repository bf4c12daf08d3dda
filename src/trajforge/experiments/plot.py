"""The closed-loop figure (``rl demo``): GRPO's training reward per step with the held-out
sampled success of each stage on the same axis, and per family the held-out success of every
stage side by side -- the warm start, GRPO and each control (RFT, the supervised ones) drawn apart.

matplotlib (the ``rl`` extra) is imported here only; the demo runs without it and says so.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

COLORS = {
    "before": "tab:gray",
    "warm start": "tab:orange",
    "GRPO": "tab:blue",
    "RFT": "tab:red",
    "set SFT": "tab:green",
    "oracle SFT": "tab:olive",
}
MARKERS = {"RFT": "D", "set SFT": "v", "oracle SFT": "^"}


def stage_x(report: dict[str, Any]) -> dict[str, float]:
    """Where each stage's held-out result sits on the step axis: the warm start at 0 and the
    evaluation before it left of 0 (a stretch of its own, so its jump is not drawn on top of GRPO's
    first point); GRPO at its last step, and the controls there too (they had GRPO's compute)."""
    last = float(report["metrics"][-1]["step"]) if report.get("metrics") else 1.0
    xs = {"before": -max(1.0, 0.25 * last), "warm start": 0.0, "GRPO": last}
    return {s["name"]: xs.get(s["name"], last) for s in report["stages"]}


def plot_closed_loop(report: dict[str, Any], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.8))
    _curve(ax1, report)
    _families(ax2, report)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _curve(ax: Any, report: dict[str, Any]) -> None:
    metrics = report.get("metrics") or []
    steps = [m["step"] for m in metrics]
    ax.plot(
        steps, [m["reward_mean"] for m in metrics], color="black", lw=1.5, label="GRPO training reward (T=1)"
    )
    for fam in sorted({k for m in metrics for k in m.get("reward_by_category", {})}):
        ys = [m.get("reward_by_category", {}).get(fam) for m in metrics]
        ax.plot(steps, ys, lw=0.8, alpha=0.6, label=f"  {fam}")
    xs = stage_x(report)
    controls = [s["name"] for s in report["stages"] if s["name"] in MARKERS]
    for stage in report["stages"]:
        cell = stage["families"]["all"]["sampled_pass1"]
        shift = controls.index(stage["name"]) + 1 if stage["name"] in controls else 0
        x = xs[stage["name"]] + 0.02 * shift * max(1.0, xs.get("GRPO", 1.0))
        ax.errorbar(
            [x],
            [cell["value"]],
            yerr=[[cell["value"] - cell["low"]], [cell["high"] - cell["value"]]],
            fmt=MARKERS.get(stage["name"], "s"),
            color=COLORS.get(stage["name"], "tab:purple"),
            ms=8,
            capsize=4,
            label=f"held-out sampled pass@1: {stage['name']}",
        )
    if "warm start" in xs and "before" in xs:
        ax.axvspan(xs["before"], xs["warm start"], color="tab:orange", alpha=0.08)
    ax.set_xlabel("GRPO step (left of 0: the warm start)")
    ax.set_ylabel("success")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title("training reward and held-out sampled success")
    ax.legend(fontsize=7, loc="lower right")


def _families(ax: Any, report: dict[str, Any]) -> None:
    stages = report["stages"]
    families = list(stages[0]["families"])
    width = 0.8 / max(1, len(stages))
    for j, stage in enumerate(stages):
        xs, ys, lo, hi, greedy = [], [], [], [], []
        for i, fam in enumerate(families):
            cell = stage["families"].get(fam)
            if not cell or not cell["sampled_pass1"]:
                continue
            p = cell["sampled_pass1"]
            xs.append(i - 0.4 + width * (j + 0.5))
            ys.append(p["value"])
            lo.append(p["value"] - p["low"])
            hi.append(p["high"] - p["value"])
            greedy.append(cell["greedy"]["value"])
        color = COLORS.get(stage["name"], "tab:purple")
        ax.bar(
            xs,
            ys,
            width,
            yerr=[lo, hi],
            color=color,
            alpha=0.75,
            capsize=2,
            label=f"{stage['name']}: sampled",
        )
        ax.scatter(xs, greedy, marker="_", s=120, color="black", zorder=3)
    ax.scatter([], [], marker="_", s=120, color="black", label="greedy")
    ax.set_xticks(range(len(families)))
    ax.set_xticklabels(families, fontsize=8, rotation=15)
    ax.set_ylim(0, 1.05)
    ev = report.get("eval", {})
    ax.set_title(
        f"held-out {ev.get('env', 'tiny_tasks')} by family ({ev.get('items')} items x "
        f"{ev.get('samples_per_item')} samples, 95% CI)"
    )
    ax.legend(fontsize=7, loc="lower left")
