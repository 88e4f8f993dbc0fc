"""Stage 4's typed details of one case (FunctionalRun and its parts: the checkpoint round trip,
the golden comparison, upstream's A100 golden; how it failed, CaseFailure): each to_dict() is what
the report's JSON holds."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class UpstreamGolden:
    """Upstream's DGX A100 golden beside this run (`upstream_golden_a100`): the file, the common steps
    (step, A100's loss, this run's) and a one-line summary of the first and last."""

    path: str
    steps: list[tuple[int, float, float]]
    summary: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "steps": [{"step": k, "a100": a, "here": b} for k, a, b in self.steps],
            "summary": self.summary,
        }


def upstream_golden(cdir: Path, losses: list[float]) -> UpstreamGolden | None:
    """Upstream's DGX A100 `lm loss` values for the case, side by side with this run's at the same
    steps (shown for reference with real data: a different machine, never a pass/fail gate)."""
    path = cdir / "golden_values_dev_dgx_a100.json"
    if not path.is_file():
        return None
    values = {int(k): float(v) for k, v in json.loads(path.read_text()).get("lm loss", {}).get("values", {}).items()}
    steps = [k for k in sorted(values) if k <= len(losses)]
    pairs = [(k, values[k], losses[k - 1]) for k in steps]
    summary = ", ".join(f"step {k}: {a:.4f} vs {b:.4f}" for k, a, b in pairs[:1] + pairs[-1:]) or "no common steps"
    return UpstreamGolden(str(path), pairs, summary)


@dataclass
class ResumeCheck:
    """The checkpoint round trip (`resume` of stage 4): the iteration saved and the one the resumed
    run loaded, the largest loss difference and its bound, whether the save was async, the resumed
    losses; where the log has them, the params norm's largest difference, and the iteration whose
    logged loss averages two (None: absent from the JSON)."""

    from_iteration: int
    loaded_iteration: int | None
    max_abs_diff: float
    tolerance: float
    async_save: bool
    losses: list[float]
    params_norm_max_abs_diff: float | None = None
    averaged_iteration: int | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "from_iteration": self.from_iteration,
            "loaded_iteration": self.loaded_iteration,
            "max_abs_diff": self.max_abs_diff,
            "tolerance": self.tolerance,
            "async_save": self.async_save,
            "losses": self.losses,
        }
        if self.params_norm_max_abs_diff is not None:
            out["params_norm_max_abs_diff"] = self.params_norm_max_abs_diff
        if self.averaged_iteration is not None:
            out["averaged_iteration"] = self.averaged_iteration
        return out


@dataclass
class ResumeSkipped:
    """Why the checkpoint round trip was not checked (`resume` of stage 4)."""

    skipped: str

    def to_dict(self) -> dict[str, Any]:
        return {"skipped": self.skipped}


@dataclass
class GoldenComparison:
    """This device kind's golden against this run (`golden` of stage 4): its path, and either why it
    was not compared (``other_args``: made with other arguments) or the largest relative drift, its
    bound and the golden's simulated ROCm."""

    path: str
    other_args: str | None = None
    max_rel_drift: float | None = None
    tolerance: float | None = None
    hip_sim: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"path": self.path}
        if self.other_args is not None:
            out["other_args"] = self.other_args
        else:
            out.update({"max_rel_drift": self.max_rel_drift, "tolerance": self.tolerance, "hip_sim": self.hip_sim})
        return out


@dataclass
class CudaTwin:
    """An FP8 case's CUDA-path twin (`cuda_twin` of stage 4; case_run._twin): the same ported tree and
    arguments on the CUDA path (no HIP simulation) with NVIDIA's TE layer and ROCm TE's arithmetic deltas
    only, run where the golden cannot decide. ``drift``: its losses against the ROCm run's, largest
    relative difference (None when it did not train: ``reason`` says why)."""

    te: str  # the twin's TE, in words (te_flavour.TEFlavour.describe)
    reason: str
    seconds: float
    losses: list[float] = field(default_factory=list)
    max_rel_drift: float | None = None
    tolerance: float | None = None

    @property
    def matches(self) -> bool:
        return self.max_rel_drift is not None and self.tolerance is not None and self.max_rel_drift <= self.tolerance

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"te": self.te, "reason": self.reason, "seconds": self.seconds, "losses": self.losses}
        if self.max_rel_drift is not None:
            out.update({"max_rel_drift": self.max_rel_drift, "tolerance": self.tolerance, "matches": self.matches})
        return out


@dataclass
class FunctionalRun:
    """Stage 4's details (`functional` of the report, and its stage's own keys): the case and the command
    that ran it, its losses, the proxy's swaps and the arguments verify chose, the log's tail, and what
    was checked: the checkpoint resume, the golden, upstream's A100 golden (each typed; None, and absent
    from the JSON, when not checked)."""

    case: str
    command: str
    losses: list[float]
    iters: int
    proxy_env: dict[str, str] = field(default_factory=dict)
    chosen_args: dict[str, str] = field(default_factory=dict)
    log_tail: list[str] = field(default_factory=list)
    redirects: dict[str, int] | None = None  # CPU proxy only
    resume_log_tail: list[str] | None = None
    resume: ResumeCheck | ResumeSkipped | None = None
    golden: GoldenComparison | None = None
    cuda_twin: CudaTwin | None = None  # an FP8 case under the ROCm flavour whose golden could not decide
    upstream_golden_a100: UpstreamGolden | None = None
    fp8: dict[str, Any] | None = None  # an FP8 case: its plan (case_plan.Fp8Plan) and the casts or the refusal seen
    # a case decided by upstream's AFTER_SCRIPT: whether the exit status decides, the run's exit, each check's result
    upstream_checks: dict[str, Any] | None = None

    def report_entries(self) -> dict[str, Any]:
        return {"functional": self.to_dict()}

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "case": self.case,
            "command": self.command,
            "losses": self.losses,
            "iters": self.iters,
            "proxy_env": self.proxy_env,
            "chosen_args": self.chosen_args,
            "log_tail": self.log_tail,
        }
        if self.redirects is not None:
            out["redirects"] = self.redirects
        if self.resume_log_tail is not None:
            out["resume_log_tail"] = self.resume_log_tail
        if self.fp8 is not None:
            out["fp8"] = self.fp8
        if self.upstream_checks is not None:
            out["upstream_checks"] = self.upstream_checks
        for key, part in (
            ("resume", self.resume),
            ("golden", self.golden),
            ("cuda_twin", self.cuda_twin),
            ("upstream_golden_a100", self.upstream_golden_a100),
        ):
            if part is not None:
                out[key] = part.to_dict()
        return out


@dataclass
class CaseFailure:
    """How a case's run failed, in terms two trees can be compared by: ``phase`` (run: the
    uninterrupted run; resume: the run resumed from its checkpoint; check: a check on their logs),
    ``message`` (the exception, or the checks' problems; tree paths as <tree>, addresses and, for a
    check, its figures as #), ``site`` the innermost traceback frame inside the tree as "path (function)"
    — no line number: the port's codemods move lines — and ``shim`` the innermost frame of the CPU
    proxy's shim (rocmport/verify/runtime/proxy_shim.py) the traceback passed through, if any."""

    phase: str
    message: str
    site: str | None = None
    shim: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"phase": self.phase, "message": self.message}
        out.update({k: v for k, v in (("site", self.site), ("shim", self.shim)) if v is not None})
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CaseFailure:
        return cls(str(d["phase"]), str(d["message"]), d.get("site"), d.get("shim"))
