"""fp8-arch-check: on HIP, `validate_args()` refuses, in one line naming the arch and the recipe, an
FP8 recipe the device cannot run (gfx942: no MXFP8, its FP8 formats are the FNUZ ones; gfx90a, RDNA,
gfx906: no FP8 at all), instead of a failure deep in a Transformer Engine kernel; MXFP8 on gfx950 gets
NVTE_ROCM_ENABLE_MXFP8=1 where unset. The installed TE's own checks decide too where it has them.
On CUDA nothing changes."""

from __future__ import annotations

import libcst as cst

from rocmport.codemods.base import Codemod, Context
from rocmport.codemods.launch_env import prepend_to_validate_args


class Fp8ArchCheck(Codemod):
    NAME = "fp8-arch-check"
    DESCRIPTION = (
        "On ROCm, validate_args() refuses an FP8 recipe the GPU's arch cannot run (and enables MXFP8 on gfx950)"
    )
    TRIGGERS = ("\ndef validate_args(args",)

    def transform(self, module: cst.Module, ctx: Context):
        return prepend_to_validate_args(
            module,
            ctx,
            "check_fp8_for_arch",
            "on ROCm, the FP8 recipe against the GPU's arch",
            "validate_args() starts with check_fp8_for_arch(args) (HIP, --fp8-format)",
        )
