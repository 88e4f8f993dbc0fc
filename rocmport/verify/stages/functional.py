"""verify's functional stage: upstream's own GPT functional case (`tests/functional_tests/test_cases/
gpt/<case>/model_config.yaml`) run with `pretrain_gpt.py` under torchrun, its losses parsed from the
log, compared with this machine's recorded goldens (per port version and device kind), and a
checkpoint round trip: the run saves part way, a second run resumes from that checkpoint and must
log the same losses for the remaining iterations.

In CPU-proxy mode every worker gets the proxy shim (`proxy_shim.install_for_script`): torch.cuda's
answers for a CPU, each counted by its call site, plus the HIP simulation when it is on."""

from __future__ import annotations

import json
import re
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import click

from rocmport import output
from rocmport.errors import BadInput
from rocmport.fsutil import atomic_write_text
from rocmport.verify.stages import case_plan
from rocmport.verify.stages.case_plan import CasePlan
from rocmport.verify.orchestration.launcher import Launcher
from rocmport.machine import probe
from rocmport.verify.runtime import protocol
from rocmport.verify.orchestration import environment
from rocmport.verify.orchestration.contract import NotRequested, RunSetup, Stage, StageRun, VerifyContext, VerifyOptions
from rocmport.verify.orchestration.device_kind import DeviceKind
from rocmport.verify.orchestration.stage_result import (
    FAIL,
    PASS,
    SKIPPED,
    UNSUPPORTED,
    StageResult,
    skipped,
    tree_lacks,
)
from rocmport.verify.stages.gpt_training import took_part

if TYPE_CHECKING:
    from rocmport.verify.orchestration.te_layer import TELayer

NAME = "functional"

CASES = Path("tests/functional_tests/test_cases/gpt")
_LOSS_RE = re.compile(r"iteration\s+(\d+)/\s*\d+ \|.*?lm loss: ([0-9.eE+-]+)")
# The last one: a torch.cuda call the proxy shim has no CPU answer for reaches the CPU build's missing
# CUDA bindings (the shim reports CUDA as initialised, so torch's own "not compiled" check is passed).
_CUDA_BLOCKER = re.compile(
    r"(Megatron requires CUDA|Torch not compiled with CUDA enabled|Found no NVIDIA driver|"
    r"No CUDA GPUs are available|CUDA driver|nvml|module 'torch\._C' has no attribute '_cuda)",
    re.I,
)
_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')
# Data and output locations the case takes from upstream CI's environment.
_DATA_ARGS = (
    "--data-path",
    "--vocab-file",
    "--merge-file",
    "--split",
    "--data-cache-path",
    "--tokenizer-type",
    "--tokenizer-model",
)
# What the proxy changes about training besides the model's size (case_plan.shrink sizes the model,
# keeping the case's parallel layout and pipeline structure).
PROXY_TRAINING = {
    # A few iterations must move the loss: the case warms the learning rate up over 1% of
    # 320000 iterations (about 0 for ten), so on the proxy no warm-up and a small model's rate.
    "--lr": 3e-3,
    "--lr-warmup-iters": 0,
    "--lr-warmup-fraction": None,
    # Data-loader workers are processes, spawned on HIP (dataloader-mp-context), each importing
    # torch and megatron.training: one per rank still proves the spawned worker, and validation,
    # which the case never reaches in a few iterations (--eval-interval 1000), builds no loader.
    "--num-workers": 1,
    "--eval-iters": 0,
}
TOLERANCE = {"cpu-proxy": 1e-4, "gpu": 0.05}
RESUME_TOLERANCE = {True: 1e-5, False: 1e-3}  # proxy (fp32 on the CPU, deterministic) | GPU
# What the proxy changes in the workers' environment besides the shim, with the reason (reported).
PROXY_ENV = {
    "TORCHDYNAMO_DISABLE": (
        "1",
        "torch.compile off: megatron's jit_fuser functions run eagerly (a GPU compiles "
        "them to triton kernels; inductor on the CPU would build C++ ones, minutes per rank)",
    )
}


def default_case(tp: int, pp: int, te_present: bool, tree: Path | None = None) -> str:
    """Upstream's case for this parallelism: its TE case where TE is installed, else the case whose
    CI job uninstalls TE and apex (the one a CPU proxy or a TE-less ROCm image can run). Up to v0.15
    upstream named its merge-request cases by suite and machine (`gpt3_mr_mcore_tp2_pp2_uninstall_te_
    dgx_a100_1N8G`): with ``tree``, that name where the tree has no case by today's name."""
    name = f"gpt3_mcore_te_tp{tp}_pp{pp}" if te_present else f"gpt3_mcore_tp{tp}_pp{pp}_uninstall_te"
    if tree is None or case_dir(tree, name).is_dir():
        return name
    older = sorted(
        p.name for p in (tree / CASES).glob(f"{name.replace('gpt3_mcore_', 'gpt3_mr_mcore_', 1)}_dgx_*") if p.is_dir()
    )
    return next((n for n in older if n.endswith("_dgx_a100_1N8G")), older[0] if older else name)


def case_dir(tree: Path, case: str) -> Path:
    return tree / CASES / case


# A case is one directory under CASES (upstream's are all one level deep); its name also names its
# goldens (<case>.<device kind>.json), so it is a plain file name: no separator, no `..`, no control.
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]{0,199}", re.ASCII)


def check_case(tree: Path, case: str) -> Path:
    """The directory of ``--case`` in ``tree``, or BadInput: not a plain name, or (through a link)
    outside the tree's cases directory. Whether it exists is the caller's question."""
    hint = f"give the name of a directory under {CASES} (e.g. gpt3_mcore_tp2_pp2_uninstall_te)"
    if not _NAME.fullmatch(case):
        raise BadInput(f"--case {case[:200]!r}: not a case name; {hint}")
    root = (tree / CASES).resolve()
    cdir = case_dir(tree, case)
    if not cdir.resolve().is_relative_to(root):
        raise BadInput(f"--case {case!r}: {cdir} leads outside {tree / CASES} (to {cdir.resolve()}); {hint}")
    return cdir


def cases_near(tree: Path) -> list[str]:
    """Some of the tree's GPT cases with a parallel layout in their name, for a hint."""
    return sorted(p.name for p in (tree / CASES).glob("gpt3_*mcore_*") if p.is_dir() and "_tp" in p.name)[:8]


def build_args(
    config: dict,
    *,
    iters: int,
    proxy: bool,
    data_path: str | None,
    work: Path,
    extra: dict[str, object] | None = None,
    plan: CasePlan | None = None,
) -> list[str]:
    """MODEL_ARGS as a command line, with CI's paths replaced, (in proxy mode) the model scaled
    down by the case's plan (``plan``, or the one its MODEL_ARGS give), and ``extra`` on top (a value
    of None drops the flag)."""
    args: dict[str, Any] = dict(config.get("MODEL_ARGS") or {})  # YAML values: str, int, float, bool
    paths = {
        "TENSORBOARD_PATH": work / "tensorboard",
        "CHECKPOINT_SAVE_PATH": work / "ckpt",
        "CHECKPOINT_LOAD_PATH": work / "ckpt",
        "DATA_CACHE_PATH": work / "data-cache",
        "DATA_PATH": Path(data_path) if data_path else work / "data",
    }
    if not data_path:
        for key in _DATA_ARGS:
            args.pop(key, None)
        args.update({"--mock-data": True, "--tokenizer-type": "NullTokenizer", "--vocab-size": 1024})
    args["--train-iters"] = iters
    args["--log-interval"] = 1
    args["--eval-interval"] = max(iters + 1, int(str(args.get("--eval-interval", 1000) or 1000)))
    if proxy:
        if plan is None:
            lay, _ = case_plan.layout(args)
            sized, _ = case_plan.shrink(args, lay)
        args.update(PROXY_TRAINING)
        args.update(plan.args if plan is not None else sized)
        args["--distributed-backend"] = "gloo"
        for key in ("--fp16", "--bf16"):  # no half-precision kernels on the CPU
            args.pop(key, None)
    args.update(extra or {})
    out = []
    for key, value in args.items():
        if value is True:
            out.append(key)
        elif value is False or value is None:
            continue
        else:
            # Megatron's --data-path takes several words (a blend: [weight] prefix ...): split the case's
            # value before the paths go in, so a data root with a space stays one word.
            words = str(value).split() if key == "--data-path" else [str(value)]
            for var, path in paths.items():
                words = [w.replace("${" + var + "}", str(path)) for w in words]
            out += [key, *words]
    return out


# The files a case reads from upstream CI's data root ($DATA_PATH), by flag: a dataset prefix is
# its .bin and .idx.
_DATA_FILES = {
    "--data-path": (".bin", ".idx"),
    "--vocab-file": ("",),
    "--merge-file": ("",),
    "--tokenizer-model": ("",),
}


def missing_data(config: dict, data_root: Path) -> list[str]:
    """The files the case names under ``data_root`` (its ${DATA_PATH}) that are not there."""
    args = config.get("MODEL_ARGS") or {}
    missing = []
    for key, suffixes in _DATA_FILES.items():
        for word in str(args.get(key) or "").split():
            if "${DATA_PATH}" in word:
                path = word.replace("${DATA_PATH}", str(data_root))
                missing += [path + sfx for sfx in suffixes if not Path(path + sfx).is_file()]
    return missing


def loss_steps(log: str) -> dict[int, float]:
    """Megatron's logged `lm loss` by iteration."""
    return {int(it): float(loss) for it, loss in _LOSS_RE.findall(log)}


def parse_losses(log: str) -> list[float]:
    found = loss_steps(log)
    return [found[i] for i in sorted(found)]


_LOADED_RE = re.compile(r"successfully loaded checkpoint from .* at iteration (\d+)")


def loaded_iteration(log: str) -> int | None:
    """The iteration a run says it resumed from (megatron's `successfully loaded checkpoint ... at iteration N`)."""
    m = _LOADED_RE.search(log)
    return int(m.group(1)) if m else None


_PARAMS_NORM_RE = re.compile(r"iteration\s+(\d+)/\s*\d+ \|.*?params norm: ([0-9.eE+-]+)")


def params_norms(log: str) -> dict[int, float]:
    """Megatron's logged `params norm` by iteration (with --log-params-norm)."""
    return {int(it): float(v) for it, v in _PARAMS_NORM_RE.findall(log)}


@dataclass
class ResumeSupport:
    """What the tree's training loop can do for stage 4's checkpoint resume (resume_support)."""

    ckpt_step: bool
    async_save: bool
    async_strategy: bool
    first_two_logged_together: bool


def resume_support(tree: Path) -> ResumeSupport:
    """Whether the tree's training loop can load a chosen checkpoint step (`--ckpt-step`) and save
    asynchronously with a persistent worker (`--async-save --use-persistent-ckpt-worker`), through a
    chosen writer (`--async-strategy`, v0.17+), and
    whether it logs the first two iterations after a start as one interval: its training log keeps
    the first iteration's loss in the running total (`should_reset = not is_first_iteration`), so
    the second logged `lm loss` of any run is the mean of its first two iterations."""
    text = "".join(
        p.read_text(encoding="utf-8", errors="replace") for p in sorted((tree / "megatron" / "training").rglob("*.py"))
    )
    return ResumeSupport(
        ckpt_step="ckpt_step" in text,
        async_save="async_save" in text and "use_persistent_ckpt_worker" in text,
        async_strategy="async_strategy" in text,
        first_two_logged_together="should_reset = not is_first_iteration" in text,
    )


def expected_resumed(steps: dict[int, float], start: int, end: int, first_two_together: bool) -> dict[int, float]:
    """What a run resumed from iteration ``start`` must log for start+1..end, from the uninterrupted
    run's losses ``steps``: the same values, except that a training loop which logs the first two
    iterations after a start as one interval logs the mean of start+1 and start+2 at start+2."""
    out = {i: steps[i] for i in range(start + 1, end + 1) if i in steps}
    if first_two_together and start + 2 in out:
        out[start + 2] = (steps[start + 1] + steps[start + 2]) / 2
    return out


# Flags that choose how a checkpoint is written, not what is trained: a golden's args leave them out.
_WRITER_FLAGS = ("--async-strategy",)


def recorded_args(args: list[str], work: Path) -> list[str]:
    """The args as a golden records them: this run's temporary directory as ${WORK}, without the
    checkpoint writer's choice (_WRITER_FLAGS: verify picks one on the CUDA path, the port on HIP)."""
    out: list[str] = []
    for i, a in enumerate(args):
        if a in _WRITER_FLAGS or (i and args[i - 1] in _WRITER_FLAGS):
            continue
        out.append(a.replace(str(work), "${WORK}"))
    return out


def nvrx_usable(env: dict) -> bool:
    """Whether the run's processes can import nvidia-resiliency-ext (not behind the firewall, installed)."""
    import importlib.util

    return (
        "nvidia_resiliency_ext" not in (protocol.FIREWALL.read(env) or ())
        and importlib.util.find_spec("nvidia_resiliency_ext") is not None
    )


def _args_difference(a: list[str], b: list[str]) -> str:
    def pairs(args):
        out, key = {}, None
        for tok in args:
            if tok.startswith("--"):
                key = tok
                out[key] = True
            elif key:
                out[key] = tok
        return out

    pa, pb = pairs(a), pairs(b)
    diff = [
        f"{k} {pa.get(k, '(absent)')} vs {pb.get(k, '(absent)')}"
        for k in sorted(set(pa) | set(pb))
        if pa.get(k) != pb.get(k)
    ]
    return "; ".join(diff[:4]) + (f" (+{len(diff) - 4} more)" if len(diff) > 4 else "")


def golden_path(series_dir: Path, case: str, device_kind: str) -> Path:
    """Where the golden of ``case`` for ``device_kind`` lives: always a file directly in the series' goldens/."""
    # A device kind is lower-case letters, digits, '-', '.' and '+' (`cpu-proxy-te2.12.0`, `rocm-amd-instinct-mi300x`):
    # never a separator, so the golden stays a file directly in goldens/.
    if not _NAME.fullmatch(case) or not re.fullmatch(r"[a-z0-9][a-z0-9.+-]{0,99}", device_kind, re.ASCII):
        raise BadInput(
            f"golden for case {case[:80]!r} and device kind {device_kind[:80]!r}: not plain names; "
            f"a golden is a file in {series_dir / 'goldens'}"
        )
    return series_dir / "goldens" / f"{case}.{device_kind}.json"


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


def _blocker(stderr: str, tree: Path) -> str | None:
    """The first CUDA-only requirement that stopped upstream's script on CPU, with its upstream site
    (the innermost traceback frame inside the tree, e.g. megatron/training/initialize.py:62)."""
    lines = stderr.splitlines()
    root = str(tree.resolve()) + "/"
    for i, line in enumerate(lines):
        if not _CUDA_BLOCKER.search(line) or line.lstrip().startswith(("raise ", "assert ")):
            continue
        site = ""
        for prev in reversed(lines[:i]):
            m = _FRAME.search(prev)
            if m and m.group(1).startswith(root):
                site = f" at {m.group(1)[len(root) :]}:{m.group(2)} ({m.group(3)})"
                break
        return line.strip()[:200] + site
    return None


def world_size(config: dict, dp: int, plan: CasePlan | None) -> int:
    """The ranks a case runs on: its plan's on the proxy (the layout the case needs: cp, the data-
    parallel ranks it shards over), tp·pp·dp (verify's --dp) on a GPU."""
    if plan is not None:
        return plan.layout.world
    margs = config.get("MODEL_ARGS") or {}
    return int(margs.get("--tensor-model-parallel-size", 1)) * int(margs.get("--pipeline-model-parallel-size", 1)) * dp


def functional_command(launcher: Launcher, world: int, args: list[str]) -> list[str]:
    return launcher.command(world, ["pretrain_gpt.py", *args], NAME)


def load_case(tree: Path, case: str) -> dict:
    return case_plan.load_config(tree, case)


# megatron's training log: " [2026-11-26 01:30:00] iteration        5/      10 | consumed samples: ..."
_ITERATION = re.compile(r"\biteration\s+(\d+)/\s*(\d+)\s*\|")


def _launch(
    cmd: list[str], tree: Path, env: dict, timeout: float = 1800, what: str = "pretrain_gpt.py"
) -> subprocess.CompletedProcess:
    """subprocess.run(capture_output=True) that says each training iteration as megatron logs it
    (a line per iteration with the elapsed time: a run of minutes is not silent)."""
    import threading

    start = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=tree, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    err: list[str] = []
    reader = threading.Thread(target=lambda: err.append(proc.stderr.read() if proc.stderr else ""), daemon=True)
    reader.start()
    expired = threading.Event()

    def stop() -> None:  # the run's time limit
        expired.set()
        proc.kill()

    timer = threading.Timer(timeout, stop)
    timer.start()
    out: list[str] = []
    try:
        for line in proc.stdout or ():
            out.append(line)
            m = _ITERATION.search(line)
            if m:
                output.info(
                    f"stage 4 {what}: iteration {m.group(1)}/{m.group(2)}, {output.elapsed(time.monotonic() - start)} elapsed"
                )
        proc.wait()
    finally:
        timer.cancel()
        reader.join()
    if expired.is_set():
        raise subprocess.TimeoutExpired(cmd, timeout, "".join(out), "".join(err))
    return subprocess.CompletedProcess(cmd, proc.returncode, "".join(out), "".join(err))


# A traceback's last line: the exception's type and message, as a rank prints it ("[rank0]: ValueError: ...").
_EXCEPTION = re.compile(r"^(?:\[rank\d+\]:\s*)?((?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Interrupt)\b:?.*)$")


def exception_line(stderr: str) -> str | None:
    """The first exception a run raised (its type and message), not a traceback's source line such as
    `raise ValueError(`: torchrun's own ChildFailedError and its elastic frames are skipped."""
    for line in stderr.splitlines():
        m = _EXCEPTION.match(line.strip())
        if m and "ChildFailedError" not in m.group(1) and "elastic" not in m.group(1):
            return m.group(1)
    return None


def _failure(
    proc: subprocess.CompletedProcess,
    tree: Path,
    proxy: bool,
    hip: str | None,
    what: str,
    seconds: float,
    details: FunctionalRun,
) -> StageResult:
    """Why a run of pretrain_gpt.py did not log every iteration: a CPU blocker or a break the HIP
    simulation made (unsupported-in-proxy, naming the site), else a failure."""
    blocker = _blocker(proc.stderr, tree) if proxy else None
    te_kernel = re.search(r"unsupported-in-proxy: transformer_engine_torch\.\w+[^\n]*", proc.stderr) if proxy else None
    if te_kernel:  # TE's Python layer reached a kernel the CPU proxy has no reference implementation for (verify --te)
        return StageResult(
            NAME, UNSUPPORTED, f"pretrain_gpt.py with TE's Python layer: {te_kernel.group(0)}", seconds, details
        )
    if blocker:
        return StageResult(NAME, UNSUPPORTED, f"pretrain_gpt.py cannot run on CPU: {blocker}", seconds, details)
    if proxy and hip:
        from rocmport.verify.runtime.hip_sim import simulation_break

        site = simulation_break(proc.stderr, tree)
        if site:
            return StageResult(
                NAME,
                UNSUPPORTED,
                f"the HIP simulation breaks {site} (a ROCm build of torch would not)",
                seconds,
                details,
            )
    tail = [exception_line(proc.stderr) or (proc.stderr.strip().splitlines() or ["no output"])[-1]]
    return StageResult(NAME, FAIL, f"{what} exited {proc.returncode}: {tail[0][:300]}", seconds, details)


def _fp8_refusal(
    fp8: case_plan.Fp8Plan,
    proc: subprocess.CompletedProcess,
    case: str,
    losses: list[float],
    seconds: float,
    details: FunctionalRun,
) -> StageResult:
    """An FP8 case whose recipe the simulated GPU cannot run: the port's argument validation must refuse
    it, naming the arch and the recipe, before any iteration (that is the check passing); a run that
    trains, or stops anywhere else (a TE assert, a kernel), fails the stage."""
    said = case_plan.refusal_in(fp8, proc.stderr)
    if proc.returncode != 0 and said and not losses:
        if details.fp8 is not None:
            details.fp8["refused"] = said
        return StageResult(
            NAME,
            PASS,
            f"{case}: refused in argument validation as planned ({fp8.recipe} on {fp8.device}, the port's "
            f"fp8-arch-check): {said}",
            seconds,
            details,
        )
    got = (
        f"it trained ({len(losses)} iterations logged)"
        if proc.returncode == 0 or losses
        else f"it stopped elsewhere: {(exception_line(proc.stderr) or f'exit {proc.returncode}')[:300]}"
    )
    return StageResult(
        NAME,
        FAIL,
        f"{case}: {fp8.device} cannot run the {fp8.recipe} recipe, so argument validation must refuse it "
        f"('{fp8.refusal} ...'); {got}",
        seconds,
        details,
    )


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
    upstream_golden_a100: UpstreamGolden | None = None
    fp8: dict[str, Any] | None = None  # an FP8 case: its plan (case_plan.Fp8Plan) and the casts or the refusal seen

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
        for key, part in (
            ("resume", self.resume),
            ("golden", self.golden),
            ("upstream_golden_a100", self.upstream_golden_a100),
        ):
            if part is not None:
                out[key] = part.to_dict()
        return out


def stage_functional(
    tree: Path,
    env: dict,
    *,
    case: str,
    dp: int,
    iters: int,
    proxy: bool,
    data_path: str | None,
    series_dir: Path | None,
    record: bool,
    device_kind: DeviceKind,
    defaulted: bool = False,
    launcher: Launcher = Launcher(),
    resume: bool = True,
    hip: str | None = None,
    rocm: bool = False,
    te: case_plan.ProxyTE | None = None,
) -> tuple[StageResult, FunctionalRun | None]:
    """Upstream's case through pretrain_gpt.py: the uninterrupted run saves a checkpoint at
    iteration iters // 2; with ``resume``, a second run loads it and must log the same losses for
    the remaining iterations. ``hip``: the simulated ROCm version (proxy), for the report;
    ``rocm``: the runs see HIP (a ROCm GPU or the simulation), where the port picks the async writer."""
    start = time.monotonic()
    cdir = check_case(tree, case)
    if series_dir is not None:  # a golden that cannot be named is bad input now, not after minutes of training
        golden_path(series_dir, case, str(device_kind))
    if not (tree / "pretrain_gpt.py").is_file():
        return skipped(NAME, tree_lacks("pretrain_gpt.py")), None
    if not (cdir / "model_config.yaml").is_file():
        text = f"upstream has no functional case {case} ({CASES / case}); pass --case NAME (e.g. {', '.join(cases_near(tree))})"
        return StageResult(NAME, SKIPPED if defaulted else FAIL, text), None
    config = load_case(tree, case)
    plan: CasePlan | None = None
    if proxy:
        planned = case_plan.plan_case(case, config, data_path=bool(data_path), te=te)
        if isinstance(planned, case_plan.Unsupported):
            return StageResult(NAME, UNSUPPORTED, f"{case} ({planned.kind}): {planned.reason}"), None
        plan = planned
    world = world_size(config, dp, plan)
    support = resume_support(tree)
    half = iters // 2
    with tempfile.TemporaryDirectory(prefix="rocmport-func-") as tmp:
        work = Path(tmp)
        save = {"--save": str(work / "ckpt"), "--load": str(work / "ckpt"), "--save-interval": half}
        chosen: dict[str, str] = {}
        if support.async_save:
            save.update({"--async-save": True, "--use-persistent-ckpt-worker": True})
            if support.async_strategy and not rocm and not nvrx_usable(env):
                # Upstream's default writer (nvrx) is nvidia-resiliency-ext's: on HIP the port switches to mcore by itself
                # (async-save-strategy), the CUDA path keeps upstream's default, which needs the package.
                save["--async-strategy"] = "mcore"
                chosen["--async-strategy mcore"] = (
                    "nvidia-resiliency-ext (upstream's default async writer, nvrx) is NVIDIA-only "
                    "and not importable here; on HIP the port picks mcore itself"
                )
        args = build_args(config, iters=iters, proxy=proxy, data_path=data_path, work=work, extra=save, plan=plan)
        run_env = {**env, **{k: str(v) for k, v in (config.get("ENV_VARS") or {}).items()}}
        swaps = {}
        if proxy:
            (work / "shim").mkdir()
            run_env.update({**protocol.SHIM_WORKERS.entry(True), **protocol.SHIM_OUT.entry(str(work / "shim"))})
            run_env.update({k: v for k, (v, _) in PROXY_ENV.items()})
            run_env.update(dict(plan.fp8.env) if plan and plan.fp8 else {})  # the CUDA control's simulated H100
            swaps = {f"{k}={v}": why for k, (v, why) in PROXY_ENV.items()}
        cmd = functional_command(launcher, world, args)
        proc = _launch(cmd, tree, run_env)
        steps = loss_steps(proc.stdout + proc.stderr)
        losses = [steps[i] for i in sorted(steps)]
        if proc.returncode == 0 and not losses and launcher.multi_node:
            return took_part(NAME, launcher, time.monotonic() - start), None
        run = FunctionalRun(
            case=case,
            command=" ".join(cmd),
            losses=losses,
            iters=iters,
            proxy_env=swaps,
            chosen_args=chosen,
            log_tail=[ln for ln in proc.stderr.splitlines() if "rank0" in ln or "Error" in ln][-15:],
        )
        if proxy:
            from rocmport.verify.runtime.proxy_shim import read_redirects

            run.redirects = read_redirects(work / "shim")
        hook = work / "shim" / "unsupported.txt"
        if proxy and hook.is_file():
            return StageResult(
                NAME,
                UNSUPPORTED,
                f"proxy shim hook missing: {hook.read_text()}",
                time.monotonic() - start,
                run,
            ), run
        if plan is not None and plan.fp8 is not None:
            run.fp8 = plan.fp8.to_dict()
            if plan.fp8.refusal:
                return _fp8_refusal(plan.fp8, proc, case, losses, time.monotonic() - start, run), run
            from rocmport.verify.runtime.proxy_shim import read_fp8_casts

            run.fp8["casts"] = read_fp8_casts(work / "shim")  # the first run's alone: the resumed run adds its own
        if proc.returncode != 0 or len(losses) < iters:
            what = f"pretrain_gpt.py (after {len(losses)} of {iters} iterations)"
            res = _failure(proc, tree, proxy, hip, what, time.monotonic() - start, run)
            return res, run
        reason = f"{case}: lm loss {losses[0]:.4f} -> {losses[-1]:.4f} in {iters} iterations"
        problems = []
        if losses[-1] >= losses[0]:
            problems.append(f"loss did not fall ({losses[0]:.4f} -> {losses[-1]:.4f})")
        if plan is not None and plan.fp8 is not None and run.fp8 is not None:
            from rocmport.verify.runtime.te_flavour import fp8_casts_differ

            wrong = fp8_casts_differ(run.fp8["casts"], plan.fp8.encoding)
            problems += [f"{plan.fp8.describe()}: {wrong}"] if wrong else []
            casts = ", ".join(f"{k} ×{v}" for k, v in sorted(run.fp8["casts"].items()))
            reason += f"; {plan.fp8.describe()} ({casts or 'none'})"
        if resume and half >= 1 and support.ckpt_step:
            again = {
                **save,
                "--ckpt-step": half,
                "--save": str(work / "ckpt-resumed"),
                "--async-save": None,
                "--use-persistent-ckpt-worker": None,
            }
            rargs = build_args(config, iters=iters, proxy=proxy, data_path=data_path, work=work, extra=again, plan=plan)
            rproc = _launch(
                functional_command(launcher, world, rargs), tree, run_env, what=f"resumed from iteration {half}"
            )
            rlog = rproc.stdout + rproc.stderr
            rsteps = loss_steps(rlog)
            wanted = list(range(half + 1, iters + 1))
            run.resume_log_tail = [ln for ln in rproc.stderr.splitlines() if "rank0" in ln or "Error" in ln][-15:]
            if rproc.returncode != 0 or any(i not in rsteps for i in wanted):
                return _failure(
                    rproc,
                    tree,
                    proxy,
                    hip,
                    f"the run resumed from iteration {half}",
                    time.monotonic() - start,
                    run,
                ), run
            expected = expected_resumed(steps, half, iters, support.first_two_logged_together)
            diff = max(abs(rsteps[i] - expected[i]) for i in wanted)
            norms, rnorms = params_norms(proc.stdout + proc.stderr), params_norms(rlog)
            norm_diff = max((abs(rnorms[i] - norms[i]) for i in wanted if i in norms and i in rnorms), default=None)
            tol = RESUME_TOLERANCE[proxy]
            run.resume = resumed = ResumeCheck(
                from_iteration=half,
                loaded_iteration=loaded_iteration(rlog),
                max_abs_diff=diff,
                tolerance=tol,
                async_save=support.async_save,
                losses=[rsteps[i] for i in wanted],
                params_norm_max_abs_diff=norm_diff,
                averaged_iteration=half + 2 if support.first_two_logged_together and half + 2 <= iters else None,
            )
            reason += (
                f"; resumed from the iteration-{half} checkpoint ({'async ' if support.async_save else ''}torch_dist): "
                f"max |Δ| {diff:.2g} over iterations {half + 1}-{iters} (≤ {tol:g})"
            )
            if norm_diff is not None:
                reason += f", params norm max |Δ| {norm_diff:.2g}"
                if norm_diff > tol:
                    problems.append(
                        f"resumed parameters differ from the uninterrupted run's (params norm |Δ| {norm_diff:.3g} > {tol:g})"
                    )
            if resumed.loaded_iteration != half:
                problems.append(f"the resumed run did not load iteration {half} (it says {resumed.loaded_iteration})")
            if diff > tol:
                problems.append(f"resumed losses differ from the uninterrupted run's by {diff:.3g} > {tol:g}")
        elif resume:
            why = "fewer than 2 iterations" if half < 1 else "the tree's training loop has no --ckpt-step"
            run.resume = ResumeSkipped(why)
            reason += f"; checkpoint resume not checked ({why})"
        recorded = recorded_args(args, work)
    seconds = time.monotonic() - start
    status = FAIL if problems else PASS
    if series_dir is not None:
        golden = golden_path(series_dir, case, str(device_kind))
        if (
            record and problems
        ):  # a golden is what a passing run logged: a failed run's curve would excuse the failure next time
            reason += f"; golden not recorded: the run failed ({golden} unchanged)"
        elif record:
            atomic_write_text(
                golden,
                json.dumps(
                    {
                        "case": case,
                        "device_kind": str(device_kind),
                        "iters": iters,
                        "losses": losses,
                        "hip_sim": hip,
                        "args": recorded,
                    },
                    indent=1,
                )
                + "\n",
            )
            reason += f"; golden recorded in {golden}"
        elif golden.is_file():
            ref = json.loads(golden.read_text())
            compared = run.golden = GoldenComparison(str(golden))
            if ref.get("args") != recorded:
                why = (
                    _args_difference(recorded, ref["args"])
                    if ref.get("args")
                    else "the golden records no args; re-record it"
                )
                compared.other_args = why
                reason += f"; golden made with other args, not compared ({why})"
            else:
                n = min(len(ref["losses"]), len(losses))
                drift = (
                    max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(losses[:n], ref["losses"][:n]))
                    if n
                    else float("inf")
                )
                tol = TOLERANCE["cpu-proxy" if device_kind.proxy else "gpu"]  # with TE's layer or not
                compared.max_rel_drift, compared.tolerance, compared.hip_sim = drift, tol, ref.get("hip_sim")
                reason += f"; max relative drift vs golden {drift:.2g} (≤ {tol:g})"
                if drift > tol:
                    problems.append(f"losses drift from the golden by {drift:.3g} > {tol:g} ({golden})")
                    status = FAIL
        else:
            reason += "; no golden for this device kind yet (--record-golden)"
    if data_path:
        reference = upstream_golden(cdir, losses)
        if reference:
            run.upstream_golden_a100 = reference
            reason += f"; upstream's A100 golden (reference only): {reference.summary}"
    if problems:
        reason = "; ".join(problems) + f" [{reason}]"
    return StageResult(NAME, status, reason, seconds, run), run


@dataclass(frozen=True)
class FunctionalOptions:
    """Stage 4: upstream's functional GPT case through pretrain_gpt.py."""

    case: str
    iters: int
    defaulted: bool = True
    data_path: str | None = None
    record: bool = False
    series_dir: Path | None = None
    resume: bool = True


CLI_OPTIONS = (
    click.Option(
        ["--functional/--no-functional", "with_functional"],
        default=None,
        help="Stage 4, upstream's functional GPT case with pretrain_gpt.py (default: when the tree has pretrain_gpt.py).",
    ),
    click.Option(
        ["--case"],
        default=None,
        metavar="NAME",
        help="Functional case: a directory name under tests/functional_tests/test_cases/gpt (default: by tp/pp, and the TE "
        "case where doctor finds TE usable).",
    ),
    click.Option(
        ["--data-path"],
        default=None,
        metavar="DIR",
        help="Real data for the functional case: upstream CI's data root ($DATA_PATH), under which the case names its "
        "dataset and tokenizer files (default: mock data, NullTokenizer).",
    ),
    click.Option(
        ["--record-golden"],
        is_flag=True,
        help="Store this run's functional loss curve (and its args) as the golden for this device kind.",
    ),
    click.Option(
        ["--resume/--no-resume"],
        default=True,
        show_default=True,
        help="Stage 4's checkpoint round trip: resume from the mid-run checkpoint and compare the remaining losses.",
    ),
)


class FunctionalStage(Stage[FunctionalOptions]):
    name = NAME
    summary = (
        "upstream's GPT case (pretrain_gpt.py with its MODEL_ARGS; mock data), a checkpoint saved half way and "
        "resumed with equal losses, and this device kind's golden"
    )
    cli_options = CLI_OPTIONS

    def check(self, given: Mapping[str, Any], setup: RunSetup) -> FunctionalOptions | NotRequested:
        options, why = functional_options(
            setup.tree,
            setup.series_dir,
            given["with_functional"],
            given["case"],
            setup.tp,
            setup.pp,
            given["data_path"],
            given["record_golden"],
            setup.iters,
            given["resume"],
            te=setup.te,
        )
        return options if options is not None else NotRequested(why)

    def launches(self, opts: VerifyOptions, options: FunctionalOptions, tmp: Path) -> list[dict]:
        f = options
        if not (case_dir(opts.tree, f.case) / "model_config.yaml").is_file():
            return []
        config = load_case(opts.tree, f.case)
        proxy = not probe.probe().has_gpu
        arch = opts.hip_arch if opts.hip_version else None
        te = case_plan.ProxyTE.of(opts.te, arch)
        plan = case_plan.plan_case(f.case, config, data_path=bool(f.data_path), te=te) if proxy else None
        if isinstance(plan, case_plan.Unsupported):
            return []
        args = build_args(config, iters=f.iters, proxy=proxy, data_path=f.data_path, work=tmp, plan=plan)
        env = dict(plan.fp8.env) if isinstance(plan, CasePlan) and plan.fp8 else {}
        return [
            {
                "stage": self.name,
                "command": functional_command(opts.launcher, world_size(config, opts.dp, plan), args),
                "cwd": str(opts.tree),
                **({"env": env} if env else {}),
            }
        ]

    def run(self, ctx: VerifyContext, options: FunctionalOptions) -> StageRun:
        f = options
        blocked_by = environment.functional_blockers(ctx.tree)
        if blocked_by:
            return StageRun(StageResult(self.name, FAIL, blocked_by))
        with output.progress(
            f"stage 4: upstream's functional case {f.case} (pretrain_gpt.py, {f.iters} iterations, "
            f"then resumed from iteration {f.iters // 2})"
        ):
            result, details = stage_functional(
                ctx.tree,
                ctx.env,
                case=f.case,
                dp=ctx.opts.dp,
                iters=f.iters,
                proxy=ctx.mode == "cpu-proxy",
                data_path=f.data_path,
                series_dir=f.series_dir,
                record=f.record,
                device_kind=DeviceKind.of_run(ctx.mode, ctx.machine, ctx.opts.te),
                defaulted=f.defaulted,
                launcher=ctx.launcher,
                resume=f.resume,
                hip=ctx.hip_version,
                rocm=bool(ctx.hip_version or ctx.machine.hip),
                te=case_plan.ProxyTE.of(ctx.opts.te, ctx.device_arch if ctx.hip_version else None),
            )
        return StageRun(result, details)


STAGE = FunctionalStage()


def functional_options(
    tree: Path,
    series_dir: Path | None,
    wanted,
    case,
    tp: int,
    pp: int,
    data_path,
    record: bool,
    iters: int,
    resume: bool = True,
    te: TELayer | None = None,
) -> tuple[FunctionalOptions | None, str]:
    from rocmport.machine.doctor import for_verify

    if case is not None:  # confined to the tree's cases directory whether or not stage 4 runs
        check_case(tree, case)
    if wanted is False:
        return None, "--no-functional"
    if not (tree / "pretrain_gpt.py").is_file():
        if wanted:
            raise BadInput(
                f"{tree}: no pretrain_gpt.py to run (a package-index source ships megatron/core only); drop --functional"
            )
        return None, tree_lacks("pretrain_gpt.py")
    if case is not None and not (check_case(tree, case) / "model_config.yaml").is_file():
        raise BadInput(
            f"--case {case!r}: no such case in {tree / CASES} (no model_config.yaml); e.g. {', '.join(cases_near(tree)) or '-'}"
        )
    if record and series_dir is None:
        raise BadInput(
            f"{tree}: --record-golden needs a tree made by `rocmport apply` (goldens live next to its series)"
        )
    # The TE case where doctor finds Transformer Engine usable (installed, in the line's range, built for the GPU),
    # or where TE's Python layer runs on the CPU proxy (--te).
    te_usable = te is not None or for_verify(series_dir / "series" if series_dir else None).te_usable
    chosen = case or default_case(tp, pp, te_usable, tree)
    if data_path is not None:
        # --data-path is upstream CI's data root ($DATA_PATH; the case names its files under it), taken
        # whole (never split on spaces) and made absolute: pretrain_gpt.py runs in the tree.
        root = Path(data_path).expanduser().resolve()
        if not root.is_dir():
            raise BadInput(
                f"--data-path {data_path}: not a directory; give upstream CI's data root ($DATA_PATH), "
                f"under which the case names its dataset and tokenizer files"
            )
        config = check_case(tree, chosen) / "model_config.yaml"
        missing = missing_data(load_case(tree, chosen), root) if config.is_file() else []
        if missing:
            raise BadInput(
                f"--data-path {data_path}: case {chosen} reads {missing[0]}, which is not there"
                + (f" (nor {len(missing) - 1} more)" if len(missing) > 1 else "")
                + "; lay the data out as upstream CI does under that directory"
            )
        data_path = str(root)
    return FunctionalOptions(
        case=chosen,
        defaulted=not case,
        data_path=data_path,
        record=record,
        series_dir=series_dir,
        iters=iters,
        resume=resume,
    ), ""
