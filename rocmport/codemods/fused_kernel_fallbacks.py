"""fused-kernel-fallbacks: no nvcc build on ROCm, guarded CUDA-extension imports, and fusion flags
that end up False on ROCm when their kernel is absent.

- `megatron/legacy/fused_kernels/__init__.py` `load()` returns early when there is no CUDA toolkit
  (always on ROCm; CUDA_HOME unset) instead of building an nvcc path from None. The dataset
  helpers compile in `_compile_dependencies` is a different function and is left alone.
- `megatron/training/arguments.py` `validate_args()` returns through `disable_missing_fusions`,
  which on HIP turns off gradient_accumulation_fusion / masked_softmax_fusion when their kernel is
  not importable, with a warning naming it. On CUDA it returns args untouched.
- Module-level imports of fused CUDA extension modules are guarded (amp_C falls back to torch).
- An import of a kernel inside a function (core/utils.py `drain_embedding_wgrad_compute` imports
  fused_weight_gradient_mlp_cuda unguarded for --defer-embedding-wgrad-compute) is guarded where a
  torch fallback exists (WgradGemmFallback, AmpCFallback); other in-function kernel imports are
  reported as skipped (their fusion flag is turned off on ROCm when the kernel is absent).
- A module-level guarded import of fused_weight_gradient_mlp_cuda whose `except ImportError:` sets an
  availability flag False (tensor_parallel/layers.py: `_grad_accum_fusion_available`) gets a HIP
  branch after upstream's body: the torch fallback (WgradGemmFallback) bound to the kernel's name and
  the flag set back to True, so gradient_accumulation_fusion=True works on ROCm without apex. This is
  what holds where megatron/training's validate_args never runs (Megatron-Bridge's GPTModelProvider
  turns the fusion on whenever Transformer Engine imports). On CUDA the except body runs as written."""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from rocmport.codemods.base import Codemod, Context
from rocmport.codemods.edits import StatementTransformer, prepend_to_function
from rocmport.codemods.guard import guard_imports, helper_import

KERNEL_MODULES = {
    "fused_weight_gradient_mlp_cuda",
    "scaled_masked_softmax_cuda",
    "scaled_upper_triang_masked_softmax_cuda",
    "scaled_softmax_cuda",
    "amp_C",
    "fused_layer_norm_cuda",
    "fast_layer_norm",
    "fused_adam_cuda",
}


class _ValidateArgsReturn(StatementTransformer):
    """`return args` in validate_args() goes through disable_missing_fusions(args)."""

    def __init__(self, ctx: Context):
        super().__init__(ctx.prefilter)
        self.ctx = ctx
        self.sites = 0
        self.found: list[tuple[cst.CSTNode, str]] = []
        self.depth = 0

    def visit_FunctionDef(self, node):
        self.depth += 1

    def leave_FunctionDef(self, original: cst.FunctionDef, updated: cst.FunctionDef):
        self.depth -= 1
        if self.depth or not isinstance(updated.body, cst.IndentedBlock):
            return updated
        name, path = original.name.value, self.ctx.relpath
        if name != "validate_args" or not path.endswith("training/arguments.py"):
            return updated
        if "disable_missing_fusions" not in cst.Module([]).code_for_node(updated):
            new_body: list[cst.BaseStatement] = []
            for old, stmt in zip(original.body.body, updated.body.body):
                if isinstance(stmt, cst.SimpleStatementLine) and m.matches(
                    stmt, m.SimpleStatementLine(body=[m.Return(m.Name("args"))])
                ):
                    self.sites += 1
                    self.found.append((old, "validate_args(): return disable_missing_fusions(args)"))
                    imp = cst.parse_statement(helper_import(self.ctx, "disable_missing_fusions") + "\n")
                    new_body.append(imp.with_changes(leading_lines=stmt.leading_lines))
                    stmt = stmt.with_changes(
                        leading_lines=[], body=[cst.Return(cst.parse_expression("disable_missing_fusions(args)"))]
                    )
                new_body.append(stmt)
            return updated.with_changes(body=updated.body.with_changes(body=new_body))
        return updated


# Kernels with a torch fallback in the helper: an in-function import of one is guarded.
FUNCTION_FALLBACKS = {"fused_weight_gradient_mlp_cuda": "WgradGemmFallback", "amp_C": "AmpCFallback"}


class _FunctionImports(StatementTransformer):
    """`import <kernel>` inside a function, outside any try: guarded with the torch fallback."""

    def __init__(self, ctx: Context):
        super().__init__(ctx.prefilter)
        self.ctx = ctx
        self.functions = 0
        self.tries = 0
        self.sites = 0
        self.found: list[tuple[cst.CSTNode, str]] = []
        self.skipped: list[tuple[cst.CSTNode, str]] = []

    def visit_FunctionDef(self, node):
        self.functions += 1

    def leave_FunctionDef(self, original, updated):
        self.functions -= 1
        return updated

    def visit_Try(self, node):
        self.tries += 1

    def leave_Try(self, original, updated):
        self.tries -= 1
        return updated

    def leave_SimpleStatementLine(self, original: cst.SimpleStatementLine, updated: cst.SimpleStatementLine):
        if not self.functions or self.tries or not m.matches(original, m.SimpleStatementLine(body=[m.Import()])):
            return updated
        imp = cst.ensure_type(original.body[0], cst.Import)
        names = [a for a in imp.names if a.evaluated_name in KERNEL_MODULES]
        if len(names) != 1 or len(imp.names) != 1:
            return updated
        kernel, bound = names[0].evaluated_name, names[0].evaluated_alias or names[0].evaluated_name
        fallback = FUNCTION_FALLBACKS.get(kernel)
        if fallback is None:
            self.skipped.append(
                (
                    original,
                    f"import {kernel} in a function: no torch fallback; the fusion that needs it is "
                    "switched off on ROCm when the kernel is absent (validate_args)",
                )
            )
            return updated
        self.sites += 1
        self.found.append((original, f"import {kernel} in a function -> guarded, {fallback} without the kernel"))
        code = (
            f"try:\n    {cst.Module([]).code_for_node(original.body[0])}\n"
            f"except ImportError:  # rocmport: no apex kernel (ROCm apex does not build it): torch fallback\n"
            f"    from {self.ctx.helper_module} import {fallback} as {bound}\n"
        )
        return cst.parse_statement(code).with_changes(leading_lines=updated.leading_lines)


def _unless_unchanged(module: cst.Module, new: cst.Module, sites: int) -> cst.Module:
    """The module a transformer made, or the one it was given when it rewrote nothing (an equal
    copy: keeping the original keeps its metadata and its text for what comes next)."""
    return new if sites else module


WGRAD_KERNEL = "fused_weight_gradient_mlp_cuda"

# `flag = False`, the whole of an except body that marks the kernel missing.
_FLAG_FALSE = m.SimpleStatementLine(body=[m.Assign(targets=[m.AssignTarget(target=m.Name())], value=m.Name("False"))])
_GUARDED_WGRAD_IMPORT = m.Try(
    body=m.IndentedBlock(
        body=[m.SimpleStatementLine(body=[m.Import(names=[m.ImportAlias(name=m.Name(WGRAD_KERNEL), asname=None)])])]
    ),
    handlers=[m.ExceptHandler(type=m.Name("ImportError"), name=None, body=m.IndentedBlock(body=[_FLAG_FALSE]))],
    orelse=None,
    finalbody=None,
)


class _WgradFlagOnHip(cst.CSTTransformer):
    """Module level `try: import fused_weight_gradient_mlp_cuda / except ImportError: flag = False`:
    on HIP the except body goes on to bind WgradGemmFallback to the kernel's name and set the flag
    back to True (upstream's lines stay as they are; a rewritten try no longer matches the shape)."""

    def __init__(self, ctx: Context):
        self.ctx = ctx
        self.sites = 0
        self.found: list[tuple[cst.CSTNode, str]] = []

    def visit_FunctionDef(self, node):
        return False  # module level only; in-function imports are _FunctionImports'

    def visit_ClassDef(self, node):
        return False

    def leave_Try(self, original: cst.Try, updated: cst.Try):
        if not m.matches(original, _GUARDED_WGRAD_IMPORT):
            return updated
        handler = updated.handlers[0]
        flag_line = cst.ensure_type(handler.body.body[0], cst.SimpleStatementLine)
        flag = cst.ensure_type(cst.ensure_type(flag_line.body[0], cst.Assign).targets[0].target, cst.Name).value
        branch = cst.parse_statement(
            f"if is_hip():  # rocmport: no apex kernel on ROCm: gradient-accumulation fusion on torch\n"
            f"    from {self.ctx.helper_module} import WgradGemmFallback as {WGRAD_KERNEL}\n"
            f"    {flag} = True\n"
        )
        imp = cst.parse_statement(helper_import(self.ctx, "is_hip") + "\n")
        self.sites += 1
        self.found.append((original, f"guarded import {WGRAD_KERNEL}: on HIP WgradGemmFallback, {flag} stays True"))
        body = handler.body.with_changes(body=[*handler.body.body, imp, branch])
        return updated.with_changes(handlers=[handler.with_changes(body=body)])


class FusedKernelFallbacks(Codemod):
    NAME = "fused-kernel-fallbacks"
    DESCRIPTION = "No nvcc build on ROCm; guarded CUDA-extension imports (torch fallbacks); fusion flags off on ROCm without kernels"
    TRIGGERS = ("\ndef load(args", "\ndef validate_args(args", *(f"import {m}" for m in sorted(KERNEL_MODULES)))

    def transform(self, module: cst.Module, ctx: Context):
        load_sites = 0
        if ctx.relpath.endswith("fused_kernels/__init__.py"):
            module, load_sites = prepend_to_function(
                module,
                ("load",),
                (
                    f"{helper_import(ctx, 'cuda_toolkit_missing')}\n"
                    "if cuda_toolkit_missing():\n"
                    "    return  # rocmport: no nvcc (ROCm, or CUDA_HOME unset): nothing to build\n"
                ),
                "cuda_toolkit_missing",
                ctx,
                "load() returns early without nvcc (ROCm, or CUDA_HOME unset)",
            )
        rewrite = _ValidateArgsReturn(ctx)
        if not ctx.absent(module, "validate_args"):
            before = module
            module = _unless_unchanged(module, module.visit(rewrite), rewrite.sites)
            ctx.sites_at(before, rewrite.found)
        wgrad = _WgradFlagOnHip(ctx)
        if not ctx.absent(module, WGRAD_KERNEL):
            before = module
            module = _unless_unchanged(module, module.visit(wgrad), wgrad.sites)
            ctx.sites_at(before, wgrad.found)
        inner = _FunctionImports(ctx)
        if not ctx.absent(module, *KERNEL_MODULES):  # an import of a kernel spells its name
            before = module
            module = _unless_unchanged(module, module.visit(inner), inner.sites)
            ctx.sites_at(before, inner.found)
            if inner.skipped:
                lines = ctx.start_lines(before, [node for node, _ in inner.skipped])
                for node, reason in inner.skipped:
                    ctx.skip(reason, lines[node])

        def fallback(name, source, node):
            return "AmpCFallback" if source.split(".")[0] == "amp_C" else "None"

        needs_ampc = "amp_C" in ctx.code(module)
        module, guarded = guard_imports(
            module,
            ctx,
            KERNEL_MODULES,
            fallback,
            lambda top: f"HAVE_{top.upper()}",
            prelude=helper_import(ctx, "AmpCFallback") if needs_ampc else None,
        )
        return module, load_sites + rewrite.sites + wgrad.sites + inner.sites + guarded
