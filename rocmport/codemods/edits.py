"""Small shared edits: prepend statements to a function found by its nesting path."""

from __future__ import annotations

import libcst as cst


def _is_docstring(stmt) -> bool:
    return (isinstance(stmt, cst.SimpleStatementLine) and isinstance(stmt.body[0], cst.Expr)
            and isinstance(stmt.body[0].value, (cst.SimpleString, cst.ConcatenatedString)))


class _Prepend(cst.CSTTransformer):
    def __init__(self, path: tuple[str, ...], code: str, marker: str):
        self.path, self.code, self.marker = path, code, marker
        self.stack: list[str] = []
        self.sites = 0

    def visit_FunctionDef(self, node):
        self.stack.append(node.name.value)

    def leave_FunctionDef(self, original, updated):
        path = tuple(self.stack)
        self.stack.pop()
        if path != self.path or not isinstance(updated.body, cst.IndentedBlock):
            return updated
        if self.marker in cst.Module([]).code_for_node(updated):
            return updated  # already rewritten: idempotent
        new = list(cst.parse_module(self.code).body)
        body = list(updated.body.body)
        at = 1 if body and _is_docstring(body[0]) else 0
        self.sites += 1
        return updated.with_changes(body=updated.body.with_changes(body=[*body[:at], *new, *body[at:]]))


def prepend_to_function(module: cst.Module, path: tuple[str, ...], code: str, marker: str) -> tuple[cst.Module, int]:
    """Insert ``code`` at the start of the function whose def-nesting is ``path`` (classes ignored),
    after its docstring, unless the function already contains ``marker``."""
    edit = _Prepend(path, code, marker)
    return module.visit(edit), edit.sites


def insert_after_binding(module: cst.Module, name: str, code: str, marker: str) -> tuple[cst.Module, int]:
    """Insert ``code`` after the last module-level statement that assigns ``name`` (also inside a
    top-level try/if), unless the module already contains ``marker``."""
    if marker in module.code:
        return module, 0
    body = list(module.body)
    last = None
    for i, stmt in enumerate(body):
        if f"{name} =" in module.code_for_node(stmt) and not isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
            last = i
    if last is None:
        return module, 0
    body[last + 1:last + 1] = list(cst.parse_module(code).body)
    return module.with_changes(body=body), 1


def add_module_import(module: cst.Module, line: str) -> cst.Module:
    """Add an import line after the last top-level import (never twice)."""
    if line in module.code:
        return module
    body = list(module.body)
    last = -1
    for i, stmt in enumerate(body):
        if isinstance(stmt, cst.SimpleStatementLine) and isinstance(stmt.body[0], (cst.Import, cst.ImportFrom)):
            last = i
    body.insert(last + 1, cst.parse_statement(line + "\n"))
    return module.with_changes(body=body)


def visit_with_helper_import(module: cst.Module, transformer, import_line: str) -> tuple[cst.Module, int]:
    """Run a site-counting transformer; when it rewrote anything, add the helper import it needs."""
    module = module.visit(transformer)
    if transformer.sites:
        module = add_module_import(module, import_line)
    return module, transformer.sites
