"""verify's report, typed down to the renderers (summary.py, report.py's JUnit, the command's summary):
they read attributes; ``to_dict()`` is the JSON (README: "Report"), written and printed only at the
boundary (`--json`, the report file, last.json). Its keys and shape are held by tests/test_result_shapes.py."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypeVar

from rocmport.machine.probe import Environment
from rocmport.output import plural
from rocmport.verify.analyses.port_sites import Coverage
from rocmport.verify.runtime.hip_sim import HipSim
from rocmport.verify.orchestration.contract import Mode, StageData
from rocmport.verify.orchestration.launcher import Launcher
from rocmport.verify.orchestration import registry
from rocmport.verify.orchestration.stage_result import FAIL, PASS, SKIPPED, UNSUPPORTED, StageResult
from rocmport.verify.orchestration.te_layer import TELayer
from rocmport.verify.stages.unit_tests.results import BLOCKING, UnitTestsRun
from rocmport.verify.stages.unit_tests.stage import NAME as UNIT_TESTS

Data = TypeVar("Data")


@dataclass
class ReportEnv:
    """Where it ran (`env` of the report): the machine probe, the launch profile the processes got, the
    firewall profile, and the line's ROCm components here ({name: {version, status}})."""

    machine: Environment
    launcher_env: dict[str, str] = field(default_factory=dict)
    firewall_profile: str = ""
    components: dict[str, dict[str, str | None]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.machine.to_dict(),
            "launcher_env": self.launcher_env,
            "firewall_profile": self.firewall_profile,
            "components": self.components,
        }


@dataclass
class VerifyReport:
    """verify's report (README: "Report"); ``to_dict()`` is the JSON."""

    mode: Mode
    backend: str
    world_size: int
    tp: int
    pp: int
    dp: int
    tree: str
    hip_sim: HipSim | None
    env: ReportEnv
    launcher: Launcher
    stages: list[StageResult] = field(default_factory=list)
    data: dict[str, StageData] = field(default_factory=dict)  # stage name -> the report data it gave
    port_sites: dict[str, Coverage] = field(default_factory=dict)
    te: TELayer | None = None
    line: str | None = None  # the release line of the series the tree was ported with ("v0.19"), None for another tree
    commit: str | None = None  # the tree's HEAD when verify ran
    started: str = ""  # when verify ran: UTC, ISO 8601 ("2026-11-26T01:30:00Z")

    def stage(self, name: str) -> StageResult | None:
        return next((s for s in self.stages if s.name == name), None)

    def data_of(self, name: str, kind: type[Data]) -> Data | None:
        """Stage ``name``'s report data when it gave data of type ``kind``, else None."""
        data = self.data.get(name)
        return data if isinstance(data, kind) else None

    def unit_run(self) -> UnitTestsRun | None:
        """Stage 3's details when its tests ran on both trees and were labelled; else None."""
        s = self.stage(UNIT_TESTS)
        return s.details if s is not None and isinstance(s.details, UnitTestsRun) else None

    @property
    def failed(self) -> list[str]:
        return [s.name for s in self.stages if s.status == FAIL]

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "mode": self.mode,
            "backend": self.backend,
            "world_size": self.world_size,
            "tp": self.tp,
            "pp": self.pp,
            "dp": self.dp,
            "tree": self.tree,
            "line": self.line,
            "commit": self.commit,
            "started": self.started,
            "hip_sim": self.hip_sim.to_dict() if self.hip_sim else None,
            "env": self.env.to_dict(),
            "launcher": self.launcher.to_dict(),
            "stages": [s.to_dict() for s in self.stages],
            "port_sites": _sites(self.port_sites),
            "te": self.te.to_dict() if self.te else None,
        }
        for (
            stage
        ) in registry.STAGES:  # each stage's own entries ({"training": {...}}), or its entries when it gave none
            data = self.data.get(stage.name)
            out.update(data.report_entries() if data is not None else stage.absent_entries)
        out["verdict"] = verdict(self)  # the summary's first line, for machines and `rocmport status` too
        return out


def _sites(sites: dict[str, Coverage]) -> dict[str, dict[str, Any]]:
    return {name: cov.to_dict() for name, cov in sites.items()}


def _short(reason: str, width: int = 70) -> str:
    """A stage's reason cut to its first clause ("the tree has no tests/unit_tests (a package-index
    source ...)" -> "the tree has no tests/unit_tests")."""
    text = reason.split(";")[0].split(" (")[0].strip()
    return text if len(text) <= width else text[: width - 1] + "…"


def unit_blocking(stage: StageResult) -> dict[str, list[str]]:
    """Stage 3's blocking items by label: test ids (and not-run test files); none before it labelled."""
    labels = stage.details.labels if isinstance(stage.details, UnitTestsRun) else {}
    out: dict[str, list[str]] = {lab: [] for lab in BLOCKING}
    for nodeid, lab in sorted(labels.items()):
        if lab in BLOCKING:
            out[lab].append(nodeid)
    return {lab: ids for lab, ids in out.items() if ids}


def _count(lab: str, n: int) -> str:
    """ "1 unverified test", "2 test files not run"."""
    return plural(n, "test file") + " not run" if lab == "not-run" else plural(n, f"{lab} test")


def verdict(r: VerifyReport) -> str:
    """One line: what this run proved. "v0.19 port (CPU proxy): 3 of 5 stages pass; blocking: unit-tests
    (1 unverified test); not run here: functional (the tree has no pretrain_gpt.py), bridge (--tree given)".
    Stages a package-index tree cannot have are counted apart: "v0.16 port (CPU proxy ...): 3 of 3
    applicable stages pass; not applicable to the package-index source (megatron/core only): unit-tests,
    functional, variants (a git source has what they need: rocmport sync --ref v0.16 --source git)"."""
    stages = r.stages
    who = f"{r.line} port" if r.line else f"tree {r.tree}"
    with_te = (
        f", TE {r.te.version}'s Python layer"
        + (f" (outside the line's range {r.te.outside_range})" if r.te.outside_range else "")
        if r.te
        else ""
    )
    machine = r.env.machine
    mode = (
        f" (CPU proxy{with_te}, not a GPU result)"
        if r.mode == "cpu-proxy"
        # an NVIDIA machine runs the port's CUDA path: its HIP branches did not run
        else f" (NVIDIA GPU, CUDA {machine.cuda}: the port's CUDA path, not a ROCm result)"
        if not machine.hip
        else ""
    )
    applicable = [s for s in stages if s.applicable]
    passed = sum(s.status == PASS for s in applicable)
    counted = "stages" if len(applicable) == len(stages) else "applicable stages"
    parts = [f"{who}{mode}: {passed} of {len(applicable)} {counted} pass"]
    blocking = []
    for s in stages:
        if s.status != FAIL:
            continue
        items = unit_blocking(s) if s.name == UNIT_TESTS else {}
        if items:
            blocking.append(f"{s.name} (" + ", ".join(_count(lab, len(ids)) for lab, ids in items.items()) + ")")
        else:
            blocking.append(f"{s.name} ({_short(s.reason)})")
    if blocking:
        parts.append("blocking: " + ", ".join(blocking))
    unsupported = [f"{s.name} ({_short(s.reason)})" for s in stages if s.status == UNSUPPORTED]
    if unsupported:
        parts.append("unsupported on the CPU proxy: " + ", ".join(unsupported))
    skipped = [f"{s.name} ({_short(s.reason)})" for s in applicable if s.status == SKIPPED]
    if skipped:
        parts.append("not run here: " + ", ".join(skipped))
    lacking = [s.name for s in stages if not s.applicable]
    if lacking:  # what this source cannot show, and how to get it: not a failure, not a stage left out
        ref = r.line or "REF"
        parts.append(
            f"not applicable to the package-index source (megatron/core only): {', '.join(lacking)}"
            # what they lack (tests/unit_tests, pretrain_gpt.py, megatron/training) a git clone has,
            # whichever stages are counted
            f" (a git source has what they need: rocmport sync --ref {ref} --source git)"
        )
    return "; ".join(parts)
