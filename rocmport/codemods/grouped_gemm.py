"""grouped-gemm: the grouped_gemm install hint (grouped_gemm_util.py) points at a CUDA-only
repository; on HIP it names AMD's build instead (through `grouped_gemm_hint()`). The sequential
fallback where the package is absent lives in the helper's `disable_missing_fusions`, which the
fused-kernel-fallbacks codemod wires into `validate_args()`: on HIP, --moe-grouped-gemm with the
local implementation and no grouped_gemm falls back to megatron's SequentialMLP with a warning."""

from __future__ import annotations

import libcst as cst

from rocmport.codemods.base import Codemod, Context
from rocmport.codemods.edits import visit_with_helper_import

CUDA_REPO = "fanshiqing/grouped_gemm"


class _HintRewrite(cst.CSTTransformer):
    """Wrap the outermost string literal telling users to pip install the CUDA-only repository."""

    def __init__(self):
        self.sites = 0
        self.found: list[tuple[cst.CSTNode, str]] = []
        self.inside = 0  # > 0 within a concatenation or an existing grouped_gemm_hint(...) call

    def visit_Call(self, node: cst.Call):
        if isinstance(node.func, cst.Name) and node.func.value == "grouped_gemm_hint":
            self.inside += 1

    def leave_Call(self, original: cst.Call, updated: cst.Call):
        if isinstance(original.func, cst.Name) and original.func.value == "grouped_gemm_hint":
            self.inside -= 1
        return updated

    def visit_ConcatenatedString(self, node):
        self.inside += 1

    def leave_ConcatenatedString(self, original, updated):
        self.inside -= 1
        return self._wrap(original, updated)

    def leave_SimpleString(self, original, updated):
        return self._wrap(original, updated)

    def _wrap(self, original, updated):
        text = cst.Module([]).code_for_node(original)
        # Only install hints: docstrings and comments that cite the repository stay as they are.
        if self.inside or CUDA_REPO not in text or "pip install" not in text:
            return updated
        self.sites += 1
        self.found.append((original, "grouped_gemm install hint -> grouped_gemm_hint(...) (AMD's build on HIP)"))
        return cst.Call(func=cst.Name("grouped_gemm_hint"), args=[cst.Arg(updated)])


class GroupedGemm(Codemod):
    NAME = "grouped-gemm"
    DESCRIPTION = "grouped_gemm install hint names AMD's build on HIP (sequential fallback via validate_args)"
    TRIGGERS = (CUDA_REPO,)

    def transform(self, module: cst.Module, ctx: Context):
        hints = _HintRewrite()
        new, sites = visit_with_helper_import(module, hints, ctx, "grouped_gemm_hint")
        ctx.sites_at(module, hints.found)
        return new, sites
