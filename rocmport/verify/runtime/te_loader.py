"""In a started process of a `verify --te` run: Transformer Engine's own Python layer (the wheel
verify.te_layer fetched, at ``protocol.TE_PATH``) loads with ``rocmport.verify.runtime.te_cpu`` as
its compiled extension ``transformer_engine_torch``. Installed by the bootstrap when ``protocol.TE``
is set."""

from __future__ import annotations

import os
import sys

from rocmport.verify.runtime import protocol
from rocmport.verify.runtime.module_hooks import ModuleHooks


def _replace_loader(common) -> None:
    import functools

    @functools.lru_cache(maxsize=None)
    def load_framework_extension(framework: str) -> None:
        if framework != "torch":
            raise ImportError(f"rocmport's CPU proxy provides TE's torch extension only, not {framework}")
        from rocmport.verify.runtime import te_cpu

        sys.modules["transformer_engine_torch"] = te_cpu

    common.load_framework_extension = load_framework_extension


def install() -> None:
    if protocol.TE.read() is None:
        return
    # TE's own switch for "building, do not load the shared libraries" (transformer_engine/common).
    os.environ.setdefault("NVTE_PROJECT_BUILDING", "1")
    # TE's own switch for its torch.compile'd fusions (bias-GELU, dropout-add): compiled on the
    # proxy, dynamo would ask its CUDA device interface about a device that is the CPU; uncompiled,
    # the same Python functions run eagerly.
    os.environ.setdefault("NVTE_TORCH_COMPILE", "0")
    path = protocol.TE_PATH.read()
    if path and path not in sys.path:
        sys.path.insert(0, path)
    # When transformer_engine.common is imported, its loader of the compiled extension is replaced.
    sys.meta_path.insert(0, ModuleHooks({"transformer_engine.common": [("after", _replace_loader)]}))
    from rocmport.verify.runtime import te_rocm

    te_rocm.install()  # the rocm flavour's deltas (nothing under nvidia)
