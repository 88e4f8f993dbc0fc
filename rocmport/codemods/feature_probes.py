"""Feature probes: first-party modules that upstream imports only behind `try: ... except ImportError`.

Upstream decides some features by whether one of its own modules imports. Upstream main
(megatron/training/checkpointing.py, 0.20.0):

    try:
        from megatron.post_training.utils import print_distributed_quant_summary
        has_nvidia_modelopt = True
    except Exception:
        has_nvidia_modelopt = False

megatron/post_training/utils.py imports modelopt at its top, so this is a probe for modelopt. If a
codemod makes that module import without modelopt (guarded imports bound to placeholders), the probe
says the feature is there, and the first checkpoint save calls into modelopt. Such a module must keep
failing to import where its package is absent.

`probe_only_files` finds them over a whole tree. A file's *feature scope* is the package it belongs
to just below the top-level one (megatron.post_training for megatron/post_training/utils.py), or the
file alone when it sits higher. Its *dependents* are itself and the scope's modules that import a
dependent at their top (if it fails, they fail). The file is left alone when library code outside
the scope imports a dependent through at least one probe and never at the importing module's top.
Imports inside functions do not count (that code meets the absent package when it runs, as
upstream's does, and upstream calls it under the probe's flag: `if has_nvidia_modelopt: from
megatron.post_training.checkpointing import ...`), nor do `TYPE_CHECKING` imports, nor imports of
the scope's other modules (tools/run_text_generation_server.py imports megatron.post_training.arguments,
which imports no NVIDIA-only package). Library code is everything outside the top-level `tests/` and
`examples/` folders: a test or an example that imports the module needs the package either way."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath

# Cheap index of which files may import which module (`from X import` / `import X, Y`); a parse of
# each file it names settles what the import is.
_IMPORT = re.compile(r"^[ \t]*(?:from[ \t]+(\.*[\w.]*)[ \t]+import\b|import[ \t]+([\w. \t,]+))", re.M)
_CATCHES_IMPORT_ERROR = {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"}
_NOT_LIBRARY = {"tests", "examples"}


@dataclass(frozen=True)
class ImportSite:
    path: str
    line: int
    kind: str  # "probe" | "module" (at the importer's top) | "function" | "typing"


def module_name(relpath: str) -> str | None:
    """The dotted module a file defines (`src/` layouts too), or None for a file no import names."""
    parts = list(PurePosixPath(relpath).with_suffix("").parts)
    if parts and parts[0] == "src":
        parts = parts[1:]
    if parts and parts[-1] == "__init__":
        parts = parts[:-1]
    if not parts or not all(p.isidentifier() for p in parts):
        return None
    return ".".join(parts)


def is_library(relpath: str) -> bool:
    parts = PurePosixPath(relpath).parts
    return not parts or parts[0] not in _NOT_LIBRARY


def _resolve(relpath: str, module: str, level: int) -> str:
    """The absolute module a relative `from ... import` in ``relpath`` names."""
    if not level:
        return module
    package = (module_name(relpath) or "").split(".")
    if not relpath.endswith("__init__.py"):
        package = package[:-1]
    base = package[: len(package) - (level - 1)] if level > 1 else package
    return ".".join([*base, module] if module else base)


def _index(texts: Mapping[str, str]) -> dict[str, set[str]]:
    """module name (as written, relative ones resolved) -> files that may import it."""
    out: dict[str, set[str]] = {}
    for rel, text in texts.items():
        for frm, imp in _IMPORT.findall(text):
            names = [frm] if frm else [n.split(" as ")[0].strip() for n in imp.split(",")]
            for name in names:
                level = len(name) - len(name.lstrip("."))
                out.setdefault(_resolve(rel, name.lstrip("."), level), set()).add(rel)
    return out


def _inside(relpath: str, scope: str) -> bool:
    module = module_name(relpath)
    return module is not None and (module == scope or module.startswith(scope + "."))


def _may_import(index: dict[str, set[str]], modules: set[str]) -> set[str]:
    """Files the index says import one of ``modules``, a module below one, or one by name from its parent."""
    out: set[str] = set()
    for name, files in index.items():
        if name in modules or any(name.startswith(m + ".") or m.rpartition(".")[0] == name for m in modules):
            out |= files
    return out


def _catches_import_error(handler: ast.ExceptHandler) -> bool:
    if handler.type is None:
        return True
    types = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return any((t.attr if isinstance(t, ast.Attribute) else getattr(t, "id", "")) in _CATCHES_IMPORT_ERROR for t in types)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


class _Sites(ast.NodeVisitor):
    """Every import in one file of one of ``targets``, with what surrounds it."""

    def __init__(self, relpath: str, targets: set[str]):
        self.relpath, self.targets = relpath, targets
        self.found: list[tuple[str, ImportSite]] = []
        self._context: list[str] = []  # innermost last: "probe", "function", "typing", "other"

    def _kind(self) -> str:
        for ctx in reversed(self._context):
            if ctx != "other":
                return ctx
        return "module"

    def _within(self, ctx: str, nodes: Iterable[ast.AST]) -> None:
        self._context.append(ctx)
        for node in nodes:
            self.visit(node)
        self._context.pop()

    def visit_FunctionDef(self, node: ast.AST) -> None:
        self._within("function", node.body)  # type: ignore[attr-defined]

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Try(self, node: ast.Try) -> None:
        probe = any(_catches_import_error(h) for h in node.handlers)
        self._within("probe" if probe else "other", node.body)
        self._within("other", [*node.handlers, *node.orelse, *node.finalbody])

    visit_TryStar = visit_Try  # type: ignore[assignment]

    def visit_If(self, node: ast.If) -> None:
        self._within("typing" if _is_type_checking(node.test) else "other", node.body)
        self._within("other", node.orelse)

    def _record(self, node: ast.stmt, modules: Iterable[str]) -> None:
        for target in self.targets:
            if any(m == target or m.startswith(target + ".") for m in modules):
                self.found.append((target, ImportSite(self.relpath, node.lineno, self._kind())))

    def visit_Import(self, node: ast.Import) -> None:
        self._record(node, [a.name for a in node.names])

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = _resolve(self.relpath, node.module or "", node.level)
        self._record(node, [base] + [f"{base}.{a.name}" for a in node.names])


class _Parsed:
    """Each file parsed once, on demand."""

    def __init__(self, texts: Mapping[str, str]):
        self.texts, self.trees = texts, {}

    def sites(self, files: Iterable[str], targets: set[str]) -> list[tuple[str, ImportSite]]:
        out = []
        for rel in sorted(files):
            if rel not in self.trees:
                try:
                    self.trees[rel] = ast.parse(self.texts[rel])
                except (SyntaxError, ValueError):
                    self.trees[rel] = None  # the codemod runner reports files it cannot parse
            if self.trees[rel] is not None:
                visitor = _Sites(rel, targets)
                visitor.visit(self.trees[rel])
                out += [(t, site) for t, site in visitor.found if module_name(rel) != t]
        return out


def _scope(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 2 else module


def probe_only_files(texts: Mapping[str, str], candidates: Iterable[str]) -> dict[str, list[str]]:
    """Of ``candidates`` (files of the tree), those to leave alone, each with the library files whose
    probes decide by them (sorted)."""
    modules = {rel: m for rel in candidates if is_library(rel) and (m := module_name(rel))}
    if not modules:
        return {}
    index, parsed = _index(texts), _Parsed(texts)
    library = {rel for rel in texts if is_library(rel)}
    out: dict[str, list[str]] = {}
    for rel, module in sorted(modules.items()):
        scope = _scope(module)
        dependents, frontier = {module}, {module}
        while frontier:  # the scope's modules that fail when one that fails is imported at their top
            inner = {f for f in _may_import(index, frontier) & library if _inside(f, scope)}
            frontier = {m for _, s in parsed.sites(inner, frontier) if s.kind == "module"
                        and (m := module_name(s.path)) and m not in dependents}
            dependents |= frontier
        outer = {f for f in _may_import(index, dependents) & library if not _inside(f, scope)}
        found = [s for _, s in parsed.sites(outer, dependents)]
        if any(s.kind == "probe" for s in found) and all(s.kind != "module" for s in found):
            out[rel] = sorted({s.path for s in found if s.kind == "probe"})
    return out
