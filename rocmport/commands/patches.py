"""`rocmport patches list|export|check`: every command on patch sets lives here."""

from __future__ import annotations

import re

import click

from rocmport import output
from rocmport.codemods.declared import check_series
from rocmport.config import load_settings
from rocmport.errors import EXIT_OK, EXIT_PROBLEM
from rocmport.patches.series import all_series, describe
from rocmport.port.export import check as check_drift
from rocmport.port.export import export as export_commits
from rocmport.port.export import ported_trees
from rocmport.upstreams import NAMES


@click.group("patches")
def command():
    """List, export and check the patch series in patchsets/."""


@command.command("list")
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def list_cmd(obj, as_json):
    """Every series with its version range, codemods and patches, and each line's ROCm component matrix."""
    settings = load_settings(obj["project"])
    data = [describe(check_series(s)) for name in NAMES for s in all_series(settings.patchsets_dir, name)]
    if as_json:
        output.emit_json({"series": data})
        return EXIT_OK
    rows = [
        [
            d["upstream"],
            d["line"],
            d["versions"],
            len(d["patches"]),
            ", ".join(d["codemods"]) or "-",
            ", ".join(d["excluded_paths"]) or "-",
        ]
        for d in data
    ]
    output.table(["upstream", "line", "versions", "patches", "codemods", "excluded"], rows)
    for d in data:
        for p in d["patches"]:
            output.info(f"  {d['upstream']} {d['line']}: {p['name']} [{p['upstream_status']}] {p['description']}")
    rocm = [
        [
            d["line"],
            name + ("*" if c["required"] else ""),
            re.sub(r"^https://github.com/|\.git(?=@)", "", c["source"]),
            c["versions"],
            ",".join(c["builds"]),
            ",".join(c["refuses"]) or "-",
            ",".join(c["variants"]) or "-",
        ]
        for d in data
        if d["rocm"]
        for name, c in d["rocm"]["components"].items()
    ]
    if rocm:
        output.table(
            ["line", "component", "source", "versions", "builds for", "refuses", "variants"],
            rocm,
            title="ROCm component matrix (rocm: in each series, the source of each choice in its comments; * required)",
        )
        for d in data:
            if d["rocm"]:
                output.info(
                    f"  {d['upstream']} {d['line']}: base image {d['rocm']['base_image']} (Python {d['rocm']['python']})"
                )
    return EXIT_OK


@command.command("export")
@click.option("--upstream", type=click.Choice(NAMES))
@click.option("--description", help="Description for the new patches (default: the commit message).")
@click.option(
    "--upstream-status",
    default="Pending",
    show_default=True,
    help="Pending | Submitted <url> | Backport <commit> | Inappropriate <reason> | ROCm-only",
)
@click.option("--dry-run", is_flag=True, help="Print what would be written; change nothing.")
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def export_cmd(obj, upstream, description, upstream_status, dry_run, as_json):
    """Turn your commits on the work branch (after the applied port) into patches in the series."""
    results = {}
    for name, series, tree in ported_trees(load_settings(obj["project"]), upstream):
        r = export_commits(tree, series, description, upstream_status, dry_run=dry_run)
        results[name] = {
            "written": r.written,
            "unchanged": r.unchanged,
            "would_write": sorted(r.texts) if dry_run else [],
            "notes": r.notes,
        }
        if not as_json:
            for note in r.notes:
                output.warn(f"{name}: {note}")
            for n in r.written:
                output.info(f"{name}: wrote {series.dir / n}")
            for n in sorted(r.texts) if dry_run else []:
                output.info(f"{name}: would write {series.dir / n}")
                click.echo(r.texts[n])
            if not r.texts:
                output.info(f"{name}: nothing to export")
    if as_json:
        output.emit_json(results)
    return EXIT_OK


@command.command("check")
@click.option("--upstream", type=click.Choice(NAMES))
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def check_cmd(obj, upstream, as_json):
    """Drift gate for CI: exit 1 if the stored patches differ from the work branch or a header is bad."""
    problems = {}
    for name, series, tree in ported_trees(load_settings(obj["project"]), upstream):
        problems[name] = check_drift(tree, series)
    if as_json:
        output.emit_json({"problems": problems})
    else:
        for name, items in problems.items():
            for p in items:
                output.warn(p)
            if not items:
                output.info(f"{name}: patches match the branch")
    return EXIT_PROBLEM if any(problems.values()) else EXIT_OK
