"""Shared rewrite: wrap unguarded module-level imports of given packages in
`try: ... HAVE_X = True / except ImportError: <fallbacks>; HAVE_X = False`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Callable

import libcst as cst
from libcst.metadata import PositionProvider

from rocmport.codemods.base import Context, bound_names, dotted, import_names
from rocmport.codemods.edits import top_level_line
from rocmport.codemods.skip_flags import imports_pytest, skip_unless


def _top(modname: str) -> str:
    return modname.split(".")[0]


def matching_import(stmt: cst.BaseStatement, packages: set[str]) -> cst.Import | cst.ImportFrom | None:
    """The import of one of ``packages`` that ``stmt`` is, when it is a module-level import line."""
    if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
        return None
    node = stmt.body[0]
    if isinstance(node, (cst.Import, cst.ImportFrom)) and any(_top(m) in packages for m in import_names(node)):
        return node
    return None


def importorskipped(stmt: cst.BaseStatement) -> str | None:
    """The top-level package a module-level ``pytest.importorskip("pkg...")`` line skips the file
    without (``x = pytest.importorskip(...)`` too), else None."""
    if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
        return None
    node = stmt.body[0]
    call = node.value if isinstance(node, (cst.Expr, cst.Assign)) else None
    if not isinstance(call, cst.Call) or dotted(call.func) not in ("pytest.importorskip", "importorskip"):
        return None
    first = call.args[0].value if call.args else None
    if not isinstance(first, cst.SimpleString):
        return None
    name = first.evaluated_value
    return _top(name) if isinstance(name, str) and name else None


def guard_imports(
    module: cst.Module,
    ctx: Context,
    packages: set[str],
    fallback: Callable[[str, str, cst.Import | cst.ImportFrom], str],
    flag: Callable[[str], str],
    prelude: str | None = None,
    skip_flags: Mapping[str, Mapping[str, str]] | None = None,
) -> tuple[cst.Module, int]:
    """Guard runs of consecutive module-level imports of ``packages``.

    ``fallback(bound_name, full_dotted_source, node)`` returns the expression bound in the except
    branch, after ``prelude`` (e.g. an import of the helper); ``flag(top_package)`` names the HAVE_
    flag. Imports already inside a try are untouched, which makes the rewrite idempotent.

    ``skip_flags``: FLAG -> {package: proof} for flags whose truth implies the package imports
    (codemods/skip_flags.py): an import of such packages after a module-level `if not FLAG:
    pytest.skip(..., allow_module_level=True)` is left unguarded, as after a pytest.importorskip."""
    body = list(module.body)
    if not any(matching_import(stmt, packages) is not None for stmt in body):
        return module, 0

    def line(stmt: cst.BaseStatement) -> int:
        # The imports are statements of the module, mostly near its top: their lines from the code
        # before them, not from positions over the whole module (a codegen of all of it).
        found = top_level_line(module, stmt) if ctx.prefilter else None
        return found if found is not None else ctx.wrap(module).resolve(PositionProvider)[stmt].start.line

    out: list[cst.BaseStatement] = []
    sites = 0
    skipped: dict[str, str] = {}  # package -> the module-level skip without it (what, where, why)
    has_pytest = False

    def to_guard(stmt: cst.BaseStatement) -> cst.Import | cst.ImportFrom | None:
        """``stmt``'s import of ``packages``, unless each package it imports was importorskipped above:
        the file skips itself where that package is absent, so a guard there could never run."""
        imp = matching_import(stmt, packages)
        if imp is None:
            return None
        tops = {_top(m) for m in import_names(imp) if _top(m) in packages}
        if tops and tops <= skipped.keys():
            ctx.skip(
                f"left unguarded: {module.code_for_node(stmt).strip()}: the file skips itself without "
                + ", ".join(f"{t} ({skipped[t]})" for t in sorted(tops))
                + ", so a guard here could never run",
                line(stmt),
            )
            return None
        return imp

    i = 0
    while i < len(body):
        node = to_guard(body[i])
        if node is None:
            if (top := importorskipped(body[i])) is not None:
                skipped.setdefault(top, f"pytest.importorskip at line {line(body[i])}")
            has_pytest = has_pytest or imports_pytest(body[i])
            if has_pytest and skip_flags and (unless := skip_unless(body[i])) is not None and unless in skip_flags:
                for pkg, proof in skip_flags[unless].items():
                    skipped.setdefault(
                        pkg,
                        f"`if not {unless}: pytest.skip(..., allow_module_level=True)` at line {line(body[i])}, "
                        f"and {unless} is true only where {pkg} imports: {proof}",
                    )
            out.append(body[i])
            i += 1
            continue
        run: list[tuple[cst.BaseStatement, cst.Import | cst.ImportFrom]] = []
        while i < len(body) and (imp := to_guard(body[i])) is not None:
            run.append((body[i], imp))
            i += 1
        tops = sorted({_top(m) for _, imp in run for m in import_names(imp) if _top(m) in packages})
        flags = sorted({flag(t) for t in tops})
        try_lines = [module.code_for_node(stmt).strip("\n") for stmt, _ in run]
        except_lines = [prelude] if prelude else []
        for _, imp in run:
            for name, source in zip(bound_names(imp), _sources(imp)):
                except_lines.append(f"{name} = {fallback(name, source, imp)}")
        code = "try:\n" + "".join(f"    {ln}\n" for ln in "\n".join(try_lines).splitlines())
        code += "".join(f"    {f} = True\n" for f in flags)
        code += "except ImportError:\n"
        code += "".join(f"    {ln}\n" for ln in except_lines)
        code += "".join(f"    {f} = False\n" for f in flags)
        new = cst.parse_statement(code)
        first = cst.ensure_type(run[0][0], cst.SimpleStatementLine)
        out.append(new.with_changes(leading_lines=first.leading_lines))
        sites += len(run)
        for stmt, _ in run:
            ctx.site(
                f"guarded: {module.code_for_node(stmt).strip()} (except ImportError: {', '.join(flags)} = False)",
                line(stmt),
            )
    return (module.with_changes(body=out), sites) if sites else (module, 0)


def _sources(imp: cst.Import | cst.ImportFrom) -> list[str]:
    """The dotted thing each bound name stands for (`from a.b import c as d` -> 'a.b.c')."""
    if isinstance(imp, cst.Import):
        return [(dotted(a.name) or "") if a.asname else (dotted(a.name) or "").split(".")[0] for a in imp.names]
    if isinstance(imp.names, cst.ImportStar):
        return []
    mod = dotted(imp.module) or ""
    return [f"{mod}.{dotted(a.name)}" for a in imp.names]


def helper_import(ctx: Context, *names: str) -> str:
    return f"from {ctx.helper_module} import {', '.join(names)}"
