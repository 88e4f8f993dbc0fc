"""apex-to-torch: deprecated `torch.cuda.amp.*` becomes `torch.amp.*(device_type="cuda")`, and
unguarded module-level apex imports become guarded imports with real torch fallbacks
(FusedLayerNorm -> LayerNorm, FusedAdam/FusedSGD -> torch.optim, multi_tensor_applier ->
torch._foreach_*, apex.amp -> a torch.amp-style shim) from the generated megatron/core/_rocm.py.

`torch.cuda.amp.X` is an alias of `torch.amp.X` with device "cuda" in every torch megatron supports
(>= 2.4), so CUDA behaviour is unchanged; with apex installed the imports bind what they always did."""

from __future__ import annotations

import libcst as cst

from rocmport.codemods.base import NAMES, Codemod, Context, means
from rocmport.codemods.edits import add_imports, remove_unused_imports
from rocmport.codemods.guard import guard_imports, helper_import

AMP = "torch.cuda.amp"
_KW_AMP = {f"{AMP}.custom_fwd": "custom_fwd", f"{AMP}.custom_bwd": "custom_bwd"}  # take device_type=
_POS_AMP = {f"{AMP}.autocast": "autocast", f"{AMP}.GradScaler": "GradScaler"}  # take the device first


def _torch_amp(name: str) -> cst.Attribute:
    return cst.ensure_type(cst.parse_expression(f"torch.amp.{name}"), cst.Attribute)


class _AmpRewrite(cst.CSTTransformer):
    """Every reference that means `torch.cuda.amp.<X>`, however the module imported it."""

    METADATA_DEPENDENCIES = NAMES

    def __init__(self):
        self.sites = 0
        self.found: list[tuple[cst.CSTNode, str]] = []
        self.handled: set[int] = set()
        self.needs_functools = False
        self.aliases: list[tuple[str, str | None, str | None]] = []  # imports that bound torch.cuda.amp names

    def _target(self, node: cst.CSTNode) -> str | None:
        return means(self, node, *_KW_AMP, *_POS_AMP)

    def _site(self, node: cst.CSTNode, target: str, new: str) -> None:
        self.sites += 1
        self.found.append((node, f"{target} -> {new}"))

    def visit_Import(self, node: cst.Import):
        for alias in node.names:
            # `import torch.cuda.amp` binds `torch`, which the rewritten code uses: only aliases go.
            if alias.asname and (alias.evaluated_name.startswith(AMP + ".") or alias.evaluated_name == AMP):
                self.aliases.append((alias.evaluated_name, None, alias.evaluated_alias))
        return False  # the import statements themselves are not references

    def visit_ImportFrom(self, node: cst.ImportFrom):
        mod = cst.Module([]).code_for_node(node.module) if node.module is not None and not node.relative else ""
        if not isinstance(node.names, cst.ImportStar):
            for alias in node.names:
                if f"{mod}.{alias.evaluated_name}" == AMP or mod == AMP or mod.startswith(AMP + "."):
                    self.aliases.append((mod, alias.evaluated_name, alias.evaluated_alias))
        return False

    def visit_Call(self, node: cst.Call):
        if self._target(node.func):
            self.handled.add(id(node.func))

    def visit_Decorator(self, node: cst.Decorator):
        if not isinstance(node.decorator, cst.Call) and self._target(node.decorator) in _KW_AMP:
            self.handled.add(id(node.decorator))

    def leave_Decorator(self, original: cst.Decorator, updated: cst.Decorator):
        # A called decorator (`@amp.custom_fwd(cast_inputs=...)`) is a Call: leave_Call rewrites it.
        target = None if isinstance(original.decorator, cst.Call) else self._target(original.decorator)
        if target in _KW_AMP:
            self._site(original, target, f'torch.amp.{_KW_AMP[target]}(device_type="cuda")')
            return updated.with_changes(
                decorator=cst.parse_expression(f'torch.amp.{_KW_AMP[target]}(device_type="cuda")')
            )
        return updated

    def leave_Call(self, original: cst.Call, updated: cst.Call):
        target = self._target(original.func)
        if target in _KW_AMP:
            self._site(original, target, f'torch.amp.{_KW_AMP[target]}(..., device_type="cuda")')
            args = list(updated.args)
            if not any(a.keyword and a.keyword.value == "device_type" for a in args):
                if args:
                    args[-1] = args[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
                args.append(
                    cst.Arg(
                        keyword=cst.Name("device_type"),
                        value=cst.SimpleString('"cuda"'),
                        equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace("")),
                    )
                )
            return updated.with_changes(func=_torch_amp(_KW_AMP[target]), args=args)
        if target in _POS_AMP:
            self._site(original, target, f'torch.amp.{_POS_AMP[target]}("cuda", ...)')
            first = cst.Arg(
                value=cst.SimpleString('"cuda"'),
                comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
                if updated.args
                else cst.MaybeSentinel.DEFAULT,
            )
            return updated.with_changes(func=_torch_amp(_POS_AMP[target]), args=[first, *updated.args])
        return updated

    def _reference(self, original, updated):
        """A bare reference (`f = amp.custom_fwd`): a partial with the device bound."""
        if id(original) in self.handled:
            return updated
        target = self._target(original)
        if target in _KW_AMP:
            new = f'functools.partial(torch.amp.{_KW_AMP[target]}, device_type="cuda")'
        elif target in _POS_AMP:
            new = f'functools.partial(torch.amp.{_POS_AMP[target]}, "cuda")'
        else:
            return updated
        self._site(original, target, new)
        self.needs_functools = True
        return cst.parse_expression(new)

    def leave_Attribute(self, original: cst.Attribute, updated: cst.Attribute):
        return self._reference(original, updated)

    def leave_Name(self, original: cst.Name, updated: cst.Name):
        return self._reference(original, updated)


class ApexToTorch(Codemod):
    NAME = "apex-to-torch"
    DESCRIPTION = "torch.cuda.amp -> torch.amp; unguarded apex imports -> guarded, with torch fallbacks"
    # Every spelling of torch.cuda.amp passes through one of the first four; only module-level apex
    # imports are guarded.
    TRIGGERS = (
        "cuda.amp",
        "from torch.cuda import",
        "from torch import cuda",
        "import torch.cuda as",
        "\nimport apex",
        "\nfrom apex",
    )

    def transform(self, module: cst.Module, ctx: Context):
        sites = 0
        amp = _AmpRewrite()
        # A reference that means torch.cuda.amp.<X> spells X: in the access or in its import.
        if not ctx.absent(module, *(name.rsplit(".", 1)[1] for name in (*_KW_AMP, *_POS_AMP))):
            before = module
            rewritten = ctx.wrap(module).visit(amp)
            ctx.sites_at(before, amp.found)
            module = rewritten if amp.sites else before  # an equal copy otherwise: keep its metadata
        if amp.sites:
            sites += amp.sites
            # The rewritten references need `torch` (and functools for a bare reference); imports
            # that only served the old spellings go when nothing uses them any more.
            module = add_imports(
                module, [("torch", None, None)] + ([("functools", None, None)] if amp.needs_functools else [])
            )
            module = remove_unused_imports(module, amp.aliases)
        module, guarded = guard_imports(
            module,
            ctx,
            {"apex"},
            lambda name, source, node: f"apex_fallback({source!r})",
            lambda top: "HAVE_APEX",
            prelude=helper_import(ctx, "apex_fallback"),
        )
        return module, sites + guarded
