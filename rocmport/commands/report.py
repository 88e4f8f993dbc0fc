"""`rocmport report`: a verify report as one self-contained HTML page, or two reports compared."""

from __future__ import annotations

from pathlib import Path

import click

from rocmport.errors import EXIT_OK, BadInput
from rocmport.verify.orchestration.report import LAST, verify_dir

MISSING_EXTRA = (
    "the HTML report needs jinja2 and matplotlib, which this Python lacks: "
    "pip install 'rocmport[report]' (or pip install jinja2 matplotlib)"
)


def page_path_beside(report: Path) -> Path:
    """Where a report's page goes by default: beside it, the same name ending in .html."""
    return report.with_suffix(".html")


def require_renderer() -> None:
    """BadInput (exit 2, saying what to install) when jinja2 or matplotlib is missing."""
    try:
        import jinja2  # noqa: F401
        import matplotlib  # noqa: F401
    except ImportError:
        raise BadInput(MISSING_EXTRA) from None


@click.command("report")
@click.argument("reports", nargs=-1, type=click.Path(dir_okay=False), metavar="[REPORT.json [OTHER.json]]")
@click.option(
    "--html",
    "html_out",
    type=click.Path(dir_okay=False),
    default=None,
    help="Write the page here (default: beside the (second) report, ending in .html).",
)
@click.pass_obj
def command(obj, reports, html_out):
    """Render a verify report as one self-contained HTML page (two reports: what changed).

    \b
    rocmport report                              build/verify/last.json -> build/verify/last.html
    rocmport report build/verify/v0.16-….json --html page.html
    rocmport report BEFORE.json AFTER.json --html hop.html   stages, labels, sites and losses that changed
    The page needs no network: its plots are inline SVG and it opens from file:// or as a CI artifact.
    """
    if len(reports) > 2:
        raise BadInput(f"rocmport report takes one report or two to compare, not {len(reports)}")
    paths = [Path(p) for p in reports] or [verify_dir(Path(obj["project"])) / LAST]
    require_renderer()
    from rocmport.report import render

    out = Path(html_out) if html_out else None
    if len(paths) == 1:
        written = render.write_page(paths[0], out or page_path_beside(paths[0]))
    else:
        default = paths[1].with_name(f"{paths[0].stem}-vs-{paths[1].stem}.html")
        written = render.write_comparison(paths[0], paths[1], out or default)
    click.echo(str(written.resolve()))  # the page's path alone on stdout: a script opens or uploads it
    return EXIT_OK
