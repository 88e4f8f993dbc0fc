"""libcst codemods: a registry of one-module-per-codemod transforms and the layered runner.

`compute_layers(tree, codemods)` parses each triggered file once, runs the selected codemods in
order and returns one Layer per codemod (the files it changed, with their text after it)."""

from rocmport.codemods.apex_to_torch import ApexToTorch
from rocmport.codemods.base import Codemod, Context
from rocmport.codemods.fused_kernel_fallbacks import FusedKernelFallbacks
from rocmport.codemods.guard_nvidia_only_imports import GuardNvidiaOnlyImports

registry: dict[str, Codemod] = {c.NAME: c for c in (ApexToTorch(), FusedKernelFallbacks(), GuardNvidiaOnlyImports())}

from rocmport.codemods.runner import FileFailure, Layer, LayersResult, compute_layers  # noqa: E402

__all__ = ["Codemod", "Context", "FileFailure", "Layer", "LayersResult", "compute_layers", "registry"]
