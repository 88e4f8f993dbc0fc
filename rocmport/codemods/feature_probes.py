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

from rocmport.nvidia_only import handles_import_error

# Cheap index of which files may import which module (`from X import` / `import X, Y`); a parse of
# each file it names settles what the import is.
_IMPORT = re.compile(r"^[ \t]*(?:from[ \t]+(\.*[\w.]*)[ \t]+import\b|import[ \t]+([\w. \t,]+))", re.M)
# The try statements (3.11 adds `except*`).
_TRY = (ast.Try, ast.TryStar) if hasattr(ast, "TryStar") else (ast.Try,)
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
    base = package[: max(0, len(package) - (level - 1))]
    return ".".join([*base, module] if module else base)


@dataclass
class _Index:
    """module name (as written, relative ones resolved) -> files that may import it; and module name
    -> files that may import a module below it."""

    named: dict[str, set[str]]
    below: dict[str, set[str]]

    def may_import(self, modules: Iterable[str]) -> set[str]:
        """Files that may import one of ``modules``, a module below one, or one by name from its parent."""
        out: set[str] = set()
        for m in modules:
            out |= self.named.get(m, set()) | self.below.get(m, set()) | self.named.get(m.rpartition(".")[0], set())
        return out


def _index(texts: Mapping[str, str]) -> _Index:
    named: dict[str, set[str]] = {}
    below: dict[str, set[str]] = {}
    for rel, text in texts.items():
        for frm, imp in _IMPORT.findall(text):
            names = [frm] if frm else [n.split(" as ")[0].strip() for n in imp.split(",")]
            for name in names:
                level = len(name) - len(name.lstrip("."))
                module = _resolve(rel, name.lstrip("."), level)
                named.setdefault(module, set()).add(rel)
                parts = module.split(".")
                for i in range(1, len(parts)):
                    below.setdefault(".".join(parts[:i]), set()).add(rel)
    return _Index(named, below)


def _inside(relpath: str, scope: str) -> bool:
    module = module_name(relpath)
    return module is not None and (module == scope or module.startswith(scope + "."))


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(relpath: str, body: list[ast.stmt], kind: str = "module") -> Iterable[tuple[list[str], ImportSite]]:
    """Every import statement of a file (statements only: imports are never expressions), with the
    modules it may import and what surrounds it."""
    for node in body:
        if isinstance(node, ast.Import):
            yield [a.name for a in node.names], ImportSite(relpath, node.lineno, kind)
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(relpath, node.module or "", node.level)
            yield [base] + [f"{base}.{a.name}" for a in node.names], ImportSite(relpath, node.lineno, kind)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield from _imports(relpath, node.body, "function")
        elif isinstance(node, _TRY):
            probe = any(handles_import_error(h) for h in node.handlers)
            yield from _imports(relpath, node.body, "probe" if probe else kind)
            for part in [h.body for h in node.handlers] + [node.orelse, node.finalbody]:
                yield from _imports(relpath, part, kind)
        elif isinstance(node, ast.If):
            yield from _imports(relpath, node.body, "typing" if _is_type_checking(node.test) else kind)
            yield from _imports(relpath, node.orelse, kind)
        elif isinstance(node, (ast.ClassDef, ast.With, ast.AsyncWith, ast.For, ast.AsyncFor, ast.While)):
            yield from _imports(relpath, node.body, kind)
            yield from _imports(relpath, getattr(node, "orelse", []), kind)
        elif isinstance(node, ast.Match):
            for case in node.cases:
                yield from _imports(relpath, case.body, kind)


class _Parsed:
    """Each file's imports, found once, on demand."""

    def __init__(self, texts: Mapping[str, str]):
        self.texts = texts
        self.found: dict[str, list[tuple[list[str], ImportSite]]] = {}

    def sites(self, files: Iterable[str], targets: set[str]) -> list[ImportSite]:
        """Every import of one of ``targets`` in ``files`` (a module importing itself aside)."""
        out = []
        for rel in sorted(files):
            if rel not in self.found:
                try:
                    self.found[rel] = list(_imports(rel, ast.parse(self.texts[rel]).body))
                except (SyntaxError, ValueError):
                    self.found[rel] = []  # the codemod runner reports files it cannot parse
            own = module_name(rel)
            for modules, site in self.found[rel]:
                if any(m in targets and m != own or any(m.startswith(t + ".") for t in targets) for m in modules):
                    out.append(site)
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
            inner = {f for f in index.may_import(frontier) & library if _inside(f, scope)}
            frontier = {
                m
                for s in parsed.sites(inner, frontier)
                if s.kind == "module" and (m := module_name(s.path)) and m not in dependents
            }
            dependents |= frontier
        outer = {f for f in index.may_import(dependents) & library if not _inside(f, scope)}
        found = parsed.sites(outer, dependents)
        if any(s.kind == "probe" for s in found) and all(s.kind != "module" for s in found):
            out[rel] = sorted({s.path for s in found if s.kind == "probe"})
    return out
