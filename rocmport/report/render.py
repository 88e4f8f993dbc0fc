"""One self-contained HTML page per verify report (and one for two reports compared): Jinja2
templates (rocmport/report/templates/, autoescaped), matplotlib's plots inline as SVG, the style
inline: no script, no font, no image fetched at view time, so it opens from file:// and as a CI
artifact alike."""

from __future__ import annotations

from pathlib import Path

from rocmport import __version__
from rocmport.fsutil import atomic_write_text
from rocmport.report import plots, source
from rocmport.report.compare import Comparison, compare
from rocmport.report.reader import BLOCKING_LABELS, Curve, RunReport, load


def _environment():
    from jinja2 import Environment, PackageLoader, StrictUndefined

    # autoescape on for every template: a test id, a reason or a source line is text, never markup
    env = Environment(
        loader=PackageLoader("rocmport.report", "templates"),
        autoescape=True,
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["seconds"] = lambda s: "—" if s is None else f"{s:.1f}"
    return env


def _plots(report: RunReport, prefix: str) -> dict[str, str]:
    """run key -> its SVG (matplotlib's output: markup, inserted unescaped by the template)."""
    from markupsafe import Markup

    return {
        run.key: Markup(plots.loss_svg(run.curves, run.title, salt=f"{prefix}-{run.key}"))
        for run in report.training
        if run.curves
    }


def render(report: RunReport) -> str:
    """The page of one report."""
    return (
        _environment()
        .get_template("report.html.j2")
        .render(
            r=report,
            plots=_plots(report, "r"),
            coverage=source.coverage_views(report),
            inputs=source.tree_inputs(report),
            blocking_labels=BLOCKING_LABELS,
            version=__version__,
        )
    )


def render_comparison(comparison: Comparison) -> str:
    from markupsafe import Markup

    svgs = {}
    for d in comparison.losses:
        curves = [
            Curve(f"{which}: {c.label}", c.steps, c.losses)
            for which, c in (("before", d.before), ("after", d.after))
            if c is not None
        ]
        svgs[d.key] = Markup(plots.loss_svg(curves, d.title, salt=f"c-{d.key}", delta_label="after − before"))
    return (
        _environment()
        .get_template("compare.html.j2")
        .render(c=comparison, a=comparison.before, b=comparison.after, plots=svgs, version=__version__)
    )


def write_page(report_path: str | Path, out: str | Path) -> Path:
    """Render the report at ``report_path`` into ``out`` (written atomically); the path written."""
    html = render(load(report_path))
    atomic_write_text(out, html)
    return Path(out)


def write_comparison(before: str | Path, after: str | Path, out: str | Path) -> Path:
    html = render_comparison(compare(load(before), load(after)))
    atomic_write_text(out, html)
    return Path(out)
