"""nccl-allocator-rccl: `--use-nccl-ub` builds megatron/core/nccl_allocator.py's inline extension with
`extra_ldflags=["-lnccl"]`; on HIP it links RCCL (`-lrccl`), as AMD's fork does (torch's hipify maps
the `nccl.h` include). Matched by construct: `-lnccl` in the `extra_ldflags` of a
torch.utils.cpp_extension load/load_inline call, however imported. CUDA unchanged."""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from rocmport.codemods.base import NAMES, Codemod, Context, means
from rocmport.codemods.edits import visit_with_helper_import

BUILDERS = ("torch.utils.cpp_extension.load_inline", "torch.utils.cpp_extension.load")
LNCCL = m.List(
    elements=[
        m.ZeroOrMore(),
        m.Element(m.SimpleString(m.MatchIfTrue(lambda s: s.strip("'\"") == "-lnccl"))),
        m.ZeroOrMore(),
    ]
)


class _NcclLink(cst.CSTTransformer):
    METADATA_DEPENDENCIES = NAMES

    def __init__(self):
        self.sites = 0
        self.found: list[tuple[cst.CSTNode, str]] = []

    def leave_Call(self, original: cst.Call, updated: cst.Call):
        if not means(self, original.func, *BUILDERS):
            return updated
        args = list(updated.args)
        for i, arg in enumerate(original.args):
            if arg.keyword is not None and arg.keyword.value == "extra_ldflags" and m.matches(arg.value, LNCCL):
                self.sites += 1
                self.found.append((arg, "extra_ldflags -lnccl -> nccl_ldflags(...): -lrccl on HIP"))
                args[i] = args[i].with_changes(value=cst.Call(cst.Name("nccl_ldflags"), [cst.Arg(args[i].value)]))
        return updated.with_changes(args=args)


class NcclAllocatorRccl(Codemod):
    NAME = "nccl-allocator-rccl"
    DESCRIPTION = "On ROCm the NCCL memory-allocator extension (--use-nccl-ub) links RCCL"
    TRIGGERS = ("-lnccl",)

    def transform(self, module: cst.Module, ctx: Context):
        links = _NcclLink()
        new, sites = visit_with_helper_import(module, links, ctx, "nccl_ldflags")
        ctx.sites_at(module, links.found)
        return new, sites
