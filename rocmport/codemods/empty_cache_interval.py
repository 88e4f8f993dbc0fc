"""empty-cache-interval: with `--empty-unused-memory-level` 1 or more, upstream's `train_step` calls
`torch.cuda.empty_cache()` every iteration; on ROCm that returns the caching allocator's blocks to
the driver and the next iteration allocates them again (AMD's Primus measured ~4.6 s of hipMalloc and
~2.3 s of hipFree per iteration on an MI300X, 91% of the step: its patch
`megatron.training.empty_cache_interval.wrap_train_step`). On HIP the call goes through
`empty_cache_on_interval()`: `ROCMPORT_EMPTY_CACHE_INTERVAL=N` empties the cache on the first
iteration and every N-th after it (0: never; 1, the default, and unset: every iteration, upstream's
behaviour), as Primus's `PRIMUS_EMPTY_CACHE_INTERVAL` does. Upstream's gate (the level) is kept: with
level 0, Megatron's default, nothing is emptied either way. Matched by construct: a
`torch.cuda.empty_cache()` statement, however torch is imported, directly under an
`if args.empty_unused_memory_level >= 1:` in `train_step`. CUDA unchanged."""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from rocmport.codemods.base import NAMES, Codemod, Context, means_as_spelled, spelled_plainly
from rocmport.codemods.edits import SKELETON, visit_with_helper_import

LEVEL_1 = m.If(
    test=m.Comparison(
        left=m.Attribute(attr=m.Name("empty_unused_memory_level")),
        comparisons=[m.ComparisonTarget(operator=m.GreaterThanEqual(), comparator=m.Integer("1"))],
    )
)


EMPTY_CACHE = "torch.cuda.empty_cache"


class _Interval(cst.CSTTransformer):
    METADATA_DEPENDENCIES = NAMES

    def __init__(self, prune: bool = True, plain: bool = False):
        super().__init__()
        self.prune = prune
        self.plain = plain  # spelled_plainly: no scope analysis, a name means what it spells
        self.sites = 0
        self.found: list[tuple[cst.CSTNode, str]] = []
        self._function: list[str] = []
        self._gates: list[bool] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        # Statements are walked to find the gates; what is under a gate whole (a site is a call
        # there, in its body or its else, however deep); anything else holds no site.
        if self.prune and not isinstance(node, SKELETON) and not (self._gates and self._gates[-1]):
            return False
        return super().on_visit(node)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self._function.append(node.name.value)

    def leave_FunctionDef(self, original: cst.FunctionDef, updated: cst.FunctionDef):
        self._function.pop()
        return updated

    def visit_If(self, node: cst.If) -> None:
        self._gates.append(m.matches(node, LEVEL_1) and self._function[-1:] == ["train_step"])

    def leave_If(self, original: cst.If, updated: cst.If):
        self._gates.pop()
        return updated

    def leave_Call(self, original: cst.Call, updated: cst.Call):
        # Directly in the level-1 gate's body (not in a nested if or function).
        if (
            not (self._gates and self._gates[-1])
            or original.args
            or not means_as_spelled(self, self.plain, original.func, EMPTY_CACHE)
        ):
            return updated
        self.sites += 1
        self.found.append(
            (
                original,
                "train_step's per-iteration empty_cache() -> empty_cache_on_interval(): "
                "every ROCMPORT_EMPTY_CACHE_INTERVAL iterations on HIP",
            )
        )
        return cst.Call(cst.Name("empty_cache_on_interval"))


class EmptyCacheInterval(Codemod):
    NAME = "empty-cache-interval"
    DESCRIPTION = (
        "On ROCm train_step's per-iteration torch.cuda.empty_cache() (--empty-unused-memory-level >= 1) "
        "runs every ROCMPORT_EMPTY_CACHE_INTERVAL iterations"
    )
    TRIGGERS = ("empty_unused_memory_level >= 1",)

    def transform(self, module: cst.Module, ctx: Context):
        interval = _Interval(ctx.prefilter, ctx.prefilter and spelled_plainly(ctx.code(module), (EMPTY_CACHE,)))
        new, sites = visit_with_helper_import(
            module, interval, ctx, "empty_cache_on_interval", metadata=not interval.plain
        )
        ctx.sites_at(module, interval.found)
        return (new, sites) if sites else (module, 0)
