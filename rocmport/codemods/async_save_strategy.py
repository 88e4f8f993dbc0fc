"""async-save-strategy: from v0.17, `--async-save` writes through `--async-strategy`, whose default
`nvrx` is nvidia-resiliency-ext's async checkpointing: NVIDIA-only, dropped by the ROCm port's
manifests, so the first save stops with "A compatible `nvidia-resiliency-ext` installation is
required". On HIP, `validate_args()` first switches a `nvrx` strategy whose package does not import
to Megatron-Core's own writer (`mcore`, the path patch 0001 and async-checkpoint-spawn port), with a
warning saying why. Only where validate_args knows the option (`args.async_strategy`); CUDA unchanged."""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from rocmport.codemods.base import Codemod, Context
from rocmport.codemods.launch_env import prepend_to_validate_args

_ASYNC_STRATEGY = m.Attribute(value=m.Name("args"), attr=m.Name("async_strategy"))


class AsyncSaveStrategy(Codemod):
    NAME = "async-save-strategy"
    DESCRIPTION = "On ROCm, --async-save uses Megatron-Core's own writer (mcore) where nvidia-resiliency-ext (nvrx) does not import"
    TRIGGERS = ("\ndef validate_args(args",)

    def transform(self, module: cst.Module, ctx: Context):
        # lines before v0.17 have no --async-strategy
        if ctx.absent(module, "async_strategy") or not m.findall(module, _ASYNC_STRATEGY):
            return module, 0
        return prepend_to_validate_args(
            module,
            ctx,
            "use_available_async_strategy",
            "on ROCm, mcore where nvidia-resiliency-ext is absent",
            "validate_args() starts with use_available_async_strategy(args) (HIP only)",
        )
