"""What changed between two verify reports (a refresh hop's before and after): stages, stage 3's
labels that moved, port sites gained or lost (and the sites that no longer run, with the stages that
ran them), and the loss curves' deltas."""

from __future__ import annotations

from dataclasses import dataclass, field

from rocmport.report.reader import Curve, RunReport


@dataclass
class StageChange:
    name: str
    before: str  # status, or "—" when the report has no such stage
    after: str
    reason_before: str
    reason_after: str

    @property
    def changed(self) -> bool:
        return self.before != self.after


@dataclass
class LabelMove:
    nodeid: str
    before: str  # label, "passed" (no label), or "—" (not in that run)
    after: str


@dataclass
class CodemodChange:
    name: str
    exercised: tuple[int | None, int | None]
    total: tuple[int | None, int | None]
    newly_unreached: dict[str, str]  # site -> why, in the second run and not the first
    no_longer_unreached: dict[str, str]  # site -> why it did not run before (now it ran, or is gone)
    # site -> the stages that ran it in the first run, for each site the second run did not run (now
    # not run, or gone from the tree): the regression to look at first. Empty when a report does not
    # record who ran each site (before the 'ran' key).
    no_longer_ran: dict[str, list[str]] = field(default_factory=dict)
    # site -> (stages before, stages after) for a site both runs ran, by other stages
    stages_moved: dict[str, tuple[list[str], list[str]]] = field(default_factory=dict)


@dataclass
class LossDelta:
    key: str
    title: str
    before: Curve | None
    after: Curve | None
    common_steps: int = 0
    max_abs_delta: float | None = None
    last_delta: float | None = None  # after - before at the last common step


@dataclass
class Comparison:
    before: RunReport
    after: RunReport
    stages: list[StageChange] = field(default_factory=list)
    labels: list[LabelMove] = field(default_factory=list)
    codemods: list[CodemodChange] = field(default_factory=list)
    losses: list[LossDelta] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def compare(before: RunReport, after: RunReport) -> Comparison:
    out = Comparison(before, after)
    names = [s.name for s in before.stages] + [s.name for s in after.stages if before.stage(s.name) is None]
    for name in names:
        a, b = before.stage(name), after.stage(name)
        out.stages.append(
            StageChange(
                name, a.status if a else "—", b.status if b else "—", a.reason if a else "", b.reason if b else ""
            )
        )
    out.labels = _labels(before, after, out.notes)
    out.codemods = _codemods(before, after, out.notes)
    out.losses = _losses(before, after)
    return out


def _state(report: RunReport) -> dict[str, str] | None:
    if report.unit is None:
        return None
    return {t.nodeid: t.label or t.outcome for t in report.unit.tests}


def _labels(before: RunReport, after: RunReport, notes: list[str]) -> list[LabelMove]:
    a, b = _state(before), _state(after)
    if a is None or b is None:
        which = [n for n, s in (("the first", a), ("the second", b)) if s is None]
        notes.append(f"stage 3's labels are not compared: {' and '.join(which)} report has no labelled tests")
        return []
    moves = []
    for nodeid in sorted(set(a) | set(b)):
        if a.get(nodeid) != b.get(nodeid):
            moves.append(LabelMove(nodeid, a.get(nodeid, "—"), b.get(nodeid, "—")))
    return moves


def _codemods(before: RunReport, after: RunReport, notes: list[str]) -> list[CodemodChange]:
    a = {c.name: c for g in before.coverage if g.key == "port_sites" for c in g.codemods}
    b = {c.name: c for g in after.coverage if g.key == "port_sites" for c in g.codemods}
    if not a or not b:
        notes.append("port sites are not compared: a report has no port-site coverage")
        return []
    unrecorded = [
        which for which, group in (("the first", a), ("the second", b)) if any(c.ran is None for c in group.values())
    ]
    if unrecorded:
        notes.append(
            f"which stages ran each site is not compared: {' and '.join(unrecorded)} report does not record it "
            "(an older rocmport, before the 'ran' key)"
        )
    out = []
    for name in list(a) + [n for n in b if n not in a]:
        ca, cb = a.get(name), b.get(name)
        ua, ub = (ca.unreached if ca else {}), (cb.unreached if cb else {})
        change = CodemodChange(
            name,
            (ca.exercised if ca else None, cb.exercised if cb else None),
            (ca.total if ca else None, cb.total if cb else None),
            {k: v for k, v in ub.items() if k not in ua},
            {k: v for k, v in ua.items() if k not in ub},
        )
        if not unrecorded:
            ra, rb = (ca.ran or {}) if ca else {}, (cb.ran or {}) if cb else {}
            change.no_longer_ran = {k: v for k, v in ra.items() if k not in rb}
            change.stages_moved = {k: (v, rb[k]) for k, v in ra.items() if k in rb and rb[k] != v}
        if (
            change.exercised[0] != change.exercised[1]
            or change.total[0] != change.total[1]
            or ua.keys() != ub.keys()
            or change.no_longer_ran
            or change.stages_moved
        ):
            out.append(change)
    return out


def _losses(before: RunReport, after: RunReport) -> list[LossDelta]:
    a = {r.key: r for r in before.training}
    b = {r.key: r for r in after.training}
    out = []
    for key in list(a) + [k for k in b if k not in a]:
        ra, rb = a.get(key), b.get(key)
        ca = ra.curves[0] if ra and ra.curves else None  # the port's own curve is each run's first
        cb = rb.curves[0] if rb and rb.curves else None
        titled = rb or ra
        delta = LossDelta(key, titled.title if titled else key, ca, cb)
        if ca and cb:
            pa, pb = dict(zip(ca.steps, ca.losses)), dict(zip(cb.steps, cb.losses))
            common = sorted(set(pa) & set(pb))
            delta.common_steps = len(common)
            if common:
                delta.max_abs_delta = max(abs(pb[s] - pa[s]) for s in common)
                delta.last_delta = pb[common[-1]] - pa[common[-1]]
        out.append(delta)
    return out
