"""Flagged decisions over the stream as an inline SVG bar chart, drawn here so the page needs no
chart library: one bar per stretch of the stream, stacked by rule and model."""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

WIDTH, HEIGHT = 760, 230
LEFT, RIGHT, TOP, BOTTOM = 52, 12, 14, 44
SERIES_CLASSES = 8  # the page's CSS colours .s0 ... .s7


def flagged_chart(
    series: Sequence[tuple[str, Sequence[int]]], extent: int, axis: str, bins: int = 60
) -> str:
    """An ``<svg>`` of how many decisions were flagged in each of ``bins`` equal stretches of
    positions ``[0, extent)``; ``series`` are (label, positions) pairs, ``axis`` names the
    positions (e.g. "decision in the stream")."""
    extent = max(extent, 1)
    width = -(-extent // min(bins, extent))  # positions per bar
    n = -(-extent // width)
    counts = [[0] * n for _ in series]
    for row, (_, positions) in zip(counts, series, strict=True):
        for p in positions:
            row[min(max(p, 0) // width, n - 1)] += 1
    totals = [sum(column) for column in zip(*counts, strict=True)] or [0]
    top = max(max(totals), 1)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    bar_w = plot_w / n
    parts = [
        f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" '
        f'role="img" aria-label="flagged decisions per {width} positions, by {escape(axis)}">'
    ]
    for value in sorted({0, top // 2, top}):
        y = TOP + plot_h - plot_h * value / top
        parts.append(
            f'<line class="grid" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" y2="{y:.1f}"/>'
            f'<text class="tick" x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{value}</text>'
        )
    for b in range(n):
        base = 0
        first, last = b * width, min((b + 1) * width, extent) - 1
        for k, row in enumerate(counts):
            if not row[b]:
                continue
            h = plot_h * row[b] / top
            y = TOP + plot_h - plot_h * (base + row[b]) / top
            label = escape(series[k][0])
            parts.append(
                f'<rect class="s{k % SERIES_CLASSES}" x="{LEFT + b * bar_w + 0.5:.1f}" '
                f'y="{y:.1f}" width="{max(bar_w - 1, 0.5):.1f}" height="{h:.1f}">'
                f"<title>{label}: {row[b]} flagged, positions {first}-{last}</title></rect>"
            )
            base += row[b]
    for value in sorted({0, extent // 2, extent}):
        x = LEFT + plot_w * value / extent
        parts.append(
            f'<text class="tick" x="{x:.1f}" y="{TOP + plot_h + 16}" '
            f'text-anchor="middle">{value}</text>'
        )
    parts.append(
        f'<text class="axis" x="{LEFT + plot_w / 2:.0f}" y="{HEIGHT - 6}" '
        f'text-anchor="middle">{escape(axis)} (bars of {width})</text>'
    )
    if len(series) > 1:
        for k, (label, _) in enumerate(series):
            y = TOP + 4 + 14 * k
            parts.append(
                f'<rect class="s{k % SERIES_CLASSES}" x="{WIDTH - RIGHT - 190}" y="{y}" '
                f'width="10" height="10"/><text class="tick" x="{WIDTH - RIGHT - 176}" '
                f'y="{y + 9}">{escape(label)}</text>'
            )
    parts.append("</svg>")
    return "".join(parts)
