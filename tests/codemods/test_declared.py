"""rocmport/codemods/declared.py repeats what each codemod class declares (so apply's inputs hash and
the recipe checks need no libcst): it must say exactly what the classes say, in the catalogue's order."""

from __future__ import annotations

import pytest

from rocmport.codemods import declared, registry
from rocmport.codemods.helper import helper_text
from rocmport.errors import BadInput


def test_every_codemod_is_declared_as_its_class_declares_it():
    assert list(declared.DECLARED) == list(registry)
    for name, mod in registry.items():
        d = declared.DECLARED[name]
        assert (d.version, d.uses_helper, d.options) == (mod.VERSION, mod.USES_HELPER, mod.OPTIONS), (
            f"{name}: declared.py says version {d.version}, uses_helper {d.uses_helper}, options {d.options}; "
            f"the class says {mod.VERSION}, {mod.USES_HELPER}, {mod.OPTIONS}: make them agree")


def test_the_recipe_helper_is_the_helper_of_the_codemods_that_use_it():
    names = list(registry)
    assert declared.recipe_helper_text([{"name": n, "options": {}} for n in names]) == helper_text(
        [n for n in names if registry[n].USES_HELPER])
    with pytest.raises(BadInput, match="unknown codemod 'no-such'"):
        declared.recipe_helper_text(["no-such"])
