"""verify's report: a stable JSON schema (VerifyReport.to_dict(), written here: the JSON boundary), JUnit
XML from the typed report, and a text loss plot for the human summary."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rocmport.errors import BadInput
from rocmport.fsutil import atomic_write_text
from rocmport.inputs import read_json
from rocmport.verify.stages.unit_tests.stage import NAME as UNIT_TESTS
from rocmport.verify.stages.gpt_training import StageResult
from rocmport.verify.stages.unit_tests.results import BLOCKING, UnitTestsRun, UnitTestsStopped

if TYPE_CHECKING:
    from rocmport.verify.orchestration.result import VerifyReport

LAST = "last.json"  # the last verify's report, in verify_dir: what `rocmport status` shows

SCHEMA = """\
{mode: "gpu" | "cpu-proxy", backend, world_size, tp, pp, dp, tree, line, commit, started,
 hip_sim: {version, arch, device} | null,
 env: {python, torch, hip, cuda, device_count, devices, launcher_env, firewall_profile},
 launcher: {kind, nnodes, node_rank, rdzv_endpoint},
 stages: [{name, status: pass|fail|skipped|unsupported-in-proxy, reason, seconds, applicable, ...}],
 training: {losses, reference_losses, max_abs_diff, tied_embeddings_equal, redirects},
 functional: {case, losses, resume: {from_iteration, max_abs_diff, ...}, golden, redirects, ...,
              version: 2, selection, selection_note, counts, cases: [{case, status, reason, seconds, losses, ...,
              kind, failure, baseline, label, label_reason}]},
 port_sites: {<codemod>: {exercised, total, rewrites, unreached: {<site>: <reason>}, explanation}}}"""


def write_json(report: dict[str, Any], path) -> None:
    atomic_write_text(path, json.dumps(report, indent=2, sort_keys=True) + "\n")


def verify_dir(project: Path) -> Path:
    """Where every verify run's report goes when no --report is given, and last.json."""
    return Path(project) / "build" / "verify"


def default_path(project: Path, report: VerifyReport) -> Path:
    """build/verify/<line, or the tree's directory name>-<UTC time>.json ("v0.19-20261126T013000Z.json")."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", report.line or Path(report.tree).name) or "tree"
    return verify_dir(project) / f"{name}-{re.sub(r'[^0-9TZ]', '', report.started or '')}.json"


def write_last(project: Path, data: dict[str, Any], written: Path | None) -> Path:
    """last.json: the report's JSON, with where it was written (None: it could not be)."""
    path = verify_dir(project) / LAST
    write_json({**data, "report": str(written) if written else None}, path)
    return path


@dataclass
class LastVerify:
    """What `rocmport status` shows of the last verify run here (last.json, read back): when, the tree
    and its commit, the verdict, the report; or ``error`` when last.json cannot be read."""

    path: str
    started: str | None = None
    tree: str = ""
    line: str | None = None
    commit: str | None = None
    verdict: str | None = None
    failed: list[str] = field(default_factory=list)
    report: str | None = None
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        if self.error is not None:
            return {"error": self.error, "path": self.path}
        return {
            "started": self.started,
            "tree": self.tree,
            "line": self.line,
            "commit": self.commit,
            "verdict": self.verdict,
            "failed": self.failed,
            "report": self.report,
            "path": self.path,
        }


def last_verify(project: Path) -> LastVerify | None:
    """The last verify run here; None when verify has not written one. Whatever last.json holds (a
    hand edit, a truncated write, a hostile file), the answer is a LastVerify: its fields as verify
    wrote them, or ``error`` "<path>: not a verify report (why)"; never an exception."""
    path = verify_dir(project) / LAST
    if not path.is_file():
        return None
    try:
        r = read_json(path, "verify report", fix="the next verify run replaces it", root=project)
        return LastVerify(
            path=str(path),
            started=_field(r, "started"),
            tree=_field(r, "tree", required=True) or "",
            line=_field(r, "line"),
            commit=_field(r, "commit"),
            verdict=_field(r, "verdict"),
            failed=[s["name"] for s in _stages(r) if s["status"] == "fail"],
            report=_field(r, "report"),
        )
    except (BadInput, _NotAReport) as exc:
        why = str(exc).removeprefix(f"{path}: ").removesuffix("; the next verify run replaces it")
        return LastVerify(
            path=str(path),
            error=f"{path}: not a verify report ({why}); the next verify run replaces it",
        )


class _NotAReport(ValueError):
    """last.json's JSON is not what verify writes: the message names the key."""


def _field(r: Any, key: str, required: bool = False) -> str | None:
    if not isinstance(r, dict):
        raise _NotAReport(f"a JSON {type(r).__name__ if r is not None else 'null'}, not an object")
    if key not in r and required:
        raise _NotAReport(f"no {key!r}")
    value = r.get(key)
    if value is not None and not isinstance(value, str):
        raise _NotAReport(f"{key!r} is not a string")
    return value


def _stages(r: dict) -> list[dict[str, str]]:
    stages = r.get("stages")
    if not isinstance(stages, list) or not all(
        isinstance(s, dict) and isinstance(s.get("name"), str) and isinstance(s.get("status"), str) for s in stages
    ):
        raise _NotAReport("'stages' is not a list of {name, status}")
    return stages


def junit_xml(mode: str, stages: Sequence[StageResult]) -> str:
    """A test suite of the stages (one test case each) and, when stage 3 ran, one of upstream's unit
    tests (a test case per test id: a blocking label is a failure, any other label or a skip is
    skipped with the label and its reason)."""
    root = ET.Element("testsuites", name="rocmport.verify")
    suite = ET.SubElement(
        root,
        "testsuite",
        name="rocmport.verify.stages",
        tests=str(len(stages)),
        failures=str(sum(s.status == "fail" for s in stages)),
        skipped=str(sum(s.status in ("skipped", "unsupported-in-proxy") for s in stages)),
    )
    for s in stages:
        case = ET.SubElement(
            suite, "testcase", classname=f"rocmport.verify.{mode}", name=s.name, time=str(round(s.seconds, 2))
        )
        if s.status == "fail":
            ET.SubElement(case, "failure", message=s.reason[:500]).text = s.reason
        elif s.status != "pass":
            ET.SubElement(case, "skipped", message=f"{s.status}: {s.reason}"[:500])
    stage3 = next((s for s in stages if s.name == UNIT_TESTS), None)
    unit = stage3.details if stage3 is not None else None
    if isinstance(unit, UnitTestsStopped) and unit.files:  # pytest produced no results: an empty suite
        unit = UnitTestsRun(tests=unit.tests, files=unit.files)
    if isinstance(unit, UnitTestsRun) and (unit.outcomes or unit.files):
        labels = unit.labels
        # a selected file that did not run (label not-run) is a failing case too: never left out
        outcomes = {**unit.outcomes, **{k: "not-run" for k, v in labels.items() if v == "not-run"}}
        failing = [k for k in outcomes if labels.get(k) in BLOCKING]
        tests = ET.SubElement(
            root,
            "testsuite",
            name="upstream.unit_tests",
            tests=str(len(outcomes)),
            failures=str(len(failing)),
            skipped=str(len(outcomes) - len(failing) - sum(v == "passed" for v in outcomes.values())),
        )
        for nodeid, outcome in sorted(outcomes.items()):
            path, _, name = nodeid.partition("::")
            case = ET.SubElement(
                tests, "testcase", classname=path.removesuffix(".py").replace("/", "."), name=name or path, file=path
            )
            lab, why = labels.get(nodeid), unit.label_reasons.get(nodeid, "")
            failure = unit.failures.get(nodeid, "")
            if lab in BLOCKING:
                ET.SubElement(
                    case, "failure", message=f"{lab}: {why}"[:500], type=lab
                ).text = f"{failure}\nunported tree: {unit.on_baseline.get(nodeid, '')}"
            elif lab:
                ET.SubElement(case, "skipped", message=f"{lab}: {why}"[:500]).text = failure
            elif outcome == "skipped":
                ET.SubElement(case, "skipped", message="skipped by the test")
    _functional_cases_suite(root, stages)
    return ET.tostring(root, encoding="unicode")


def _functional_cases_suite(root: ET.Element, stages: Sequence[StageResult]) -> None:
    """Stage 4's cases, a test case each, when it ran several: a blocking one (a port-regression, or a
    failure nothing labelled) is a failure; a labelled or unsupported one is skipped with why."""
    from rocmport.verify.stages.functional.cases import FunctionalCases

    stage4 = next((s for s in stages if isinstance(s.details, FunctionalCases)), None)
    data = stage4.details if stage4 is not None else None
    if not isinstance(data, FunctionalCases) or len(data.entries) < 2:
        return
    suite = ET.SubElement(
        root,
        "testsuite",
        name="upstream.functional_cases",
        tests=str(len(data.entries)),
        failures=str(sum(e.blocks for e in data.entries)),
        skipped=str(sum(e.status != "pass" and not e.blocks for e in data.entries)),
    )
    for e in data.entries:
        case = ET.SubElement(
            suite, "testcase", classname="upstream.functional_cases", name=e.case, time=str(round(e.seconds, 2))
        )
        if e.blocks:
            ET.SubElement(
                case, "failure", message=f"{e.label or 'fail'}: {e.reason}"[:500], type=e.label or "fail"
            ).text = f"{e.reason}\nunported tree: {e.baseline.status + ': ' + e.baseline.reason if e.baseline else e.label_reason}"
        elif e.status != "pass":
            why = f"{e.label}: {e.label_reason}" if e.label else f"{e.status}: {e.reason}"
            ET.SubElement(case, "skipped", message=why[:500])


def loss_plot(losses: list[float], width: int = 40, height: int = 6) -> str:
    """A small text plot of the loss curve (one column per iteration, resampled to ``width``)."""
    if not losses:
        return ""
    pts = [losses[int(i * len(losses) / min(width, len(losses)))] for i in range(min(width, len(losses)))]
    lo, hi = min(pts), max(pts)
    span = (hi - lo) or 1.0
    rows = []
    for r in range(height, -1, -1):
        level = lo + span * r / height
        rows.append(f"{level:8.3f} |" + "".join("*" if round((p - lo) / span * height) == r else " " for p in pts))
    rows.append(" " * 9 + "+" + "-" * len(pts) + f"  ({len(losses)} iterations)")
    return "\n".join(rows)
