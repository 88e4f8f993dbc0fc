"""Stage 4's results per GPT case of a line, committed: `patchsets/<upstream>/<line>/case-results.json`,
beside the series and reach.json, so that docs/cases.md (scripts/case_table.py) shows them and its
mirror test regenerates the same page without the reports.

Made from `rocmport verify --json` reports. A `--cases all` sweep runs a few cases per report (each
chunk has the machine to itself), so a record is several reports merged in the order given: a later
report's entry for a case replaces an earlier one's; a committed record is extended the same way, the
new reports merged after its own. A case keeps what the page shows and no more: its
status, its label, the unsupported kind, a one-line reason (cut at REASON_CHARS), its seconds and the
unported tree's status where stage 4 ran it again (a failed case's baseline); no log, loss or command.

The record says what it was made on: the line, the upstream commit (the commit of the line's release
tag, which the page reads the cases at), TE's Python layer and the device kind; and for each report,
in order, when it ran, the port tree's commit, the rocmport commit (given with the report: a report
does not record the code that wrote it) and stage 4's selection. One record is one port's: a report of
another line, TE layer or device kind is refused, one line naming the file, and so is one of another
upstream commit where the report shows it (the commit its failed cases ran the unported tree at: a
report records no upstream commit of its own)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rocmport.errors import BadInput
from rocmport.line_records import FULL_COMMIT, LineRecordFile, opt_str
from rocmport.report import reader
from rocmport.verify.orchestration.device_kind import DeviceKind

# A case's statuses as the JSON spells them (verify's stage_result): the record is read from the JSON alone.
PASS, FAIL, SKIPPED, UNSUPPORTED = "pass", "fail", "skipped", "unsupported-in-proxy"
STATUSES = (PASS, FAIL, UNSUPPORTED, SKIPPED)
# A reason longer than this is cut at a word and ends in '…': the record is a summary, the report has it all.
REASON_CHARS = 160
# The file (rocmport/line_records.py reads and writes it, as it does reach.json): the page names the
# upstream commit it reads the cases at, so the record's is a full one.
RECORD = LineRecordFile(
    "case-results.json",
    "case-results record",
    fix="record the line's reports again (scripts/case_table.py --record) or restore it from git",
    full_commit=True,
)


@dataclass(frozen=True)
class CaseResult:
    """One case as stage 4 ended it: ``report`` is the index, in the record's reports, of the report it came from."""

    status: str
    reason: str
    seconds: float
    report: int
    label: str | None = None  # a failed case's label (port-regression, upstream-known, unverified, ...)
    kind: str | None = None  # an unsupported case's kind (case_plan: gpu-only, not-on-proxy, ...)
    unported: str | None = None  # the unported tree's status, where stage 4 ran the case on it

    @property
    def outcome(self) -> str:
        """The one word the counts use: a failed case's label (`fail` without one), `unsupported`, or the status."""
        if self.status == FAIL:
            return self.label or FAIL
        return "unsupported" if self.status == UNSUPPORTED else self.status

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"status": self.status}
        for key in ("label", "kind"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        out.update(reason=self.reason, seconds=round(self.seconds, 2), report=self.report)
        if self.unported is not None:
            out["unported"] = self.unported
        return out


@dataclass(frozen=True)
class SourceReport:
    """One verify report a record was made from, as given (``file``) and as it says it ran."""

    file: str
    started: str | None
    tree_commit: str | None  # the port tree's commit (the report's ``commit``)
    rocmport: str | None  # the rocmport commit the run used (None: not given)
    selection: str | None  # stage 4's selection: named, all, reach
    cases: int  # how many cases its stage 4 held

    def to_dict(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "started": self.started,
            "tree_commit": self.tree_commit,
            "rocmport": self.rocmport,
            "selection": self.selection,
            "cases": self.cases,
        }


@dataclass
class CaseResults:
    """A line's case-results.json."""

    line: str
    upstream: str
    te: str | None  # TE's Python layer version the runs had (None: Megatron's local layers only)
    device_kind: str
    reports: list[SourceReport] = field(default_factory=list)
    cases: dict[str, CaseResult] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": RECORD.schema,
            "line": self.line,
            "recorded_on": {"upstream": self.upstream, "te": self.te, "device_kind": self.device_kind},
            "reports": [r.to_dict() for r in self.reports],
            "cases": {name: c.to_dict() for name, c in sorted(self.cases.items())},
        }

    def counts(self, names: Sequence[str] | None = None) -> dict[str, int]:
        """Outcome -> cases (among ``names`` when given): pass first, then the most frequent (ties by name)."""
        seen = [c.outcome for n, c in self.cases.items() if names is None or n in names]
        words = sorted(set(seen), key=lambda w: (w != PASS, -seen.count(w), w))
        return {w: seen.count(w) for w in words}

    def rocmport_commits(self) -> dict[str | None, int]:
        """Each rocmport commit the reports ran at -> how many reports, in the order first given."""
        out: dict[str | None, int] = {}
        for r in self.reports:
            out[r.rocmport] = out.get(r.rocmport, 0) + 1
        return out


# --- from verify reports ----------------------------------------------------------------------------


def one_line(text: str, limit: int = REASON_CHARS) -> str:
    """``text`` on one line (whitespace runs made one space), cut at a word to at most ``limit`` characters."""
    flat = " ".join(text.split())
    if len(flat) <= limit:
        return flat
    cut = flat[: limit - 1]
    space = cut.rfind(" ")
    return (cut[:space] if space > limit // 2 else cut).rstrip(" ,;:([") + "…"


def _case_reason(name: str, entry: dict[str, Any]) -> str:
    """What the page says of a case: a failed one's failure message (the cause, without the run's
    summary), or the reason without the case's name that stage 4 puts before it."""
    failure = entry.get("failure")
    if entry.get("status") == FAIL and isinstance(failure, dict) and isinstance(failure.get("message"), str):
        return one_line(failure["message"])
    reason = entry["reason"] if isinstance(entry.get("reason"), str) else ""
    kind = entry.get("kind")
    for prefix in (f"{name} ({kind}): ", f"{name}: "):
        reason = reason.removeprefix(prefix)
    return one_line(reason)


def stage_four_cases(report: reader.RunReport) -> list[dict[str, Any]]:
    """Stage 4's case entries in a report: its ``cases`` list, or the one case a report from before
    that list ran (the stage's own entry); [] when stage 4 did not run a case."""
    stage = next(
        (s for s in report.raw.get("stages") or [] if isinstance(s, dict) and s.get("name") == reader.STAGE_FOUR), None
    )
    if stage is None:
        return []
    cases = stage.get("cases")
    if isinstance(cases, list):
        return [c for c in cases if isinstance(c, dict)]
    return [stage] if isinstance(stage.get("case"), str) and stage.get("status") in (PASS, FAIL) else []


def _case_result(path: Path, entry: dict[str, Any], index: int) -> tuple[str, CaseResult]:
    name, status = entry.get("case"), entry.get("status")
    if not isinstance(name, str) or not name or status not in STATUSES:
        raise BadInput(
            f"{path}: stage 4 holds a case without a name or a status ({str(entry.get('case'))[:60]!r}); "
            "give a report `rocmport verify --json` wrote"
        )
    seconds = entry.get("seconds")
    baseline = entry.get("baseline")
    label, kind = entry.get("label"), entry.get("kind")
    return name, CaseResult(
        status=status,
        reason=_case_reason(name, entry),
        seconds=float(seconds) if isinstance(seconds, (int, float)) and not isinstance(seconds, bool) else 0.0,
        report=index,
        label=label if isinstance(label, str) and label else None,
        kind=kind if status == UNSUPPORTED and isinstance(kind, str) and kind else None,
        unported=baseline["status"] if isinstance(baseline, dict) and isinstance(baseline.get("status"), str) else None,
    )


def _te_version(report: reader.RunReport) -> str | None:
    te = report.raw.get("te")
    return te["version"] if isinstance(te, dict) and isinstance(te.get("version"), str) else None


def from_reports(
    line: str, upstream: str, reports: Sequence[tuple[Path, str | None]], onto: CaseResults | None = None
) -> CaseResults:
    """The record of ``line`` (its cases read at ``upstream``) from ``reports`` (a path and the rocmport
    commit it ran at), merged in order; BadInput, one line naming the file, for a report that is not
    one, has no stage-4 case, or is of another line, TE layer or device kind than the line and the
    reports before it, or whose failed cases ran the unported tree at another commit than ``upstream``.

    ``onto``: a record of ``line`` at ``upstream`` (the caller checks it is) to extend: its reports come
    first, so a report's entry for a case replaces the record's; a new record is returned, ``onto`` is
    left as it was."""
    record: CaseResults | None = None
    if onto is not None:
        record = CaseResults(line, upstream, onto.te, onto.device_kind, list(onto.reports), dict(onto.cases))
    for path, commit in reports:
        report = reader.load(path)
        if report.line != line:
            raise BadInput(
                f"{path}: a report of line {report.line or '(none recorded)'}, not {line}; give {line}'s reports"
            )
        entries = stage_four_cases(report)
        if not entries:
            raise BadInput(
                f"{path}: stage 4 ran no case in this report; give the reports of `verify --stages functional`"
            )
        ran_at = {
            b["commit"]
            for e in entries
            if isinstance(b := e.get("baseline"), dict) and isinstance(b.get("commit"), str)
        }
        if ran_at - {upstream}:
            raise BadInput(
                f"{path}: its cases ran the unported tree at {sorted(ran_at - {upstream})[0][:12]}, and {line}'s "
                f"upstream commit is {upstream[:12]}; give the reports of a port of {line}'s release"
            )
        te = _te_version(report)
        kind = str(DeviceKind.of_parts(report.mode or "", report.env.devices, report.env.hip, te))
        if record is None:
            record = CaseResults(line, upstream, te, kind)
        elif (te, kind) != (record.te, record.device_kind):
            raise BadInput(
                f"{path}: ran with TE {te or 'none'} on {kind}, the reports before it with TE {record.te or 'none'} on "
                f"{record.device_kind}; a record is one TE layer's and one device kind's: record them apart"
            )
        index = len(record.reports)
        functional = report.raw.get("functional")
        selection = functional.get("selection") if isinstance(functional, dict) else None
        record.reports.append(
            SourceReport(
                str(path),
                report.started,
                report.commit,
                commit,
                selection if isinstance(selection, str) else None,
                len(entries),
            )
        )
        record.cases.update(_case_result(path, e, index) for e in entries)
    if record is None:
        raise BadInput(f"no report given for {line}: give --record {line}=REPORT for each report of the sweep")
    return record


# --- the file ------------------------------------------------------------------------------------


def record_path(series_dir: Path) -> Path:
    return RECORD.path(series_dir)


def _source(raw: Any, path: Path, where: str) -> SourceReport:
    if not isinstance(raw, dict) or set(raw) != {"file", "started", "tree_commit", "rocmport", "selection", "cases"}:
        raise RECORD.problem(
            path, f"{where} is not a mapping of file, started, tree_commit, rocmport, selection, cases"
        )
    if not isinstance(raw["file"], str) or not all(opt_str(raw, k) for k in ("started", "tree_commit", "selection")):
        raise RECORD.problem(
            path, f"{where}: file is not a string, or started, tree_commit or selection not a string or null"
        )
    if raw["rocmport"] is not None and not (
        isinstance(raw["rocmport"], str) and FULL_COMMIT.fullmatch(raw["rocmport"])
    ):
        raise RECORD.problem(path, f"{where}.rocmport is not a full commit (40 hex digits) or null")
    if isinstance(raw["cases"], bool) or not isinstance(raw["cases"], int) or raw["cases"] < 1:
        raise RECORD.problem(path, f"{where}.cases is not a number of cases (1 or more)")
    return SourceReport(
        raw["file"], raw["started"], raw["tree_commit"], raw["rocmport"], raw["selection"], raw["cases"]
    )


CASE_KEYS = {"status", "label", "kind", "reason", "seconds", "report", "unported"}


def _case(raw: Any, path: Path, where: str, reports: int) -> CaseResult:
    raw = RECORD.mapping(raw, path, where)
    RECORD.known_keys(raw, CASE_KEYS, path, where)
    if raw.get("status") not in STATUSES:
        raise RECORD.problem(path, f"{where}.status is {raw.get('status')!r}, not one of {', '.join(STATUSES)}")
    if not isinstance(raw.get("reason"), str) or len(raw["reason"]) > REASON_CHARS or "\n" in raw["reason"]:
        raise RECORD.problem(path, f"{where}.reason is not one line of at most {REASON_CHARS} characters")
    seconds = RECORD.seconds(raw.get("seconds"), path, where)
    index = raw.get("report")
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < reports:
        raise RECORD.problem(path, f"{where}.report is not the index of one of its {reports} reports")
    if not all(opt_str(raw, k) for k in ("label", "kind", "unported")):
        raise RECORD.problem(path, f"{where}: label, kind and unported are strings when present")
    return CaseResult(
        raw["status"], raw["reason"], seconds, index, raw.get("label"), raw.get("kind"), raw.get("unported")
    )


def parse_record(data: Any, path: Path) -> CaseResults:
    """A record from its JSON, or BadInput naming ``path`` and the first thing wrong."""
    head = RECORD.header(data, path)
    if not isinstance(head.recorded_on.get("device_kind"), str):
        raise RECORD.problem(path, "recorded_on.device_kind is not a device kind (a string)")
    raw_reports, raw_cases = data.get("reports"), data.get("cases")
    if not isinstance(raw_reports, list) or not raw_reports or not isinstance(raw_cases, dict):
        raise RECORD.problem(path, "reports (a list, not empty) and cases (a mapping) are required")
    reports = [_source(r, path, f"reports[{i}]") for i, r in enumerate(raw_reports)]
    cases = {name: _case(c, path, f"cases[{name[:80]!r}]", len(reports)) for name, c in raw_cases.items()}
    return CaseResults(head.line, head.upstream, head.te, head.recorded_on["device_kind"], reports, cases)


def read_record(series_dir: Path) -> CaseResults | None:
    """The line's record (None: the series has none); a broken one is BadInput naming the file."""
    loaded = RECORD.load(series_dir)
    return None if loaded is None else parse_record(loaded[1], loaded[0])


def write_record(series_dir: Path, record: CaseResults) -> Path:
    return RECORD.write(series_dir, record.to_dict())
