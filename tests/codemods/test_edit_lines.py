"""prepend_to_function reports a site at the line PositionProvider gives the function, computed from
the code before it alone when the function is a module-level statement (top_level_def_line); so do
the guarded imports (top_level_line, any module-level statement)."""

from __future__ import annotations

import libcst as cst
import pytest
from libcst.metadata import MetadataWrapper, PositionProvider

from rocmport.codemods.base import Context
from rocmport.codemods.edits import prepend_to_function, top_level_def_line, top_level_line
from tests.helpers.real import REPO

SOURCES = [
    "def validate_args(args):\n    pass\n",
    '#!/usr/bin/env python\n# header\n\n"""doc"""\nimport os\n\n\ndef validate_args(args):\n    """doc"""\n    x = 1\n',
    "import os\n# before\n@decorator\n# between\n@other(\n    1,\n)\n\nasync def validate_args(args):\n    pass\n",
    "class A:\n    def validate_args(self):\n        pass\n\n\nif True:\n    x = '''\ndef validate_args(args):\n'''\n\n"
    "def validate_args(args, defaults={}):\n    return args\n",
    "x = 1\r\ndef validate_args(args):\r\n    pass\r\n",
    "x = 1\r# lone carriage returns\r\rdef validate_args(args):\r    pass\r",
]


@pytest.mark.parametrize("source", SOURCES)
def test_the_line_is_the_one_positionprovider_gives(source):
    module = cst.parse_module(source)
    positions = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
    tops = [s for s in module.body if isinstance(s, cst.FunctionDef)]
    assert tops
    for func in tops:
        assert top_level_def_line(module, func) == positions[func].start.line
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


def test_every_module_level_statement_gets_positionproviders_line():
    """The guarded imports' lines: every statement of real modules (rocmport's own, the cases above)."""
    texts = [*SOURCES, *(p.read_text() for p in sorted((REPO / "rocmport").rglob("*.py")))]
    checked = 0
    for text in texts:
        module = cst.parse_module(text)
        positions = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
        for stmt in module.body:
            assert top_level_line(module, stmt) == positions[stmt].start.line, (text[:60], stmt)
            checked += 1
        inner = [n for n in positions if isinstance(n, cst.SimpleStatementLine) and n not in module.body]
        assert all(top_level_line(module, n) is None for n in inner[:50])
    assert checked > 2000, checked
