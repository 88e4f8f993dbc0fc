"""deterministic-env: with --deterministic-mode on HIP, `validate_args()` makes sure of the ROCm
extras besides upstream's NCCL_ALGO check: ROCBLAS_DEFAULT_ATOMICS_MODE=0 (rocBLAS GEMMs without
atomics) and NCCL_ALGO=Ring are set when missing, with a warning naming them; a contradicting value
(e.g. ROCBLAS_DEFAULT_ATOMICS_MODE=1) is a clear error. The values are rocmport's deterministic
launcher environment (rocmport/launch_env.py). On CUDA nothing changes."""

from __future__ import annotations

import libcst as cst

from rocmport.codemods.base import Codemod, Context
from rocmport.codemods.launch_env import prepend_to_validate_args


class DeterministicEnv(Codemod):
    NAME = "deterministic-env"
    DESCRIPTION = "On ROCm with --deterministic-mode, validate_args() sets ROCBLAS_DEFAULT_ATOMICS_MODE=0 / NCCL_ALGO (or errors clearly)"
    TRIGGERS = ("\ndef validate_args(args",)

    def transform(self, module: cst.Module, ctx: Context):
        return prepend_to_validate_args(
            module,
            ctx,
            "apply_deterministic_env",
            "on ROCm, deterministic-mode extras",
            "validate_args() starts with apply_deterministic_env(args) (HIP, --deterministic-mode)",
        )
