"""Generate docs/cases.md: upstream's GPT functional cases per release line, as the CPU proxy plans
them (rocmport/verify/stages/case_plan.py), read straight from a Megatron-LM mirror: each line's
counts (runnable, and unsupported by kind) and a case × line table with the plan (layout, ranks,
features) or the unsupported kind and its reason, and stage 4's result per case where the line has
a committed record of them (patchsets/megatron-lm/<line>/case-results.json).

    python scripts/case_table.py --mlm /path/to/Megatron-LM.git            # write docs/cases.md
    python scripts/case_table.py --mlm MIRROR --check                      # exit 1 when it is stale
    python scripts/case_table.py --mlm MIRROR --pin main=COMMIT            # main at a given commit
    python scripts/case_table.py --mlm MIRROR --record v0.16=a.json@COMMIT --record v0.16=b.json@COMMIT
                          # v0.16's record made anew from a sweep's reports, in order; then the page
    python scripts/case_table.py --mlm MIRROR --add v0.19=c.json@COMMIT
                          # v0.19's committed record extended with a later report; then the page

A line's cases are its tag's tests/functional_tests/test_cases/gpt (git archive into a temporary
directory, removed after). `main` is the mirror's main branch: the page records the commit it read,
and the mirror test pins main to that commit, so only the release tags, the planner and the
committed records decide the page.

Results (rocmport/report/case_results.py). Each line's case-results.json is read by default:
the cases it holds show their status (and label) before their plan, and the counts and a section of
the page say what ran, from which run. `--record LINE=REPORT[@COMMIT]` (repeatable) writes LINE's
record anew from `rocmport verify --json` reports (a `--cases all` sweep runs a few cases per report,
so that each chunk has the machine to itself), merged in the order given, a later report's entry for
a case replacing an earlier one's; COMMIT is the rocmport commit the report's run used (a report does
not record it). `--add LINE=REPORT[@COMMIT]` (repeatable) extends LINE's committed record instead, by the same merge:
the reports given are merged after the record's own (a case they hold replaces its entry there), and
each is listed after the record's reports, with its file and commit. A record made at another upstream
commit than the page reads the line at is refused, and so is a report that shows another (its failed
cases' unported runs), as with `--record`; `--add` needs a record to extend and takes a report once (a
file the record lists is refused), and a line is either made anew (`--record`) or extended (`--add`) in
one run.
The page holds upstream's case names and the planner's reasons, no upstream file."""

from __future__ import annotations

import argparse
import re
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
from rocmport.report import case_results as cr  # noqa: E402
from rocmport.report.case_results import FAIL, PASS  # noqa: E402
from rocmport.verify.stages import case_plan as cp  # noqa: E402

DOC = REPO / "docs" / "cases.md"
SERIES = REPO / "patchsets" / "megatron-lm"  # a directory per line: its series, reach.json, case-results.json
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
# The --cases option behind stage 4's selection as a report records it (`functional.selection`).
SELECTED_BY = {"named": "--cases NAME,...", "all": "--cases all", "reach": "--cases reach"}
REGENERATE = "python scripts/case_table.py --mlm MIRROR --record LINE=REPORT@COMMIT ..."
EXTEND = "python scripts/case_table.py --mlm MIRROR --add LINE=REPORT@COMMIT ..."


@dataclass
class Line:
    name: str
    ref: str
    commit: str
    plans: dict[str, cp.Plan]
    results: cr.CaseResults | None = None  # None: the line has no record

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


def result_words(result: cr.CaseResult) -> str:
    return f"**{result.status}**" + (f" ({result.label})" if result.label else "")


def result_cell(result: cr.CaseResult | None) -> str:
    if result is None:
        return ""
    words = result_words(result)
    if result.status not in (PASS, FAIL) and result.reason:
        words += f": {_cell(_head(result.reason))}"
    return words + "<br>"


def _outcomes(line: Line) -> dict[str, int]:
    return line.results.counts(list(line.plans)) if line.results else {}


def result_counts(line: Line) -> str:
    """'35 ran: 24 pass, 6 unverified, ...' over the line's cases its record holds; — without a record."""
    if line.results is None:
        return "—"
    counts = _outcomes(line)
    if not counts:
        return "none of its cases"
    return f"{sum(counts.values())} ran: " + ", ".join(f"{n} {word}" for word, n in counts.items())


def _commits(record: cr.CaseResults) -> str:
    """The rocmport commits the reports ran at, with how many reports when there are several."""
    commits = record.rocmport_commits()
    named = [f"`{c[:12]}`" if c else "a commit not recorded" for c in commits]
    if len(commits) == 1:
        return f"rocmport {named[0]}"
    return "rocmport " + ", ".join(
        f"{name} ({n} report{'s' if n != 1 else ''})" for name, n in zip(named, commits.values())
    )


def _when(record: cr.CaseResults) -> str:
    started = sorted(r.started for r in record.reports if r.started)
    if not started:
        return "at times not recorded"
    first, last = (s.replace("T", " ").removesuffix("Z") for s in (started[0], started[-1]))
    return f"between {first} and {last} UTC" if first != last else f"at {first} UTC"


def results_section(lines: list[Line]) -> list[str]:
    out = [
        "## Verify results",
        "",
        "Stage 4's status per case, from the line's committed record",
        "`patchsets/megatron-lm/<line>/case-results.json` (`rocmport/report/case_results.py`): the",
        "`rocmport verify --json` reports of a sweep of the line's cases, a few cases per report, merged in",
        "order (a later report's entry for a case replaces an earlier one's). They are CPU-proxy results",
        "(simulated HIP, gloo ranks), not a GPU's; a failed case's label says how the unported tree ran it",
        "([stage 4's cases](commands/verify.md#stage-4s-cases)). Regenerate a line's record and this page",
        "with the sweep's reports in order, each with the rocmport commit it ran at, or extend a line's",
        "record with later reports (merged after its own):",
        "",
        f"    {REGENERATE}",
        f"    {EXTEND}",
        "",
    ]
    recorded = [line for line in lines if line.results is not None]
    if not recorded:
        return out + ["No line has a record yet.", ""]
    for line in recorded:
        record = line.results
        assert record is not None
        held = {n: c for n, c in record.cases.items() if n in line.plans}
        trees = sorted({r.tree_commit[:12] for r in record.reports if r.tree_commit})
        options = sorted({f"`{SELECTED_BY.get(r.selection, r.selection)}`" for r in record.reports if r.selection})
        out += [
            f"### {line.name}",
            "",
            f"{len(held)} of its {len(line.plans)} cases ran: "
            + ", ".join(f"{n} {word}" for word, n in _outcomes(line).items())
            + f"; {round(sum(c.seconds for c in held.values()))} s of stage 4 (the port's runs). From "
            + f"{len(record.reports)} report{'s' if len(record.reports) != 1 else ''} of `rocmport verify` "
            + f"({', '.join(options) or 'cases chosen as not recorded'}) started {_when(record)}, at {_commits(record)} on the port "
            + "tree "
            + (", ".join(f"`{t}`" for t in trees) or "(commit not recorded)")
            + f" of upstream `{record.upstream[:12]}`, with TE {record.te or 'none'}"
            + (" (its Python layer)" if record.te else "")
            + f", device kind `{record.device_kind}`.",
            "",
        ]
        others = {n: c for n, c in sorted(held.items()) if c.status != PASS}
        if others:
            out += [
                "The cases that did not pass:",
                "",
                "| case | result | unported tree | seconds | reason |",
                "|---|---|---|---|---|",
                *(
                    f"| `{n}` | {result_words(c)} | {c.unported or '—'} | {c.seconds:.0f} | {_cell(c.reason)} |"
                    for n, c in others.items()
                ),
                "",
            ]
    return out


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
        "one rule, at most 8 ranks) or unsupported, with its kind and the specific reason; and stage 4's",
        "results where the line has a record of them ([Verify results](#verify-results)). Do not edit by",
        "hand: `tests/test_case_table.py` regenerates it from the mirror and the records and compares.",
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
    out += [
        "",
        *results_section(lines),
        "## Cases",
        "",
        "Each cell: the layout on the proxy (`tp`·`pp`·`vp`·`cp`·`ep`·`etp`·`dp`, `+sp` with sequence",
        "parallelism, the ranks it launches), `local` when the case runs Megatron's own layers instead of",
        "Transformer Engine's, then the features it exercises (`upstream-checks`: the case is decided by",
        "upstream's own AFTER_SCRIPT checks of its log, [stage 4](commands/verify.md#upstreams-own-checks-after_script));",
        "or the unsupported kind and the cause, with its full reason under [Reasons](#reasons); `—` where the",
        "line has no such case. A case the line's record holds shows its result first.",
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
    return result_cell((line.results.cases if line.results else {}).get(case)) + plan_cell(
        line.plans.get(case), reasons
    )


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


_AT_COMMIT = re.compile(r"(?P<path>.+)@(?P<commit>[0-9a-fA-F]{7,40})")


def _code_commit(value: str, commit: str, option: str = "--record") -> str:
    """``commit`` as this rocmport checkout names it in full (BadInput naming the option when it has none)."""
    proc = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}"],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise BadInput(
            f"{option} {value}: no commit {commit} in this rocmport checkout ({REPO}); give the commit the run used"
        )
    return proc.stdout.strip()


def _records(
    values: list[str], series_root: Path, option: str = "--record"
) -> dict[str, list[tuple[Path, str | None]]]:
    """Each ``option`` LINE=REPORT[@COMMIT] (--record, --add), by line in the order given, the commit in full."""
    out: dict[str, list[tuple[Path, str | None]]] = {}
    for value in values:
        name, rest = next(iter(_pairs([value], option).items()))
        if not (series_root / name).is_dir():
            raise BadInput(
                f"{option} {value}: {series_root / name} is not a line's series directory; record a release line"
            )
        at = _AT_COMMIT.fullmatch(rest)
        path, commit = (at["path"], _code_commit(value, at["commit"], option)) if at else (rest, None)
        out.setdefault(name, []).append((Path(path), commit))
    return out


Reports = dict[str, list[tuple[Path, str | None]]]  # line -> its reports in order, each with its rocmport commit


def _foreign(path: Path, record: cr.CaseResults, line: Line) -> BadInput:
    return BadInput(
        f"{path}: results of {record.line} at upstream {record.upstream[:12]}, and the page reads {line.name} at "
        f"{line.commit[:12]} ({line.ref}); record the line's reports again (--record {line.name}=REPORT@COMMIT) "
        "or git rm it"
    )


def _extended(series_root: Path, line: Line, reports: list[tuple[Path, str | None]]) -> cr.CaseResults:
    """The line's committed record with ``reports`` merged after its own (BadInput without a record, with
    one of another line or upstream commit than the page's, or a report its reports list already)."""
    record = cr.read_record(series_root / line.name)
    if record is None:
        raise BadInput(
            f"--add {line.name}=...: {cr.record_path(series_root / line.name)} does not exist; make the line's "
            f"record with --record {line.name}=REPORT@COMMIT"
        )
    if (record.line, record.upstream) != (line.name, line.commit):
        raise _foreign(cr.record_path(series_root / line.name), record, line)
    files = [r.file for r in record.reports] + [str(path) for path, _ in reports]
    again = next((f for i, f in enumerate(files) if f in files[:i]), None)
    if again is not None:
        raise BadInput(
            f"--add {line.name}={again}: the report is in the record already, or given twice; add each report once"
        )
    return cr.from_reports(line.name, line.commit, reports, onto=record)


def build(
    mirror: Path, pins: dict[str, str], series_root: Path, records: Reports, adds: Reports | None = None
) -> list[Line]:
    """The lines read from the mirror; the records given written anew and those added to extended, then
    every line's record read back."""
    adds = adds or {}
    both = sorted(set(records) & set(adds))
    if both:
        raise BadInput(
            f"--record {both[0]}=... makes the line's record anew and --add {both[0]}=... extends it: give one "
            "(the reports of a new record all with --record)"
        )
    if not mirror.is_dir() or _git(mirror, "rev-parse", "--git-dir").returncode != 0:
        raise BadInput(f"--mlm {mirror}: not a git directory; give a Megatron-LM mirror (a bare clone)")
    lines = []
    with tempfile.TemporaryDirectory(prefix="rocmport-case-table-") as tmp:
        for name, ref in LINES.items():
            commit = resolve(mirror, pins.get(name, ref))
            where = Path(tmp) / name
            where.mkdir()
            lines.append(Line(name, ref, commit, read_cases(mirror, commit, where)))
    made = {
        line.name: cr.from_reports(line.name, line.commit, records[line.name]) for line in lines if line.name in records
    }
    made.update((line.name, _extended(series_root, line, adds[line.name])) for line in lines if line.name in adds)
    for name, record in made.items():  # every record made before any is written: a bad report writes none
        cr.write_record(series_root / name, record)
    for line in lines:
        line.results = cr.read_record(series_root / line.name) if (series_root / line.name).is_dir() else None
        if line.results is not None and (line.results.line, line.results.upstream) != (line.name, line.commit):
            raise _foreign(cr.record_path(series_root / line.name), line.results, line)
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="case_table.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--mlm", required=True, type=Path, help="a Megatron-LM mirror (bare git directory)")
    p.add_argument("--pin", action="append", default=[], metavar="LINE=COMMIT", help="read LINE at COMMIT")
    p.add_argument(
        "--record",
        action="append",
        default=[],
        metavar="LINE=REPORT[@COMMIT]",
        help="make LINE's case-results.json anew from this verify report and the others given for LINE, in "
        "order (COMMIT: the rocmport commit the run used)",
    )
    p.add_argument(
        "--add",
        action="append",
        default=[],
        metavar="LINE=REPORT[@COMMIT]",
        help="extend LINE's committed case-results.json with this verify report and the others given for LINE, "
        "merged in order after its own (COMMIT: the rocmport commit the run used)",
    )
    p.add_argument(
        "--series-root",
        type=Path,
        default=SERIES,
        help=f"the lines' series directories, where the records are (default {SERIES.relative_to(REPO)})",
    )
    p.add_argument("--out", type=Path, default=DOC, help=f"the page to write (default {DOC.relative_to(REPO)})")
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 when --out differs")
    args = p.parse_args(argv)
    if args.check and (args.record or args.add):
        option = "--record" if args.record else "--add"
        print(f"case_table.py: error: --check writes nothing and {option} writes a record: give one", file=sys.stderr)
        return 2
    try:
        records = _records(args.record, args.series_root)
        adds = _records(args.add, args.series_root, "--add")
        text = render(build(args.mlm, _pairs(args.pin, "--pin"), args.series_root, records, adds))
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
