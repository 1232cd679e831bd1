"""Charts for the html report, drawn server-side by matplotlib as inline SVG.

Deterministic: the same figures give the same bytes (fixed hash salt per chart, no date or
creator metadata, glyphs as paths so no font is needed to view them). Safe under a strict
Content-Security-Policy: the SVG carries no `<style>` element and no `style` attribute (both are
turned into presentation attributes), and its ids are prefixed per chart so several charts can
share one page. Amounts are plotted as display values (whole currency units); the labels on the
bars are formatted from the exact integers.
"""

from __future__ import annotations

import io
import re
import threading
from typing import Any

from reports.money import amount_text, exponent, units

MAX_BARS = 12
STATUS_COLOURS = {"pending": "#c9a227", "approved": "#1b7a2b", "held": "#8792a2", "reversed": "#b3372f"}
BAR = "#2f5fb3"
NEGATIVE = "#b3372f"
RC: dict[str, Any] = {
    "svg.fonttype": "path",
    "font.family": "DejaVu Sans",
    "font.size": 9.0,
    "axes.edgecolor": "#8792a2",
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.axisbelow": True,
    "axes.grid": True,
    "axes.grid.axis": "x",
    "grid.color": "#e6e9ee",
    "path.simplify": False,
}
PRESENTATION = frozenset(
    {
        "fill",
        "fill-opacity",
        "fill-rule",
        "stroke",
        "stroke-width",
        "stroke-linejoin",
        "stroke-linecap",
        "stroke-opacity",
        "stroke-dasharray",
        "stroke-dashoffset",
        "stroke-miterlimit",
        "opacity",
    }
)
_LOCK = threading.Lock()  # matplotlib's rcParams are process-global


def _figure(name: str, width: float, height: float, draw: Any) -> str:
    import matplotlib as mpl
    from matplotlib.backends.backend_svg import FigureCanvasSVG
    from matplotlib.figure import Figure

    settings: Any = {**RC, "svg.hashsalt": f"tally-{name}"}
    with _LOCK, mpl.rc_context(settings):
        fig = Figure(figsize=(width, height), layout="constrained")
        FigureCanvasSVG(fig)
        draw(fig.add_subplot())
        out = io.StringIO()
        fig.savefig(out, format="svg", metadata={"Date": None, "Creator": None, "Format": None, "Type": None})
    return inline_svg(out.getvalue(), prefix=f"{name}-")


def _declarations(style: str) -> str:
    attributes = []
    for declaration in style.split(";"):
        if not declaration.strip():
            continue
        prop, _, value = declaration.partition(":")
        prop, value = prop.strip(), value.strip()
        if prop not in PRESENTATION:
            raise ValueError(f"chart SVG style {prop!r} has no presentation attribute")
        attributes.append(f'{prop}="{value}"')
    return " ".join(attributes)


def inline_svg(svg: str, prefix: str) -> str:
    """matplotlib's SVG document -> an element safe to inline under a strict CSP."""
    svg = svg[svg.index("<svg") :]
    svg = re.sub(r"<defs>\s*<style[^>]*>[^<]*</style>\s*</defs>\s*", "", svg, count=1)
    svg = re.sub(r' style="([^"]*)"', lambda m: " " + _declarations(m.group(1)), svg)
    svg = re.sub(r'(\bid="|url\(#|xlink:href="#)', lambda m: m.group(1) + prefix, svg)
    return svg.replace("<svg ", '<svg stroke-linejoin="round" stroke-linecap="butt" role="img" ', 1).strip()


def _axis_formatter(currency: str) -> Any:
    from matplotlib.ticker import FuncFormatter

    places = exponent(currency)
    return FuncFormatter(lambda value, _pos: f"{value:,.{places}f}")


def partners_chart(rows: list[dict[str, Any]], currency: str) -> str:
    """Horizontal bars: commission per partner (the largest first, the rest as one bar)."""
    shown = rows[:MAX_BARS]
    labels = [str(r["partner_code"]) for r in shown]
    amounts = [int(r["commission"]) for r in shown]
    if len(rows) > MAX_BARS:
        labels.append(f"{len(rows) - MAX_BARS} others")
        amounts.append(sum(int(r["commission"]) for r in rows[MAX_BARS:]))
    labels = [label if len(label) <= 24 else label[:23] + "…" for label in labels]

    def draw(ax: Any) -> None:
        values = [float(units(a, currency)) for a in amounts]  # display values only
        positions = list(range(len(values)))
        bars = ax.barh(positions, values, color=[BAR if v >= 0 else NEGATIVE for v in values], height=0.6)
        ax.set_yticks(positions, labels)
        ax.invert_yaxis()
        ax.xaxis.set_major_formatter(_axis_formatter(currency))
        ax.bar_label(bars, labels=[amount_text(a, currency) for a in amounts], padding=3, fontsize=8)
        ax.set_xlabel(f"Commission ({currency.upper()})")
        ax.margins(x=0.18)

    return _figure(f"partners-{currency}", 6.4, 1.1 + 0.32 * len(amounts), draw)


def status_chart(rows: list[dict[str, Any]], currency: str) -> str:
    """Vertical bars: commission per status (pending, approved, held, reversed)."""
    statuses = [str(r["status"]) for r in rows]
    amounts = [int(r["commission"]) for r in rows]

    def draw(ax: Any) -> None:
        values = [float(units(a, currency)) for a in amounts]  # display values only
        bars = ax.bar(statuses, values, color=[STATUS_COLOURS.get(s, BAR) for s in statuses], width=0.6)
        ax.yaxis.set_major_formatter(_axis_formatter(currency))
        ax.grid(axis="y")
        ax.grid(axis="x", visible=False)
        ax.bar_label(bars, labels=[amount_text(a, currency) for a in amounts], padding=3, fontsize=8)
        ax.set_ylabel(f"Commission ({currency.upper()})")
        ax.margins(y=0.15)
        ax.axhline(0, color="#8792a2", linewidth=0.8)

    return _figure(f"status-{currency}", 4.2, 2.8, draw)


ACTIVITY_COLOURS = ("#8792a2", "#c9a227", "#2f5fb3")


def activity_chart(periods: list[str], series: dict[str, list[int]]) -> str:
    """Grouped vertical bars per month: counts (a partner's clicks, sign-ups and sales), the last
    MAX_BARS months."""
    periods = periods[-MAX_BARS:]
    shown = {name: values[-MAX_BARS:] for name, values in series.items()}

    def draw(ax: Any) -> None:
        from matplotlib.ticker import MaxNLocator

        width = 0.8 / max(len(shown), 1)
        for i, ((name, values), colour) in enumerate(zip(shown.items(), ACTIVITY_COLOURS, strict=False)):
            positions = [p + (i - (len(shown) - 1) / 2) * width for p in range(len(periods))]
            ax.bar(positions, values, width=width, color=colour, label=name)
        ax.set_xticks(range(len(periods)), periods, rotation=45, ha="right")
        ax.grid(axis="y")
        ax.grid(axis="x", visible=False)
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))  # counts
        ax.legend(loc="upper left", fontsize=8, frameon=False)
        ax.margins(y=0.15)

    return _figure("activity", 6.4, 2.8, draw)


def earnings_chart(periods: list[str], amounts: list[int], currency: str) -> str:
    """Vertical bars per month: a partner's commissions in one currency (negatives in red), the
    last MAX_BARS months, each labelled with its exact amount."""
    periods, amounts = periods[-MAX_BARS:], amounts[-MAX_BARS:]

    def draw(ax: Any) -> None:
        values = [float(units(a, currency)) for a in amounts]  # display values only
        bars = ax.bar(periods, values, color=[BAR if v >= 0 else NEGATIVE for v in values], width=0.6)
        ax.yaxis.set_major_formatter(_axis_formatter(currency))
        ax.set_xticks(range(len(periods)), periods, rotation=45, ha="right")
        ax.grid(axis="y")
        ax.grid(axis="x", visible=False)
        ax.bar_label(bars, labels=[amount_text(a, currency) for a in amounts], padding=3, fontsize=7)
        ax.set_ylabel(f"Commission ({currency.upper()})")
        ax.margins(y=0.2)
        ax.axhline(0, color="#8792a2", linewidth=0.8)

    return _figure(f"earnings-{currency}", 6.4, 2.8, draw)
