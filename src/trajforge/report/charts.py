"""Small SVG charts drawn here: no chart library, no script, nothing fetched.

Each chart is an ``<svg>`` whose marks carry ``data-label``/``data-value`` and a ``<title>``
(the hover text), so the numbers are on the page even where the picture is too small to read.
Every label is escaped (tool names and reasons come from the run).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from markupsafe import Markup, escape

WIDTH = 640
PALETTE = ("#3b73b9", "#d9822b", "#3a9e5c", "#c23b3b", "#7f5bb8", "#8c6d3f", "#d36ba6", "#6b7b8c")
STATUS_COLOURS = {"completed": "#3a9e5c", "filtered": "#d9822b", "partial": "#c9a227", "failed": "#c23b3b"}


def fmt(value: float) -> str:
    """A number short enough for an axis: 1234 -> 1.23k, 0.01234 -> 0.0123."""
    if value != value:  # NaN
        return "-"
    magnitude = abs(value)
    if magnitude >= 1e6:
        return f"{value / 1e6:.3g}M"
    if magnitude >= 1e4:
        return f"{value / 1e3:.3g}k"
    if magnitude >= 100 or value == int(value):
        return f"{value:.0f}"
    return f"{value:.3g}"


def _svg(height: int, body: list[str], title: str) -> Markup:
    return Markup(
        f'<svg class="chart-svg" viewBox="0 0 {WIDTH} {height}" width="{WIDTH}" height="{height}" '
        f'role="img" aria-label="{escape(title)}">' + "".join(body) + "</svg>"
    )


def _mark(tag: str, label: str, value: float, hover: str, **attrs: object) -> str:
    attr = " ".join(f'{k.replace("_", "-")}="{escape(str(v))}"' for k, v in attrs.items())
    return (
        f'<{tag} class="mark" data-label="{escape(label)}" data-value="{escape(repr(float(value)))}" {attr}>'
        f"<title>{escape(hover)}</title></{tag}>"
    )


def bars(
    items: Sequence[tuple[str, float]],
    title: str,
    *,
    colours: dict[str, str] | None = None,
    note: Sequence[str] | None = None,
) -> Markup:
    """Horizontal bars, one per (label, value), largest scale to the full width."""
    if not items:
        return Markup('<p class="empty">none</p>')
    row, label_w, right = 22, 190, 110
    height = row * len(items) + 8
    top = max((v for _, v in items), default=0) or 1
    body: list[str] = []
    for k, (label, value) in enumerate(items):
        y = 4 + k * row
        width = max((WIDTH - label_w - right) * value / top, 0 if value == 0 else 1)
        colour = (colours or {}).get(label, PALETTE[k % len(PALETTE)])
        shown = label if len(label) <= 28 else label[:27] + "…"
        extra = f" {note[k]}" if note else ""
        body.append(f'<text x="{label_w - 6}" y="{y + 15}" text-anchor="end">{escape(shown)}</text>')
        body.append(
            _mark(
                "rect",
                label,
                value,
                f"{label}: {fmt(value)}{extra}",
                x=label_w,
                y=y + 2,
                width=f"{width:.1f}",
                height=row - 6,
                fill=colour,
            )
        )
        body.append(f'<text x="{label_w + width + 5:.1f}" y="{y + 15}">{escape(fmt(value) + extra)}</text>')
    return _svg(height, body, title)


def _bins(values: Sequence[float], integer: bool, max_bins: int = 30) -> tuple[list[float], bool]:
    """Bin edges over the values up to their 99th percentile, and whether an overflow bin follows.

    Integer bins are half-open ``[a, b)`` of whole steps; float bins split ``[min, p99]`` evenly."""
    ordered = sorted(values)
    low, high = ordered[0], ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)))]
    if integer:
        start, stop = math.floor(low), math.floor(high) + 1
        step = max(1, math.ceil((stop - start) / max_bins))
        count = math.ceil((stop - start) / step)
        edges = [float(start + k * step) for k in range(count + 1)]
        return edges, ordered[-1] >= edges[-1]
    if high <= low:
        high = low + (abs(low) * 0.1 or 1.0)
    width = (high - low) / max_bins
    return [low + k * width for k in range(max_bins + 1)], ordered[-1] > high


def histogram(
    values: Sequence[float],
    title: str,
    unit: str = "",
    *,
    integer: bool = False,
    markers: dict[str, float | None] | None = None,
    colour: str = PALETTE[0],
) -> Markup:
    """Vertical bars over binned values (the top 1% share one last bin), percentile markers."""
    if not values:
        return Markup('<p class="empty">no data</p>')
    edges, overflow = _bins(values, integer)
    counts = [0] * (len(edges) - 1 + (1 if overflow else 0))
    last = len(edges) - 2
    width = edges[1] - edges[0]
    for value in values:
        beyond = value >= edges[-1] if integer else value > edges[-1]
        if beyond and overflow:
            counts[-1] += 1
            continue
        counts[min(max(int((value - edges[0]) / width), 0), last)] += 1
    height, left, bottom, top_pad = 200, 50, 36, 10
    plot_w, plot_h = WIDTH - left - 10, height - bottom - top_pad
    bar_w = plot_w / len(counts)
    peak = max(counts) or 1
    body = [
        f'<line x1="{left}" y1="{height - bottom}" x2="{WIDTH - 10}" y2="{height - bottom}" class="axis"/>'
    ]
    body.append(f'<text x="{left - 4}" y="{top_pad + 8}" text-anchor="end">{peak}</text>')
    for k, count in enumerate(counts):
        if k < len(edges) - 1:
            lo, hi = edges[k], edges[k + 1]
            label = f"{fmt(lo)}{unit}" if integer and hi - lo == 1 else f"{fmt(lo)}–{fmt(hi)}{unit}"
        else:
            label = f"≥{fmt(edges[-1])}{unit}"
        h = plot_h * count / peak
        body.append(
            _mark(
                "rect",
                label,
                count,
                f"{label}: {count}",
                x=f"{left + k * bar_w + 1:.1f}",
                y=f"{height - bottom - h:.1f}",
                width=f"{max(bar_w - 2, 1):.1f}",
                height=f"{h:.1f}",
                fill=colour,
            )
        )
    for k in (0, len(counts) // 2, len(counts) - 1):
        edge = edges[min(k, len(edges) - 1)]
        text = f"≥{fmt(edges[-1])}" if k >= len(edges) - 1 else fmt(edge)
        body.append(
            f'<text x="{left + k * bar_w:.1f}" y="{height - bottom + 14}">{escape(text + unit)}</text>'
        )
    span = edges[-1] - edges[0] or 1
    for name, at in (markers or {}).items():
        if at is None or at > edges[-1] or at < edges[0]:
            continue
        x = left + (len(edges) - 1) * bar_w * (at - edges[0]) / span
        body.append(
            f'<line x1="{x:.1f}" y1="{top_pad}" x2="{x:.1f}" y2="{height - bottom}" class="marker">'
            f"<title>{escape(f'{name} {fmt(at)}{unit}')}</title></line>"
            f'<text x="{x + 2:.1f}" y="{height - bottom + 28}" class="marker-label">{escape(name)}</text>'
        )
    return _svg(height, body, title)


def lines(
    series: Mapping[str, Sequence[tuple[float, float]]], title: str, x_unit: str, y_unit: str
) -> Markup:
    """One polyline per named series of (x, y) points, sharing axes; a legend under it."""
    points = [p for s in series.values() for p in s]
    if not points:
        return Markup('<p class="empty">no data</p>')
    height, left, bottom, top_pad = 220, 50, 48, 10
    plot_w, plot_h = WIDTH - left - 10, height - bottom - top_pad
    x_max = max(x for x, _ in points) or 1
    y_max = max(y for _, y in points) or 1
    body = [
        f'<line x1="{left}" y1="{height - bottom}" x2="{WIDTH - 10}" y2="{height - bottom}" class="axis"/>',
        f'<line x1="{left}" y1="{top_pad}" x2="{left}" y2="{height - bottom}" class="axis"/>',
        f'<text x="{left - 4}" y="{top_pad + 8}" text-anchor="end">{escape(fmt(y_max))}</text>',
        f'<text x="{left - 4}" y="{height - bottom}" text-anchor="end">0</text>',
        f'<text x="{left}" y="{height - bottom + 14}">0{escape(x_unit)}</text>',
        f'<text x="{WIDTH - 10}" y="{height - bottom + 14}" text-anchor="end">{escape(fmt(x_max) + x_unit)}</text>',
        f'<text x="{left + 4}" y="{top_pad + 8}">{escape(y_unit)}</text>',
    ]
    for k, (name, pts) in enumerate(series.items()):
        colour = STATUS_COLOURS.get(name, PALETTE[k % len(PALETTE)])
        coords = " ".join(
            f"{left + plot_w * x / x_max:.1f},{height - bottom - plot_h * y / y_max:.1f}" for x, y in pts
        )
        total = sum(y for _, y in pts)
        body.append(
            f'<polyline class="series" data-label="{escape(name)}" data-points="{len(pts)}" '
            f'fill="none" stroke="{colour}" stroke-width="2" points="{coords}"><title>{escape(name)}</title></polyline>'
        )
        for x, y in pts:
            cx, cy = left + plot_w * x / x_max, height - bottom - plot_h * y / y_max
            body.append(
                _mark(
                    "circle",
                    name,
                    y,
                    f"{name} at {fmt(x)}{x_unit}: {fmt(y)} {y_unit}",
                    cx=f"{cx:.1f}",
                    cy=f"{cy:.1f}",
                    r=2,
                    fill=colour,
                )
            )
        lx = left + 130 * k
        body.append(
            f'<rect x="{lx}" y="{height - 16}" width="10" height="10" fill="{colour}"/>'
            f'<text x="{lx + 14}" y="{height - 7}">{escape(f"{name} ({fmt(total)})")}</text>'
        )
    return _svg(height, body, title)
