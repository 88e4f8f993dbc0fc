"""What each codemod declares (its version, the options a series may give it, whether its rewrites
import the runtime helper), readable without libcst: the checks of a recipe and what an apply's
inputs hash holds (the codemod versions, the helper text) come from here, so `rocmport status`, a
no-op `rocmport apply` and `rocmport --help` load neither libcst nor a codemod.

This is the one place a codemod's version, options and helper use are written: its class
(rocmport/codemods/<name>.py, registered in catalog.py in the same order) gets them from here when
it is defined (Codemod.__init_subclass__), and a class that spells them itself is refused."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rocmport.codemods.options import DISTRIBUTION, MODULE, problems
from rocmport.errors import BadInput

if TYPE_CHECKING:
    from rocmport.patches.series import Series


@dataclass(frozen=True)
class Declared:
    version: str
    uses_helper: bool = True
    options: dict = field(default_factory=dict)


# In the order a full run applies them (catalog.registry's order).
DECLARED: dict[str, Declared] = {
    "apex-to-torch": Declared("2"),
    "fused-kernel-fallbacks": Declared("4"),
    "guard-nvidia-only-imports": Declared("5", options={"packages": {MODULE: DISTRIBUTION}}),
    "attention-backend-env": Declared("1"),
    "te-version-gates": Declared("5"),
    "device-probes": Declared("2"),
    "flash-attention-hooks": Declared("2"),
    "capability-gates": Declared("3"),
    "grouped-gemm": Declared("2"),
    # issue 17: the ROCm run-time gaps
    "launch-env": Declared("1"),
    "deterministic-env": Declared("1"),
    "tp-comm-overlap": Declared("1"),
    "async-checkpoint-spawn": Declared("1"),
    "dataloader-mp-context": Declared("1"),
    "nccl-allocator-rccl": Declared("1"),
    "async-save-strategy": Declared("2"),
    # issue 29: what AMD's own ports do
    "hip-runtime-link": Declared("1"),
    "fp8-arch-check": Declared("1"),
    "empty-cache-interval": Declared("1"),
}


def check_recipe(codemods: list[dict], where) -> None:
    """Every codemod of a recipe (`{name, options}` entries) exists and gets options it declares, of
    the declared kind: BadInput naming ``where`` and the entry otherwise (before anything runs)."""
    for i, entry in enumerate(codemods):
        mod = DECLARED.get(entry["name"])
        if mod is None:
            raise BadInput(
                f"{where}: key 'codemods[{i}]': unknown codemod '{entry['name']}'; known: {', '.join(sorted(DECLARED))}"
            )
        found = problems(mod.options, entry.get("options") or {})
        if found:
            raise BadInput(f"{where}: key 'codemods[{i}]' ({entry['name']}): {found[0]}")


def check_series(series: Series) -> Series:
    """The one check of a series' codemods that every reader runs (apply, `patches check` and `list`,
    `status`, `emit docker`): what apply refuses, each of them refuses with the same message."""
    check_recipe(series.codemods, series.path)
    return series


def versions(series: Series) -> dict[str, str]:
    """Each codemod's version, by name (the series checked first)."""
    check_series(series)
    return {entry["name"]: DECLARED[entry["name"]].version for entry in series.codemods}


def recipe_helper_text(codemods) -> str:
    """The generated helper a recipe's tree gets (its codemods: names or {name, options} entries)."""
    from rocmport.codemods.helper import helper_text

    names = []
    for entry in codemods:
        name = entry if isinstance(entry, str) else entry["name"]
        if name not in DECLARED:
            raise BadInput(f"unknown codemod '{name}'; known: {', '.join(sorted(DECLARED))}")
        if DECLARED[name].uses_helper:
            names.append(name)
    return helper_text(names)
