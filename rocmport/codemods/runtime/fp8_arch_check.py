"""The `fp8-arch-check` codemod's runtime helpers: an FP8 recipe the GPU's arch cannot run refused in
argument validation on HIP.

Only the text between the `# >>> helper part N` / `# <<< helper part N` markers goes into the
generated helper module (rocmport/codemods/helper.py assembles it, parts in N order); what is
above the first marker is for the type checker and readers (the generated module defines
these names itself)."""

import importlib
import os
import warnings

import torch

from rocmport.codemods.runtime.core import is_hip

# >>> helper part 194
# ---- FP8 by architecture ---------------------------------------------------------------------------

# The FP8 recipes each AMD architecture can run with ROCm Transformer Engine: FP8 needs gfx94x/gfx95x
# ("Device arch gfx94x or gfx95x required for FP8 execution", ROCm/TransformerEngine#359); gfx942 has
# the FNUZ FP8 formats and no MX formats; MXFP8 is gfx95x only, behind NVTE_ROCM_ENABLE_MXFP8 (ROCm TE
# README, "MXFP8 support on ROCm (gfx95x only)"). FP8 block scaling runs on no AMD GPU: ROCm TE's
# check_fp8_block_scaling_support() is False on HIP (quantization.py @030b7921, "FP8 block scaled gemm
# not yet supported for ROCm"). Where the installed TE has its own check, it decides too.
FP8_RECIPES_BY_ARCH = {
    "gfx942": ("delayed", "tensorwise", "custom"),
    "gfx950": ("delayed", "tensorwise", "custom", "mxfp8"),
}
_WHY_NOT = {
    "mxfp8": "MXFP8 needs gfx950; {arch} has the FNUZ FP8 formats",
    "blockwise": "ROCm Transformer Engine has no FP8 block scaling on any AMD GPU",
}
_TE_FP8_CHECKS = {"mxfp8": "check_mxfp8_support", "blockwise": "check_fp8_block_scaling_support"}


def device_arch():
    """The first device's gfx name (gfx942 from 'gfx942:sramecc+:xnack-'); None where there is none."""
    try:
        name = getattr(torch.cuda.get_device_properties(0), "gcnArchName", "") or ""
    except Exception:  # no device (a CPU run): nothing to judge by
        return None
    return name.split(":")[0] or None


def _te_fp8_answer(recipe: str):
    """ROCm TE's own (ok, reason) for ``recipe`` where the installed TE has the check; None otherwise."""
    for module in ("transformer_engine.pytorch.fp8", "transformer_engine.pytorch.quantization"):
        try:
            te_fp8 = importlib.import_module(module)
        except Exception:
            continue
        check = getattr(te_fp8, _TE_FP8_CHECKS.get(recipe, "check_fp8_support"), None)
        if check is None:
            continue
        try:
            ok, reason = check()
        except Exception:
            return None
        return bool(ok), str(reason)
    return None


def check_fp8_for_arch(args, environ=None):
    """On HIP, refuse in argument validation, in one line naming the arch and the recipe, an FP8 recipe
    this device cannot run (instead of failing deep in a kernel); for MXFP8 on gfx950 set
    NVTE_ROCM_ENABLE_MXFP8=1 where unset. Returns the arch judged (None: nothing to judge). CUDA unchanged."""
    if not is_hip() or not getattr(args, "fp8", None):
        return None
    arch = device_arch()
    if arch is None:
        return None
    recipe = str(getattr(args, "fp8_recipe", None) or "delayed")
    recipe = recipe.rsplit(".", 1)[-1]  # an Fp8Recipe enum member prints as Fp8Recipe.mxfp8
    what = f"--fp8-format {args.fp8} --fp8-recipe {recipe}"
    if arch not in FP8_RECIPES_BY_ARCH:
        raise ValueError(f"{what}: {arch} cannot run FP8 (ROCm Transformer Engine runs FP8 on gfx942/gfx950 only); "
                         "train in bf16 (--bf16, without --fp8-format)")
    if recipe not in FP8_RECIPES_BY_ARCH[arch]:
        why = _WHY_NOT.get(recipe, "not among {arch}'s FP8 recipes").format(arch=arch)
        raise ValueError(f"{what}: {arch} cannot run the {recipe} recipe ({why}); "
                         f"use --fp8-recipe {' or '.join(r for r in FP8_RECIPES_BY_ARCH[arch] if r in ('delayed', 'tensorwise'))}")
    if recipe == "mxfp8":
        env = os.environ if environ is None else environ
        current = env.get("NVTE_ROCM_ENABLE_MXFP8")
        if current is None:
            env["NVTE_ROCM_ENABLE_MXFP8"] = "1"
            warnings.warn(f"ROCm {arch} {what}: set NVTE_ROCM_ENABLE_MXFP8=1 (ROCm TE runs MXFP8 only with it; "
                          "export it in the launcher too: `rocmport env --arch gfx950`)", stacklevel=2)
        elif current not in ("1", "2"):
            raise ValueError(f"{what}: {arch} runs MXFP8 only with NVTE_ROCM_ENABLE_MXFP8=1 (it is set to {current!r}); "
                             "export NVTE_ROCM_ENABLE_MXFP8=1")
    te = _te_fp8_answer(recipe)
    if te is not None and not te[0]:
        raise ValueError(f"{what}: the installed Transformer Engine cannot run it on {arch}: {te[1]}")
    return arch


# <<< helper part 194
