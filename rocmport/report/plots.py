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


def loss_svg(curves: Sequence[Curve], title: str, salt: str, ylabel: str = "lm loss") -> str:
    """One plot of ``curves`` (iteration on x), as an <svg> element's text."""
    import matplotlib

    matplotlib.use("Agg")  # never a GUI backend, whatever the environment asks for
    from matplotlib.figure import Figure

    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": salt, "font.size": 9}):
        fig = Figure(figsize=(6.4, 3.0), dpi=100)
        ax = fig.add_subplot()
        for c in curves:
            if c.losses:
                ax.plot(c.steps, c.losses, label=c.label, **_style(c.label))
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("iteration")
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        if any(c.losses for c in curves):
            ax.legend(fontsize=8, loc="best")
        fig.tight_layout()
        buf = io.StringIO()
        fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None})
    return _inline(buf.getvalue())


def _inline(svg: str) -> str:
    """The <svg> element alone (no XML declaration or DOCTYPE, which HTML does not allow inline)."""
    start = svg.find("<svg")
    return re.sub(r"<!--.*?-->", "", svg[start:], flags=re.S).strip()
