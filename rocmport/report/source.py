"""The ported source around each rewritten site, for the page's coverage section.

The report names every site that did NOT run (``unreached``: "path:line helper" -> why) and, since
its ``ran`` key, every site that did with the stages that ran it ("path:line helper" -> [stage]).
An older report only counts the ones that ran: where the ported tree is still on this machine, they
are found in it the way verify found them (the lines `git blame` gives to a codemod's commit that
call a helper of the generated module: rocmport.verify.analyses.port_sites), and the page says the
report does not record which stage ran them. The lines around every site are read from the tree.
Where it is not here, or it has moved on since the run, the page says so and shows what the report
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
    stages: list[str] = field(default_factory=list)  # ran: the stages that ran it, where the report records them


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
    """Who ran a site, for a report without the 'ran' key: only the stages that ran at all."""
    ran = [s.name for s in report.stages if s.status in ("pass", "fail")]
    return (
        "ran during this run's stages (" + ", ".join(ran) + "); the report does not record which of them ran it"
        if ran
        else "ran during this run; the report does not record which stage ran it"
    )


def _ran_in(stages: list[str]) -> str:
    # No stage named: verify recorded the site outside any stage's directory (a flat records directory).
    return "ran in " + ", ".join(stages) if stages else "ran (the report names no stage for it)"


def _view(report: RunReport, group: CoverageGroup, tree: Path | None) -> CoverageView:
    notes: list[str] = []
    sites: list[SiteView] = []
    for cm in group.codemods:
        for key, why in cm.unreached.items():
            m = _SITE_KEY.match(key)
            if m:
                line = int(m["line"])
                sites.append(SiteView(cm.name, m["path"], line, line, m["helper"], False, why))
    if group.records_ran:
        sites += _ran_from_report(group, tree, report, notes, sites)
    else:
        sites += _ran_from_tree(group, tree, report, notes, sites)
    by_file: dict[str, list[SiteView]] = {}
    for s in sorted(sites, key=lambda s: (s.path, s.line)):
        by_file.setdefault(s.path, []).append(s)
    files = [_file(tree, path, fsites) for path, fsites in by_file.items()]
    if tree is not None and not tree.is_dir():
        notes.append(f"the ported source is not shown: the tree {tree} is not on this machine")
    return CoverageView(group, files, notes)


def _extents(tree: Path | None, report: RunReport, notes: list[str], sites: list[SiteView]) -> None:
    """Each site's last line (a call over several lines), from the tree where it is here."""
    found = _tree_sites(tree, report, notes, marking=False) if tree is not None else None
    ends = {(s.path, s.line, s.helper): s.end for s in found or ()}
    for s in sites:
        s.end = ends.get((s.path, s.line, s.helper), s.line)


def _ran_from_report(
    group: CoverageGroup, tree: Path | None, report: RunReport, notes: list[str], unreached: list[SiteView]
) -> list[SiteView]:
    """The sites that ran, as the report's 'ran' names them with the stages that ran each."""
    ran = []
    for cm in group.codemods:
        for key, stages in (cm.ran or {}).items():
            m = _SITE_KEY.match(key)
            if m:
                line = int(m["line"])
                ran.append(SiteView(cm.name, m["path"], line, line, m["helper"], True, _ran_in(stages), stages))
    _extents(tree, report, notes, unreached + ran)
    return ran


def _ran_from_tree(
    group: CoverageGroup, tree: Path | None, report: RunReport, notes: list[str], unreached: list[SiteView]
) -> list[SiteView]:
    """The sites that ran, for a report without 'ran': the tree's sites that the report does not
    list as unreached, when their number is the report's count (none, with a note, otherwise)."""
    found = _tree_sites(tree, report, notes) if tree is not None else None
    if found is None:
        if group.exercised:
            where = f"the tree {report.tree} is not on this machine" if report.tree else "the report names no tree"
            notes.append(
                f"{group.exercised} rewritten sites ran; the report names only the sites that did not run, and "
                f"{where}, so the ones that ran cannot be shown"
            )
        return []
    known = {(s.path, s.line, s.helper) for s in unreached}
    ran_sites = [s for s in found if (s.path, s.line, s.helper) not in known]
    ends = {(s.path, s.line, s.helper): s.end for s in found}
    for s in unreached:
        s.end = ends.get((s.path, s.line, s.helper), s.line)
    if len(ran_sites) != group.exercised:
        notes.append(
            f"the tree has {len(ran_sites)} rewritten sites that the report does not list as unreached, "
            f"the report counts {group.exercised} that ran: the tree changed since the run, so the sites that ran "
            "are not marked (the ones that did not are, by the report)"
        )
        return []
    by = _ran_by(report)
    return [SiteView(s.codemod, s.path, s.line, s.end, s.helper, True, by) for s in ran_sites]


def _tree_sites(tree: Path, report: RunReport, notes: list[str], marking: bool = True) -> list[SiteView] | None:
    """The rewritten sites of ``tree`` as verify finds them; None (with a note) when they cannot be
    found here or the tree is not at the report's commit. ``marking``: the page marks the sites that
    ran by them (a report without 'ran'); otherwise they only give each call's extent."""
    if not tree.is_dir():
        return None
    try:
        from rocmport.gitutil import run_git
        from rocmport.port.worktree import read_state
        from rocmport.verify.analyses.port_sites import find_sites

        state = read_state(tree)
        head = run_git("rev-parse", "HEAD", cwd=tree, check=False).stdout.strip()
        if state is None or not state.base:
            if marking:
                notes.append(f"{tree} has no apply state: the sites that ran cannot be found in it")
            return None
        if report.commit and head != report.commit:
            notes.append(
                f"the tree {tree} is at {head[:12]}, the run was at {report.commit[:12]}: "
                + (
                    "the sites that ran are not marked and the source shown is today's"
                    if marking
                    else "the source shown is today's"
                )
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
