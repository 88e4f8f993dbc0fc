"""verify's report, typed down to the renderers (summary.py, report.py's JUnit, the command's summary):
they read attributes; ``to_dict()`` is the JSON (README: "Report"), written and printed only at the
boundary (`--json`, the report file, last.json). Its keys and shape are held by tests/test_result_shapes.py."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rocmport.machine.probe import Environment
from rocmport.verify.contract import Mode
from rocmport.verify.launcher import Launcher
from rocmport.verify.port_sites import Coverage
from rocmport.verify.bridge_stage import BridgeTraining
from rocmport.verify.functional import FunctionalRun
from rocmport.verify.hip_sim import HipSim
from rocmport.verify.stages import FAIL, StageResult, Training
from rocmport.verify.te_layer import TELayer


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
    training: Training | None = None  # None: stage 2 did not run to losses
    functional: FunctionalRun | None = None  # stage 4's case, losses, resume, golden (also its stage's keys)
    bridge_training: BridgeTraining | None = None
    port_sites: dict[str, Coverage] = field(default_factory=dict)
    bridge_port_sites: dict[str, Coverage] | None = None
    te: TELayer | None = None
    line: str | None = None  # the release line of the series the tree was ported with ("v0.19"), None for another tree
    commit: str | None = None  # the tree's HEAD when verify ran
    started: str = ""  # when verify ran: UTC, ISO 8601 ("2026-11-26T01:30:00Z")

    def stage(self, name: str) -> StageResult | None:
        return next((s for s in self.stages if s.name == name), None)

    @property
    def failed(self) -> list[str]:
        return [s.name for s in self.stages if s.status == FAIL]

    def to_dict(self) -> dict[str, Any]:
        from rocmport.verify import summary

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
            "training": self.training.to_dict() if self.training else {},
            "port_sites": _sites(self.port_sites),
            "te": self.te.to_dict() if self.te else None,
        }
        if self.functional:
            out["functional"] = self.functional.to_dict()
        if self.bridge_training:
            out["bridge_training"] = self.bridge_training.to_dict()
        if self.bridge_port_sites is not None:
            out["bridge_port_sites"] = _sites(self.bridge_port_sites)
        out["verdict"] = summary.verdict(self)  # the summary's first line, for machines and `rocmport status` too
        return out


def _sites(sites: dict[str, Coverage]) -> dict[str, dict[str, Any]]:
    return {name: cov.to_dict() for name, cov in sites.items()}
