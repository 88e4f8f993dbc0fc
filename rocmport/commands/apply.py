"""`rocmport apply`: build the ported work trees from the lock, the patch series and the codemods."""

from __future__ import annotations

import click

from rocmport import output, procs
from rocmport.config import load_settings
from rocmport.errors import EXIT_OK, EXIT_PROBLEM, BadInput
from rocmport.port.apply import apply_project
from rocmport.port.uptodate import noop_reports
from rocmport.upstreams import NAMES


def _print_report(r) -> None:
    if r.noop:
        output.info(
            f"{r.upstream}: up to date ({r.branch} at {(r.result or '')[:12]}, series {r.series_hash[:12]}); nothing to do"
        )
        return
    if r.status == "aborted":  # the engine said where the branch is; there is no table to show
        return
    if not r.patches and not r.codemods:
        output.info(f"{r.upstream}: series {r.series} has no patches or codemods; {r.branch} is the upstream commit")
    rows = [
        [
            p["name"],
            p["bucket"],
            ", ".join(f"#{o['hunk']}{o['offset']:+d}" for o in p["offsets"]) or "-",
            ", ".join(p["files"]),
            p["detail"],
        ]
        for p in r.patches
    ]
    rows += [
        [
            f"codemod: {c['name']} (version {c['version']})",
            "codemod",
            "-",
            f"{len(c['files'])} files",
            f"{c['sites']} sites",
        ]
        for c in r.codemods
    ]
    if rows:
        output.table(
            ["patch", "bucket", "offsets", "files", "detail"], rows, title=f"{r.upstream}: {r.branch} ({r.tree})"
        )
    if r.status == "conflict":
        bad = r.patches[-1]
        hunks = ", ".join(f"{h['file']}:{h['line']}" for h in bad["failed_hunks"]) or ", ".join(bad["files"])
        output.warn(
            f"{r.upstream}: {bad['name']} does not apply ({hunks}); the tree is at the last good commit. "
            f"Apply it by hand in {r.tree}, commit, then `rocmport apply --continue` (or `rocmport apply --abort`)."
        )
    elif r.status == "done":
        output.info(f"{r.upstream}: {r.base[:12]} -> {r.result[:12]} on {r.branch}")


@click.command("apply")
@click.option("--upstream", type=click.Choice(NAMES), help="Only this upstream (default: every pinned one).")
@click.option("--codemods-only", is_flag=True, help="No patch series: the default codemod recipe on the pinned commit.")
@click.option("--continue", "cont", is_flag=True, help="Go on after you resolved and committed a conflicting patch.")
@click.option("--abort", is_flag=True, help="Give up a stopped apply and restore the branch as it was.")
@click.option(
    "--force",
    is_flag=True,
    help="Rebuild over uncommitted edits or extra commits, saving them on refs/rocmport/backup/<n> first.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the per-upstream reports as JSON.")
@click.pass_obj
def command(obj, upstream, codemods_only, cont, abort, force, as_json):
    """Check out the pinned commits and build the ported branches rocm/<ref>.

    \b
    History: rocmport/base/<ref> -> one commit per patch -> one commit per codemod (rocmport/port/<ref>).
    Each patch ends in one bucket: clean, offset, merged-3way, already-upstream, not-applicable, conflict.
    A report is written next to each work tree (build/<upstream>.report.json).
    Exit: 0 done, 1 a patch conflicts (resolve, commit, --continue), 2 bad input.
    """
    if cont and abort:
        raise BadInput("--continue and --abort contradict each other; give one")
    mode = "continue" if cont else "abort" if abort else "apply"
    settings = load_settings(obj["project"])
    reports = []
    # Nothing changed since the last apply: said without loading a codemod (rocmport/port/uptodate.py).
    for report in (noop_reports(settings, upstream, codemods_only=codemods_only) if mode == "apply" else None) or ():
        with output.progress(f"applying the {report.upstream} port"):  # the lines the full apply prints
            reports.append(report)
        if not as_json:
            _print_report(report)
    if not reports:
        # Ctrl-C or SIGTERM in any step (a git checkout or clone as much as the codemods): every process
        # of the apply ended, exit 130/143 "interrupted", and the tree left for the next apply to recover
        # (the state file says where it was). Without the scope, a signal in a git step surfaced as
        # git's own failure ("index.lock ... Bad file descriptor", exit 1) or killed rocmport outright.
        then = "the next `rocmport apply` recovers the work tree (or `rocmport apply --abort` restores it)"
        with procs.run_scope("rocmport-apply-", then=then):
            for report in apply_project(
                settings, upstream, codemods_only=codemods_only, force=force, mode=mode, say=output.info
            ):
                reports.append(report)
                if not as_json:
                    _print_report(report)
    if as_json:
        output.emit_json({"upstreams": {r.upstream: r.to_dict() for r in reports}})
    return EXIT_PROBLEM if any(r.status == "conflict" for r in reports) else EXIT_OK
