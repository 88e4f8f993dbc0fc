"""Upstream's GPT training cases as the CPU proxy can run them.

Each case is a directory under ``tests/functional_tests/test_cases/gpt`` whose ``model_config.yaml``
upstream's CI turns into a `pretrain_gpt.py` command line. Here each one becomes either a
:class:`CasePlan` (its parallel layout, the ranks it needs, the proxy-sized arguments, the
checkpoint round trip it asks for, the features it exercises) or an :class:`Unsupported` with the
specific thing the proxy cannot provide (the kernel, the backend, the CUDA-only feature, the
artifact), classified ``gpu-only``, ``not-on-proxy`` or ``needs-nvidia-only``.

One shrink rule for every case (:func:`shrink`): widths become proxy sizes, while depth keeps the
case's pipeline structure (virtual chunks, uneven first and last stages) at its smallest integer
scale, so a layout that upstream tests is the layout the proxy runs. Nothing here is a copy of
upstream's arguments: every plan is read from the tree's own YAML."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from rocmport.errors import BadInput
from rocmport.launch_env import FSDP_OPTIONS
from rocmport.verify.runtime import protocol
from rocmport.verify.stages import after_script

CASES = Path("tests/functional_tests/test_cases/gpt")
# The most ranks verify launches for one case (upstream's cases run on one 8-GPU node).
MAX_RANKS = 8
# The proxy's model widths. Depth is not here: shrink() keeps each case's pipeline structure.
PROXY_WIDTHS: dict[str, int] = {
    "--hidden-size": 64,
    "--num-attention-heads": 4,
    "--seq-length": 128,
    "--max-position-embeddings": 128,
    "--micro-batch-size": 2,
}
# Widths that only some cases set, each shrunk when present (MLA's ranks and head sizes, MoE's and
# the FFN's hidden sizes, explicit per-head channels).
PROXY_OPTIONAL_WIDTHS: dict[str, int] = {
    "--ffn-hidden-size": 256,
    "--kv-channels": 16,
    "--q-lora-rank": 32,
    "--kv-lora-rank": 16,
    "--qk-head-dim": 16,
    "--qk-pos-emb-head-dim": 8,
    "--v-head-dim": 16,
    "--moe-ffn-hidden-size": 64,
    "--moe-shared-expert-intermediate-size": 64,
}
# The smallest model the proxy trains: a case whose structure fits fewer layers gets a multiple of
# its structure up to this many (the default tp2×pp2 case: 4 layers, 2 per stage, as before).
MIN_LAYERS = 4

UnsupportedKind = Literal["gpu-only", "not-on-proxy", "needs-nvidia-only", "not-training"]


@dataclass(frozen=True)
class Layout:
    """A case's parallel layout on the proxy. ``vp``: model chunks per pipeline stage (1 when the case
    has no virtual pipeline)."""

    tp: int = 1
    pp: int = 1
    vp: int = 1
    cp: int = 1
    ep: int = 1
    etp: int = 1
    dp: int = 1
    sequence_parallel: bool = False

    @property
    def world(self) -> int:
        return self.tp * self.pp * self.cp * self.dp

    def describe(self) -> str:
        parts = [f"tp{self.tp}", f"pp{self.pp}"]
        parts += [f"vp{self.vp}"] if self.vp > 1 else []
        parts += [f"cp{self.cp}"] if self.cp > 1 else []
        parts += [f"ep{self.ep}"] if self.ep > 1 else []
        parts += [f"etp{self.etp}"] if self.etp > 1 else []
        parts += [f"dp{self.dp}"]
        return "×".join(parts) + (" +sp" if self.sequence_parallel else "") + f" ({self.world} ranks)"


@dataclass(frozen=True)
class CasePlan:
    """How the proxy runs one case: ``case_args`` its MODEL_ARGS, ``args`` the proxy's overrides on
    top of them (build_args' ``extra``), ``resume`` whether the run checks a checkpoint round trip, ``features``
    what the case exercises (from its flags), ``notes`` what the proxy changes about it; ``dropped``: the
    options of PROXY_DROPPED the case sets (option, why; ``args`` drops them), ``env_unset``: its ENV_VARS
    the runs unset (variable, why: stale_attention_env, on the CUDA path); ``kept``: the case's half precision
    the proxy keeps (option, why: kept_precision; every other case trains in fp32), ``launch_env_unset``: verify's
    own launch environment the runs leave out (variable, why: fsdp_launch_env); ``set_args``: options the proxy
    sets that the case does not (option and value, why: proxy_loss_scale)."""

    case: str
    test_type: str
    layout: Layout
    case_args: dict[str, Any]
    args: dict[str, Any]
    resume: bool
    te: bool
    features: tuple[str, ...]
    notes: tuple[str, ...] = ()
    fp8: Fp8Plan | None = None  # an FP8 case: its recipe, encoding and device, or the refusal it must meet
    dropped: tuple[tuple[str, str], ...] = ()
    env_unset: tuple[tuple[str, str], ...] = ()
    kept: tuple[tuple[str, str], ...] = ()
    launch_env_unset: tuple[tuple[str, str], ...] = ()
    set_args: tuple[tuple[str, str], ...] = ()  # options the proxy sets that the case does not (option, why)
    after_script: after_script.AfterScript | None = None


@dataclass(frozen=True)
class Unsupported:
    """A case the proxy cannot run, and the one thing it lacks."""

    case: str
    kind: UnsupportedKind
    reason: str


Plan = CasePlan | Unsupported


# --- reading the YAML --------------------------------------------------------------------------


def training_cases(tree: Path) -> list[str]:
    """The tree's GPT case directories that have a model_config.yaml, sorted."""
    root = tree / CASES
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if p.is_dir() and (p / "model_config.yaml").is_file())


def load_config(tree: Path, case: str) -> dict:
    """The case's model_config.yaml as a mapping (BadInput naming the file when it is not one)."""
    from rocmport.inputs import parse_yaml, read_text

    path = tree / CASES / case / "model_config.yaml"
    config = parse_yaml(read_text(path, "functional case"), path, last_key_wins=True) or {}
    if not isinstance(config, dict) or not isinstance(config.get("MODEL_ARGS") or {}, dict):
        raise BadInput(f"{path}: not a functional case (a mapping with MODEL_ARGS)")
    return config


def _int(args: dict, key: str, default: int) -> int:
    value = args.get(key, default)
    if value is None or value is False:
        return default
    try:
        return int(str(value).strip())
    except ValueError:
        raise BadInput(f"{key}: {value!r} is not an integer") from None


def _on(args: dict, key: str) -> bool:
    return args.get(key) not in (None, False, "false", "False")


# --- upstream CI's variables --------------------------------------------------------------------

# The variables upstream's CI puts into a case's MODEL_ARGS. Its launcher
# (tests/functional_tests/shell_test_utils/_run_training.sh) runs the YAML through envsubst with every
# variable of its environment, which run_ci_test.sh sets: the paths (build_args gives verify's own) and
# REPEAT, the repeat's number (run_ci_test.sh runs a case N_REPEAT times, exporting REPEAT=1, 2, ...;
# gpt3_mcore_reruns_resume_check_grads seeds with it). Verify runs one repeat: the first.
CI_VARIABLES = (
    "TENSORBOARD_PATH",
    "CHECKPOINT_SAVE_PATH",
    "CHECKPOINT_LOAD_PATH",
    "DATA_CACHE_PATH",
    "DATA_PATH",
    "REPEAT",
)
FIRST_REPEAT = "1"
# A shell variable as envsubst reads one: ${NAME} or $NAME.
SHELL_VARIABLE = re.compile(r"\$(?:\{([A-Za-z_]\w*)\}|([A-Za-z_]\w*))")


def unresolved_variables(args: dict) -> list[tuple[str, str, str]]:
    """(flag, value, variable) for each variable in MODEL_ARGS that is not one of CI_VARIABLES: upstream's
    launcher gives it a value from its own environment, verify has none to give."""
    out = []
    for flag, value in args.items():
        for m in SHELL_VARIABLE.finditer(str(value)):
            var = m.group(1) or m.group(2)
            if var not in CI_VARIABLES:
                out.append((flag, str(value), var))
    return out


# --- what the proxy cannot provide -------------------------------------------------------------

# (flag, value predicate or None for "present", kind, the specific reason). Checked in order; the
# first that matches is the case's reason. Each reason names the kernel, backend or artifact.
_BLOCKERS: tuple[tuple[str, str | None, UnsupportedKind, str], ...] = (
    (
        "--fp4-format",
        None,
        "not-on-proxy",
        "--fp4-format: FP4 GEMMs are TE kernels the proxy's CPU layer does not emulate",
    ),
    (
        "--experimental-attention-variant",
        None,
        "not-on-proxy",
        "--experimental-attention-variant (gated delta net): its attention runs flash-linear-attention's "
        "Triton kernels, which have no CPU backend",
    ),
    (
        "--export-kd-teacher-load",
        None,
        "needs-nvidia-only",
        "--export-kd-teacher-load: knowledge distillation through nvidia-modelopt, an NVIDIA-only package",
    ),
    (
        "--fim-data",
        None,
        "not-on-proxy",
        "--fim-data: the fill-in-the-middle dataset needs upstream CI's tokenized corpus (pass --data-path); "
        "mock data has no FIM sentinels",
    ),
    (
        "--use-flash-attn",
        None,
        "gpu-only",
        "--use-flash-attn: the flash-attn package's CUDA kernels",
    ),
    (
        "--enable-cuda-graph",
        None,
        "gpu-only",
        "--enable-cuda-graph: CUDA graph capture",
    ),
    (
        "--cuda-graph-impl",
        None,
        "gpu-only",
        "--cuda-graph-impl: CUDA graph capture",
    ),
    (
        "--external-cuda-graph",
        None,
        "gpu-only",
        "--external-cuda-graph: CUDA graph capture",
    ),
    (
        "--defer-embedding-wgrad-compute",
        None,
        "gpu-only",
        "--defer-embedding-wgrad-compute: megatron defers the output layer's weight gradient only with "
        "gradient accumulation fusion, APEX's fused_weight_gradient_mlp_cuda GPU extension (the unported tree "
        "stops without it; the port turns the fusion off where it is missing, and megatron then refuses the "
        "deferral)",
    ),
)
# Options the proxy drops from every case of every line, each a GPU-only schedule that does not change
# what the case computes: (the option, the prefix of the options that go with it, why). A case with one
# is no GPU-only case: it runs without them, and says so (its plan's ``dropped``, stage 4's report among
# the arguments verify chose). What the option alone reaches stays unrun (gpu_only_reasons: reach).
PROXY_DROPPED: tuple[tuple[str, str, str], ...] = (
    (
        "--tp-comm-overlap",
        "--tp-comm-",
        "--tp-comm-overlap: TE's userbuffers overlap the tensor-parallel all-gather and reduce-scatter with "
        "the GEMMs through CUDA IPC buffers, which the proxy has none of; the proxy runs the case without it "
        "(and its --tp-comm-* options): the same GEMMs on the same operands and the same collectives, not "
        "overlapped (the overlap splits and schedules the communication, not the arithmetic), so the "
        "userbuffers path itself is not exercised",
    ),
)
# The case's own half precision the proxy keeps, where the fp32 it otherwise trains in (shrink) would change what the
# case computes: (the option that decides, why). Every line, every flavour; a case with one keeps its --bf16 or --fp16
# (its plan's ``kept``, stage 4's report among the arguments verify chose).
PROXY_KEEPS_PRECISION: tuple[tuple[str, str], ...] = (
    (
        "--fp8-param-gather",
        "--fp8-param-gather keeps the weights in FP8 (TE's Float8Tensor) and the optimizer's fp32 master weights "
        "beside them, cast into the FP8 weights after each step (TE's cast_master_weights_to_fp8); Megatron makes "
        "master weights only for half-precision parameters (distrib_optimizer.py: 'torch.cuda.HalfTensor', "
        "'torch.cuda.BFloat16Tensor'), so in fp32 the optimizer would step the FP8 weights themselves, which TE's "
        "FusedAdam refuses ('FusedAdam without master_weights does not support Float8Tensor parameters'): the case "
        "keeps its half precision (parameters and activations; TE's CPU kernels compute in fp32 and write it), with "
        "fp32 master weights and gradient reduction, as on the GPU",
    ),
    (
        "--use-distributed-optimizer",
        "the distributed optimizer keeps fp32 main copies of a half-precision model's parameter shards and gathers "
        "the stepped shards back into the model (distrib_optimizer.py's float16 branch), while in fp32 it steps views "
        "of the model's own parameters, another code path than the case tests; and that fp32 path cannot resume from "
        "a dp-reshardable checkpoint on any device (load_parameter_state_from_dp_reshardable, not under "
        "torch.no_grad, copies into a view of a leaf that requires grad: 'a view of a leaf Variable that requires "
        "grad is being used in an in-place operation', measured on both trees): the case keeps its half precision, "
        "with fp32 main weights, as on the GPU",
    ),
)
_HALF = ("--fp16", "--bf16")

# The loss scale an fp16 case kept on the proxy starts from. Megatron's dynamic scaler starts at 2^32 and skips
# every iteration whose fp16 gradients overflow, halving the scale (after 2, its hysteresis): upstream's H100 run
# of gpt3_mcore_tp1_pp1_resume_torch_dist_dist_optimizer_overlap_grad_reduce_param_gather skips iterations 1-17
# and first steps at 2^16, then saves at 50. The proxy's 10 iterations would all be skips, logging no loss, and
# its checkpoint at 5 would come before the optimizer's first step, whose Adam states a fully reshardable save
# reads (upstream's distrib_optimizer.get_parameter_state_dp_zero: KeyError 'exp_avg', v0.16 port; the unported
# tree stops earlier on the proxy, without apex). From 2^12, well
# below the scale upstream first stepped at, the small model's gradients do not overflow: every iteration steps.
FP16_INITIAL_LOSS_SCALE = 4096
FP16_LOSS_SCALE_WHY = (
    "fp16's dynamic loss scale starts at 2^32 and skips each iteration whose gradients overflow while it falls "
    "(upstream's H100 run of this kind skips 17 and first steps at 2^16); the proxy's 10 iterations would all be "
    "skips, with no loss logged and its checkpoint half way saved before the optimizer's first step (a fully "
    "reshardable distributed-optimizer save then fails in upstream's get_parameter_state_dp_zero: KeyError 'exp_avg'); it starts at 2^12, "
    "below the scale upstream first stepped at, so every iteration steps"
)


def proxy_loss_scale(args: dict) -> tuple[tuple[str, str], ...]:
    """The --initial-loss-scale the proxy gives an fp16 case it keeps in fp16 (FP16_INITIAL_LOSS_SCALE), as
    (option and value, why); () for any other case, or one that sets its own scale."""
    if "--fp16" not in dict(kept_precision(args)) or _on(args, "--loss-scale") or _on(args, "--initial-loss-scale"):
        return ()
    return ((f"--initial-loss-scale {FP16_INITIAL_LOSS_SCALE}", FP16_LOSS_SCALE_WHY),)


def kept_precision(args: dict) -> tuple[tuple[str, str], ...]:
    """The case's half-precision options (--fp16, --bf16) the proxy keeps, each with why (PROXY_KEEPS_PRECISION);
    () where the case trains in fp32 on the proxy."""
    for flag, why in PROXY_KEEPS_PRECISION:
        if _on(args, flag):
            return tuple((key, why) for key in _HALF if _on(args, key))
    return ()


# The NVTE_* attention variables upstream's LanguageModule._set_attention_backend (megatron/core/models/
# common/language_module/language_module.py, check_and_set_env_variable) checks as it builds the model, by
# --attention-backend: each unset or this value, else it asserts ("NVTE_FUSED_ATTN set to 0, but expected 1
# for attention backend type auto").
ATTENTION_ENV_EXPECTED: dict[str, dict[str, str]] = {
    "auto": {"NVTE_FLASH_ATTN": "1", "NVTE_FUSED_ATTN": "1", "NVTE_UNFUSED_ATTN": "1"},
    "flash": {"NVTE_FLASH_ATTN": "1", "NVTE_FUSED_ATTN": "0", "NVTE_UNFUSED_ATTN": "0"},
    "fused": {"NVTE_FLASH_ATTN": "0", "NVTE_FUSED_ATTN": "1", "NVTE_UNFUSED_ATTN": "0"},
    "unfused": {"NVTE_FLASH_ATTN": "0", "NVTE_FUSED_ATTN": "0", "NVTE_UNFUSED_ATTN": "1"},
    "local": {"NVTE_FLASH_ATTN": "0", "NVTE_FUSED_ATTN": "0", "NVTE_UNFUSED_ATTN": "0"},
}
# The variables that switch a GPU attention kernel off (flash-attention, cuDNN's fused attention): the
# proxy's TE has neither, so unsetting one changes no attention the proxy runs. NVTE_UNFUSED_ATTN is not
# here: it switches off the unfused attention, the proxy's only one.
_GPU_ATTENTION_ENV = ("NVTE_FLASH_ATTN", "NVTE_FUSED_ATTN")


def stale_attention_env(config: dict) -> tuple[tuple[str, str], ...]:
    """The case's ENV_VARS that switch a GPU attention kernel off (NVTE_FLASH_ATTN, NVTE_FUSED_ATTN = 0)
    where upstream's own _set_attention_backend asserts them for the case's --attention-backend, each with
    why the CUDA path unsets it. They are the way cases chose TE's attention before --attention-backend
    (upstream moved its cases' NVTE_*_ATTN to it in fa0dcc4872, "Attention as a config option in mcore",
    2024-12, and left its weekly FP8 cases as they were): on an NVIDIA GPU such a case stops in that
    assertion before its first iteration. On HIP the port's attention-backend-env keeps the variables
    for auto (AMD's images bake NVTE_FUSED_ATTN=1): they stay, and the run checks the port takes them."""
    env = {k: str(v).strip() for k, v in (config.get("ENV_VARS") or {}).items()}
    args = config.get("MODEL_ARGS") or {}
    backend = str(args.get("--attention-backend") or "auto").strip()
    expected = ATTENTION_ENV_EXPECTED.get(backend, {})
    out = []
    for var in _GPU_ATTENTION_ENV:
        if var in env and var in expected and env[var] != expected[var] and env[var] == "0":
            out.append(
                (
                    var,
                    f"{var}={env[var]} (the case's ENV_VARS) unset on the CUDA path: upstream's "
                    f"LanguageModule._set_attention_backend asserts {var} unset or {expected[var]} under "
                    f"--attention-backend {backend}, so the case stops there on an NVIDIA GPU too; the variable "
                    "chose TE's attention before --attention-backend did, and only switches off a GPU kernel the "
                    "proxy's TE does not have (it runs TE's unfused attention either way)",
                )
            )
    return tuple(out)


# Megatron's FSDP flags: under each, upstream's validate_args asserts CUDA_DEVICE_MAX_CONNECTIONS is not 1
# (rocmport/launch_env.py's one list: the port's launch-env helper is written from it and sets no 1 under them).
FSDP_FLAGS = FSDP_OPTIONS
CONNECTIONS = "CUDA_DEVICE_MAX_CONNECTIONS"


def fsdp_launch_env(config: dict) -> tuple[tuple[str, str], ...]:
    """What an FSDP case's runs leave out of verify's launch environment, with why: the launch profile's
    CUDA_DEVICE_MAX_CONNECTIONS=1 (`rocmport env`, AMD's launcher default, which verify gives every run
    on ROCm and under the HIP simulation), where the case's ENV_VARS set none. Upstream asserts it is not
    1 under FSDP, its CI launch gives such a case no value, AMD's launchers and the port's launch-env set
    none under FSDP: left in, every FSDP case stops at that assertion on both trees, a failure of
    verify's own making."""
    args = config.get("MODEL_ARGS") or {}
    flag = next((f for f in FSDP_FLAGS if _on(args, f)), None)
    if flag is None or CONNECTIONS in (config.get("ENV_VARS") or {}):
        return ()
    why = (
        f"{flag}: upstream's validate_args asserts {CONNECTIONS} is not 1 under FSDP ('FSDP always requires "
        f"{CONNECTIONS} value large than one'); the 1 is verify's launch profile's (`rocmport env`: AMD's "
        "launcher default for every run), which AMD's launchers and the port's launch-env leave unset under "
        "FSDP, and upstream's CI launch gives the case none: its runs leave it unset"
    )
    return ((CONNECTIONS, why),)


# Attention backends that are GPU kernels (--attention-backend), and which kernel each is.
_GPU_ATTENTION = {
    "flash": "flash-attn's CUDA kernels",
    "fused": "TE's fused attention (cuDNN)",
}


def blocker(name: str, config: dict, *, data_path: bool = False) -> Unsupported | None:
    """Why the proxy cannot run the case at all, read from its YAML alone, or None."""
    mode = str(config.get("MODE") or "pretraining")
    if mode != "pretraining":
        return Unsupported(name, "not-training", f"MODE {mode}: not a pretraining case (stage 4 runs training)")
    test_type = str(config.get("TEST_TYPE") or "regular")
    if test_type == "frozen-start":
        return Unsupported(
            name,
            "not-on-proxy",
            "TEST_TYPE frozen-start: starts from upstream CI's stored checkpoint (${CHECKPOINT_LOAD_PATH}), "
            "which is not published",
        )
    if test_type == "checkpoint-consistency":
        return Unsupported(
            name,
            "not-on-proxy",
            "TEST_TYPE checkpoint-consistency: each of its MODEL_ARGS runs starts from upstream CI's stored "
            "checkpoint (${CHECKPOINT_LOAD_PATH}), which is not published, for one step whose gradients "
            "upstream's harness compares across the runs",
        )
    if test_type == "release":
        return Unsupported(
            name,
            "not-on-proxy",
            "TEST_TYPE release: a multi-node release run on upstream's full corpus; its point is scale, "
            "which a proxy-sized model removes",
        )
    args = config.get("MODEL_ARGS") or {}
    for flag, _, kind, reason in _BLOCKERS:
        if flag == "--fim-data" and data_path:
            continue
        if _on(args, flag):
            return Unsupported(name, kind, reason)
    backend = str(args.get("--attention-backend") or "").strip()
    if backend in _GPU_ATTENTION:
        return Unsupported(
            name, "gpu-only", f"--attention-backend {backend}: {_GPU_ATTENTION[backend]}; the proxy runs unfused"
        )
    return None


def gpu_only_reasons(tree: Path) -> dict[str, str]:
    """The flag of each GPU-only case of the tree -> the reason its blocker gives (the first case by
    name quoted), and of each option the proxy drops (PROXY_DROPPED) that a case of the tree sets -> why:
    what reach.classify says of a port site only that feature reaches."""
    out: dict[str, str] = {}
    for name in training_cases(tree):
        try:
            config = load_config(tree, name)
        except BadInput:
            continue
        planned = blocker(name, config)
        if planned is not None and planned.kind == "gpu-only":
            flag = planned.reason.split(":")[0].split()[0]
            out.setdefault(flag, f"{planned.reason} (e.g. case {name})")
        for flag, _, why in PROXY_DROPPED:  # the proxy runs such a case without the option: what it reaches, never
            if _on(config.get("MODEL_ARGS") or {}, flag):
                out.setdefault(flag, f"{why} (e.g. case {name})")
    return out


# --- the layout --------------------------------------------------------------------------------


def _chunks_per_stage(args: dict, layers: int, pp: int) -> int:
    """Model chunks per pipeline stage (the virtual pipeline), from either of its two spellings."""
    if _on(args, "--num-virtual-stages-per-pipeline-rank"):
        return _int(args, "--num-virtual-stages-per-pipeline-rank", 1)
    per = _int(args, "--num-layers-per-virtual-pipeline-stage", 0)
    if per:
        if layers % (per * pp):
            raise BadInput(
                f"--num-layers {layers} is not a multiple of --num-layers-per-virtual-pipeline-stage {per} × pp {pp}"
            )
        return layers // (per * pp)
    return 1


def layout(args: dict) -> tuple[Layout, list[str]]:
    """The case's layout at the fewest ranks that still exercise it, and why dp is what it is.

    dp: 1, unless the case shards across data-parallel ranks (the distributed optimizer, its
    instances, Megatron FSDP, torch FSDP2) — then 2 — and raised to what expert parallelism needs:
    tp·cp·dp must be a multiple of etp·ep (megatron's expert groups are carved from the same ranks)."""
    tp = _int(args, "--tensor-model-parallel-size", 1)
    pp = _int(args, "--pipeline-model-parallel-size", 1)
    cp = _int(args, "--context-parallel-size", 1)
    # Expert layouts matter only where there are experts (megatron's etp defaults to tp).
    moe = _on(args, "--num-experts")
    ep = _int(args, "--expert-model-parallel-size", 1) if moe else 1
    etp = _int(args, "--expert-tensor-parallel-size", tp) if moe else 1
    layers = _int(args, "--num-layers", 1)
    vp = _chunks_per_stage(args, layers, pp)
    why: list[str] = []
    dp = 1
    instances = _int(args, "--num-distributed-optimizer-instances", 1)
    if _on(args, "--use-distributed-optimizer") or _on(args, "--use-megatron-fsdp") or _on(args, "--use-torch-fsdp2"):
        dp = max(2, instances)
        why.append(f"dp{dp}: the case shards optimizer state or parameters across data-parallel ranks")
    if ep * etp > 1:
        need = ep * etp
        while (tp * cp * dp) % need:
            dp += 1
        if dp > 1:
            why.append(f"dp{dp}: expert parallelism ep{ep}×etp{etp} is carved from tp·cp·dp ranks")
    return Layout(tp, pp, vp, cp, ep, etp, dp, _on(args, "--sequence-parallel")), why


# --- the shrink rule ---------------------------------------------------------------------------


def shrink(args: dict, lay: Layout) -> tuple[dict[str, Any], list[str]]:
    """The proxy's overrides for one case: widths to PROXY_WIDTHS, depth divided by the greatest
    common divisor of every layer count the layout fixes (total, per chunk, uneven first and last
    stage), then multiplied up to at least MIN_LAYERS, so the pipeline structure is the case's.
    Batch: micro-batch 2, and at least pp micro-batches per step (2·pp with a virtual pipeline, so
    the interleaved schedule has work for every chunk)."""
    notes: list[str] = []
    out: dict[str, Any] = dict(PROXY_WIDTHS)
    out.update({k: v for k, v in PROXY_OPTIONAL_WIDTHS.items() if _on(args, k)})
    heads = PROXY_WIDTHS["--num-attention-heads"]
    if _on(args, "--num-query-groups"):
        groups = _int(args, "--num-query-groups", 1)
        # Keep grouped-query attention grouped (fewer groups than heads) and divisible by tp.
        out["--num-query-groups"] = max(lay.tp, min(groups, heads // 2))
    if lay.tp > heads:
        out["--num-attention-heads"] = lay.tp
        notes.append(f"{lay.tp} attention heads: one per tensor-parallel rank")

    layers = _int(args, "--num-layers", 1)
    first = _int(args, "--decoder-first-pipeline-num-layers", 0)
    last = _int(args, "--decoder-last-pipeline-num-layers", 0)
    # With --account-for-{embedding,loss}-in-pipeline-split the embedding and the loss each take a
    # layer's place in the split: the structure is over layers plus those.
    extra = sum(_on(args, f"--account-for-{part}-in-pipeline-split") for part in ("embedding", "loss"))
    total = layers + extra
    if first or last:
        middle_stages = lay.pp - (1 if first else 0) - (1 if last else 0)
        counts = [total, *(c for c in (first, last) if c)]
        if middle_stages:
            counts.append((layers - first - last) // middle_stages)
    else:
        counts = [total, total // (lay.pp * lay.vp) or 1]
    g = math.gcd(*counts)
    smallest = total // g
    scale = max(1, math.ceil((MIN_LAYERS + extra) / smallest))
    out["--num-layers"] = smallest * scale - extra
    if first:
        out["--decoder-first-pipeline-num-layers"] = first // g * scale
    if last:
        out["--decoder-last-pipeline-num-layers"] = last // g * scale
    if _on(args, "--num-layers-per-virtual-pipeline-stage"):
        out["--num-layers-per-virtual-pipeline-stage"] = out["--num-layers"] // (lay.pp * lay.vp)
    if out["--num-layers"] != layers:
        notes.append(f"{layers} → {out['--num-layers']} layers (the case's pipeline structure at its smallest scale)")

    micro = out["--micro-batch-size"]
    steps = max(4, lay.pp * (2 if lay.vp > 1 else 1))
    group = _int(args, "--microbatch-group-size-per-virtual-pipeline-stage", 0)
    if lay.vp > 1 and group:
        # Megatron's interleaved schedule refuses a step whose micro-batches leave a remainder modulo the
        # case's group size that is neither 0 nor at least pp (a dependency bubble): take the fewest that do.
        fewest = steps
        while steps % group and steps % group < lay.pp:
            steps += 1
        if steps != fewest:
            notes.append(
                f"{steps} micro-batches per step, not {fewest}: the case's "
                f"--microbatch-group-size-per-virtual-pipeline-stage {group} at pp {lay.pp}"
            )
    out["--global-batch-size"] = micro * lay.dp * steps
    if _on(args, "--rampup-batch-size"):
        out["--rampup-batch-size"] = None
        notes.append("--rampup-batch-size dropped: a few proxy iterations never leave the ramp")
    kept = dict(kept_precision(args))
    for key in _HALF:
        if key in kept:
            notes.append(f"{key} kept: {kept[key]}")
        elif _on(args, key):
            notes.append(f"{key} → fp32: the CPU has no half-precision GEMM kernels the case's numerics test")
    for option, why in proxy_loss_scale(args):
        out["--initial-loss-scale"] = FP16_INITIAL_LOSS_SCALE
        notes.append(f"{option}: {why}")
    return out, notes


# --- what the shrink changed, as Megatron's messages name it ---------------------------------------

# The GPUs an upstream case runs on: one 8-GPU node (MAX_RANKS is the proxy's cap for the same reason).
UPSTREAM_GPUS = 8
# How Megatron's messages name a quantity besides its option's own spellings (`--hidden-size`,
# `hidden_size`, `hidden size`): its argument validation, TransformerConfig's __post_init__, the
# schedules' checks ("The remainder of M (the total micro-batches) ...", core_v0.16.1 schedules.py).
_QUANTITY_NAMES: dict[str, tuple[str, ...]] = {
    "--num-layers": (r"number of (?:transformer )?layers", r"layers per"),
    "--num-attention-heads": (r"attention heads", r"number of heads", r"num_heads"),
    "--num-query-groups": (r"query groups",),
    "--seq-length": (r"sequence length", r"seq_len\b"),
    "--max-position-embeddings": (r"position embeddings",),
    "--micro-batch-size": (r"micro[- ]batch size",),
    "micro-batches": (r"micro-?batches", r"num_microbatches", r"number of micro"),
    "--global-batch-size": (r"global batch size",),
    "--vocab-size": (r"vocab",),
    "ranks": (r"world[_ ]size", r"data[-_ ]parallel[-_ ]size", r"data[- ]parallel ranks", r"number of (?:ranks|GPUs)"),
    "precision": (r"\bbf16\b", r"\bfp16\b", r"b?float16", r"half[- ]precision", r"params_dtype"),
}


@dataclass(frozen=True)
class ShrinkChange:
    """One thing verify changed about a case to run it on the proxy: the quantity (an option, or
    `micro-batches`, `ranks`, `precision`), the case's value and the proxy's (None: unset, dropped)."""

    quantity: str
    case: str | None
    proxy: str | None

    def describe(self) -> str:
        return f"{self.quantity} {self.case if self.case is not None else '(unset)'} → {self.proxy or '(dropped)'}"

    def names(self) -> list[re.Pattern[str]]:
        """How a message names it: the option as given, as Megatron's attribute, in words, and _QUANTITY_NAMES."""
        out = list(_QUANTITY_NAMES.get(self.quantity, ()))
        if self.quantity.startswith("--"):
            bare = self.quantity[2:]
            # as a whole word: `lr` is not named by `--decoupled-lr` nor `decoupled_lr`
            out += [
                rf"(?<![\w-]){re.escape(form)}(?![\w-])"
                for form in {bare, bare.replace("-", "_"), bare.replace("-", " ")}
            ]
        return [re.compile(p, re.I) for p in out]

    def named_in(self, message: str) -> bool:
        return any(p.search(message) for p in self.names())


def _value(value: Any) -> str | None:
    return None if value is None or value is False else ("on" if value is True else str(value).strip())


def shrink_changes(
    plan: CasePlan, *, mock_data: bool = True, training: dict[str, Any] | None = None
) -> list[ShrinkChange]:
    """What verify changed about the case to run it on the proxy (plan_case): each option the plan
    overrides to another value than the case's (shrink: widths, depth, the batch; what it drops), the
    micro-batches per step and the ranks that follow (upstream runs its cases on one UPSTREAM_GPUS-GPU
    node), the half precision the proxy trains in fp32, the mock data's vocabulary (``mock_data``), and
    ``training``: the run's own overrides (case_args.PROXY_TRAINING, the iterations)."""
    case = plan.case_args
    out: list[ShrinkChange] = []
    for key, value in {**plan.args, **(training or {})}.items():
        if _value(value) != _value(case.get(key)) and not (value is None and key not in case):
            out.append(ShrinkChange(key, _value(case.get(key)), _value(value)))
    lay = plan.layout
    upstream_dp = max(1, UPSTREAM_GPUS // (lay.tp * lay.pp * lay.cp))
    if lay.world != lay.tp * lay.pp * lay.cp * upstream_dp:
        out.append(
            ShrinkChange(
                "ranks", f"{lay.tp * lay.pp * lay.cp * upstream_dp} (dp{upstream_dp})", f"{lay.world} (dp{lay.dp})"
            )
        )
    sized = {**case, **plan.args}

    def steps(args: dict, dp: int) -> int | None:
        try:
            return _int(args, "--global-batch-size", 0) // (_int(args, "--micro-batch-size", 1) * dp) or None
        except BadInput:
            return None

    before, after = steps(case, upstream_dp), steps(sized, lay.dp)
    if before != after:
        how = ", ".join(
            f"{key} {_value(case.get(key))} → {_value(sized.get(key))}"
            for key in ("--global-batch-size", "--micro-batch-size")
            if _value(case.get(key)) != _value(sized.get(key))
        )
        how += f", dp{upstream_dp} → dp{lay.dp}" if upstream_dp != lay.dp else ""
        out.append(
            ShrinkChange("micro-batches", None if before is None else f"{before} per step", f"{after} per step ({how})")
        )
    kept = dict(plan.kept)
    dropped = [key for key in _HALF if _on(case, key) and key not in kept]
    if dropped:
        out.append(ShrinkChange("precision", " ".join(dropped), "fp32"))
    if mock_data:  # case_args.build_args without a data path: mock data, NullTokenizer, a vocabulary of 1024
        out.append(
            ShrinkChange("--vocab-size", _value(case.get("--vocab-size")) or "the tokenizer's", "1024 (mock data)")
        )
        tokenizer = _value(case.get("--tokenizer-type")) or "the case's"
        if tokenizer != "NullTokenizer":
            out.append(ShrinkChange("--tokenizer-type", tokenizer, "NullTokenizer (mock data)"))
    return out


def shrink_named(changes: list[ShrinkChange], message: str) -> list[ShrinkChange]:
    """The changes ``message`` names (ShrinkChange.names)."""
    return [c for c in changes if c.named_in(message)]


# --- what a case exercises ---------------------------------------------------------------------

# Flag → the feature name the report and the reach selection use.
_FEATURES = {
    "--use-distributed-optimizer": "distributed-optimizer",
    "--overlap-grad-reduce": "overlap-grad-reduce",
    "--overlap-param-gather": "overlap-param-gather",
    "--overlap-param-gather-with-optimizer-step": "overlap-optimizer-step",
    "--num-distributed-optimizer-instances": "distributed-optimizer-instances",
    "--sequence-parallel": "sequence-parallel",
    "--swiglu": "swiglu",
    "--squared-relu": "squared-relu",
    "--untie-embeddings-and-output-weights": "untied-embeddings",
    "--multi-latent-attention": "mla",
    "--qk-layernorm": "qk-layernorm",
    "--cross-entropy-loss-fusion": "cross-entropy-fusion",
    "--calculate-per-token-loss": "per-token-loss",
    "--decoupled-lr": "decoupled-lr",
    "--defer-embedding-wgrad-compute": "deferred-wgrad",
    "--rerun-mode": "reruns",
    "--recompute-granularity": "recompute",
    "--disable-bias-linear": "no-bias-linear",
    "--rotary-interleaved": "rope-interleaved",
    "--no-rope-fusion": "rope-unfused",
    "--use-megatron-fsdp": "megatron-fsdp",
    "--use-torch-fsdp2": "torch-fsdp2",
    "--ddp-average-in-collective": "ddp-average-in-collective",
    "--group-query-attention": "gqa",
    "--num-experts": "moe",
    "--async-save": "async-save",
    "--no-create-attention-mask-in-dataloader": "no-dataloader-mask",
    "--account-for-embedding-in-pipeline-split": "embedding-in-pipeline-split",
    "--decoder-first-pipeline-num-layers": "uneven-pipeline",
    "--use-tp-pp-dp-mapping": "tp-pp-dp-mapping",
    "--hierarchical-context-parallel-sizes": "hierarchical-cp",
}


def features(args: dict, lay: Layout, test_type: str) -> tuple[str, ...]:
    found = {name for flag, name in _FEATURES.items() if _on(args, flag)}
    pos = str(args.get("--position-embedding-type") or "").strip()
    if pos:
        found.add(f"position-{pos}")
    found |= {n for n, on in (("virtual-pipeline", lay.vp > 1), ("context-parallel", lay.cp > 1)) if on}
    found |= {n for n, on in (("expert-parallel", lay.ep > 1), ("expert-tensor-parallel", lay.etp > 1)) if on}
    if test_type in ("ckpt-resume", "frozen-resume", "checkpoint-consistency"):
        found.add("resume")
    return tuple(sorted(found))


# --- FP8 cases (TE's FP8 path: verify --te) ----------------------------------------------------

# Megatron's --fp8-recipe when a case names none.
DEFAULT_FP8_RECIPE = "delayed"
# The FP8 recipes ROCm TE runs on each AMD GPU (te_flavour's fp8-support-by-gfx, fp8-block-scaling-unsupported
# and mxfp8-gfx950-behind-env deltas); any other recipe, and FP8 on any other GPU, the port's fp8-arch-check
# refuses in argument validation. Its table (codemods/runtime/fp8_arch_check.FP8_RECIPES_BY_ARCH) is the same:
# tests/test_case_plan.py holds the two equal.
ROCM_FP8_RECIPES: dict[str, tuple[str, ...]] = {
    "gfx942": ("delayed", "tensorwise", "custom"),
    "gfx950": ("delayed", "tensorwise", "custom", "mxfp8"),
}
# The CUDA control (no HIP simulation): NVIDIA's TE on a simulated H100, where it runs delayed and current
# scaling. MXFP8 needs a Blackwell GPU (compute capability 10.0); block scaling's casts have no CPU kernel.
CUDA_CONTROL = "sm_90"
CUDA_CONTROL_RECIPES = ("delayed", "tensorwise")


@dataclass(frozen=True)
class ProxyTE:
    """The Transformer Engine a verify run gives its ranks (verify --te): its flavour (nvidia, rocm), the
    encoding of its FP8 casts (ocp, fnuz: the flavour's ``fp8``) and the simulated AMD GPU (None: the CUDA path)."""

    flavour: str
    fp8: str
    arch: str | None

    @classmethod
    def of(cls, layer: Any, arch: str | None) -> ProxyTE | None:
        """The TE of a run from its layer (orchestration's TELayer; None: no --te) and its simulated GPU."""
        return None if layer is None else cls(layer.flavour.name, layer.flavour.fp8, arch)


@dataclass(frozen=True)
class Fp8Plan:
    """How the proxy runs an FP8 case: its format and recipe, the encoding its casts must have and the
    GPU the ranks see (gfx942, gfx950, or the CUDA control's sm_90); ``env``: what the ranks'
    environment adds for it (protocol entries); ``refusal``: set where the GPU cannot run the recipe,
    the text the port's argument validation (fp8-arch-check) must refuse the case with."""

    format: str
    recipe: str
    encoding: str
    device: str
    env: tuple[tuple[str, str], ...] = ()
    refusal: str | None = None

    def describe(self) -> str:
        head = f"FP8 {self.format}, {self.recipe} scaling on {self.device}"
        if self.refusal:
            return f"{head}: expected to be refused in argument validation ('{self.refusal} ...')"
        return f"{head}, {self.encoding.upper()} casts"

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "format": self.format,
            "recipe": self.recipe,
            "encoding": self.encoding,
            "device": self.device,
        }
        if self.env:
            out["env"] = dict(self.env)
        if self.refusal:
            out["refusal"] = self.refusal
        return out


def plan_fp8(name: str, args: dict, te: ProxyTE | None) -> Fp8Plan | Unsupported | None:
    """An FP8 case (``--fp8-format``; megatron trains without FP8 otherwise, whatever ``--fp8-recipe``
    says) as the proxy runs it with ``te``: None for a case without FP8."""
    if not _on(args, "--fp8-format"):
        return None
    fmt = str(args["--fp8-format"]).strip()
    recipe = str(args.get("--fp8-recipe") or DEFAULT_FP8_RECIPE).strip()
    what = f"--fp8-format {fmt} --fp8-recipe {recipe}"
    if te is None:
        return Unsupported(
            name,
            "not-on-proxy",
            f"{what}: FP8 runs through TE's FP8 path (TE's Python layer, its casts and FP8 GEMMs on the proxy's "
            "CPU kernels); it needs --te VERSION|auto",
        )
    if te.arch is not None:  # the HIP simulation: the port's fp8-arch-check judges the recipe first
        if recipe not in ROCM_FP8_RECIPES.get(te.arch, ()):
            return Fp8Plan(fmt, recipe, te.fp8, te.arch, refusal=f"--fp8-recipe {recipe}: {te.arch} cannot run")
        if recipe == "mxfp8" and te.flavour == "nvidia":
            # NVIDIA's TE runs MXFP8 from compute capability 10.0: the port asks the installed TE, which refuses.
            refusal = f"--fp8-recipe {recipe}: the installed Transformer Engine cannot run it on {te.arch}"
            return Fp8Plan(fmt, recipe, te.fp8, te.arch, refusal=refusal)
        return Fp8Plan(fmt, recipe, te.fp8, te.arch)
    if recipe not in CUDA_CONTROL_RECIPES:
        why = (
            "MXFP8 under NVIDIA's TE needs a Blackwell GPU (compute capability 10.0)"
            if recipe == "mxfp8"
            else f"the {recipe} recipe's casts have no CPU kernel in the proxy's TE layer"
        )
        return Unsupported(name, "not-on-proxy", f"{what}: {why}; the CUDA control simulates an H100 ({CUDA_CONTROL})")
    return Fp8Plan(fmt, recipe, te.fp8, CUDA_CONTROL, env=tuple(protocol.CUDA_SIM_ARCH.entry(CUDA_CONTROL).items()))


def refusal_in(fp8: Fp8Plan, stderr: str) -> str | None:
    """The port's refusal of ``fp8`` in a run's output (the exception's message, from ``--fp8-format``
    on), or None when the run did not meet it."""
    if not fp8.refusal:
        return None
    for line in stderr.splitlines():
        # the exception's own line ("[rank0]: ValueError: --fp8-format ..."), not a traceback's source line
        m = _EXCEPTION_LINE.match(line.strip())
        if m and fp8.refusal in m.group(1):
            return m.group(1)
    return None


_EXCEPTION_LINE = re.compile(r"^(?:\[rank\d+\]:\s*)?(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception): (.*)$")


# --- upstream's own checks (AFTER_SCRIPT) -------------------------------------------------------

# The feature a case decided by upstream's checks shows (its plan, docs/cases.md).
UPSTREAM_CHECKS = "upstream-checks"


def upstream_checks(name: str, config: dict) -> after_script.AfterScript | Unsupported | None:
    """The case's AFTER_SCRIPT as checks that decide it (None: it has none), or unsupported naming the
    statement verify does not read: a check verify cannot decide is never silently left out."""
    text = config.get("AFTER_SCRIPT")
    if text is None:
        return None
    test_type = str(config.get("TEST_TYPE") or "regular").split("#")[0].strip()
    if not isinstance(text, str):
        return Unsupported(name, "not-on-proxy", f"AFTER_SCRIPT is a {type(text).__name__}, not a script")
    if test_type != "regular":
        # upstream evaluates it after each of the case's runs, over the logs they leave together; verify maps
        # the one run of a regular case only (every case with AFTER_SCRIPT, v0.15 to main, is regular or frozen-start)
        return Unsupported(
            name,
            "not-on-proxy",
            f"AFTER_SCRIPT in a TEST_TYPE {test_type} case: upstream runs it after each of the case's runs over "
            "their logs together; verify decides upstream's checks for a regular case's one run only",
        )
    try:
        return after_script.parse(text)
    except after_script.NotTranslated as e:
        return Unsupported(
            name,
            "not-on-proxy",
            f"AFTER_SCRIPT: {e}; the case is decided by upstream's checks, which verify runs only when it reads "
            "every statement",
        )


# --- the plan ----------------------------------------------------------------------------------


def _fewest_dp(lay: Layout) -> Layout:
    """``lay`` with the smallest dp that expert parallelism still allows."""
    dp = 1
    while (lay.tp * lay.cp * dp) % (lay.ep * lay.etp):
        dp += 1
    return replace(lay, dp=dp)


def plan_case(
    name: str,
    config: dict,
    *,
    data_path: bool = False,
    max_ranks: int = MAX_RANKS,
    te: ProxyTE | None = None,
    cuda: bool = False,
) -> Plan:
    """The case as the proxy runs it, or the one reason it cannot. ``te``: the run's TE (verify --te;
    None: Megatron's local spec), which decides FP8 cases; ``cuda``: the runs take the CUDA path (no HIP
    simulation), where upstream's attention-backend check meets the case's ENV_VARS unported."""
    stop = blocker(name, config, data_path=data_path)
    if stop:
        return stop
    args = config.get("MODEL_ARGS") or {}
    if not args:
        return Unsupported(name, "not-training", "its MODEL_ARGS is empty: no training command to run")
    unknown = unresolved_variables(args)
    if unknown:
        flag, value, var = unknown[0]
        return Unsupported(
            name,
            "not-on-proxy",
            f"{flag} {value}: ${var} is set by upstream CI's launcher environment (envsubst over the YAML), "
            f"and verify has no value for it (it gives only {', '.join(CI_VARIABLES)})",
        )
    checks = upstream_checks(name, config)
    if isinstance(checks, Unsupported):
        return checks
    fp8 = plan_fp8(name, args, te)
    if isinstance(fp8, Unsupported):
        return fp8
    try:
        lay, why_dp = layout(args)
    except BadInput as e:
        return Unsupported(name, "not-on-proxy", f"its layout does not parse: {e}")
    if lay.world > max_ranks and lay.dp > 1:
        # The data-parallel ranks were added to shard; a case that cannot afford them still runs its
        # layout with the optimizer unsharded over one data-parallel rank (said in the notes).
        fewer = _fewest_dp(lay)
        if fewer.world <= max_ranks:
            why_dp = [f"dp{fewer.dp}: dp{lay.dp} would need {lay.world} ranks, over the proxy's {max_ranks}"]
            lay = fewer
    if lay.world > max_ranks:
        return Unsupported(
            name,
            "not-on-proxy",
            f"needs {lay.world} ranks ({lay.describe()}); the proxy runs at most {max_ranks} on one machine",
        )
    te_impl = str(args.get("--transformer-impl") or "transformer_engine") == "transformer_engine"
    if te is not None and te_impl and lay.cp > 1 and not (fp8 and fp8.refusal):
        # TE's get_attention_backend (attention/dot_product_attention/utils.py): "Disabling
        # UnfusedDotProductAttention as it does not support context parallelism". (A case the port
        # must refuse stops in argument validation, before any attention: it runs.)
        return Unsupported(
            name,
            "not-on-proxy",
            f"context parallelism (cp{lay.cp}) with TE's attention: TE runs it only through flash-attention or its "
            "fused attention (CUDA kernels); its unfused path, the one the proxy has, does not support it",
        )
    overrides, notes = shrink(args, lay)
    dropped = []
    for flag, prefix, why in PROXY_DROPPED:
        if _on(args, flag):
            gone = sorted(k for k in args if k == flag or k.startswith(prefix))
            overrides.update(dict.fromkeys(gone, None))
            dropped.append((" ".join(gone), why))
            notes.append(f"{' '.join(gone)} dropped: {why.split(': ', 1)[1]}")
    env_unset = stale_attention_env(config) if cuda else ()
    notes += [why for _, why in env_unset]
    launch_env_unset = fsdp_launch_env(config)
    notes += [why for _, why in launch_env_unset]
    test_type = str(config.get("TEST_TYPE") or "regular").split("#")[0].strip()
    notes = [*why_dp, *notes]
    if test_type == "frozen-resume":
        notes.append("resumes from its own checkpoint: upstream's frozen checkpoint is not published")
    if any(k.startswith("MODEL_ARGS_") for k in config):
        notes.append("runs MODEL_ARGS only: the later MODEL_ARGS_N runs reshard across other GPU counts")
    if checks is not None:
        notes.append(checks.describe())
    if fp8 is not None and fp8.recipe == "mxfp8" and fp8.device == "gfx950" and not fp8.refusal:
        notes.append("NVTE_ROCM_ENABLE_MXFP8=1 from the gfx950 launch profile (ROCm TE runs MXFP8 only with it)")
    return CasePlan(
        case=name,
        test_type=test_type,
        layout=lay,
        case_args=dict(args),
        args=overrides,
        # Every case gets verify's own round trip; upstream's ckpt-resume cases are the ones that ask for it.
        # A case the port must refuse never trains: nothing to resume.
        resume=not (fp8 and fp8.refusal),
        te=te_impl,
        features=features(args, lay, test_type) + (("fp8",) if fp8 else ()) + ((UPSTREAM_CHECKS,) if checks else ()),
        notes=tuple(notes),
        fp8=fp8,
        dropped=tuple(dropped),
        env_unset=env_unset,
        kept=kept_precision(args),
        launch_env_unset=launch_env_unset,
        set_args=proxy_loss_scale(args),
        after_script=checks,
    )


def plan_tree(
    tree: Path, *, data_path: bool = False, max_ranks: int = MAX_RANKS, te: ProxyTE | None = None, cuda: bool = False
) -> dict[str, Plan]:
    """Every GPT case of the tree, planned (``te``, ``cuda``: as plan_case)."""
    out: dict[str, Plan] = {}
    for name in training_cases(tree):
        try:
            config = load_config(tree, name)
        except BadInput as e:
            out[name] = Unsupported(name, "not-on-proxy", str(e))
            continue
        out[name] = plan_case(name, config, data_path=data_path, max_ranks=max_ranks, te=te, cuda=cuda)
    return out


@dataclass
class PlanSummary:
    """Counts for a tree's plans: runnable, and unsupported by kind."""

    runnable: list[str] = field(default_factory=list)
    unsupported: dict[str, list[str]] = field(default_factory=dict)

    @classmethod
    def of(cls, plans: dict[str, Plan]) -> PlanSummary:
        out = cls()
        for name, plan in plans.items():
            if isinstance(plan, CasePlan):
                out.runnable.append(name)
            else:
                out.unsupported.setdefault(plan.kind, []).append(name)
        return out
