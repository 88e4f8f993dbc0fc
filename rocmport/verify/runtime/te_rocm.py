"""The rocm TE flavour applied in verify's started processes: each delta te_flavour declares (and the
run chose: protocol.TE_DELTAS) made to NVIDIA's Python layer as its modules are imported, and
nothing else. Installed by ``te_loader.install``, through module_hooks.ModuleHooks, when protocol.TE_FLAVOUR is ``rocm``.

A delta that cannot be applied to the TE release in use (its source no longer has what the delta
rewrites) stops the import naming the delta: never a silent NVIDIA behaviour under the rocm name."""

from __future__ import annotations

import functools
import importlib.metadata
import inspect
import os
import re
import sys
from typing import Any, Callable, Literal

from rocmport.verify.runtime import te_flavour
from rocmport.verify.runtime.module_hooks import Hook, ModuleHooks

APPLIED: list[str] = []  # the deltas this process applied, in order (tests and the worker read it)


class DeltaNotApplicable(ImportError):
    def __init__(self, delta: str, why: str) -> None:
        super().__init__(f"rocm TE flavour: delta {delta} cannot be applied to this TE: {why}")


# ---- the deltas, by name: (module they change, "source" rewrite before it runs | "after" it ran, how) ----


def _rewrite_fused_attn(source: str) -> str:
    """FusedAttnBackend's NVIDIA members (dict entries up to 2.19, IntEnum attributes from 2.20)
    replaced by ROCm TE's AOTriton and CK, in the same form, where the first of them stood."""
    dict_entry = re.compile(
        r'^(?P<indent>[ \t]*)"(?:F16_max512_seqlen|F16_arbitrary_seqlen|FP8)"\s*:\s*'
        r"NVTE_Fused_Attn_Backend\.NVTE_\w+,[ \t]*\n",
        re.M,
    )
    attribute = re.compile(
        r"^(?P<indent>[ \t]*)(?:F16_max512_seqlen|F16_arbitrary_seqlen|FP8)\s*=\s*"
        r"int\(NVTE_Fused_Attn_Backend\.NVTE_\w+\)[ \t]*\n",
        re.M,
    )
    for pattern, form in (
        (
            dict_entry,
            '{i}"AOTriton": NVTE_Fused_Attn_Backend.NVTE_AOTriton,\n{i}"CK": NVTE_Fused_Attn_Backend.NVTE_CK,\n',
        ),
        (
            attribute,
            "{i}AOTriton = int(NVTE_Fused_Attn_Backend.NVTE_AOTriton)\n{i}CK = int(NVTE_Fused_Attn_Backend.NVTE_CK)\n",
        ),
    ):
        found = list(pattern.finditer(source))
        if found:
            first = found[0]
            out, last = [source[: first.start()], form.format(i=first["indent"])], first.end()
            for m in found[1:]:
                out.append(source[last : m.start()])
                last = m.end()
            out.append(source[last:])
            return "".join(out)
    raise DeltaNotApplicable("fused-attn-backends-ck-aotriton", "fused_attn.py declares no FusedAttnBackend members")


def _keep_fp8_cache(module) -> None:
    """ROCm TE's extra constructor keyword on the three GEMM modules, visible to inspect.signature."""
    names = {
        "transformer_engine.pytorch.module.linear": "Linear",
        "transformer_engine.pytorch.module.layernorm_linear": "LayerNormLinear",
        "transformer_engine.pytorch.module.layernorm_mlp": "LayerNormMLP",
    }
    cls = getattr(module, names[module.__name__], None)
    if cls is None:
        raise DeltaNotApplicable(
            "keep-fp8-weight-transpose-cache", f"{module.__name__} has no {names[module.__name__]}"
        )
    original = cls.__init__
    signature = inspect.signature(original)
    if "keep_fp8_weight_transpose_cache" in signature.parameters:
        return

    @functools.wraps(original)
    def __init__(self, *args: Any, keep_fp8_weight_transpose_cache: bool = True, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        # ROCm TE drops the FP8 weight's transpose after use when False (memory); the values are the same
        self.keep_fp8_weight_transpose_cache = keep_fp8_weight_transpose_cache

    params = list(signature.parameters.values())
    extra = inspect.Parameter(
        "keep_fp8_weight_transpose_cache", inspect.Parameter.KEYWORD_ONLY, default=True, annotation=bool
    )
    at = next((i for i, p in enumerate(params) if p.kind is inspect.Parameter.VAR_KEYWORD), len(params))
    __init__.__signature__ = signature.replace(parameters=params[:at] + [extra] + params[at:])  # type: ignore[attr-defined]
    cls.__init__ = __init__


def _get_workspace(module) -> None:
    """module.base.get_workspace() kept (a ROCm build's hipBLASLt workspace) beside a general_gemm
    without the argument."""
    import torch

    if hasattr(module, "get_workspace"):
        return

    def get_workspace() -> torch.Tensor:
        """Returns workspace for hipBLASLt (ROCm TE keeps it exported)."""
        return torch.empty(0, dtype=torch.uint8)

    module.get_workspace = get_workspace


def _fnuz_utils(module) -> None:
    import torch

    module.is_fp8_fnuz = lambda: True
    module.get_torch_float8_e4m3_type = lambda: torch.float8_e4m3fnuz
    module.get_torch_float8_e5m2_type = lambda: torch.float8_e5m2fnuz


def _fnuz_formats(module) -> None:
    """Format's maxima the FNUZ ones (ROCm TE's _FormatHelper picks them on gfx942): E4M3 240."""
    helper, fmt = getattr(module, "_FormatHelper", None), getattr(module, "Format", None)
    if helper is None or fmt is None:
        raise DeltaNotApplicable("fp8-fnuz-on-gfx942", "transformer_engine.common.recipe has no Format/_FormatHelper")
    for member, value in (
        (fmt.E4M3, helper(max_fwd=240, max_bwd=240)),
        (fmt.HYBRID, helper(max_fwd=240, max_bwd=fmt.E5M2.value.max_bwd)),
    ):
        member._value_ = value
        # Format(value) finds the member by its value: a recipe pickled into a checkpoint's TE extra
        # state (delayed scaling's) comes back as Format(its FNUZ value) when training resumes.
        fmt._value2member_map_[value] = member


def _fnuz_master_weights(source: str) -> str:
    """The FP8 maximum of E4M3 in tensor/utils.py's cast of master weights to current-scaling (and
    blockwise) FP8 weights (Megatron's --fp8-param-gather): NVIDIA's hard-codes 448, ROCm TE's reads
    ``240.0 if is_fp8_fnuz() else 448.0``; with 448 a FNUZ cast (max 240) would saturate every weight
    above 240/448 of the amax."""
    pattern = re.compile(r"^(?P<indent>[ \t]*)max_fp8 = 448\.0[ \t]*$", re.M)
    if not pattern.search(source):
        raise DeltaNotApplicable("fp8-fnuz-on-gfx942", "tensor/utils.py sets no 'max_fp8 = 448.0' for E4M3")
    return pattern.sub(r"\g<indent>max_fp8 = 240.0  # rocm TE on gfx942: 240.0 if is_fp8_fnuz() else 448.0", source)


def _capability() -> tuple[int, int]:
    import torch

    return tuple(torch.cuda.get_device_capability())


def _fp8_support(module) -> None:
    def check_fp8_support() -> tuple[bool, str]:
        if _capability() in ((9, 4), (9, 5), (12, 5)):
            return True, ""
        return False, "Device arch gfx94x or newer is required for FP8 execution."

    _replace(module, "check_fp8_support", check_fp8_support, "fp8-support-by-gfx")


def _block_scaling(module) -> None:
    def check_fp8_block_scaling_support() -> tuple[bool, str]:
        return False, "FP8 block scaled gemm not yet supported for ROCm"

    _replace(
        module, "check_fp8_block_scaling_support", check_fp8_block_scaling_support, "fp8-block-scaling-unsupported"
    )


def _mxfp8(module) -> None:
    def check_mxfp8_support() -> tuple[bool, str]:
        if os.getenv("NVTE_ROCM_ENABLE_MXFP8", "0") == "0":
            return False, "MXFP8 support is not enabled."
        if _capability() in ((9, 5), (12, 5)):
            return True, ""
        return False, "Device arch gfx95x or newer is required for MXFP8 execution."

    _replace(module, "check_mxfp8_support", check_mxfp8_support, "mxfp8-gfx950-behind-env")
    recipe = sys.modules.get("transformer_engine.common.recipe")
    if recipe is not None and hasattr(module, "get_default_fp8_recipe"):

        def get_default_fp8_recipe():
            if os.getenv("NVTE_ROCM_ENABLE_MXFP8", "0") == "2" and check_mxfp8_support()[0]:
                return recipe.MXFP8BlockScaling()
            return recipe.DelayedScaling()

        module.get_default_fp8_recipe = get_default_fp8_recipe


def _replace(module, name: str, fn: Callable, delta: str) -> None:
    if not hasattr(module, name):
        raise DeltaNotApplicable(delta, f"{module.__name__} has no {name}")
    fn.__name__ = fn.__qualname__ = name
    setattr(module, name, fn)


def _version(module) -> None:
    reported = os.environ.get(te_flavour.VERSION_ENV)
    if not reported:
        return
    module.__version__ = reported
    original = importlib.metadata.version

    def version(name: str) -> str:
        if name.replace("_", "-").lower() == "transformer-engine":
            return reported
        return original(name)

    importlib.metadata.version = version  # type: ignore[assignment]


QUANTIZATION = ("transformer_engine.pytorch.quantization", "transformer_engine.pytorch.fp8")
HOOKS: dict[str, list[tuple[str, Literal["source", "after"], Callable]]] = {
    "keep-fp8-weight-transpose-cache": [
        ("transformer_engine.pytorch.module.linear", "after", _keep_fp8_cache),
        ("transformer_engine.pytorch.module.layernorm_linear", "after", _keep_fp8_cache),
        ("transformer_engine.pytorch.module.layernorm_mlp", "after", _keep_fp8_cache),
    ],
    "get-workspace-without-workspace-parameter": [("transformer_engine.pytorch.module.base", "after", _get_workspace)],
    "fused-attn-backends-ck-aotriton": [
        ("transformer_engine.pytorch.cpp_extensions.fused_attn", "source", _rewrite_fused_attn)
    ],
    "cudnn-version-99": [],  # the CPU extension's answer (te_cpu.get_cudnn_version)
    "fp8-fnuz-on-gfx942": [
        ("transformer_engine.pytorch.utils", "after", _fnuz_utils),
        ("transformer_engine.common.recipe", "after", _fnuz_formats),
        ("transformer_engine.pytorch.tensor.utils", "source", _fnuz_master_weights),
    ],
    "fp8-support-by-gfx": [(QUANTIZATION[0], "after", _fp8_support)],
    "fp8-block-scaling-unsupported": [(QUANTIZATION[0], "after", _block_scaling)],
    "mxfp8-gfx950-behind-env": [(QUANTIZATION[0], "after", _mxfp8)],
    "baked-attention-env": [],  # its variables are in the started processes' environment (te_flavour)
    "rocm-version-string": [("transformer_engine", "after", _version)],
}


def _recorded(delta: str, module: str, how: Callable) -> Callable:
    """``how`` as a te_loader hook that, once it has run, records the delta in APPLIED."""

    def hook(arg: Any) -> Any:
        out = how(arg)
        APPLIED.append(f"{delta} ({module})")
        return out

    return hook


def install() -> None:
    """Apply the chosen deltas to TE as it is imported (nothing when the flavour is not rocm)."""
    deltas = sorted(te_flavour.active())
    unknown = [d for d in deltas if d not in HOOKS]
    if unknown:
        raise DeltaNotApplicable(unknown[0], "rocmport has no implementation of it")
    by_module: dict[str, list[Hook]] = {}
    for name in deltas:
        for module, when, how in HOOKS[name]:
            by_module.setdefault(module, []).append((when, _recorded(name, module, how)))
    if by_module:
        sys.meta_path.insert(0, ModuleHooks(by_module))
