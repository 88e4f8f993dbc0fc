"""hip-runtime-link: from v0.16 megatron/core/inference/unified_memory.py's `compile_allocator` (v0.15:
module level, built at first use on ROCm by patch 0002) builds the unified-memory allocator with
`load_inline(..., with_cuda=True, extra_ldflags=_extra_ldflags)`, `_extra_ldflags = ["-lcudart"]`.
ROCm has no libcudart: the link fails, the failure is caught, and unified memory is silently
unavailable. On HIP the flags link the HIP runtime instead (`-L{ROCM_HOME}/lib -lamdhip64`, as AMD
links it); torch's load_inline hipifies the source itself (cuda_runtime_api.h, cudaMallocManaged,
cudaMemAdvise ... have HIP spellings; `CUDART_VERSION` is undefined on HIP, so the pre-CUDA-13
`int device` branch compiles, which is HIP's signature).

Matched by construct: the `extra_ldflags` of a torch.utils.cpp_extension load/load_inline call,
however imported, that is a list naming `-lcudart`, or a name this module assigns such a list.
The value becomes `hip_runtime_ldflags(<value>)`. CUDA unchanged."""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from rocmport.codemods.base import NAMES, Codemod, Context, means
from rocmport.codemods.edits import visit_with_helper_import

BUILDERS = ("torch.utils.cpp_extension.load_inline", "torch.utils.cpp_extension.load")
LCUDART = m.List(
    elements=[
        m.ZeroOrMore(),
        m.Element(m.SimpleString(m.MatchIfTrue(lambda s: s.strip("'\"") == "-lcudart"))),
        m.ZeroOrMore(),
    ]
)
HELPER = "hip_runtime_ldflags"


class _CudartLists(cst.CSTVisitor):
    """Names this module assigns a list naming -lcudart (`_extra_ldflags = ["-lcudart"]`)."""

    def __init__(self):
        self.names: set[str] = set()

    def visit_Assign(self, node: cst.Assign) -> None:
        if m.matches(node.value, LCUDART):
            self.names.update(t.target.value for t in node.targets if isinstance(t.target, cst.Name))


class _CudartLink(cst.CSTTransformer):
    METADATA_DEPENDENCIES = NAMES

    def __init__(self, names: set[str]):
        self.names = names
        self.sites = 0
        self.found: list[tuple[cst.CSTNode, str]] = []

    def _links_cudart(self, value: cst.BaseExpression) -> bool:
        return m.matches(value, LCUDART) or (isinstance(value, cst.Name) and value.value in self.names)

    def leave_Call(self, original: cst.Call, updated: cst.Call):
        if not means(self, original.func, *BUILDERS):
            return updated
        args = list(updated.args)
        for i, arg in enumerate(original.args):
            if arg.keyword is not None and arg.keyword.value == "extra_ldflags" and self._links_cudart(arg.value):
                self.sites += 1
                self.found.append(
                    (arg, f"extra_ldflags -lcudart -> {HELPER}(...): the HIP runtime (-lamdhip64) on HIP")
                )
                args[i] = args[i].with_changes(value=cst.Call(cst.Name(HELPER), [cst.Arg(args[i].value)]))
        return updated.with_changes(args=args)


class HipRuntimeLink(Codemod):
    NAME = "hip-runtime-link"
    DESCRIPTION = "On ROCm an inline extension linked against the CUDA runtime (-lcudart: the unified-memory allocator) links the HIP runtime"
    TRIGGERS = ("-lcudart",)

    def transform(self, module: cst.Module, ctx: Context):
        lists = _CudartLists()
        module.visit(lists)
        links = _CudartLink(lists.names)
        new, sites = visit_with_helper_import(module, links, ctx, "hip_runtime_ldflags")
        ctx.sites_at(module, links.found)
        return new, sites
