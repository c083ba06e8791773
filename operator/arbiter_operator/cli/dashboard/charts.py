"""The dashboard's pictures as inline SVG, made on the server: a promotion's timeline (phases, and each version's
traffic weight as a step line), a gate's value against its bound, a decision mix as one stacked bar.

Why no chart library: the three pictures are step lines and bars, about 150 lines here; a JavaScript library (uPlot,
Chart.js) would be a vendored asset in the wheel to keep current, would need JavaScript to show anything, and would
draw on the client what the server already knows. Server-made SVG is in the HTML as it arrives (no second request),
readable by screen readers through each picture's title and description (each also comes with its numbers as a
table), and cheap: the page of a model renders in about a millisecond and the overview of 200 models in a few
(benchmarks/dashboard_page.py). Colours are the Okabe-Ito palette (distinguishable with colour blindness), and
nothing is told by colour alone (phases are named, a failing gate says Fail).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from html import escape

PALETTE = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#000000", "#F0E442")
PHASE_COLOURS = {
    "Idle": "#BBBBBB", "Cooling": "#009E73", "Deploying": "#56B4E9", "Waiting": "#56B4E9", "Shadowing": "#0072B2",
    "Progressing": "#0072B2", "Paused": "#CC79A7", "RollingBack": "#D55E00", "Failed": "#D55E00", "Aborted": "#E69F00",
}


def colour(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


def _clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(t))


def timeline(points: Sequence[tuple[float, str, dict[str, float]]], versions: Sequence[str], start: float,
             end: float, title: str, width: int = 760, height: int = 190) -> str:
    """Phases as a band along the top, each version's weight (0-100%) as a step line below; `points` are (time,
    phase, weights), each holding until the next."""
    left, right, band, top, bottom = 44, 10, 22, 34, 24
    span = max(end - start, 1.0)
    plot_h = height - top - bottom

    def x(t: float) -> float:
        return round(left + (width - left - right) * (min(max(t, start), end) - start) / span, 1)

    def y(w: float) -> float:
        return round(top + plot_h * (1 - w / 100), 1)

    parts = [f'<svg class="timeline" viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" '
             f'aria-labelledby="tl-title tl-desc" xmlns="http://www.w3.org/2000/svg">',
             f'<title id="tl-title">{escape(title)}</title>',
             f'<desc id="tl-desc">{escape(_describe(points))}</desc>']
    for w in (0, 50, 100):
        parts.append(f'<line x1="{left}" x2="{width - right}" y1="{y(w)}" y2="{y(w)}" class="grid"/>'
                     f'<text x="{left - 6}" y="{y(w) + 4}" text-anchor="end" class="axis">{w}%</text>')
    for i, (t, phase, _) in enumerate(points):
        t_next = points[i + 1][0] if i + 1 < len(points) else end
        x0, x1 = x(t), x(t_next)
        fill = PHASE_COLOURS.get(phase, "#999999")
        parts.append(f'<rect x="{x0}" y="4" width="{max(x1 - x0, 1.5)}" height="{band}" fill="{fill}" '
                     f'class="phase" data-phase="{escape(phase)}"><title>{escape(phase)} from {_clock(t)}</title>'
                     "</rect>")
        if x1 - x0 > 8 * len(phase):
            parts.append(f'<text x="{x0 + 4}" y="19" class="phase-label">{escape(phase)}</text>')
    for vi, version in enumerate(versions):
        path = _steps([(x(t), y(weights.get(version, 0.0))) for t, _, weights in points], x(end))
        if path:
            parts.append(f'<polyline points="{path}" fill="none" stroke="{colour(vi)}" stroke-width="2.5" '
                         f'class="weight" data-version="{escape(version)}"/>')
    parts.append(f'<text x="{left}" y="{height - 6}" class="axis">{_clock(start)}</text>'
                 f'<text x="{width - right}" y="{height - 6}" text-anchor="end" class="axis">{_clock(end)} UTC</text>')
    parts.append("</svg>")
    return "".join(parts)


def _steps(xy: list[tuple[float, float]], x_end: float) -> str:
    if not xy:
        return ""
    out = []
    for i, (px, py) in enumerate(xy):
        if i:
            out.append(f"{px},{xy[i - 1][1]}")
        out.append(f"{px},{py}")
    out.append(f"{x_end},{xy[-1][1]}")
    return " ".join(out)


def _describe(points: Sequence[tuple[float, str, dict[str, float]]]) -> str:
    steps = []
    for t, phase, weights in points[-12:]:
        split = ", ".join(f"{v} {w:g}%" for v, w in weights.items()) or "no traffic"
        steps.append(f"{_clock(t)} {phase} ({split})")
    return "; ".join(steps)


def gate_bar(value: float | None, bound: float | None, direction: str, failing: bool, label: str) -> str:
    """The value as a bar against the bound (the mark in the middle); past the mark is past the bound."""
    width, height = 160, 14
    if value is None or bound is None or bound <= 0:
        return ""
    ratio = min(value / bound, 2.0) / 2.0
    fill = "#D55E00" if failing else "#009E73"
    return (f'<svg class="gate-bar" viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" '
            f'aria-label="{escape(label)}" xmlns="http://www.w3.org/2000/svg">'
            f'<rect x="0" y="2" width="{width}" height="{height - 4}" class="track"/>'
            f'<rect x="0" y="2" width="{round(width * ratio, 1)}" height="{height - 4}" fill="{fill}"/>'
            f'<line x1="{width / 2}" x2="{width / 2}" y1="0" y2="{height}" class="bound-mark"/></svg>')


def stacked_bar(shares: dict[str, float], labels: Sequence[str], label: str) -> str:
    width, height = 240, 16
    x = 0.0
    parts = [f'<svg class="mix-bar" viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" '
             f'aria-label="{escape(label)}" xmlns="http://www.w3.org/2000/svg">']
    for i, name in enumerate(labels):
        w = width * max(0.0, shares.get(name, 0.0))
        if w > 0:
            parts.append(f'<rect x="{round(x, 1)}" y="0" width="{round(w, 1)}" height="{height}" fill="{colour(i)}">'
                         f"<title>{escape(name)} {100 * shares.get(name, 0.0):.1f}%</title></rect>")
        x += w
    parts.append("</svg>")
    return "".join(parts)
