"""A meta-path finder that changes named modules of Transformer Engine's Python layer as they are
imported: the one finder both te_loader (the CPU extension) and te_rocm (the rocm flavour's deltas)
install, in a module of its own so neither imports the other for it."""

from __future__ import annotations

import importlib.abc
import sys
from typing import Any, Callable, Literal


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
