"""launch-env: on HIP, `validate_args()` starts by setting the AMD launcher defaults a launcher
forgot (CUDA_DEVICE_MAX_CONNECTIONS=1, HSA_NO_SCRATCH_RECLAIM=1, GPU_MAX_HW_QUEUES=2,
TORCH_NCCL_HIGH_PRIORITY=1, ...), with setdefault so the user's value wins, and prints what it set
on rank 0. The list is rocmport's launcher environment (rocmport/launch_env.py, rendered into the
generated helper), the one `rocmport env`, verify and the container recipe use. tp > 1 then no
longer stops at arguments.py's CUDA_DEVICE_MAX_CONNECTIONS assertion. With FSDP (which asserts that
variable is not 1) it is left unset. On CUDA nothing is set."""

from __future__ import annotations

import libcst as cst

from rocmport.codemods.base import Codemod, Context
from rocmport.codemods.edits import prepend_to_function
from rocmport.codemods.guard import helper_import

VALIDATE_ARGS = "megatron/training/arguments.py"


def prepend_to_validate_args(
    module: cst.Module, ctx: Context, helper: str, comment: str, note: str
) -> tuple[cst.Module, int]:
    """`from <helper module> import helper; helper(args)  # comment` first thing in validate_args()."""
    if not ctx.relpath.endswith(VALIDATE_ARGS):
        return module, 0
    code = f"{helper_import(ctx, helper)}\n{helper}(args)  # rocmport: {comment}\n"
    return prepend_to_function(module, ("validate_args",), code, f"{helper}(args)", ctx, note)


class LaunchEnv(Codemod):
    NAME = "launch-env"
    DESCRIPTION = "On ROCm, validate_args() first sets the AMD launcher defaults a launcher forgot (user values win)"
    TRIGGERS = ("\ndef validate_args(args",)

    def transform(self, module: cst.Module, ctx: Context):
        return prepend_to_validate_args(
            module,
            ctx,
            "apply_launch_env",
            "on ROCm, AMD launcher defaults (setdefault)",
            "validate_args() starts with apply_launch_env(args) (HIP only)",
        )
