"""capability-gates: CUDA compute-capability gates go through a HIP-aware helper.

`torch.cuda.get_device_capability()[0]` (cuda_graphs.py) and megatron/training's
`get_device_arch_version()` decide NVIDIA-architecture behaviour (e.g. Blackwell no longer needs
CUDA_DEVICE_MAX_CONNECTIONS=1). On HIP torch reports AMD gfx numbers there, which an RDNA4 GPU (12)
would read as Blackwell: `nvidia_arch_major()` answers Hopper-class (9) on HIP, and exactly what
torch reports on CUDA."""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m
from libcst.metadata import QualifiedNameProvider

from rocmport.codemods.base import Codemod, Context, means
from rocmport.codemods.edits import prepend_to_function, visit_with_helper_import
from rocmport.codemods.guard import helper_import

CAPABILITY = "torch.cuda.get_device_capability"


class _CapabilityIndex(cst.CSTTransformer):
    """`<torch.cuda.get_device_capability>()[0]`, however torch.cuda or the function was imported."""

    METADATA_DEPENDENCIES = (QualifiedNameProvider,)
    SHAPE = m.Subscript(value=m.Call(args=[]), slice=[m.SubscriptElement(m.Index(m.Integer("0")))])

    def __init__(self):
        self.sites = 0
        self.found: list[tuple[cst.CSTNode, str]] = []

    def leave_Subscript(self, original: cst.Subscript, updated: cst.Subscript):
        if m.matches(original, self.SHAPE) and means(self, cst.ensure_type(original.value, cst.Call).func, CAPABILITY):
            self.sites += 1
            self.found.append((original, f"{CAPABILITY}()[0] -> nvidia_arch_major()"))
            return cst.parse_expression("nvidia_arch_major()")
        return updated


class CapabilityGates(Codemod):
    NAME = "capability-gates"
    VERSION = "2"
    DESCRIPTION = "CUDA compute-capability gates go through a HIP-aware nvidia_arch_major()"
    TRIGGERS = ("get_device_capability", "def get_device_arch_version(")
    USES_HELPER = True

    def transform(self, module: cst.Module, ctx: Context):
        gates = _CapabilityIndex()
        before = module
        module, sites = visit_with_helper_import(module, gates, ctx, "nvidia_arch_major")
        ctx.sites_at(before, gates.found)
        module, arch = prepend_to_function(module, ("get_device_arch_version",), (
            f"{helper_import(ctx, 'is_hip', 'HIP_ARCH_EQUIVALENT')}\n"
            "if is_hip():\n"
            "    return HIP_ARCH_EQUIVALENT  # rocmport: AMD gfx numbers are not NVIDIA architectures\n"
        ), "HIP_ARCH_EQUIVALENT", ctx, "get_device_arch_version() answers HIP_ARCH_EQUIVALENT on HIP")
        return module, sites + arch
