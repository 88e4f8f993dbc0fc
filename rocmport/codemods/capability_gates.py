"""capability-gates: CUDA compute-capability gates go through a HIP-aware helper.

`torch.cuda.get_device_capability()[0]` (cuda_graphs.py) and megatron/training's
`get_device_arch_version()` decide NVIDIA-architecture behaviour (e.g. Blackwell no longer needs
CUDA_DEVICE_MAX_CONNECTIONS=1). On HIP torch reports AMD gfx numbers there, which an RDNA4 GPU (12)
would read as Blackwell: `nvidia_arch_major()` answers Hopper-class (9) on HIP, and exactly what
torch reports on CUDA."""

from __future__ import annotations

import libcst as cst

from rocmport.codemods.base import Codemod, Context, dotted
from rocmport.codemods.edits import prepend_to_function, visit_with_helper_import
from rocmport.codemods.guard import helper_import


class _CapabilityIndex(cst.CSTTransformer):
    def __init__(self):
        self.sites = 0

    def leave_Subscript(self, original: cst.Subscript, updated: cst.Subscript):
        value = original.value
        if (isinstance(value, cst.Call) and dotted(value.func) == "torch.cuda.get_device_capability" and not value.args
                and len(original.slice) == 1 and isinstance(original.slice[0].slice, cst.Index)
                and isinstance(original.slice[0].slice.value, cst.Integer) and original.slice[0].slice.value.value == "0"):
            self.sites += 1
            return cst.parse_expression("nvidia_arch_major()")
        return updated


class CapabilityGates(Codemod):
    NAME = "capability-gates"
    VERSION = "1"
    DESCRIPTION = "CUDA compute-capability gates go through a HIP-aware nvidia_arch_major()"
    TRIGGERS = ("torch.cuda.get_device_capability()[0]", "def get_device_arch_version(")
    USES_HELPER = True

    def transform(self, module: cst.Module, ctx: Context):
        module, sites = visit_with_helper_import(module, _CapabilityIndex(), helper_import(ctx, "nvidia_arch_major"))
        module, arch = prepend_to_function(module, ("get_device_arch_version",), (
            f"{helper_import(ctx, 'is_hip', 'HIP_ARCH_EQUIVALENT')}\n"
            "if is_hip():\n"
            "    return HIP_ARCH_EQUIVALENT  # rocmport: AMD gfx numbers are not NVIDIA architectures\n"
        ), "HIP_ARCH_EQUIVALENT")
        return module, sites + arch
