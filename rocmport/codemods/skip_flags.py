"""Module-level skips on a flag whose truth implies a package imports (guard-nvidia-only-imports 5).

v0.19's generalized_tensor_parallel tests:

    from megatron.core.tensor_parallel.gtp_api import HAVE_GTP

    if not HAVE_GTP:
        pytest.skip("GTP requires TransformerEngine >= 2.19", allow_module_level=True)

    import transformer_engine.pytorch as te

HAVE_GTP is true only where transformer_engine imports (gtp_api.py: `HAVE_GTP = HAVE_TE` after
importing HAVE_TE from generalized_tensor_parallelism.py, where `HAVE_TE = True` follows `import
transformer_engine as te` in a try; every other binding is False). Without the package the file skips
itself before the import, so a guard on it could never run.

What counts as proof, read from the tree with libcst (anything else is not proven: the import is
guarded as before):

- the skip: a module-level `if not FLAG:` one of whose own statements is
  `pytest.skip(..., allow_module_level=True)`, after a module-level `import pytest`. What the body
  does before it completes or raises: either way the module goes no further where FLAG is falsy.
- the flag: every binding of FLAG anywhere in its module (in any scope: conservative) is one of
  `FLAG = False` / `FLAG = None`; `FLAG = <anything>` as a statement of a `try:` body after a
  statement of that body that imports the package; `FLAG = OTHER` with OTHER implying the package
  by these rules in the same module; `from M import X [as FLAG]` with M a module of the tree whose X
  implies it. At least one binding is not a falsy constant, the module has no `import *`, and the
  chain takes at most MAX_HOPS hops.
- the package is a top-level one, as for `pytest.importorskip` (version 4).

Not seen, as by any reading of the code: something setting the flag from outside its module
(monkeypatching, `globals()`)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

import libcst as cst

from rocmport.codemods.base import dotted
from rocmport.codemods.feature_probes import _resolve, module_name

MAX_HOPS = 6
# Cheap text test of a file that may hold such a skip (the parse settles it).
_SKIP_IF = re.compile(r"^if[ \t]+not[ \t]+\w+[ \t]*:", re.M)


def skip_unless(stmt: cst.BaseStatement) -> str | None:
    """FLAG, when ``stmt`` is `if not FLAG:` with `pytest.skip(..., allow_module_level=True)` as one of
    its body's own statements."""
    if not isinstance(stmt, cst.If) or not isinstance(stmt.test, cst.UnaryOperation):
        return None
    if not isinstance(stmt.test.operator, cst.Not) or not isinstance(stmt.test.expression, cst.Name):
        return None
    for line in stmt.body.body if isinstance(stmt.body, cst.IndentedBlock) else []:
        if not isinstance(line, cst.SimpleStatementLine):
            continue
        for small in line.body:
            call = small.value if isinstance(small, cst.Expr) else None
            if (
                isinstance(call, cst.Call)
                and dotted(call.func) == "pytest.skip"
                and any(
                    a.keyword is not None
                    and a.keyword.value == "allow_module_level"
                    and isinstance(a.value, cst.Name)
                    and a.value.value == "True"
                    for a in call.args
                )
            ):
                return stmt.test.expression.value
    return None


def imports_pytest(stmt: cst.BaseStatement) -> bool:
    """``stmt`` is a module-level line binding pytest to the pytest module (`import pytest`)."""
    return isinstance(stmt, cst.SimpleStatementLine) and any(
        isinstance(s, cst.Import) and any(dotted(a.name) == "pytest" and a.asname is None for a in s.names)
        for s in stmt.body
    )


def candidates(texts: Mapping[str, str], files: Iterable[str]) -> list[str]:
    """Of ``files``, those that may hold a module-level `if not FLAG: pytest.skip(...)` (text only)."""
    return [rel for rel in files if "allow_module_level" in texts[rel] and _SKIP_IF.search(texts[rel])]


def _targets(node: cst.BaseExpression | None) -> Iterable[cst.Name]:
    """The names an assignment target binds (tuples, lists and starred ones unpacked)."""
    if isinstance(node, cst.Name):
        yield node
    elif isinstance(node, (cst.Tuple, cst.List)):
        for el in node.elements:
            yield from _targets(el.value)
    elif isinstance(node, cst.StarredElement):
        yield from _targets(node.value)


class _Bindings(cst.CSTVisitor):
    """Every node binding ``name`` anywhere in a module (any scope), and whether it star-imports.

    ``expressions``: whether to descend into expressions. Without assignment expressions (`:=`)
    nothing inside an expression binds a name in a module's or a function's scope (comprehension
    and lambda targets bind their own), so a module without `:=` is read from its statements,
    parameters and patterns alone: a tenth of the time on a 2,000-line module."""

    def __init__(self, name: str, expressions: bool = True):
        self.name = name
        self.expressions = expressions
        self.found: list[cst.CSTNode] = []
        self.star = False

    def on_visit(self, node: cst.CSTNode) -> bool:
        return super().on_visit(node) and (self.expressions or not isinstance(node, cst.BaseExpression))

    def _names(self, node: cst.BaseExpression | None) -> None:
        self.found += [n for n in _targets(node) if n.value == self.name]

    def visit_AssignTarget(self, node: cst.AssignTarget) -> None:
        self._names(node.target)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        self._names(node.target)

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        self._names(node.target)

    def visit_For(self, node: cst.For) -> None:
        self._names(node.target)

    def visit_CompFor(self, node: cst.CompFor) -> None:
        self._names(node.target)

    def visit_NamedExpr(self, node: cst.NamedExpr) -> None:
        self._names(node.target)

    def visit_Del(self, node: cst.Del) -> None:
        self._names(node.target)

    def visit_AsName(self, node: cst.AsName) -> None:
        if not isinstance(node.name, cst.Name):
            self._names(node.name)  # `with ... as (a, b)`

    def visit_ImportAlias(self, node: cst.ImportAlias) -> None:
        bound = node.asname.name if node.asname else None
        name = bound.value if isinstance(bound, cst.Name) else (dotted(node.name) or "").split(".")[0]
        if name == self.name:
            self.found.append(node)

    def visit_ImportStar(self, node: cst.ImportStar) -> None:
        self.star = True

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self._names(node.name)

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self._names(node.name)

    def visit_Param(self, node: cst.Param) -> None:
        self._names(node.name)

    def visit_ExceptHandler(self, node: cst.ExceptHandler) -> None:
        if node.name is not None:
            self._names(node.name.name)

    def visit_ExceptStarHandler(self, node: cst.ExceptStarHandler) -> None:
        if node.name is not None:
            self._names(node.name.name)

    def visit_MatchAs(self, node: cst.MatchAs) -> None:
        self._names(node.name)

    def visit_MatchStar(self, node: cst.MatchStar) -> None:
        self._names(node.name)

    def visit_MatchMapping(self, node: cst.MatchMapping) -> None:
        self._names(node.rest)

    def visit_WithItem(self, node: cst.WithItem) -> None:
        if node.asname is not None:
            self._names(node.asname.name)


def _imported_tops(stmt: cst.BaseStatement) -> list[tuple[str, cst.CSTNode]]:
    """The top-level packages a simple statement line imports (absolute imports), with each import."""
    out: list[tuple[str, cst.CSTNode]] = []
    if isinstance(stmt, cst.SimpleStatementLine):
        for s in stmt.body:
            if isinstance(s, cst.Import):
                out += [((dotted(a.name) or "").split(".")[0], s) for a in s.names]
            elif isinstance(s, cst.ImportFrom) and not s.relative and s.module is not None:
                out.append(((dotted(s.module) or "").split(".")[0], s))
    return out


def _statements(block) -> list[cst.BaseStatement]:
    if isinstance(block, cst.SimpleStatementSuite):  # `if x: y = 1` on one line
        return [cst.SimpleStatementLine(body=block.body)]
    return list(getattr(block, "body", []))


def _blocks(stmt: cst.BaseStatement) -> list[tuple[list[cst.BaseStatement], bool]]:
    """The statement lists inside a compound statement, each with whether it is a try's own body."""
    out: list[tuple[list[cst.BaseStatement], bool]] = []
    if isinstance(stmt, (cst.Try, cst.TryStar)):
        out.append((_statements(stmt.body), True))
        out += [(_statements(h.body), False) for h in stmt.handlers]
        out += [(_statements(p.body), False) for p in (stmt.orelse, stmt.finalbody) if p is not None]
    elif isinstance(stmt, cst.If):
        out.append((_statements(stmt.body), False))
        if isinstance(stmt.orelse, cst.If):
            out.append(([stmt.orelse], False))
        elif stmt.orelse is not None:
            out.append((_statements(stmt.orelse.body), False))
    elif isinstance(stmt, (cst.For, cst.While)):
        out.append((_statements(stmt.body), False))
        if stmt.orelse is not None:
            out.append((_statements(stmt.orelse.body), False))
    elif isinstance(stmt, (cst.With, cst.FunctionDef, cst.ClassDef)):
        out.append((_statements(stmt.body), False))
    elif isinstance(stmt, cst.Match):
        out += [(_statements(c.body), False) for c in stmt.cases]
    return out


class Prover:
    """Which names of which modules of a tree imply which packages; each module parsed once."""

    def __init__(self, texts: Mapping[str, str], packages: Iterable[str]):
        self.texts = texts
        self.packages = set(packages)
        self.modules = {m: rel for rel in texts if (m := module_name(rel))}
        self.parsed: dict[str, cst.Module | None] = {}
        self.memo: dict[tuple[str, str], dict[str, str]] = {}

    def module(self, rel: str) -> cst.Module | None:
        if rel not in self.parsed:
            try:
                self.parsed[rel] = cst.parse_module(self.texts[rel])
            except (cst.ParserSyntaxError, RecursionError, ValueError):
                self.parsed[rel] = None
        return self.parsed[rel]

    def implies(self, rel: str, name: str, hops: int = 0, seen: frozenset = frozenset()) -> dict[str, str]:
        """package -> the proof that ``name`` in ``rel`` is true only where the package imports."""
        key = (rel, name)
        if key in seen or hops > MAX_HOPS:
            return {}
        if key not in self.memo:
            self.memo[key] = self._implies(rel, name, hops, seen | {key})
        return self.memo[key]

    def _implies(self, rel: str, name: str, hops: int, seen: frozenset) -> dict[str, str]:
        module = self.module(rel)
        if module is None:
            return {}
        bindings = _Bindings(name, expressions=":=" in self.texts[rel])
        module.visit(bindings)
        if bindings.star or not bindings.found:
            return {}
        proofs: dict[int, dict[str, str] | None] = {}  # id(binding node) -> its proofs (None: a falsy constant)
        self._walk(list(module.body), rel, name, hops, seen, proofs, False)
        if any(id(node) not in proofs for node in bindings.found):
            return {}  # a binding of another form
        found = [p for p in proofs.values() if p is not None]
        if not found:
            return {}
        packages = set.intersection(*(set(p) for p in found))
        return {pkg: " and ".join(sorted({p[pkg] for p in found})) for pkg in sorted(packages)}

    def _walk(self, body, rel, name, hops, seen, proofs, try_body: bool) -> None:
        """Classify the accepted binding forms of ``name`` in ``body`` (statements), recursively;
        ``try_body``: ``body`` is a try's own body."""
        for i, stmt in enumerate(body):
            if isinstance(stmt, cst.SimpleStatementLine):
                for small in stmt.body:
                    if isinstance(small, cst.Assign):
                        self._assign(small, body[:i] if try_body else [], rel, name, hops, seen, proofs)
                    elif isinstance(small, cst.ImportFrom) and not isinstance(small.names, cst.ImportStar):
                        for alias in small.names:
                            bound = alias.asname.name if alias.asname else alias.name
                            if isinstance(bound, cst.Name) and bound.value == name:
                                proofs[id(alias)] = self._from_import(small, alias, rel, name, hops, seen)
                continue
            for block, is_try in _blocks(stmt):
                self._walk(block, rel, name, hops, seen, proofs, is_try)

    def _assign(self, node: cst.Assign, before, rel, name, hops, seen, proofs) -> None:
        if len(node.targets) != 1 or not isinstance(node.targets[0].target, cst.Name):
            return
        target = node.targets[0].target
        if target.value != name:
            return
        value = node.value
        if isinstance(value, cst.Name) and value.value in ("False", "None"):
            proofs[id(target)] = None
            return
        found: dict[str, str] = {}
        for stmt in before:
            for top, imp in _imported_tops(stmt):
                if top in self.packages and top not in found:
                    code = cst.Module([]).code_for_node(imp).strip()
                    found[top] = f"{name} ({rel}: after `{code}` in its try)"
        if isinstance(value, cst.Name) and value.value != "True":
            for pkg, proof in self.implies(rel, value.value, hops + 1, seen).items():
                found.setdefault(pkg, f"{name} ({rel}) ⇐ {proof}")
        proofs[id(target)] = found

    def _from_import(self, node: cst.ImportFrom, alias: cst.ImportAlias, rel, name, hops, seen) -> dict[str, str]:
        level = len(node.relative)
        source = _resolve(rel, dotted(node.module) or "" if node.module else "", level)
        target_rel = self.modules.get(source)
        original = dotted(alias.name)
        if target_rel is None or original is None:
            return {}
        found = self.implies(target_rel, original, hops + 1, seen)
        if original == name:
            return found
        return {pkg: f"{name} ({rel}) ⇐ {proof}" for pkg, proof in found.items()}


def skip_flags(texts: Mapping[str, str], files: Iterable[str], packages: Iterable[str]) -> dict[str, dict]:
    """Of ``files``: relpath -> {FLAG: {package: proof}} for each flag of a module-level
    `if not FLAG: pytest.skip(..., allow_module_level=True)` that implies one of ``packages``."""
    prover = Prover(texts, packages)
    out: dict[str, dict] = {}
    for rel in sorted(candidates(texts, files)):
        module = prover.module(rel)
        if module is None:
            continue
        flags = {f for stmt in module.body if (f := skip_unless(stmt))}
        found = {flag: proofs for flag in sorted(flags) if (proofs := prover.implies(rel, flag))}
        if found:
            out[rel] = found
    return out
