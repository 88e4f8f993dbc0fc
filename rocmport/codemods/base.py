"""What a codemod is: a name, a version, a one-line purpose, cheap trigger tokens, and a
transform over a parsed libcst Module that returns the new Module and its changed-site count."""

from __future__ import annotations

from dataclasses import dataclass, field
import libcst as cst

from rocmport.upstreams import upstream_of_path


@dataclass
class Context:
    """What a codemod knows about the file it transforms."""

    relpath: str
    options: dict = field(default_factory=dict)

    @property
    def helper_module(self) -> str:
        """The generated runtime helper rewritten sites import (megatron-core ships only megatron.core)."""
        return upstream_of_path(self.relpath).helper_module


class Codemod:
    NAME: str = ""
    VERSION: str = "1"
    DESCRIPTION: str = ""
    TRIGGERS: tuple[str, ...] = ()
    # Rewritten call sites import megatron/core/_rocm.py (written by the runner when needed).
    USES_HELPER: bool = False
    # The options a series may give it: name -> spec (see codemods/options.py); none by default.
    OPTIONS: dict = {}

    def triggers(self, options: dict) -> tuple[str, ...]:
        """Cheap text tokens: a file containing none of them is never parsed."""
        return self.TRIGGERS

    def triggered(self, text: str, options: dict | None = None) -> bool:
        # Tokens starting with "\n" match at the start of a line (the file's first line too).
        text = "\n" + text
        return any(t in text for t in self.triggers(options or {}))

    def transform(self, module: cst.Module, ctx: Context) -> tuple[cst.Module, int]:
        raise NotImplementedError


def dotted(node: cst.BaseExpression | None) -> str | None:
    """`a.b.c` for a Name/Attribute chain, else None."""
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        head = dotted(node.value)
        return f"{head}.{node.attr.value}" if head else None
    return None


def import_names(stmt: cst.Import | cst.ImportFrom) -> list[str]:
    """Top-level module names an import statement imports (`from a.b import c` -> ['a.b'])."""
    if isinstance(stmt, cst.Import):
        return [dotted(a.name) or "" for a in stmt.names]
    if stmt.relative:
        return []
    return [dotted(stmt.module) or ""]


def bound_names(stmt: cst.Import | cst.ImportFrom) -> list[str]:
    """The names an import statement binds in the module namespace."""
    out = []
    if isinstance(stmt, cst.Import):
        for a in stmt.names:
            out.append(cst.ensure_type(a.asname.name, cst.Name).value if a.asname else (dotted(a.name) or "").split(".")[0])
    elif not isinstance(stmt.names, cst.ImportStar):
        for a in stmt.names:
            out.append(cst.ensure_type(a.asname.name, cst.Name).value if a.asname else dotted(a.name) or "")
    return out


def is_try_import_guard(node: cst.Try) -> bool:
    """A `try:` with an `except ImportError/ModuleNotFoundError/Exception/bare` handler."""
    for h in node.handlers:
        if h.type is None:
            return True
        names = [dotted(e.value) for e in h.type.elements] if isinstance(h.type, cst.Tuple) else [dotted(h.type)]
        if any(n in ("ImportError", "ModuleNotFoundError", "Exception", "BaseException") for n in names):
            return True
    return False
