"""Stage 2, gpt-training: megatron's schedule/DDP/optimizer via torchrun; the loss falls, tied
embeddings stay equal, and losses match a tp1/pp1 run from the same weights (with --te, a MoE case
too). Also the launch helpers the stages share (launch, took_part, exhausted, _last_error)."""

from __future__ import annotations

import json
import re
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from pathlib import Path

import click

from rocmport import output
from rocmport.verify.runtime import protocol, te_flavour
from rocmport.machine.cpu_meter import task_limit, threads_running
from rocmport.verify.orchestration.launcher import Launcher
from rocmport.verify.orchestration.stage_result import (
    FAIL,
    PASS,
    SKIPPED,
    UNSUPPORTED,
    StageDetails,
    StageResult,
    skipped,
    tree_lacks,
)

from rocmport.verify.orchestration.contract import RunSetup, Stage, StageRun, VerifyContext, VerifyOptions

if TYPE_CHECKING:
    from rocmport.verify.orchestration.te_layer import TELayer

__all__ = [
    "FAIL",
    "PASS",
    "SKIPPED",
    "UNSUPPORTED",
    "StageDetails",
    "StageResult",
    "skipped",
    "tree_lacks",
]  # the stages' shared names, re-exported

NAME = "gpt-training"

# Relative to the loss (times max(1, |loss|)). fp32 on the CPU proxy is not bitwise either: tp2xpp2
# reduces in another order than tp1/pp1, so single iterations differ by a few float32 ulps of the
# loss (measured on the v0.16 port: up to 1.5e-5 at a loss of ~3.7, 3.5e-6 relative, typically 5e-7
# absolute); GPU kernels differ more.
EQUIVALENCE_TOL = {"gloo": 1e-5, "nccl": 1e-3}

# The MoE case of stage 2 with TE: this many experts, top-2, over expert-parallel ranks of this size
# (TE's GroupedLinear for the grouped GEMM). Its router's top-k can flip for a token near a tie
# between layouts, so after the first iteration (same weights, same tokens: as close as the dense
# model) its losses are held to MOE_TOL, relative.
MOE_EXPERTS, MOE_EP = 4, 2
# Stage 2 with an FP8 recipe (verify --fp8-recipe): the tp×pp losses against tp1/pp1's, relative to
# the loss, per recipe. FP8 casts round differently when tensor parallelism splits a tensor, so the
# layouts differ by more than fp32's ulps. Measured on the v0.16 port, TE 2.12.0, tp2xpp2 against
# tp1/pp1 over 10 iterations (first iterations equal): delayed (gfx942, FNUZ) max |Δ| 9.6e-4 at a loss
# of 4.87 (2.0e-4 relative), the CUDA control (OCP) 1.7e-3 (3.4e-4), MXFP8 (gfx950, OCP) 1.4e-3
# (2.9e-4): delayed scaling reduces amaxes over the group and MXFP8's 32-value blocks do not cross a
# shard, so the bound is about 6 times the largest. Tensorwise (current scaling) scales each shard of
# a split weight or gradient by that shard's own amax: 3.2e-2 (6.6e-3 relative), bound 1.5e-2.
FP8_TOL = {"delayed": 2e-3, "mxfp8": 2e-3, "tensorwise": 1.5e-2}
FP8_TOL_OTHER = 1.5e-2


def fp8_tolerance(setting: str) -> float:
    """The relative bound for stage 2's FP8 case ``FORMAT:RECIPE``."""
    return FP8_TOL.get(setting.partition(":")[2] or "delayed", FP8_TOL_OTHER)


MOE_TOL = {"gloo": 1e-2, "nccl": 2e-2}


@dataclass
class MoeRun:
    """Stage 2's MoE case as it ran (`training.moe` of the report): its losses against the tp1/pp1
    reference's, the first iteration's and the largest difference with their bounds, the experts and
    the expert-parallel size, and the torch.cuda calls answered on the CPU."""

    losses: list[float]
    reference_losses: list[float]
    first_abs_diff: float
    max_abs_diff: float
    tolerance: float
    first_tolerance: float
    experts: int = MOE_EXPERTS
    ep: int = MOE_EP
    redirects: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "losses": self.losses,
            "reference_losses": self.reference_losses,
            "first_abs_diff": self.first_abs_diff,
            "max_abs_diff": self.max_abs_diff,
            "tolerance": self.tolerance,
            "first_tolerance": self.first_tolerance,
            "experts": self.experts,
            "ep": self.ep,
            "redirects": self.redirects,
        }


@dataclass
class MoeNotRun:
    """Why stage 2's MoE case did not run, or did not run to the end (`training.moe` of the report)."""

    not_run: str

    def to_dict(self) -> dict[str, Any]:
        return {"not_run": self.not_run}


@dataclass
class Training:
    """Stage 2's losses (`training` of the report): the tp×pp×dp run against the tp1/pp1 reference from
    the same weights, the tolerance they met, the torch.cuda calls answered on the CPU, and the MoE case
    (MoeRun, or MoeNotRun saying why; None without TE)."""

    losses: list[float]
    reference_losses: list[float]
    max_abs_diff: float
    tied_embeddings_equal: bool
    redirects: dict[str, int] = field(default_factory=dict)
    tolerance: float = 0.0
    moe: MoeRun | MoeNotRun | None = None
    fp8_casts: dict[str, int] | None = None  # with --fp8-recipe: the run's FP8 casts by encoding (e4m3fnuz: n)

    def report_entries(self) -> dict[str, Any]:
        return {"training": self.to_dict()}

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "losses": self.losses,
            "reference_losses": self.reference_losses,
            "max_abs_diff": self.max_abs_diff,
            "tied_embeddings_equal": self.tied_embeddings_equal,
            "redirects": self.redirects,
            "tolerance": self.tolerance,
        }
        if self.moe is not None:
            out["moe"] = self.moe.to_dict()
        if self.fp8_casts is not None:
            out["fp8_casts"] = self.fp8_casts
        return out


def moe_applies(tp: int, dp: int, te: TELayer | None, moe: bool = True) -> str | None:
    """Why stage 2's MoE case does not run with these sizes, or None when it does. Experts are whole
    on each rank (expert tp 1), so the expert-parallel ranks come from tp × dp."""
    if te is None:
        return "the MoE case runs with TE (its grouped GEMM is TE's GroupedLinear): pass --te"
    if not moe:
        return "--no-moe"
    if (tp * dp) % MOE_EP:
        return f"expert parallel {MOE_EP} needs tp × dp divisible by {MOE_EP} (tp {tp} × dp {dp})"
    return None


def training_commands(
    launcher: Launcher, tp: int, pp: int, dp: int, iters: int, tmp: Path, te: TELayer | None = None, moe: bool = True
) -> dict[str, list[str]]:
    """Stage 2's launches: the tp1/pp1 reference (here, one process) and the tp×pp×dp run (``te``:
    both with upstream's Transformer Engine layer spec, and, where `moe_applies`, the same pair for a
    MoE model with the grouped GEMM through TE's GroupedLinear at expert parallel MOE_EP)."""
    worker = ["-m", "rocmport.verify.runtime.gpt_worker", "--iters", str(iters), *(["--te"] if te is not None else [])]
    cmds = {
        "reference": launcher.command(
            1,
            [*worker, "--tp", "1", "--pp", "1", "--out", str(tmp / "ref.json"), "--save-init", str(tmp / "init.pt")],
            "gpt-reference",
        ),
        "run": launcher.command(
            tp * pp * dp,
            [
                *worker,
                "--tp",
                str(tp),
                "--pp",
                str(pp),
                "--out",
                str(tmp / "run.json"),
                "--load-init",
                str(tmp / "init.pt"),
            ],
            NAME,
        ),
    }
    if moe_applies(tp, dp, te, moe) is None:
        moe_worker = [*worker, "--moe", str(MOE_EXPERTS)]
        cmds["moe-reference"] = launcher.command(
            1,
            [
                *moe_worker,
                "--tp",
                "1",
                "--pp",
                "1",
                "--out",
                str(tmp / "moe-ref.json"),
                "--save-init",
                str(tmp / "moe-init.pt"),
            ],
            "gpt-moe-reference",
        )
        cmds["moe-run"] = launcher.command(
            tp * pp * dp,
            [
                *moe_worker,
                "--ep",
                str(MOE_EP),
                "--tp",
                str(tp),
                "--pp",
                str(pp),
                "--out",
                str(tmp / "moe-run.json"),
                "--load-init",
                str(tmp / "moe-init.pt"),
            ],
            "gpt-moe-training",
        )
    return cmds


def launch(cmd: list[str], env: dict, cwd: Path, timeout: float = 900) -> subprocess.CompletedProcess:
    """Run one of a stage's launches; once more after a pause when it failed because the machine ran
    out of a resource (threads, memory, file descriptors): a busy machine, not the tree."""
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0 and exhausted(proc.stderr):
        time.sleep(EXHAUSTION_RETRY_AFTER)
        proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    return proc


def took_part(name: str, launcher: Launcher, seconds: float) -> StageResult:
    """A node without global rank 0 of a multi-node run: its processes finished cleanly, the
    numbers are reported by the node that held rank 0."""
    return StageResult(
        name,
        PASS,
        f"node {launcher.node_rank} of {launcher.nnodes} took part and exited 0; "
        "the node that held global rank 0 reports the results",
        seconds,
    )


def unsupported_why(what: str) -> str:
    """A worker's `unsupported` record as a stage reason: te_cpu's refusal names its kernel itself
    ("unsupported-in-proxy: transformer_engine_torch.X ..."); anything else is a proxy-shim hook the tree lacks."""
    return what if what.startswith("unsupported-in-proxy") else f"proxy shim hook missing: {what}"


# An exception's own line in a traceback ("RuntimeError: ...", "torch.OutOfMemoryError: ..."), after
# torchrun's "[rank3]: " prefix: what failed, where a line that merely mentions an error may be the
# source line that raised it ("raise RuntimeError(").
_EXCEPTION_LINE = re.compile(
    r"^(?:\[(?:rank|default)\d*\]:\s*)?((?:[A-Za-z_][\w]*\.)*[A-Za-z_]\w*(?:Error|Exception|Exit)(?::\s.*|$))"
)


def _last_error(proc: subprocess.CompletedProcess) -> str:
    """The first exception a failed launch raised (its type and message), else the first line that
    mentions an error, else its last line."""
    for ln in proc.stderr.splitlines():
        m = _EXCEPTION_LINE.match(ln.strip())
        if m and m.group(1).rstrip(":").strip():
            return m.group(1)[:400]
    lines = [ln for ln in proc.stderr.splitlines() if "Error" in ln or "error" in ln.lower()]
    return (lines[0] if lines else (proc.stderr.strip().splitlines() or ["no output"])[-1])[:400]


# What a process prints when the machine, not the code, ran out of something (threads, processes,
# file descriptors, memory): on a busy machine a run can hit it where the same run passes later.
EXHAUSTION = (
    "Resource temporarily unavailable",
    "can't start new thread",
    "Too many open files",
    "Cannot allocate memory",
    "Cannot fork",  # bash's word for EAGAIN from fork(): the task limit, as a shell in a launch meets it
)
EXHAUSTION_RETRY_AFTER = 20.0  # seconds before the one retry of a launch that ran out of a machine resource


def exhausted(text: str) -> str | None:
    """The resource-exhaustion message in ``text``, if any: the machine's limit, not the tree's bug."""
    return next((m for m in EXHAUSTION if m in text), None)


def _failed(what: str, proc: subprocess.CompletedProcess) -> str:
    """Why a launch failed: its error, or, when the machine ran out of a resource (after a retry), that."""
    m = exhausted(proc.stderr)
    if m:
        threads, limit = threads_running(), task_limit()
        return (
            f"{what} failed twice because this machine ran out of a resource ({m}"
            + (f"; {threads} threads running on it" if threads else "")
            + (f" of its limit of {limit}, kernel.pid_max / kernel.threads-max" if threads and limit else "")
            + "): the machine, not the port; rerun when it is less busy"
        )
    return f"{what} failed: {_last_error(proc)}"


def _pair(
    cmds: dict, key: str, env: dict, tree: Path, tmp: Path, launcher: Launcher, what: str, layout: str
) -> tuple[StageResult | None, dict, dict]:
    """One reference/run pair of stage 2 (``key``: "" for the dense model, "moe-" for the MoE one):
    a StageResult when it did not produce losses to compare, else (None, reference, run)."""
    start = time.monotonic()
    ref = launch(cmds[f"{key}reference"], env, tree)
    ref_file, run_file = tmp / f"{key}ref.json", tmp / f"{key}run.json"
    ref_data = json.loads(ref_file.read_text()) if ref_file.exists() else None
    if ref_data and "unsupported" in ref_data:
        return (
            StageResult(NAME, UNSUPPORTED, what + unsupported_why(ref_data["unsupported"]), time.monotonic() - start),
            {},
            {},
        )
    if ref.returncode != 0 or not ref_data:
        return (
            StageResult(NAME, FAIL, _failed(f"{what}tp1/pp1 reference run", ref), time.monotonic() - start),
            {},
            {},
        )
    run = launch(cmds[f"{key}run"], env, tree)
    data = json.loads(run_file.read_text()) if run_file.exists() else None
    if run.returncode == 0 and not data and launcher.multi_node:
        return took_part(NAME, launcher, time.monotonic() - start), {}, {}
    if data and "unsupported" in data:
        return (
            StageResult(NAME, UNSUPPORTED, what + unsupported_why(data["unsupported"]), time.monotonic() - start),
            {},
            {},
        )
    if run.returncode != 0 or not data:
        return StageResult(NAME, FAIL, _failed(f"{what}{layout} run", run), time.monotonic() - start), {}, {}
    return None, ref_data, data


def stage_training(
    tree: Path,
    env: dict,
    tp: int,
    pp: int,
    dp: int,
    iters: int,
    backend: str,
    launcher: Launcher = Launcher(),
    te: TELayer | None = None,
    moe_case: bool = True,
) -> tuple[StageResult, Training | None]:
    """``te``: the Transformer Engine layer the run uses (None: the local spec);
    ``moe_case``: with TE, the MoE case too (where `moe_applies`); the losses are None when the runs
    did not produce them."""
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="rocmport-verify-") as tmp_dir:
        tmp = Path(tmp_dir)
        cmds = training_commands(launcher, tp, pp, dp, iters, tmp, te=te, moe=moe_case)
        stopped, ref_data, data = _pair(cmds, "", env, tree, tmp, launcher, "", f"tp{tp}/pp{pp}/dp{dp}")
        if stopped:
            return stopped, None
        moe_stopped, moe_ref, moe_data = (
            _pair(
                cmds,
                "moe-",
                env,
                tree,
                tmp,
                launcher,
                f"MoE case ({MOE_EXPERTS} experts, ep{MOE_EP}): ",
                f"tp{tp}/pp{pp}/dp{dp}/ep{MOE_EP}",
            )
            if "moe-run" in cmds
            else (None, {}, {})
        )
    losses, ref_losses = data["losses"], ref_data["losses"]
    diff = (
        max(abs(a - b) for a, b in zip(losses, ref_losses))
        if losses and len(losses) == len(ref_losses)
        else float("inf")
    )
    fp8 = protocol.VERIFY_FP8.read(env)
    bound = fp8_tolerance(fp8) if fp8 else EQUIVALENCE_TOL.get(backend, 1e-3)
    tol = bound * max([1.0, *(abs(x) for x in ref_losses)])
    training = Training(
        losses=losses,
        reference_losses=ref_losses,
        max_abs_diff=diff,
        tied_embeddings_equal=data["tied_embeddings_equal"],
        redirects=data.get("redirects", {}),
        tolerance=tol,
        fp8_casts=data.get("fp8_casts") if fp8 else None,
    )
    problems = []
    if fp8 and te is not None:  # the FP8 that ran is the flavour's (FNUZ on gfx942 under rocm, else OCP)
        wrong = te_flavour.fp8_casts_differ(training.fp8_casts or {}, te.flavour.fp8)
        if wrong:
            problems.append(f"--fp8-recipe {fp8.partition(':')[2]}: {wrong}")
    if not losses or losses[-1] >= losses[0]:
        problems.append(
            f"loss did not decrease ({losses[0]:.4f} -> {losses[-1]:.4f})" if losses else "no losses reported"
        )
    if not data["tied_embeddings_equal"]:
        problems.append(
            f"tied embedding copies differ (start equal: {data['tied_start']}, end equal: {data['tied_end']})"
        )
    if diff > tol:
        problems.append(f"tp{tp}xpp{pp} losses differ from tp1/pp1 by {diff:.3g} > {tol:.2g}")
    moe_phrase = ""
    if moe_data:
        moe, moe_problems = _moe_check(moe_ref["losses"], moe_data["losses"], tol, backend)
        moe.redirects = moe_data.get("redirects", {})
        training.moe = moe
        problems += moe_problems
        moe_phrase = (
            f"; MoE ({MOE_EXPERTS} experts, top-2, grouped GEMM through TE's GroupedLinear, ep{MOE_EP}): loss "
            f"{moe.losses[0]:.4f} -> {moe.losses[-1]:.4f}, first iteration |Δ| {moe.first_abs_diff:.2g}, "
            f"max |Δ| {moe.max_abs_diff:.2g} (≤ {moe.tolerance:.2g})"
        )
    elif te and (moe_why_not := moe_applies(tp, dp, te, moe_case)):
        training.moe = MoeNotRun(moe_why_not)
        moe_phrase = f"; MoE case not run: {moe_why_not}"
    seconds = time.monotonic() - start
    if problems:
        return StageResult(NAME, FAIL, "; ".join(problems), seconds), training
    if moe_stopped:  # the dense model passed; the MoE case did not run to the end: never a pass
        training.moe = MoeNotRun(moe_stopped.reason)
        return StageResult(
            NAME,
            moe_stopped.status,
            f"dense model passed (max |Δ| vs tp1/pp1 {diff:.2g}); {moe_stopped.reason}",
            seconds,
        ), training
    reason = f"loss {losses[0]:.4f} -> {losses[-1]:.4f} in {iters} iterations; max |Δ| vs tp1/pp1 {diff:.2g} (≤ {tol:.2g}); tied embeddings equal"
    if te:
        reason += moe_phrase + f"; {te.describe()}"
    return StageResult(NAME, PASS, reason, seconds), training


def _moe_check(
    ref_losses: list[float], losses: list[float], dense_tol: float, backend: str
) -> tuple[MoeRun, list[str]]:
    """The MoE pair: the loss falls; the first iteration (same weights, same tokens, before any
    routing decision depends on a parallel layout's rounding) within the dense bound; every
    iteration within MOE_TOL of the reference, relative."""
    same = bool(losses) and len(losses) == len(ref_losses)
    diffs = [abs(a - b) for a, b in zip(losses, ref_losses)] if same else []
    tol = MOE_TOL.get(backend, 2e-2) * max([1.0, *(abs(x) for x in ref_losses)])
    first, worst = (diffs[0], max(diffs)) if diffs else (float("inf"), float("inf"))
    moe = MoeRun(
        losses=losses,
        reference_losses=ref_losses,
        first_abs_diff=first,
        max_abs_diff=worst,
        tolerance=tol,
        first_tolerance=dense_tol,
    )
    problems = []
    if not losses or losses[-1] >= losses[0]:
        problems.append(
            f"MoE loss did not decrease ({losses[0]:.4f} -> {losses[-1]:.4f})" if losses else "MoE: no losses reported"
        )
    elif first > dense_tol:
        problems.append(
            f"MoE first iteration differs from tp1/pp1 by {first:.3g} > {dense_tol:.2g} "
            "(expert placement or the all-to-all dispatch, not routing)"
        )
    elif worst > tol:
        problems.append(f"MoE losses differ from tp1/pp1 by {worst:.3g} > {tol:.2g}")
    return moe, problems


@dataclass(frozen=True)
class TrainingOptions:
    """Stage 2's own option: with TE, the MoE case too."""

    moe: bool = True


class TrainingStage(Stage[TrainingOptions]):
    name = NAME
    summary = (
        "megatron's schedule/DDP/optimizer via torchrun; the loss falls, tied embeddings stay equal, and losses "
        "match a tp1/pp1 run from the same weights (with --te, a MoE case too)"
    )
    absent_entries = {"training": {}}  # the report always has it: {} when stage 2 gave no losses
    cli_options = (
        click.Option(
            ["--moe/--no-moe"],
            default=True,
            show_default=True,
            help="With --te: stage 2 also trains a MoE model (4 experts, top-2, TE's GroupedLinear, expert parallel 2) "
            "against its tp1/pp1 run; --no-moe leaves it out (the dense pair alone).",
        ),
    )

    def check(self, given: Mapping[str, Any], setup: RunSetup) -> TrainingOptions:
        return TrainingOptions(moe=bool(given["moe"]))

    def launches(self, opts: VerifyOptions, options: TrainingOptions, tmp: Path) -> list[dict]:
        cmds = training_commands(opts.launcher, opts.tp, opts.pp, opts.dp, opts.iters, tmp, te=opts.te, moe=options.moe)
        return [{"stage": f"{self.name} ({name})", "command": cmd, "cwd": str(opts.tree)} for name, cmd in cmds.items()]

    def run(self, ctx: VerifyContext, options: TrainingOptions) -> StageRun:
        o = ctx.opts
        spec = f"Transformer Engine {o.te.version}" if o.te else "the local layer spec"
        with output.progress(
            f"stage 2: GPT training tp{o.tp}×pp{o.pp}×dp{o.dp} on {ctx.backend} with {spec}, and the tp1/pp1 reference"
        ):
            result, training = stage_training(
                ctx.tree, ctx.env, o.tp, o.pp, o.dp, o.iters, ctx.backend, o.launcher, te=o.te, moe_case=options.moe
            )
        return StageRun(result, training)


STAGE = TrainingStage()
