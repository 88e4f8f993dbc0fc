"""async-save-strategy: from v0.17, `--async-save` writes through `--async-strategy`, whose default
`nvrx` is nvidia-resiliency-ext's async checkpointing: NVIDIA-only, dropped by the ROCm port's
manifests, so the first save stops with "A compatible `nvidia-resiliency-ext` installation is
required". On HIP, `validate_args()` first switches a `nvrx` strategy whose package does not import
to Megatron-Core's own writer (`mcore`, the path patch 0001 and async-checkpoint-spawn port), with a
warning saying why. Only where validate_args knows the option (`args.async_strategy`); CUDA unchanged.

The `mcore` writer must then serve every async save. save_checkpoint's `--ckpt-format torch_dcp` /
`fsdp_dtensor` branch (v0.17..main) calls the strategy's `save_state_dict_async_plan` (bound from
`get_async_strategy(...)`'s modules) with `enable_cache=`, which only nvrx's saver takes, and hands
the result to the strategy's finalize as its arguments, which only nvrx's saver returns: that call
becomes `call_async_save_plan(save_state_dict_async_plan, ...)`, which passes the keywords the
saver's signature takes and cuts Megatron-Core's result to its finalize arguments (nvrx's saver:
called as upstream calls it)."""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from rocmport.codemods.base import Codemod, Context
from rocmport.codemods.edits import visit_with_helper_import
from rocmport.codemods.launch_env import prepend_to_validate_args

_ASYNC_STRATEGY = m.Attribute(value=m.Name("args"), attr=m.Name("async_strategy"))
SAVER = "save_state_dict_async_plan"
HELPER = "call_async_save_plan"
# `<modules>['save_state_dict_async_plan']`: the saver get_async_strategy's modules give.
_FROM_STRATEGY = m.Subscript(
    slice=[m.SubscriptElement(m.Index(m.SimpleString(m.MatchIfTrue(lambda s: s[1:-1] == SAVER))))]
)
_ENABLE_CACHE = m.Arg(keyword=m.Name("enable_cache"))


def _savers(function: cst.FunctionDef) -> set[str]:
    """The names ``function`` binds only to the strategy's saver (every `name = ...` of it is one)."""
    bound: dict[str, bool] = {}
    for assign in m.findall(function, m.Assign(targets=[m.AssignTarget(m.Name())])):
        assert isinstance(assign, cst.Assign)
        name = cst.ensure_type(assign.targets[0].target, cst.Name).value
        bound[name] = bound.get(name, True) and m.matches(assign.value, _FROM_STRATEGY)
    return {name for name, only in bound.items() if only}


class _SaverCalls(cst.CSTTransformer):
    def __init__(self):
        self.savers: list[set[str]] = [set()]
        self.sites = 0
        self.found: list[tuple[cst.CSTNode, str]] = []

    def visit_FunctionDef(self, node: cst.FunctionDef):
        self.savers.append(_savers(node))

    def leave_FunctionDef(self, original: cst.FunctionDef, updated: cst.FunctionDef):
        self.savers.pop()
        return updated

    def leave_Call(self, original: cst.Call, updated: cst.Call):
        func = original.func
        if not (
            isinstance(func, cst.Name)
            and func.value in self.savers[-1]
            and m.matches(original, m.Call(args=[m.ZeroOrMore(), _ENABLE_CACHE, m.ZeroOrMore()]))
        ):
            return updated
        self.sites += 1
        self.found.append(
            (
                original,
                f"{func.value}(..., enable_cache=...) -> {HELPER}({func.value}, ...): "
                "keywords the strategy's saver takes, its result in nvidia-resiliency-ext's shape",
            )
        )
        # The saver goes first, laid out as the first argument was (its comma carries the line break).
        first = updated.args[0]
        saver = cst.Arg(
            updated.func,
            comma=first.comma
            if first.comma is not cst.MaybeSentinel.DEFAULT
            else cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")),
        )
        return updated.with_changes(func=cst.Name(HELPER), args=[saver, *updated.args])


class AsyncSaveStrategy(Codemod):
    NAME = "async-save-strategy"
    DESCRIPTION = (
        "On ROCm, --async-save uses Megatron-Core's own writer (mcore) where nvidia-resiliency-ext (nvrx) does not "
        "import; torch_dcp/fsdp_dtensor async saves call the strategy's saver with what it takes"
    )
    TRIGGERS = ("\ndef validate_args(args", f"'{SAVER}'", f'"{SAVER}"')

    def transform(self, module: cst.Module, ctx: Context):
        sites = 0
        calls_saver = not ctx.absent(module, "enable_cache")  # read on the text as given (no second codegen)
        # lines before v0.17 have no --async-strategy
        if not ctx.absent(module, "async_strategy") and m.findall(module, _ASYNC_STRATEGY):
            module, sites = prepend_to_validate_args(
                module,
                ctx,
                "use_available_async_strategy",
                "on ROCm, mcore where nvidia-resiliency-ext is absent",
                "validate_args() starts with use_available_async_strategy(args) (HIP only)",
            )
        if not calls_saver:
            return module, sites
        calls = _SaverCalls()
        new, more = visit_with_helper_import(module, calls, ctx, "call_async_save_plan", metadata=False)
        ctx.sites_at(module, calls.found)
        return new, sites + more
