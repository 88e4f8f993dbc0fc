"""The Transformer Engine flavour verify runs on the CPU proxy: ``nvidia``, NVIDIA's Python layer as
released, or ``rocm``, that same layer with the declared ROCm TE deltas below applied when TE is
imported in the started processes (``rocmport.verify.runtime.te_rocm``), and nothing else changed.

ROCm TE (ROCm/TransformerEngine, as AMD's images ship it) follows NVIDIA's Python API at the same
version number, with ROCm branches; a whole current ROCm TE source tree cannot be had here, so verify
runs NVIDIA's wheel plus this list. Each delta names what it changes, its source (a ROCm TE file at a
commit, or the AMD-AGI/Primus runtime patch that works around it) and the ROCm TE versions it holds
for; the report lists the ones a run applied. docs/rocm-te-flavour.md is generated from it
(``render_markdown``; a test keeps the page and the list equal)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from rocmport.verify.runtime import protocol
from rocmport.errors import BadInput

FLAVOURS = ("nvidia", "rocm")
# The started processes learn the flavour through the protocol (runtime/protocol.py).
ENV = protocol.TE_FLAVOUR.name
DELTAS_ENV = protocol.TE_DELTAS.name
VERSION_ENV = protocol.TE_VERSION.name
FP8_ENV = protocol.TE_FP8.name

ROCM_TE = "ROCm/TransformerEngine"
PRIMUS = "AMD-AGI/Primus"


@dataclass(frozen=True)
class Delta:
    """One way ROCm TE's Python layer differs from NVIDIA's at the same version, as Megatron meets it."""

    name: str
    changes: str  # what TE does differently, as the port sees it
    source: str  # where it is declared: ROCm TE file @ commit, or the Primus patch that works around it
    versions: str  # the ROCm TE versions it holds for (a version specifier)
    archs: tuple[str, ...] = ()  # only on these GPUs (empty: every one)
    env: tuple[tuple[str, str], ...] = field(default=())  # variables it sets in the started processes
    # It changes what TE computes, not only which checks pass or which API it offers: stage 4's CUDA-path
    # twin of an FP8 case carries it (cuda_twin), so the twin computes what the ROCm path must.
    arithmetic: bool = False

    def holds_for(self, version: str, arch: str | None) -> bool:
        try:
            v = Version(version)
        except InvalidVersion:
            return False
        if not SpecifierSet(self.versions).contains(v, prereleases=True):
            return False
        return not self.archs or arch in self.archs


DELTAS: tuple[Delta, ...] = (
    Delta(
        "keep-fp8-weight-transpose-cache",
        "Linear, LayerNormLinear and LayerNormMLP take keep_fp8_weight_transpose_cache=True "
        "(NVIDIA's refuse the keyword); inspect.signature shows it, as Primus's has_parameter check reads it",
        f"{ROCM_TE} transformer_engine/pytorch/module/linear.py @024085c5 (module/rocm_utils.py); "
        f"{PRIMUS} te_patches/linear_fp8_cache_patches.py @37533ff5, layernorm_linear_fp8_cache_patches.py @f670d910",
        ">=1.9",
    ),
    Delta(
        "get-workspace-without-workspace-parameter",
        "transformer_engine.pytorch.module.base still exports get_workspace() while general_gemm() takes no "
        "workspace argument (NVIDIA removed both in 2.10): Megatron's te_general_gemm imports both and passes "
        "workspace=, which such a build rejects",
        f"{ROCM_TE} transformer_engine/pytorch/cpp_extensions/gemm.py @01b52037 (general_gemm without workspace); "
        f"{PRIMUS} te_patches/general_gemm_workspace_patches.py @4e19d529 and "
        "megatron_lm_source/megatron_te_general_gemm_workspace_compat.patch @d6f5ca40",
        ">=2.10",
    ),
    Delta(
        "fused-attn-backends-ck-aotriton",
        "FusedAttnBackend and transformer_engine_torch.NVTE_Fused_Attn_Backend have No_Backend, AOTriton and CK "
        "instead of F16_max512_seqlen, F16_arbitrary_seqlen and FP8",
        f"{ROCM_TE} transformer_engine/pytorch/cpp_extensions/fused_attn.py @0082af5c (IS_HIP_EXTENSION branch); "
        "common fused_attn.h: NVTE_No_Backend = -1, NVTE_AOTriton = 0, NVTE_CK = 1",
        ">=1.9",
    ),
    Delta(
        "cudnn-version-99",
        "get_cudnn_version() answers (99, 0, 0): every cuDNN-version gate of TE's and Megatron's passes",
        f"{ROCM_TE} transformer_engine/pytorch/utils.py @264fb345 (get_cudnn_version on HIP)",
        ">=1.9",
    ),
    Delta(
        "fp8-fnuz-on-gfx942",
        "FP8 is FNUZ on gfx942: E4M3 is float8_e4m3fnuz (max 240, not 448), E5M2 float8_e5m2fnuz; one NaN "
        "(0x80), no negative zero; casts, scale updates and Format's maxima follow, and so does the E4M3 maximum "
        "tensor/utils.py scales FP8 master weights to (current and block scaling: 240, NVIDIA's hard-codes 448); "
        "utils.is_fp8_fnuz() is True and get_torch_float8_e4m3_type() returns float8_e4m3fnuz",
        f"{ROCM_TE} transformer_engine/pytorch/utils.py @264fb345 (is_fp8_fnuz); "
        "transformer_engine/common/recipe/__init__.py @2e633d4c (_FormatHelper: OCP and FNUZ maxima); "
        "transformer_engine/pytorch/tensor/utils.py @0861ac56 (max_fp8 = 240.0 if is_fp8_fnuz() else 448.0)",
        ">=1.9",
        archs=("gfx942",),
        arithmetic=True,
    ),
    Delta(
        "fp8-support-by-gfx",
        "check_fp8_support(): FP8 (delayed, current scaling) on gfx94x, gfx95x and (12, 5) only, else "
        "'Device arch gfx94x or newer is required for FP8 execution.'",
        f"{ROCM_TE} transformer_engine/pytorch/quantization.py @030b7921 (check_fp8_support)",
        ">=2.9",
    ),
    Delta(
        "fp8-block-scaling-unsupported",
        "check_fp8_block_scaling_support(): Float8BlockScaling is never supported "
        "('FP8 block scaled gemm not yet supported for ROCm')",
        f"{ROCM_TE} transformer_engine/pytorch/quantization.py @030b7921 (check_fp8_block_scaling_support)",
        ">=2.9",
    ),
    Delta(
        "mxfp8-gfx950-behind-env",
        "check_mxfp8_support(): MXFP8 only with NVTE_ROCM_ENABLE_MXFP8 set (not 0) and on gfx95x or (12, 5); "
        "the default recipe is DelayedScaling unless NVTE_ROCM_ENABLE_MXFP8=2",
        f"{ROCM_TE} transformer_engine/pytorch/quantization.py @030b7921 (check_mxfp8_support, get_default_fp8_recipe)",
        ">=2.9",
    ),
    Delta(
        "baked-attention-env",
        "NVTE_FLASH_ATTN=0 and NVTE_FUSED_ATTN=1 are set, as AMD's images bake them",
        f"{PRIMUS} attention_backend_patches.py @8f207527 (stock Megatron's attention-backend check meets them)",
        ">=1.9",
        env=(("NVTE_FLASH_ATTN", "0"), ("NVTE_FUSED_ATTN", "1")),
    ),
    Delta(
        "rocm-version-string",
        "transformer_engine.__version__ carries a pre-release and a ROCm local tag, "
        "<release>.dev0+rocm<major>.<minor> (packaging orders 2.12.0.dev0 below 2.12.0: a gate written "
        ">= 2.12.0 takes the older path)",
        f"{PRIMUS} pins transformer-engine 2.15.0.dev0+rocm7.15.0a20260724.2a26bf8 (its Docker release image)",
        ">=1.9",
    ),
)
BY_NAME = {d.name: d for d in DELTAS}

# NVTE_Fused_Attn_Backend's values as each library's fused_attn.h declares them (the names come from TE's Python).
NVIDIA_BACKENDS = {"NVTE_No_Backend": -1, "NVTE_F16_max512_seqlen": 0, "NVTE_F16_arbitrary_seqlen": 1, "NVTE_FP8": 2}
ROCM_BACKENDS = {"NVTE_No_Backend": -1, "NVTE_AOTriton": 0, "NVTE_CK": 1}
ROCM_CUDNN = 990000  # (99, 0, 0) as TE's get_cudnn_version() decodes it

# The FP8 encodings of each family, as the CPU kernels name the formats they cast to (te_fp8.CASTS).
FP8_ENCODINGS = {"ocp": ("e4m3fn", "e5m2"), "fnuz": ("e4m3fnuz", "e5m2fnuz")}


def fp8_casts_differ(casts: dict[str, int], family: str) -> str | None:
    """Why the FP8 casts a run made (encoding -> count, summed over its ranks) are not the run's
    family's (``ocp`` or ``fnuz``): none made, or some in another encoding; None when they are."""
    if not casts:
        return "no FP8 cast ran (the FP8 path was not taken)"
    other = {name: n for name, n in casts.items() if name not in FP8_ENCODINGS.get(family, ())}
    if other:
        return (
            f"FP8 casts in {', '.join(f'{k} ×{v}' for k, v in sorted(other.items()))}, "
            f"not the {family.upper()} encodings ({', '.join(FP8_ENCODINGS.get(family, ()))}) this flavour and GPU use"
        )
    return None


def parse(text: str | None, hip_on: bool) -> str:
    """``--te-flavour``'s value: rocm by default under the HIP simulation, nvidia without it."""
    if text is None:
        return "rocm" if hip_on else "nvidia"
    if text not in FLAVOURS:
        raise BadInput(f"--te-flavour {text[:40]!r}: choose one of {', '.join(FLAVOURS)}")
    if text == "rocm" and not hip_on:
        raise BadInput(
            "--te-flavour rocm: ROCm TE runs on a ROCm build of torch; drop --no-hip-sim or pass --te-flavour nvidia"
        )
    return text


def applicable(version: str, arch: str | None) -> list[Delta]:
    """The deltas the rocm flavour applies to TE ``version`` on GPU ``arch``, in declaration order."""
    return [d for d in DELTAS if d.holds_for(version, arch)]


def reported_version(version: str, hip_version: str | None) -> str:
    """The version string ROCm TE of ``version`` reports on a ROCm ``hip_version``: 2.12.0.dev0+rocm7.1."""
    release = Version(version).base_version
    major, minor = (hip_version or "7.1").split(".")[:2]
    minor = re.match(r"[0-9]+", minor)[0] if re.match(r"[0-9]+", minor) else "0"  # type: ignore[index]
    return f"{release}.dev0+rocm{major}.{minor}"


@dataclass(frozen=True)
class TEFlavour:
    """The flavour of a verify run's TE (the report's ``te.flavour``)."""

    name: str
    deltas: tuple[Delta, ...] = ()
    version_reported: str | None = None
    fp8: str = "ocp"

    def env(self) -> dict[str, str | None]:
        out: dict[str, str | None] = {
            ENV: self.name,
            FP8_ENV: self.fp8,
            DELTAS_ENV: ",".join(d.name for d in self.deltas),
        }
        out[VERSION_ENV] = self.version_reported
        for delta in self.deltas:
            out.update(dict(delta.env))
        return out

    def describe(self) -> str:
        if self.name == "nvidia":
            return "NVIDIA's Python layer as released (ROCm TE differences not simulated)"
        return (
            f"ROCm TE flavour: NVIDIA's Python layer with {len(self.deltas)} declared ROCm deltas "
            f"({', '.join(d.name for d in self.deltas)}); reports {self.version_reported}; FP8 {self.fp8.upper()}"
        )

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "version_reported": self.version_reported,
            "fp8": self.fp8,
            "deltas": [
                {"name": d.name, "changes": d.changes, "source": d.source, "versions": d.versions} for d in self.deltas
            ],
        }


def choose(name: str, version: str, arch: str | None, hip_version: str | None) -> TEFlavour:
    if name == "nvidia":
        return TEFlavour("nvidia")
    deltas = tuple(applicable(version, arch))
    fnuz = any(d.name == "fp8-fnuz-on-gfx942" for d in deltas)
    return TEFlavour("rocm", deltas, reported_version(version, hip_version), "fnuz" if fnuz else "ocp")


def cuda_twin(flavour: TEFlavour) -> TEFlavour:
    """The TE of stage 4's CUDA-path twin of an FP8 case run under ``flavour``: NVIDIA's Python layer with
    only the deltas that change arithmetic (FNUZ on gfx942), reporting NVIDIA's version string. The port's
    CUDA path with it computes what its ROCm path must: measured equal to every logged digit (v0.16, gfx942);
    the other deltas change which checks pass and which API TE offers, which the CUDA path must not meet."""
    deltas = tuple(d for d in flavour.deltas if d.arithmetic)
    return TEFlavour("rocm", deltas, None, flavour.fp8) if deltas else TEFlavour("nvidia", fp8=flavour.fp8)


# ---- in the started processes (te_cpu and te_rocm ask) ----


def active() -> set[str]:
    """The deltas this process applies (none under the nvidia flavour)."""
    if os.environ.get(ENV) != "rocm":
        return set()
    return {n for n in os.environ.get(DELTAS_ENV, "").split(",") if n}


def _te_source(relative: str) -> str | None:
    root = protocol.TE_PATH.read()
    path = Path(root, "transformer_engine", relative) if root else None
    try:
        return path.read_text(encoding="utf-8") if path else None
    except OSError:
        return None


def fused_attn_backends() -> dict[str, int]:
    """The members of ``NVTE_Fused_Attn_Backend``: the names TE's own fused_attn.py uses (each release
    mirrors the enum there; 2.20 dropped F16_max512_seqlen and asserts the two agree), with the values
    its library declares; ROCm TE's (No_Backend, AOTriton, CK) under the fused-attn delta."""
    if "fused-attn-backends-ck-aotriton" in active():
        return dict(ROCM_BACKENDS)
    source = _te_source("pytorch/cpp_extensions/fused_attn.py")
    names = list(dict.fromkeys(re.findall(r"NVTE_Fused_Attn_Backend\.(NVTE_\w+)", source or "")))
    if not names:
        return dict(NVIDIA_BACKENDS)
    return {n: NVIDIA_BACKENDS.get(n, 100 + i) for i, n in enumerate(names)}


def cudnn_version_encoded() -> int:
    return ROCM_CUDNN if "cudnn-version-99" in active() else 0


# ---- the documentation page ----


def render_markdown() -> str:
    """docs/rocm-te-flavour.md's delta table (the page's generated part)."""
    rows = [
        "| Delta | What changes | Source | ROCm TE versions | GPUs |",
        "|---|---|---|---|---|",
    ]
    for d in DELTAS:
        cells = [f"`{d.name}`", d.changes, d.source, f"`{d.versions}`", ", ".join(d.archs) or "all"]
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(rows) + "\n"
