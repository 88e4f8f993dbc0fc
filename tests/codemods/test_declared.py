"""rocmport/codemods/declared.py repeats what each codemod class declares (so apply's inputs hash and
the recipe checks need no libcst): it must say exactly what the classes say, in the catalogue's order."""

from __future__ import annotations

import pytest

from rocmport.codemods import declared, registry
from rocmport.codemods.helper import helper_text
from rocmport.errors import BadInput


def test_every_codemod_takes_its_declaration_and_a_class_cannot_spell_its_own():
    """declared.py is the one place a codemod's version, options and helper use are written."""
    from rocmport.codemods.base import Codemod

    assert list(declared.DECLARED) == list(registry)
    for name, mod in registry.items():
        d = declared.DECLARED[name]
        assert (d.version, d.uses_helper, d.options) == (mod.VERSION, mod.USES_HELPER, mod.OPTIONS)
    with pytest.raises(TypeError, match="codemod apex-to-torch: declare its version.*not on the class: VERSION"):
        type("Spelled", (Codemod,), {"NAME": "apex-to-torch", "VERSION": "9"})
    with pytest.raises(TypeError, match="codemod not-declared: declare its version.*no entry there"):
        type("Undeclared", (Codemod,), {"NAME": "not-declared"})


def test_the_recipe_helper_is_the_helper_of_the_codemods_that_use_it():
    names = list(registry)
    assert declared.recipe_helper_text([{"name": n, "options": {}} for n in names]) == helper_text(
        [n for n in names if registry[n].USES_HELPER]
    )
    with pytest.raises(BadInput, match="unknown codemod 'no-such'"):
        declared.recipe_helper_text(["no-such"])
