"""async-checkpoint-spawn: the process that writes an async checkpoint without the persistent
worker (`TemporalAsyncCaller.schedule_async_call`, dist_checkpointing/strategies/async_utils.py) is
forked (`mp.get_context('fork')`); on HIP it is spawned, as AMD's fork does: a child forked after the
trainer allocated pinned memory segfaults on HIP < 7.1, and a forked HIP context is not usable.
Matched by construct: a `get_context('fork')` of torch.multiprocessing or multiprocessing (however
imported) inside a class deriving from AsyncCaller. CUDA keeps upstream's fork."""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from rocmport.codemods.base import NAMES, Codemod, Context, means, qualified_names
from rocmport.codemods.edits import visit_with_helper_import

GET_CONTEXT = ("torch.multiprocessing.get_context", "multiprocessing.get_context")
FORK = m.Call(args=[m.Arg(m.SimpleString(m.MatchIfTrue(lambda s: s.strip("'\"") == "fork")), keyword=None)])


class _ForkInAsyncCaller(cst.CSTTransformer):
    METADATA_DEPENDENCIES = NAMES

    def __init__(self):
        self.callers = 0  # depth inside classes deriving from AsyncCaller
        self.sites = 0
        self.found: list[tuple[cst.CSTNode, str]] = []

    def _is_caller(self, node: cst.ClassDef) -> bool:
        return any(
            q == "AsyncCaller" or q.endswith(".AsyncCaller") for b in node.bases for q in qualified_names(self, b.value)
        )

    def visit_ClassDef(self, node: cst.ClassDef):
        self.callers += self._is_caller(node)

    def leave_ClassDef(self, original: cst.ClassDef, updated: cst.ClassDef):
        self.callers -= self._is_caller(original)
        return updated

    def leave_Call(self, original: cst.Call, updated: cst.Call):
        if self.callers and m.matches(original, FORK) and means(self, original.func, *GET_CONTEXT):
            self.sites += 1
            self.found.append(
                (original, "get_context('fork') -> get_context(async_start_method('fork')): spawn on HIP")
            )
            arg = cst.Arg(cst.Call(cst.Name("async_start_method"), [cst.Arg(original.args[0].value)]))
            return updated.with_changes(args=[arg])
        return updated


class AsyncCheckpointSpawn(Codemod):
    NAME = "async-checkpoint-spawn"
    DESCRIPTION = "On ROCm the async-checkpoint writer process (TemporalAsyncCaller) is spawned, not forked"
    TRIGGERS = ("AsyncCaller",)

    def transform(self, module: cst.Module, ctx: Context):
        forks = _ForkInAsyncCaller()
        new, sites = visit_with_helper_import(module, forks, ctx, "async_start_method")
        ctx.sites_at(module, forks.found)
        return new, sites
