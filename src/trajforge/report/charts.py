"""Small SVG charts drawn here: no chart library, no script, nothing fetched.

Each chart is an ``<svg>`` whose marks carry ``data-label``/``data-value`` and a ``<title>``
(the hover text), so the numbers are on the page even where the picture is too small to read.
Every label is escaped (tool names and reasons come from the run).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

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


# character width of the charts' 11px font, for keeping labels inside the picture
_CHAR_W = 6.6


def _text(x: float, y: float, text: str, anchor: str = "start", cls: str = "") -> str:
    """A label kept inside ``[0, WIDTH]``: its anchor moves it back when it would stick out."""
    width = len(text) * _CHAR_W
    if anchor == "middle":
        x = min(max(x, width / 2 + 1), WIDTH - width / 2 - 1)
    elif anchor == "start":
        x = max(x, 1.0)
        if x + width > WIDTH - 1:
            x, anchor = WIDTH - 1, "end"
    elif anchor == "end":
        x = min(x, WIDTH - 1.0)
        if x - width < 1:
            x, anchor = 1, "start"
    klass = f' class="{cls}"' if cls else ""
    return f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}"{klass}>{escape(text)}</text>'


def _marker_lines(
    markers: Mapping[str, float], x_of: Callable[[float], float], top: float, bottom: float, unit: str
) -> list[str]:
    """Dashed percentile lines, each labelled at the foot of the plot; labels that would overlap
    drop to a second and third row, and the last ones lean left of their line."""
    body: list[str] = []
    rows: list[float] = []  # the right end of the last label in each row
    for name, at in sorted(markers.items(), key=lambda kv: kv[1]):
        x = x_of(at)
        label = f"{name} {fmt(at)}{unit}"
        width = len(label) * _CHAR_W
        start = x + 3 if x + 3 + width <= WIDTH - 1 else x - 3 - width
        row = next((k for k, end in enumerate(rows) if start > end + 4), len(rows))
        if row == len(rows):
            rows.append(0.0)
        rows[row] = start + width
        body.append(
            f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{bottom}" class="marker">'
            f"<title>{escape(label)}</title></line>"
            + _text(start, bottom + 27 + 11 * row, label, "start", "marker-label")
        )
    return body


def histogram(
    values: Sequence[float],
    title: str,
    unit: str = "",
    *,
    integer: bool = False,
    markers: dict[str, float | None] | None = None,
    colour: str = PALETTE[0],
    discrete_max: int = 0,
) -> Markup:
    """Vertical bars over binned values (the top 1% share one last bin), percentile markers.

    Integer values get one bar per whole step; with ``discrete_max``, at most that many distinct
    values (rewards of 0, 0.5 and 1) one bar per value, labelled with it, instead of bins whose
    edges (0.967) say nothing; other values bins over ``[min, p99]``, the axis labelled at the
    bin edges."""
    if not values:
        return Markup('<p class="empty">no data</p>')
    distinct = sorted(set(values))
    if not integer and len(distinct) <= discrete_max:
        return _categories(values, distinct, title, unit, colour)
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
    labels = []
    for k in range(len(counts)):
        if k < len(edges) - 1:
            lo, hi = edges[k], edges[k + 1]
            labels.append(f"{fmt(lo)}{unit}" if integer and hi - lo == 1 else f"{fmt(lo)}–{fmt(hi)}{unit}")
        else:
            labels.append(f"≥{fmt(edges[-1])}{unit}")
    height, left, bottom, top_pad = 222, 50, 58, 10
    plot_w = WIDTH - left - 10
    bar_w = plot_w / len(counts)
    body = _bars_and_axis(counts, labels, colour, height, left, bottom, top_pad)
    axis_y = height - bottom + 14
    if integer and all(edges[k + 1] - edges[k] == 1 for k in range(len(edges) - 1)):
        step = max(1, math.ceil(len(counts) / 12))  # every value under its bar, or every n-th
        for k in range(0, len(counts), step):
            text = labels[k] if k < len(edges) - 1 else f"≥{fmt(edges[-1])}{unit}"
            body.append(_text(left + (k + 0.5) * bar_w, axis_y, text, "middle"))
    else:  # the bin edges: first, middle, the last one (where the bars end)
        n = len(edges) - 1
        for k, anchor in ((0, "start"), (n // 2, "middle"), (n, "end")):
            body.append(_text(left + k * bar_w, axis_y, fmt(edges[k]) + unit, anchor))
        if overflow:
            body.append(_text(left + (n + 0.5) * bar_w, axis_y, f"≥{fmt(edges[-1])}", "middle"))
    span = edges[-1] - edges[0] or 1
    shown = {k: v for k, v in (markers or {}).items() if v is not None and edges[0] <= v <= edges[-1]}
    body += _marker_lines(
        shown,
        lambda at: left + (len(edges) - 1) * bar_w * (at - edges[0]) / span,
        top_pad,
        height - bottom,
        unit,
    )
    return _svg(height, body, title)


def _bars_and_axis(
    counts: Sequence[int],
    labels: Sequence[str],
    colour: str,
    height: int,
    left: int,
    bottom: int,
    top_pad: int,
) -> list[str]:
    plot_w, plot_h = WIDTH - left - 10, height - bottom - top_pad
    bar_w = plot_w / len(counts)
    peak = max(counts) or 1
    body = [
        f'<line x1="{left}" y1="{height - bottom}" x2="{WIDTH - 10}" y2="{height - bottom}" class="axis"/>',
        _text(left - 4, top_pad + 8, f"{peak}", "end"),
        _text(left - 4, height - bottom, "0", "end"),
    ]
    for k, (count, label) in enumerate(zip(counts, labels, strict=True)):
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
    return body


def _categories(
    values: Sequence[float], distinct: Sequence[float], title: str, unit: str, colour: str
) -> Markup:
    """One bar per distinct value, each labelled with its value (rewards 0 and 1: two bars)."""
    counts = [sum(1 for v in values if v == d) for d in distinct]
    labels = [f"{fmt(d)}{unit}" for d in distinct]
    height, left, bottom, top_pad = 222, 50, 58, 10
    bar_w = (WIDTH - left - 10) / len(counts)
    body = _bars_and_axis(counts, labels, colour, height, left, bottom, top_pad)
    body += [
        _text(left + (k + 0.5) * bar_w, height - bottom + 14, label, "middle")
        for k, label in enumerate(labels)
    ]
    return _svg(height, body, title)  # no percentile lines: on a few values they only stack up


def lines(
    series: Mapping[str, Sequence[tuple[float, float]]],
    title: str,
    x_unit: str,
    y_unit: str,
    legend: Mapping[str, str] | None = None,
) -> Markup:
    """One polyline per named series of (x, y) points, sharing axes; a legend under it, each
    entry ``name: legend[name]`` (say what the series adds up to, with its unit)."""
    points = [p for s in series.values() for p in s]
    if not points:
        return Markup('<p class="empty">no data</p>')
    entries = [f"{name}: {(legend or {}).get(name, '')}".rstrip(": ") for name in series]
    rows, x = 1, 50.0
    for entry in entries:  # legend rows: wrap where an entry would pass the right edge
        width = 14 + len(entry) * _CHAR_W + 18
        if x + width > WIDTH and x > 50:
            rows, x = rows + 1, 50.0
        x += width
    height, left, top_pad = 200 + 16 * rows, 50, 10
    bottom = 32 + 16 * rows
    plot_w, plot_h = WIDTH - left - 10, height - bottom - top_pad
    x_max = max(x for x, _ in points) or 1
    y_max = max(y for _, y in points) or 1
    body = [
        f'<line x1="{left}" y1="{height - bottom}" x2="{WIDTH - 10}" y2="{height - bottom}" class="axis"/>',
        f'<line x1="{left}" y1="{top_pad}" x2="{left}" y2="{height - bottom}" class="axis"/>',
        _text(left - 4, top_pad + 8, fmt(y_max), "end"),
        _text(left - 4, height - bottom, "0", "end"),
        _text(left, height - bottom + 14, f"0{x_unit}", "start"),
        _text(WIDTH - 10, height - bottom + 14, fmt(x_max) + x_unit, "end"),
        _text(left + 4, top_pad + 8, y_unit, "start"),
    ]
    lx, ly = float(left), height - bottom + 30
    for k, (name, pts) in enumerate(series.items()):
        colour = STATUS_COLOURS.get(name, PALETTE[k % len(PALETTE)])
        coords = " ".join(
            f"{left + plot_w * x / x_max:.1f},{height - bottom - plot_h * y / y_max:.1f}" for x, y in pts
        )
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
        width = 14 + len(entries[k]) * _CHAR_W + 18
        if lx + width > WIDTH and lx > left:
            lx, ly = float(left), ly + 16
        body.append(
            f'<g class="legend"><rect x="{lx:.1f}" y="{ly - 9:.1f}" width="10" height="10" fill="{colour}"/>'
            + _text(lx + 14, ly, entries[k], "start")
            + "</g>"
        )
        lx += width
    return _svg(height, body, title)
