"""In a started process of a `verify --te` run: Transformer Engine's own Python layer (the wheel
verify.te_layer fetched, at ``protocol.TE_PATH``) loads with ``rocmport.verify.runtime.te_cpu`` as
its compiled extension ``transformer_engine_torch``. Installed by the bootstrap when ``protocol.TE``
is set."""

from __future__ import annotations

import importlib.abc
import os
import sys
from typing import Any, Callable, Literal

from rocmport.verify.runtime import protocol


# A hook of ModuleHooks: ("source", rewrite) takes the module's source text and returns the text that
# runs instead; ("after", change) takes the module object right after it ran.
Hook = tuple[Literal["source", "after"], Callable[[Any], Any]]


class ModuleHooks(importlib.abc.MetaPathFinder):
    """Changes the named modules of TE's Python layer as they are imported: each module's "source"
    hooks rewrite its source before it runs, then its "after" hooks change it. The module itself is
    found by the finders behind this one (the one meta-path finder both this loader and the rocm
    flavour's deltas, te_rocm, install)."""

    def __init__(self, by_module: dict[str, list[Hook]]) -> None:
        self.by_module = by_module

    def find_spec(self, name, path=None, target=None):
        hooks = self.by_module.get(name)
        if not hooks:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is None:
            return spec
        inner: Any = spec.loader
        chosen: list[Hook] = hooks

        class Loader(importlib.abc.Loader):
            def create_module(self, spec):
                return inner.create_module(spec)

            def exec_module(self, module):
                rewrites = [how for when, how in chosen if when == "source"]
                if rewrites:
                    source = inner.get_source(name)
                    for how in rewrites:
                        source = how(source)
                    exec(compile(source, module.__spec__.origin, "exec"), module.__dict__)
                else:
                    inner.exec_module(module)
                for when, how in chosen:
                    if when == "after":
                        how(module)

        spec.loader = Loader()
        return spec


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
