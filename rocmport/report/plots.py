"""Loss curves drawn by matplotlib as inline SVG (the page needs no network and no script to show them).

A Figure is made directly (no pyplot: no global state, no GUI backend) and drawn with the Agg-free SVG
canvas; text stays text (``svg.fonttype: none``: smaller, selectable, searchable), and each figure's
element ids get their own salt so that several SVGs inline in one page never share an id."""

from __future__ import annotations

import io
import re
from collections.abc import Sequence

from rocmport.report.reader import Curve

# One look for every plot: the port solid, references dashed, goldens dotted.
_STYLES = {
    "port": {"linestyle": "-", "linewidth": 2.0, "marker": "o", "markersize": 3},
    "reference": {"linestyle": "--", "linewidth": 1.5},
    "golden": {"linestyle": ":", "linewidth": 1.8, "marker": "s", "markersize": 3},
}


def _style(label: str) -> dict:
    low = label.lower()
    if "golden" in low:
        return _STYLES["golden"]
    if "reference" in low or "resumed" in low:
        return _STYLES["reference"]
    return _STYLES["port"]


def loss_svg(
    curves: Sequence[Curve], title: str, salt: str, ylabel: str = "lm loss", delta_label: str = "Δ vs the port"
) -> str:
    """One plot of ``curves`` (iteration on x), as an <svg> element's text. The first curve is the
    port's: under it a second panel draws each other curve minus the port's at their common
    iterations, where a difference of 0.006 (a failing stage 2) is visible and the curves above overlap."""
    import matplotlib

    matplotlib.use("Agg")  # never a GUI backend, whatever the environment asks for
    from matplotlib.figure import Figure

    drawn = [c for c in curves if c.losses]
    deltas = _deltas(drawn)
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": salt, "font.size": 9}):
        fig = Figure(figsize=(6.4, 4.2 if deltas else 3.0), dpi=100)
        if deltas:
            ax, dax = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 1.3]})
        else:
            ax, dax = fig.add_subplot(), None
        for i, c in enumerate(drawn):  # a curve keeps its colour in both panels
            ax.plot(c.steps, c.losses, label=c.label, color=f"C{i}", **_style(c.label))
        ax.set_title(title, fontsize=10)
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        if drawn:
            ax.legend(fontsize=8, loc="best")
        if dax is not None:
            for i, label, steps, diff in deltas:
                dax.plot(steps, diff, label=label, color=f"C{i}", **_style(label))
            dax.axhline(0.0, color="C0", linewidth=1.0)
            dax.set_ylabel(delta_label, fontsize=8)
            dax.grid(True, alpha=0.3)
            dax.set_xlabel("iteration")
        else:
            ax.set_xlabel("iteration")
        fig.tight_layout()
        buf = io.StringIO()
        fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None})
    return _inline(buf.getvalue())


def _deltas(curves: Sequence[Curve]) -> list[tuple[int, str, list[int], list[float]]]:
    """Each curve after the first minus the first, at their common iterations (with its index)."""
    if len(curves) < 2:
        return []
    base = dict(zip(curves[0].steps, curves[0].losses))
    out = []
    for i, c in enumerate(curves[1:], 1):
        steps = [s for s in c.steps if s in base]
        if steps:
            mine = dict(zip(c.steps, c.losses))
            out.append((i, c.label, steps, [mine[s] - base[s] for s in steps]))
    return out


def _inline(svg: str) -> str:
    """The <svg> element alone (no XML declaration or DOCTYPE, which HTML does not allow inline)."""
    start = svg.find("<svg")
    return re.sub(r"<!--.*?-->", "", svg[start:], flags=re.S).strip()
