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
    every = [check_series(s) for name in NAMES for s in all_series(settings.patchsets_dir, name)]
    if as_json:
        output.emit_json({"series": [describe(s) for s in every]})
        return EXIT_OK
    rows = [
        [
            s.upstream,
            s.line,
            str(s.versions),
            len(s.patches),
            ", ".join(c["name"] for c in s.codemods) or "-",
            ", ".join(s.excluded_paths) or "-",
        ]
        for s in every
    ]
    output.table(["upstream", "line", "versions", "patches", "codemods", "excluded"], rows)
    for s in every:
        for p in s.patches:
            output.info(f"  {s.upstream} {s.line}: {p.name} [{p.upstream_status}] {p.description.splitlines()[0]}")
    rocm = [
        [
            s.line,
            name + ("*" if c.required else ""),
            re.sub(r"^https://github.com/|\.git(?=@)", "", c.source),
            str(c.versions) or "any",
            ",".join(c.builds),
            ",".join(sorted(c.refuses)) or "-",
            ",".join(sorted(c.variants)) or "-",
        ]
        for s in every
        if s.rocm
        for name, c in s.rocm.components.items()
    ]
    if rocm:
        output.table(
            ["line", "component", "source", "versions", "builds for", "refuses", "variants"],
            rocm,
            title="ROCm component matrix (rocm: in each series, the source of each choice in its comments; * required)",
        )
        for s in every:
            if s.rocm:
                output.info(f"  {s.upstream} {s.line}: base image {s.rocm.base_image} (Python {s.rocm.python})")
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
