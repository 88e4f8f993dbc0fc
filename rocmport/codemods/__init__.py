"""libcst codemods: a registry of one-module-per-codemod transforms and the layered runner.

`compute_layers(tree, codemods)` parses each triggered file once, runs the selected codemods in
order and returns one Layer per codemod (the files it changed, with their text after it)."""

from rocmport.codemods.apex_to_torch import ApexToTorch
from rocmport.codemods.attention_backend_env import AttentionBackendEnv
from rocmport.codemods.base import Codemod, Context
from rocmport.codemods.capability_gates import CapabilityGates
from rocmport.codemods.device_probes import DeviceProbes
from rocmport.codemods.flash_attention_hooks import FlashAttentionHooks
from rocmport.codemods.fused_kernel_fallbacks import FusedKernelFallbacks
from rocmport.codemods.grouped_gemm import GroupedGemm
from rocmport.codemods.guard_nvidia_only_imports import GuardNvidiaOnlyImports
from rocmport.codemods.te_version_gates import TeVersionGates

registry: dict[str, Codemod] = {
    c.NAME: c
    for c in (ApexToTorch(), FusedKernelFallbacks(), GuardNvidiaOnlyImports(), AttentionBackendEnv(), TeVersionGates(),
              DeviceProbes(), FlashAttentionHooks(), CapabilityGates(), GroupedGemm())
}

from rocmport.codemods.runner import FileFailure, Layer, LayersResult, compute_layers  # noqa: E402

__all__ = ["Codemod", "Context", "FileFailure", "Layer", "LayersResult", "compute_layers", "registry"]
