"""Small shared edits: prepend statements to a function found by its nesting path, insert after a
module-level binding, and the one way codemods add (`add_imports`) or drop
(`remove_unused_imports`, libcst's RemoveImportsVisitor) module-level imports."""

from __future__ import annotations

from typing import Iterable, Sequence, cast

import libcst as cst
import libcst.matchers as m
from libcst.codemod import CodemodContext
from libcst.codemod.visitors import RemoveImportsVisitor
from libcst.metadata import PositionProvider
from libcst.metadata.position_provider import NEWLINE_RE

from rocmport.codemods.base import Context

# (module, name or None, alias or None): `import module`, `from module import name [as alias]`
ImportSpec = tuple[str, "str | None", "str | None"]


def _is_docstring(stmt) -> bool:
    return (
        isinstance(stmt, cst.SimpleStatementLine)
        and isinstance(stmt.body[0], cst.Expr)
        and isinstance(stmt.body[0].value, (cst.SimpleString, cst.ConcatenatedString))
    )


# The nodes a `def` can be found under: statements that hold blocks, and their blocks. Everything
# else (a simple statement, an expression, parameters, decorators, whitespace) holds no FunctionDef.
SKELETON = (
    cst.Module,
    cst.BaseCompoundStatement,
    cst.IndentedBlock,
    cst.Else,
    cst.ExceptHandler,
    cst.ExceptStarHandler,
    cst.Finally,
    cst.MatchCase,
)


class StatementTransformer(cst.CSTTransformer):
    """A transformer that visits only the statement skeleton (SKELETON) when ``prune``: what it
    does not visit it returns as it is (no node rebuilt), and its own leave_ method for a simple
    statement still runs, with the node unchanged. For rewrites of functions and statements: on a
    3,000-line module it visits a few thousand nodes instead of a few hundred thousand."""

    def __init__(self, prune: bool = True):
        super().__init__()
        self.prune = prune

    def on_visit(self, node: cst.CSTNode) -> bool:
        if self.prune and not isinstance(node, SKELETON):
            return False
        return super().on_visit(node)


class _Prepend(StatementTransformer):
    def __init__(self, path: tuple[str, ...], code: str, marker: str, prune: bool = True):
        super().__init__(prune)
        self.path, self.code, self.marker = path, code, marker
        self.stack: list[str] = []
        self.sites = 0
        self.changed: list[cst.FunctionDef] = []

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
        self.changed.append(original)
        return updated.with_changes(body=updated.body.with_changes(body=[*body[:at], *new, *body[at:]]))


def prepend_to_function(
    module: cst.Module, path: tuple[str, ...], code: str, marker: str, ctx: Context | None = None, note: str = ""
) -> tuple[cst.Module, int]:
    """Insert ``code`` at the start of the function whose def-nesting is ``path`` (classes ignored),
    after its docstring, unless the function already contains ``marker``. Each insertion is
    reported to ``ctx`` as a site with ``note``."""
    if ctx is not None and ctx.absent(module, path[-1]):
        return module, 0  # no function of that name in the text: nothing to find
    edit = _Prepend(path, code, marker, prune=ctx is None or ctx.prefilter)
    new = module.visit(edit)
    if not edit.changed:
        return module, 0
    if edit.changed and ctx is not None:
        for func in edit.changed:
            line = top_level_def_line(module, func)
            if line is None:  # only when there is a site to report, and no cheaper way
                line = ctx.start_lines(module, [func])[func]
            ctx.site(note or f"{'.'.join(path)}(): prepended", line)
    return new, edit.sites


def top_level_def_line(module: cst.Module, func: cst.FunctionDef) -> int | None:
    """The line PositionProvider gives ``func`` (its `def`, after any decorators) when it is a
    statement of ``module`` itself, from the code of what precedes it alone: several codemods
    prepend to validate_args() in the 3,400 lines of arguments.py, and positions over the whole
    module cost each of them ~0.4 s of CPU. None for a nested function."""
    return top_level_line(module, func)


def top_level_line(module: cst.Module, stmt: cst.CSTNode) -> int | None:
    """The start line PositionProvider gives ``stmt``, a statement of ``module`` itself (after its
    leading blank and comment lines; a def or class after its decorators), from the code of what
    precedes it alone, its line breaks counted as PositionProvider counts them. None when it is not
    in module.body."""
    at = next((i for i, node in enumerate(module.body) if node is stmt), None)
    if at is None:
        return None
    found = module.body[at]
    before: list[cst.CSTNode] = [*module.header, *module.body[:at], *found.leading_lines]
    if isinstance(found, (cst.FunctionDef, cst.ClassDef)):
        before += [*found.decorators, *found.lines_after_decorators]
    return 1 + len(NEWLINE_RE.findall("".join(module.code_for_node(node) for node in before)))


class _Binds(cst.CSTVisitor):
    """Does a statement assign ``name`` (at its own level or in nested try/if/with blocks, not in a
    function or class body)?"""

    def __init__(self, name: str):
        self.target = m.Name(name)
        self.found = False

    def visit_FunctionDef(self, node):
        return False

    def visit_ClassDef(self, node):
        return False

    def visit_AssignTarget(self, node: cst.AssignTarget):
        self.found |= m.matches(node.target, self.target)

    def visit_AnnAssign(self, node: cst.AnnAssign):
        self.found |= m.matches(node.target, self.target) and node.value is not None


def insert_after_binding(
    module: cst.Module, name: str, code: str, marker: str, ctx: Context | None = None, note: str = ""
) -> tuple[cst.Module, int]:
    """Insert ``code`` after the last module-level statement that assigns ``name`` (also inside a
    top-level try/if), unless the module already contains ``marker``; reported to ``ctx``."""
    if marker in (ctx.code(module) if ctx is not None else module.code):
        return module, 0
    body = list(module.body)
    last = None
    for i, stmt in enumerate(body):
        found = _Binds(name)
        stmt.visit(found)
        if found.found:
            last = i
    if last is None:
        return module, 0
    if ctx is not None:
        ctx.site(note or f"after {name}: inserted", ctx.wrap(module).resolve(PositionProvider)[body[last]].end.line)
    body[last + 1 : last + 1] = list(cst.parse_module(code).body)
    return module.with_changes(body=body), 1


def _is_import_line(stmt: cst.BaseStatement) -> bool:
    return isinstance(stmt, cst.SimpleStatementLine) and all(
        isinstance(b, (cst.Import, cst.ImportFrom)) for b in stmt.body
    )


def _module_of(node: cst.ImportFrom) -> str | None:
    if node.relative or node.module is None:
        return None
    return cst.Module([]).code_for_node(node.module)


def add_imports(module: cst.Module, imports: Iterable[ImportSpec]) -> cst.Module:
    """Add module-level imports, the one way every codemod does it.

    Placement follows libcst's AddImportsVisitor: after the module docstring, `from __future__`
    and the leading block of imports (before the first other statement); a `from m import x` joins
    an existing top-level `from m import ...`; what the module already imports at top level is
    never added again. Only top-level statements are looked at, so it costs nothing on a large file
    (AddImportsVisitor copies and walks the whole tree)."""
    body: list[cst.BaseStatement] = list(module.body)
    have_modules: set[tuple[str, str | None]] = set()  # (module, alias)
    have_names: set[tuple[str, str, str | None]] = set()  # (module, name, alias)
    star: set[str] = set()
    from_stmt: dict[str, int] = {}  # module -> index of the last top-level `from module import a, b`
    for i, stmt in enumerate(body):
        if not isinstance(stmt, cst.SimpleStatementLine):
            continue
        for node in stmt.body:
            if isinstance(node, cst.Import):
                for a in node.names:
                    have_modules.add((a.evaluated_name, a.evaluated_alias))
            elif isinstance(node, cst.ImportFrom) and (mod := _module_of(node)) is not None:
                if isinstance(node.names, cst.ImportStar):
                    star.add(mod)
                    continue
                for a in node.names:
                    have_names.add((mod, a.evaluated_name, a.evaluated_alias))
                if len(stmt.body) == 1:
                    from_stmt[mod] = i
    new_modules: list[tuple[str, str | None]] = []
    new_names: dict[str, list[tuple[str, str | None]]] = {}
    for mod, obj, asname in imports:
        if obj is None:
            if (mod, asname) not in have_modules and (mod, asname) not in new_modules:
                new_modules.append((mod, asname))
        elif mod not in star and (mod, obj, asname) not in have_names and (obj, asname) not in new_names.get(mod, []):
            new_names.setdefault(mod, []).append((obj, asname))
    if not new_modules and not new_names:
        return module

    def dotted_name(name: str) -> cst.Attribute | cst.Name:
        return cst.ensure_type(cst.parse_expression(name), (cst.Attribute, cst.Name))  # type: ignore[arg-type]

    def alias(name: str, asname: str | None) -> cst.ImportAlias:
        return cst.ImportAlias(dotted_name(name), asname=cst.AsName(cst.Name(asname)) if asname else None)

    added: list[cst.BaseStatement] = [cst.SimpleStatementLine([cst.Import([alias(m, a)])]) for m, a in new_modules]
    for mod, names in new_names.items():
        if mod in from_stmt:  # join the existing `from mod import ...`
            i = from_stmt[mod]
            line = cst.ensure_type(body[i], cst.SimpleStatementLine)
            node = cst.ensure_type(line.body[0], cst.ImportFrom)
            old = list(cast(Sequence[cst.ImportAlias], node.names))
            last = old[-1]
            if not isinstance(last.comma, cst.Comma):
                old[-1] = last.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
                extra = [
                    alias(n, a).with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
                    for n, a in names
                ]
                extra[-1] = extra[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
            else:  # a parenthesised list ending in a comma keeps that style
                extra = [alias(n, a).with_changes(comma=last.comma) for n, a in names]
            body[i] = line.with_changes(body=[node.with_changes(names=[*old, *extra])])
        else:
            added.append(
                cst.SimpleStatementLine(
                    [cst.ImportFrom(module=dotted_name(mod), names=[alias(n, a) for n, a in names])]
                )
            )
    if added:
        at = 0
        if (
            body
            and isinstance(body[0], cst.SimpleStatementLine)
            and m.matches(body[0].body[0], m.Expr(m.SimpleString() | m.ConcatenatedString()))
        ):
            at = 1  # the module docstring
        while at < len(body) and _is_import_line(body[at]):
            at += 1
        nxt = body[at] if at < len(body) else None
        if isinstance(nxt, (cst.SimpleStatementLine, cst.BaseCompoundStatement)) and not nxt.leading_lines:
            body[at] = nxt.with_changes(leading_lines=[cst.EmptyLine()])
        body[at:at] = added
    return module.with_changes(body=body)


def remove_unused_imports(module: cst.Module, imports: Iterable[ImportSpec]) -> cst.Module:
    """Drop these imports where nothing in the module uses them any more (RemoveImportsVisitor)."""
    context = CodemodContext()
    for mod, obj, asname in imports:
        RemoveImportsVisitor.remove_unused_import(context, mod, obj, asname)
    if not context.scratch.get(RemoveImportsVisitor.CONTEXT_KEY):
        return module
    return RemoveImportsVisitor(context).transform_module(module)


def helper_imports(ctx: Context, *names: str) -> list[ImportSpec]:
    """`from <the helper module> import name` for each name (the helper is megatron/core/_rocm.py,
    or src/megatron/bridge/_rocm.py in the Bridge)."""
    return [(ctx.helper_module, n, None) for n in names]


def visit_with_helper_import(
    module: cst.Module, transformer, ctx: Context, *names: str, metadata: bool = True
) -> tuple[cst.Module, int]:
    """Run a site-counting transformer (with the metadata it declares, unless ``metadata`` is False:
    it asks none); when it rewrote anything, import the helper ``names`` it needs."""
    module = ctx.wrap(module).visit(transformer) if metadata else module.visit(transformer)
    if transformer.sites:
        module = add_imports(module, helper_imports(ctx, *names))
    return module, transformer.sites
