"""te-version-gates: `is_te_min_version` must not raise when Transformer Engine is absent.

At v0.16 `get_te_version()` returns None without TE and `None >= Version(...)` raises TypeError, so
every TE version gate crashes a TE-less run (CPU proxy, or a ROCm image without ROCm TE). With TE
absent the gate now answers False ("this TE feature is not available"); with TE present it is
unchanged. From v0.17 `get_te_version()` answers 0.0.0 without TE and nothing crashes: there the
codemod changes nothing.

Deliberately left: the version gates themselves (28 `is_te_min_version("2.7"…"2.10")` sites at
v0.16, e.g. extensions/transformer_engine.py). They guard TE API shapes (argument names, classes)
that ROCm TE mirrors by version, so a feature probe would not be more truthful; the flagged
risk is ROCm TE reporting lower numbers for a feature it has, which a per-site probe can fix when
a ROCm TE release shows it."""

from __future__ import annotations

import libcst as cst

from rocmport.codemods.base import Codemod, Context
from rocmport.codemods.edits import prepend_to_function


class TeVersionGates(Codemod):
    NAME = "te-version-gates"
    VERSION = "1"
    DESCRIPTION = "is_te_min_version answers False instead of raising when Transformer Engine is absent"
    TRIGGERS = ("def is_te_min_version(",)

    def transform(self, module: cst.Module, ctx: Context):
        getter = next((s for s in module.body if isinstance(s, cst.FunctionDef) and s.name.value == "get_te_version"), None)
        # Only where this module's own get_te_version() can answer None (v0.16); from v0.17 it
        # answers 0.0.0, and modules without it (megatron_fsdp's mixed_precision) check TE otherwise.
        if getter is None or "0.0.0" in module.code_for_node(getter):
            return module, 0
        code = (
            "if get_te_version() is None:\n"
            "    return False  # rocmport: no Transformer Engine, so no TE feature of any version\n"
        )
        return prepend_to_function(module, ("is_te_min_version",), code, "get_te_version() is None")
