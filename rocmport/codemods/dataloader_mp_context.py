"""dataloader-mp-context: the pretraining DataLoader (`build_pretraining_data_loader`,
training/datasets/data_samplers.py; legacy/data/data_samplers.py at v0.15) forks its workers
(`--num-workers` defaults to 2) after HIP initialised, which crashes on some ROCm set-ups
(multi-node, RDMA). The class is wrapped: `hip_worker_context(torch.utils.data.DataLoader)(...)`.
On HIP its workers start with 'spawn' by default (ROCMPORT_DATALOADER_MP_CONTEXT=forkserver|spawn;
`fork`, upstream's behaviour, is the explicit opt-out; a local worker_init_fn or collate_fn goes to
the workers as its code and closure values, and one whose closure cannot be pickled keeps fork, with
a warning). On CUDA the wrapper is the class itself."""

from __future__ import annotations

import libcst as cst

from rocmport.codemods.base import NAMES, Codemod, Context, means
from rocmport.codemods.edits import visit_with_helper_import

DATALOADER = "torch.utils.data.DataLoader"
LOADER_FUNCTIONS = {"build_pretraining_data_loader"}


class _WrapLoader(cst.CSTTransformer):
    METADATA_DEPENDENCIES = NAMES

    def __init__(self):
        self.inside = 0
        self.sites = 0
        self.found: list[tuple[cst.CSTNode, str]] = []

    def visit_FunctionDef(self, node: cst.FunctionDef):
        self.inside += node.name.value in LOADER_FUNCTIONS

    def leave_FunctionDef(self, original: cst.FunctionDef, updated: cst.FunctionDef):
        self.inside -= original.name.value in LOADER_FUNCTIONS
        return updated

    def leave_Call(self, original: cst.Call, updated: cst.Call):
        if self.inside and means(self, original.func, DATALOADER):
            self.sites += 1
            self.found.append((original, "DataLoader -> hip_worker_context(DataLoader): spawned workers on HIP"))
            return updated.with_changes(func=cst.Call(cst.Name("hip_worker_context"), [cst.Arg(updated.func)]))
        return updated


class DataloaderMpContext(Codemod):
    NAME = "dataloader-mp-context"
    DESCRIPTION = (
        "On ROCm the pretraining DataLoader's workers are spawned (ROCMPORT_DATALOADER_MP_CONTEXT=fork opts out)"
    )
    TRIGGERS = ("def build_pretraining_data_loader(",)

    def transform(self, module: cst.Module, ctx: Context):
        loaders = _WrapLoader()
        new, sites = visit_with_helper_import(module, loaders, ctx, "hip_worker_context")
        ctx.sites_at(module, loaders.found)
        return new, sites
