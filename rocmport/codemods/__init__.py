"""libcst codemods: one module per codemod, the catalogue of them by name, and the layered runner.

`compute_layers(tree, codemods)` parses each triggered file once, runs the selected codemods in
order and returns one Layer per codemod (the files it changed, with their text after it).

The names below load on first use (PEP 562): importing a submodule that needs no libcst
(declared.py, options.py, helper.py) does not load libcst or any codemod."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rocmport.codemods.base import Codemod, Context
    from rocmport.codemods.catalog import registry
    from rocmport.codemods.runner import FileFailure, Layer, LayersResult, compute_layers

__all__ = ["Codemod", "Context", "FileFailure", "Layer", "LayersResult", "compute_layers", "registry"]
_WHERE = {
    "Codemod": "base",
    "Context": "base",
    "registry": "catalog",
    "FileFailure": "runner",
    "Layer": "runner",
    "LayersResult": "runner",
    "compute_layers": "runner",
}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
