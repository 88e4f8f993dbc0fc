"""libcst codemods: one module per codemod, the catalogue of them by name, and the layered runner.

`compute_layers(tree, codemods)` parses each triggered file once, runs the selected codemods in
order and returns one Layer per codemod (the files it changed, with their text after it)."""

from rocmport.codemods.base import Codemod, Context
from rocmport.codemods.catalog import registry
from rocmport.codemods.runner import FileFailure, Layer, LayersResult, compute_layers

__all__ = ["Codemod", "Context", "FileFailure", "Layer", "LayersResult", "compute_layers", "registry"]
