"""prepend_to_function reports a site at the line PositionProvider gives the function, computed from
the code before it alone when the function is a module-level statement (top_level_def_line)."""

from __future__ import annotations

import libcst as cst
import pytest
from libcst.metadata import MetadataWrapper, PositionProvider

from rocmport.codemods.base import Context
from rocmport.codemods.edits import prepend_to_function, top_level_def_line

SOURCES = [
    "def validate_args(args):\n    pass\n",
    '#!/usr/bin/env python\n# header\n\n"""doc"""\nimport os\n\n\ndef validate_args(args):\n    """doc"""\n    x = 1\n',
    "import os\n# before\n@decorator\n# between\n@other(\n    1,\n)\n\nasync def validate_args(args):\n    pass\n",
    "class A:\n    def validate_args(self):\n        pass\n\n\nif True:\n    x = '''\ndef validate_args(args):\n'''\n\n"
    "def validate_args(args, defaults={}):\n    return args\n",
    "x = 1\r\ndef validate_args(args):\r\n    pass\r\n",
]


@pytest.mark.parametrize("source", SOURCES)
def test_the_line_is_the_one_positionprovider_gives(source):
    module = cst.parse_module(source)
    positions = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
    tops = [s for s in module.body if isinstance(s, cst.FunctionDef)]
    assert tops
    for func in tops:
        line = top_level_def_line(module, func)
        assert line is None if module.default_newline != "\n" else line == positions[func].start.line
    nested = [n for n in positions if isinstance(n, cst.FunctionDef) and n not in tops]
    assert all(top_level_def_line(module, n) is None for n in nested)


@pytest.mark.parametrize("source", SOURCES)
def test_prepend_reports_the_functions_line(source):
    module = cst.parse_module(source)
    positions = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
    # Every def validate_args at def-nesting depth 1 (a method too: classes do not count).
    funcs = [n for n in positions if isinstance(n, cst.FunctionDef) and n.name.value == "validate_args"]
    ctx = Context("megatron/training/arguments.py", {}, codemod="launch-env", shared={})
    new, sites = prepend_to_function(module, ("validate_args",), "apply(args)\n", "apply(args)", ctx, "prepended")
    assert sites == len(funcs) and "apply(args)" in new.code
    assert sorted(r.line for r in ctx.reports) == sorted(positions[f].start.line for f in funcs)
