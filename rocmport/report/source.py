"""The ported source around each rewritten site, for the page's coverage section.

The report names every site that did NOT run (``unreached``: "path:line helper" -> why) and counts
the ones that did. Where the ported tree is still on this machine, the sites that ran are found in
it the way verify found them (the lines `git blame` gives to a codemod's commit that call a helper
of the generated module: rocmport.verify.analyses.port_sites), and the lines around every site are read from
it. Where it is not, or it has moved on since the run, the page says so and shows what the report
alone has."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from rocmport.report.reader import CoverageGroup, RunReport

CONTEXT = 3  # lines shown before and after each site
_SITE_KEY = re.compile(r"^(?P<path>.+):(?P<line>\d+) (?P<helper>\S+)$")


@dataclass
class SiteView:
    codemod: str
    path: str
    line: int
    end: int
    helper: str
    ran: bool
    why: str  # not ran: the report's reason; ran: by what (as far as the report knows)


@dataclass
class SourceLine:
    number: int | None  # None: a gap ("…") between two windows
    text: str
    site: int | None = None  # the index in FileView.sites of the site this line belongs to


@dataclass
class FileView:
    path: str
    sites: list[SiteView] = field(default_factory=list)
    lines: list[SourceLine] = field(default_factory=list)
    note: str = ""  # why the source is not shown

    @property
    def ran(self) -> int:
        return sum(s.ran for s in self.sites)


@dataclass
class CoverageView:
    group: CoverageGroup
    files: list[FileView]
    notes: list[str]  # what the page could not show, and why


def coverage_views(report: RunReport) -> list[CoverageView]:
    views = []
    for group in report.coverage:
        tree = Path(report.tree) if group.key == "port_sites" and report.tree else None
        views.append(_view(report, group, tree))
    return views


def _ran_by(report: RunReport) -> str:
    ran = [s.name for s in report.stages if s.status in ("pass", "fail")]
    return (
        "ran during this run's stages (" + ", ".join(ran) + "); the report does not record which of them ran it"
        if ran
        else "ran during this run"
    )


def _view(report: RunReport, group: CoverageGroup, tree: Path | None) -> CoverageView:
    notes: list[str] = []
    sites: list[SiteView] = []
    for cm in group.codemods:
        for key, why in cm.unreached.items():
            m = _SITE_KEY.match(key)
            if m:
                line = int(m["line"])
                sites.append(SiteView(cm.name, m["path"], line, line, m["helper"], False, why))
    ran_total = group.exercised
    found = _tree_sites(tree, report, notes) if tree is not None else None
    if found is not None:
        unreached = {(s.path, s.line, s.helper) for s in sites}
        ran_sites = [s for s in found if (s.path, s.line, s.helper) not in unreached]
        ends = {(s.path, s.line, s.helper): s.end for s in found}
        for s in sites:
            s.end = ends.get((s.path, s.line, s.helper), s.line)
        if len(ran_sites) == ran_total:
            by = _ran_by(report)
            sites += [SiteView(s.codemod, s.path, s.line, s.end, s.helper, True, by) for s in ran_sites]
        else:
            notes.append(
                f"the tree has {len(ran_sites)} rewritten sites that the report does not list as unreached, "
                f"the report counts {ran_total} that ran: the tree changed since the run, so the sites that ran "
                "are not marked (the ones that did not are, by the report)"
            )
    elif ran_total:
        where = f"the tree {report.tree} is not on this machine" if report.tree else "the report names no tree"
        notes.append(
            f"{ran_total} rewritten sites ran; the report names only the sites that did not run, and {where}, "
            "so the ones that ran cannot be shown"
        )
    by_file: dict[str, list[SiteView]] = {}
    for s in sorted(sites, key=lambda s: (s.path, s.line)):
        by_file.setdefault(s.path, []).append(s)
    files = [_file(tree, path, fsites) for path, fsites in by_file.items()]
    if tree is not None and not tree.is_dir():
        notes.append(f"the ported source is not shown: the tree {tree} is not on this machine")
    return CoverageView(group, files, notes)


def _tree_sites(tree: Path, report: RunReport, notes: list[str]) -> list[SiteView] | None:
    """The rewritten sites of ``tree`` as verify finds them; None (with a note) when they cannot be
    found here or the tree is not at the report's commit."""
    if not tree.is_dir():
        return None
    try:
        from rocmport.gitutil import run_git
        from rocmport.port.worktree import read_state
        from rocmport.verify.analyses.port_sites import find_sites

        state = read_state(tree)
        head = run_git("rev-parse", "HEAD", cwd=tree, check=False).stdout.strip()
        if state is None or not state.base:
            notes.append(f"{tree} has no apply state: the sites that ran cannot be found in it")
            return None
        if report.commit and head != report.commit:
            notes.append(
                f"the tree {tree} is at {head[:12]}, the run was at {report.commit[:12]}: "
                "the sites that ran are not marked and the source shown is today's"
            )
            return None
        found = find_sites(tree, state.base)
    except Exception as exc:  # noqa: BLE001 (verify's site finder is its own: the page still renders)
        notes.append(f"the sites that ran could not be found in {tree} ({type(exc).__name__}: {exc})")
        return None
    return [SiteView(s.codemod, s.path, s.line, s.end, s.helper, True, "") for s in found]


def _file(tree: Path | None, rel: str, sites: list[SiteView]) -> FileView:
    view = FileView(rel, sites)
    if tree is None:
        view.note = "the report names no tree to read the source from"
        return view
    path = tree / rel
    try:
        text = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        view.note = f"not shown: {path} is not on this machine"
        return view
    owner: dict[int, int] = {}
    for i, s in enumerate(sites):
        for n in range(s.line, s.end + 1):
            owner.setdefault(n, i)
    wanted: set[int] = set()
    for s in sites:
        wanted.update(range(max(1, s.line - CONTEXT), min(len(text), s.end + CONTEXT) + 1))
    previous = 0
    for n in sorted(wanted):
        if previous and n != previous + 1:
            view.lines.append(SourceLine(None, "…"))
        view.lines.append(SourceLine(n, text[n - 1], owner.get(n)))
        previous = n
    return view


@dataclass
class Inputs:
    hash: str | None
    note: str


def tree_inputs(report: RunReport) -> Inputs:
    """The port's inputs hash (what `apply` built the tree from: the pin, the series, the codemod
    versions), read from the tree's apply state: the verify report does not carry it."""
    if not report.tree:
        return Inputs(None, "not known: the report names no tree")
    tree = Path(report.tree)
    if not tree.is_dir():
        return Inputs(None, f"not known: the report does not carry it and the tree {tree} is not on this machine")
    try:
        from rocmport.port.worktree import read_state

        state = read_state(tree)
    except Exception as exc:  # noqa: BLE001 (an unreadable apply state: the page still renders)
        return Inputs(None, f"not known: the tree's apply state cannot be read ({exc})")
    if state is None or not state.inputs:
        return Inputs(None, f"not known: {tree} has no apply state (not built by `rocmport apply`)")
    return Inputs(state.inputs, "")
