"""apex-to-torch: deprecated `torch.cuda.amp.*` becomes `torch.amp.*(device_type="cuda")`, and
unguarded module-level apex imports become guarded imports with real torch fallbacks
(FusedLayerNorm -> LayerNorm, FusedAdam/FusedSGD -> torch.optim, multi_tensor_applier ->
torch._foreach_*, apex.amp -> a torch.amp-style shim) from the generated megatron/core/_rocm.py.

`torch.cuda.amp.X` is an alias of `torch.amp.X` with device "cuda" in every torch megatron supports
(>= 2.4), so CUDA behaviour is unchanged; with apex installed the imports bind what they always did."""

from __future__ import annotations

import libcst as cst

from rocmport.codemods.base import Codemod, Context, dotted
from rocmport.codemods.guard import guard_imports, helper_import

_KW_AMP = {"torch.cuda.amp.custom_fwd": "custom_fwd", "torch.cuda.amp.custom_bwd": "custom_bwd"}
_POS_AMP = {"torch.cuda.amp.autocast": "autocast", "torch.cuda.amp.GradScaler": "GradScaler"}


def _torch_amp(name: str) -> cst.Attribute:
    return cst.ensure_type(cst.parse_expression(f"torch.amp.{name}"), cst.Attribute)


class _AmpRewrite(cst.CSTTransformer):
    def __init__(self):
        self.sites = 0
        self.handled: set[int] = set()
        self.needs_functools = False

    def visit_Call(self, node: cst.Call):
        if dotted(node.func) in _KW_AMP or dotted(node.func) in _POS_AMP:
            self.handled.add(id(node.func))

    def visit_Decorator(self, node: cst.Decorator):
        if dotted(node.decorator) in _KW_AMP:
            self.handled.add(id(node.decorator))

    def leave_Decorator(self, original: cst.Decorator, updated: cst.Decorator):
        name = _KW_AMP.get(dotted(original.decorator) or "")
        if name:
            self.sites += 1
            return updated.with_changes(decorator=cst.parse_expression(f'torch.amp.{name}(device_type="cuda")'))
        return updated

    def leave_Call(self, original: cst.Call, updated: cst.Call):
        target = dotted(original.func) or ""
        if target in _KW_AMP:
            self.sites += 1
            args = list(updated.args)
            if not any(a.keyword and a.keyword.value == "device_type" for a in args):
                if args:
                    args[-1] = args[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
                args.append(cst.Arg(keyword=cst.Name("device_type"), value=cst.SimpleString('"cuda"'),
                                    equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace(""))))
            return updated.with_changes(func=_torch_amp(_KW_AMP[target]), args=args)
        if target in _POS_AMP:
            self.sites += 1
            first = cst.Arg(value=cst.SimpleString('"cuda"'), comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")) if updated.args else cst.MaybeSentinel.DEFAULT)
            return updated.with_changes(func=_torch_amp(_POS_AMP[target]), args=[first, *updated.args])
        return updated

    def leave_Attribute(self, original: cst.Attribute, updated: cst.Attribute):
        target = dotted(original) or ""
        if id(original) in self.handled:
            return updated
        if target in _KW_AMP:
            self.sites += 1
            self.needs_functools = True
            return cst.parse_expression(f'functools.partial(torch.amp.{_KW_AMP[target]}, device_type="cuda")')
        if target in _POS_AMP:
            self.sites += 1
            self.needs_functools = True
            return cst.parse_expression(f'functools.partial(torch.amp.{_POS_AMP[target]}, "cuda")')
        return updated


def _imports_functools(module: cst.Module) -> bool:
    for stmt in module.body:
        if isinstance(stmt, cst.SimpleStatementLine):
            for node in stmt.body:
                if isinstance(node, cst.Import) and any(dotted(a.name) == "functools" and not a.asname for a in node.names):
                    return True
    return False


def _add_functools(module: cst.Module) -> cst.Module:
    """`import functools` after the last top-level `import x` line (placed, never duplicated)."""
    body = list(module.body)
    last = -1
    for i, stmt in enumerate(body):
        if isinstance(stmt, cst.SimpleStatementLine) and isinstance(stmt.body[0], (cst.Import, cst.ImportFrom)):
            last = i
    body.insert(last + 1, cst.parse_statement("import functools\n"))
    return module.with_changes(body=body)


class ApexToTorch(Codemod):
    NAME = "apex-to-torch"
    VERSION = "1"
    DESCRIPTION = "torch.cuda.amp -> torch.amp; unguarded apex imports -> guarded, with torch fallbacks"
    TRIGGERS = ("torch.cuda.amp", "\nimport apex", "\nfrom apex")  # only module-level imports are guarded
    USES_HELPER = True

    def transform(self, module: cst.Module, ctx: Context):
        sites = 0
        if "torch.cuda.amp" in module.code:
            amp = _AmpRewrite()
            module = module.visit(amp)
            sites += amp.sites
            if amp.needs_functools and not _imports_functools(module):
                module = _add_functools(module)
        module, guarded = guard_imports(
            module, ctx, {"apex"},
            lambda name, source, node: f"apex_fallback({source!r})",
            lambda top: "HAVE_APEX",
            prelude=helper_import(ctx, "apex_fallback"),
        )
        return module, sites + guarded
