"""Generate docs/cases.md: upstream's GPT functional cases per release line, as the CPU proxy plans
them (rocmport/verify/stages/case_plan.py), read straight from a Megatron-LM mirror: each line's
counts (runnable, and unsupported by kind) and a case × line table with the plan (layout, ranks,
features) or the unsupported kind and its reason.

    python scripts/case_table.py --mlm /path/to/Megatron-LM.git            # write docs/cases.md
    python scripts/case_table.py --mlm MIRROR --check                      # exit 1 when it is stale
    python scripts/case_table.py --mlm MIRROR --pin main=COMMIT            # main at a given commit
    python scripts/case_table.py --mlm MIRROR --report v0.16=verify.json --out cases.md
                                                                           # with stage 4's results
    python scripts/case_table.py --mlm MIRROR --report v0.16=a.json --report v0.16=b.json
                                                                           # a sweep run in chunks

A line's cases are its tag's tests/functional_tests/test_cases/gpt (git archive into a temporary
directory, removed after). `main` is the mirror's main branch: the page records the commit it read,
and the mirror test pins main to that commit, so only the release tags and the planner decide the
page. With --report LINE=FILE (a `rocmport verify` JSON report) each case that the report's stage 4
ran shows its status (and label) before its plan; a report without per-case data leaves the plan
alone. A line may take several reports (a `--cases all` sweep run a few cases at a time, so that each
chunk has the machine to itself): their cases are merged in the order given, a later report's entry
for a case replacing an earlier one's. The page holds upstream's case names and the planner's reasons, no upstream file."""

from __future__ import annotations

import argparse
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rocmport.errors import BadInput  # noqa: E402
from rocmport.report import reader  # noqa: E402
from rocmport.verify.stages import case_plan as cp  # noqa: E402

DOC = REPO / "docs" / "cases.md"
# Each line's cases are read at its newest final release tag; main at the head of upstream's main.
LINES: dict[str, str] = {
    "v0.15": "core_v0.15.3",
    "v0.16": "core_v0.16.1",
    "v0.17": "core_v0.17.1",
    "v0.18": "core_v0.18.2",
    "v0.19": "core_v0.19.0",
    "main": "main",
}
KINDS: tuple[str, ...] = ("gpu-only", "not-on-proxy", "needs-nvidia-only", "not-training")
STAGE_FOUR = "functional"


@dataclass
class CaseResult:
    """One case as a verify report's stage 4 recorded it."""

    status: str
    label: str | None = None
    reason: str = ""


@dataclass
class Line:
    name: str
    ref: str
    commit: str
    plans: dict[str, cp.Plan]
    results: dict[str, CaseResult] | None = None  # None: no report given for the line
    reports: list[str] = field(default_factory=list)  # the report files the results came from

    @property
    def summary(self) -> cp.PlanSummary:
        return cp.PlanSummary.of(self.plans)


@dataclass
class Reasons:
    """The distinct unsupported reasons, numbered in order of first appearance (R1, R2, ...)."""

    ids: dict[tuple[str, str], str] = field(default_factory=dict)

    def of(self, plan: cp.Unsupported) -> str:
        key = (plan.kind, plan.reason)
        if key not in self.ids:
            self.ids[key] = f"R{len(self.ids) + 1}"
        return self.ids[key]


# --- reading the mirror -------------------------------------------------------------------------


def _git(mirror: Path, *args: str, **kwargs: Any) -> subprocess.CompletedProcess:
    return subprocess.run(["git", f"--git-dir={mirror}", *args], capture_output=True, **kwargs)


def resolve(mirror: Path, ref: str) -> str:
    """The commit ``ref`` names in the mirror (BadInput naming the ref when it has none)."""
    proc = _git(mirror, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}", text=True)
    if proc.returncode != 0:
        raise BadInput(f"--mlm {mirror}: no commit {ref} in the mirror; fetch its tags and main, or --pin the line")
    return proc.stdout.strip()


def read_cases(mirror: Path, commit: str, dest: Path) -> dict[str, cp.Plan]:
    """The GPT cases at ``commit``, archived into ``dest`` and planned (a commit without the folder has none)."""
    archive = dest / "cases.tar"
    with archive.open("wb") as out:
        proc = subprocess.run(
            ["git", f"--git-dir={mirror}", "archive", commit, str(cp.CASES)], stdout=out, stderr=subprocess.PIPE
        )
    if proc.returncode != 0:
        return {}  # the folder does not exist at that commit: no GPT cases
    with tarfile.open(archive) as tar:
        tar.extractall(dest / "tree", filter="data")
    return cp.plan_tree(dest / "tree")


# --- reading stage 4's results --------------------------------------------------------------------


def case_results(report: reader.RunReport) -> dict[str, CaseResult]:
    """Stage 4's cases in a verify report, read defensively: a ``cases`` mapping (name -> entry) or
    list (entries naming their ``case``), or the single ``case`` the stage ran; an entry without a
    status is left out (its cell keeps the plan alone)."""
    stage = next(
        (s for s in report.raw.get("stages") or [] if isinstance(s, dict) and s.get("name") == STAGE_FOUR), None
    )
    if stage is None:
        return {}
    cases = stage.get("cases")
    entries: list[tuple[Any, Any]]
    if isinstance(cases, dict):
        entries = list(cases.items())
    elif isinstance(cases, list):
        entries = [(c.get("case") or c.get("name"), c) for c in cases if isinstance(c, dict)]
    else:
        entries = [(stage.get("case"), stage)]
    out: dict[str, CaseResult] = {}
    for name, entry in entries:
        if not isinstance(name, str) or not name or not isinstance(entry, dict):
            continue
        status, label, reason = entry.get("status"), entry.get("label"), entry.get("reason")
        if not isinstance(status, str) or not status:
            continue
        out[name] = CaseResult(
            status, label if isinstance(label, str) and label else None, reason if isinstance(reason, str) else ""
        )
    return out


def load_report(line: str, path: Path) -> dict[str, CaseResult]:
    report = reader.load(path)
    if line in LINES and line != "main" and report.line in LINES and report.line != line:
        raise BadInput(f"--report {line}={path}: the report is of line {report.line}, not {line}")
    return case_results(report)


def load_reports(line: str, paths: list[str]) -> dict[str, CaseResult]:
    """The cases of ``line``'s reports merged in order: a later report's entry for a case wins."""
    results: dict[str, CaseResult] = {}
    for path in paths:
        results.update(load_report(line, Path(path)))
    return results


# --- the page ---------------------------------------------------------------------------------


def _cell(text: str) -> str:
    """Text safe inside a Markdown table cell."""
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def _head(reason: str) -> str:
    """A reason's cause (the flag, mode or test type it names): its text before the first ': '."""
    return reason.split(": ", 1)[0]


def plan_cell(plan: cp.Plan | None, reasons: Reasons) -> str:
    if plan is None:
        return "—"
    if isinstance(plan, cp.Unsupported):
        return f"{plan.kind}: {_cell(_head(plan.reason))} ({reasons.of(plan)})"
    impl = "" if plan.te else " · local"
    features = ", ".join(f for f in plan.features)
    return f"{plan.layout.describe()}{impl}" + (f" · {features}" if features else "")


def result_cell(result: CaseResult | None) -> str:
    if result is None:
        return ""
    words = f"**{result.status}**" + (f" ({result.label})" if result.label else "")
    if result.status not in ("pass", "fail") and result.reason:
        words += f": {_cell(_head(result.reason))}"
    return words + "<br>"


def result_counts(line: Line) -> str:
    if line.results is None:
        return "—"
    seen = [line.results[c].status for c in line.plans if c in line.results]
    if not seen:
        return "none of its cases"
    return ", ".join(f"{seen.count(s)} {s}" for s in sorted(set(seen)))


def render(lines: list[Line]) -> str:
    reasons = Reasons()
    cases = sorted({c for line in lines for c in line.plans})
    rows = [f"| `{case}` | " + " | ".join(_case_cell(line, case, reasons) for line in lines) + " |" for case in cases]
    out = [
        "# Upstream's GPT cases per line",
        "",
        "Generated by `python scripts/case_table.py --mlm MIRROR` (see its docstring) from each line's own",
        "`tests/functional_tests/test_cases/gpt/*/model_config.yaml`, planned for the CPU proxy by",
        "`rocmport/verify/stages/case_plan.py`: a case is **runnable** (its layout shrunk to proxy sizes by",
        "one rule, at most 8 ranks) or unsupported, with its kind and the specific reason. Do not edit by",
        "hand: `tests/test_case_table.py` regenerates it from the mirror and compares.",
        "",
        "## Counts",
        "",
        "| line | ref | commit | cases | runnable | " + " | ".join(KINDS) + " | verify results |",
        "|---|---|---|---|---|" + "---|" * len(KINDS) + "---|",
    ]
    for line in lines:
        s = line.summary
        counts = " | ".join(str(len(s.unsupported.get(k, []))) for k in KINDS)
        out.append(
            f"| {line.name} | `{line.ref}` | `{line.commit[:12]}` | {len(line.plans)} | {len(s.runnable)} | {counts} "
            f"| {result_counts(line)} |"
        )
    reports = [f"{line.name}: {', '.join(f'`{r}`' for r in line.reports)}" for line in lines if line.reports]
    out += [
        "",
        "Verify results: stage 4's status per case from a `rocmport verify` report, given per line with",
        "`--report LINE=FILE`" + (f" (here: {'; '.join(reports)})." if reports else " (none given for this page)."),
        "",
        "## Cases",
        "",
        "Each cell: the layout on the proxy (`tp`·`pp`·`vp`·`cp`·`ep`·`etp`·`dp`, `+sp` with sequence",
        "parallelism, the ranks it launches), `local` when the case runs Megatron's own layers instead of",
        "Transformer Engine's, then the features it exercises (`upstream-checks`: the case is decided by",
        "upstream's own AFTER_SCRIPT checks of its log, [stage 4](commands/verify.md#upstreams-own-checks-after_script));",
        "or the unsupported kind and the cause, with its full reason under [Reasons](#reasons); `—` where the",
        "line has no such case. A case a report ran shows its status first.",
        "",
        "| case | " + " | ".join(line.name for line in lines) + " |",
        "|---|" + "---|" * len(lines),
        *rows,
        "",
        "## Reasons",
        "",
        "| | kind | reason |",
        "|---|---|---|",
        *(f"| {rid} | {kind} | {_cell(reason)} |" for (kind, reason), rid in reasons.ids.items()),
        "",
    ]
    return "\n".join(out)


def _case_cell(line: Line, case: str, reasons: Reasons) -> str:
    return result_cell((line.results or {}).get(case)) + plan_cell(line.plans.get(case), reasons)


# --- the command ------------------------------------------------------------------------------


def _pairs(values: list[str], option: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for value in values:
        name, sep, rest = value.partition("=")
        if not sep or not name or not rest:
            raise BadInput(f"{option} {value}: give LINE=VALUE, LINE one of {', '.join(LINES)}")
        if name not in LINES:
            raise BadInput(f"{option} {value}: no line {name}; the lines are {', '.join(LINES)}")
        out[name] = rest
    return out


def _report_lists(values: list[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for value in values:
        name, path = next(iter(_pairs([value], "--report").items()))
        out.setdefault(name, []).append(path)
    return out


def build(mirror: Path, pins: dict[str, str], reports: dict[str, list[str]]) -> list[Line]:
    if not mirror.is_dir() or _git(mirror, "rev-parse", "--git-dir").returncode != 0:
        raise BadInput(f"--mlm {mirror}: not a git directory; give a Megatron-LM mirror (a bare clone)")
    lines = []
    with tempfile.TemporaryDirectory(prefix="rocmport-case-table-") as tmp:
        for name, ref in LINES.items():
            commit = resolve(mirror, pins.get(name, ref))
            where = Path(tmp) / name
            where.mkdir()
            lines.append(Line(name, ref, commit, read_cases(mirror, commit, where)))
    for line in lines:
        if line.name in reports:
            line.results, line.reports = load_reports(line.name, reports[line.name]), reports[line.name]
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="case_table.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--mlm", required=True, type=Path, help="a Megatron-LM mirror (bare git directory)")
    p.add_argument("--pin", action="append", default=[], metavar="LINE=COMMIT", help="read LINE at COMMIT")
    p.add_argument(
        "--report",
        action="append",
        default=[],
        metavar="LINE=FILE",
        help="a verify report of LINE (several for one line: merged in order)",
    )
    p.add_argument("--out", type=Path, default=DOC, help=f"the page to write (default {DOC.relative_to(REPO)})")
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 when --out differs")
    args = p.parse_args(argv)
    try:
        text = render(build(args.mlm, _pairs(args.pin, "--pin"), _report_lists(args.report)))
    except BadInput as e:
        print(f"case_table.py: error: {e}", file=sys.stderr)
        return 2
    if args.check:
        current = args.out.read_text(encoding="utf-8") if args.out.is_file() else None
        if current != text:
            print(f"{args.out}: stale; run python scripts/case_table.py --mlm {args.mlm}", file=sys.stderr)
            return 1
        return 0
    args.out.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
