"""Count the functions in rocmport/ that return a dict (issue #32: "84 functions return `dict`").

Reproducible from any checkout: `python scripts/count_dict_returns.py [--list] [ROOT]`. Three counts:
  annotated   `def ... -> dict` / `-> dict[...]` / `-> dict | None` (any annotation whose top type is dict)
  bare        of those, the unparameterized `dict` (a structured result with no declared shape)
  literal     functions whose own body has `return {...}` / `return {k: v for ...}` / `return dict(...)`
and `either`, the functions in at least one of annotated or literal; `structured`, those of `either`
that are not a JSON boundary (`to_dict`, `to_json`, `to_record`: a typed result's serialisation, where a
dict is the point)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path


BOUNDARY = {"to_dict", "to_json", "to_record"}


def _is_dict(node: ast.expr | None) -> tuple[bool, bool]:
    """(the annotation is a dict, it is the bare unparameterized dict)."""
    if node is None:
        return False, False
    if isinstance(node, ast.Constant) and isinstance(node.value, str):  # a string annotation
        try:
            node = ast.parse(node.value, mode="eval").body
        except SyntaxError:
            return False, False
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):  # dict | None
        for side in (node.left, node.right):
            d, bare = _is_dict(side)
            if d:
                return d, bare
        return False, False
    if isinstance(node, ast.Name) and node.id in ("dict", "Dict"):
        return True, True
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id in ("dict", "Dict"):
        return True, False
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == "Optional":
        return _is_dict(node.slice)
    return False, False


def _own_returns(fn: ast.FunctionDef | ast.AsyncFunctionDef):
    """The return statements of ``fn`` itself, not of the functions nested in it."""
    stack: list[ast.AST] = list(fn.body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            continue
        if isinstance(node, ast.Return):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def _returns_literal(fn) -> bool:
    for ret in _own_returns(fn):
        v = ret.value
        if isinstance(v, (ast.Dict, ast.DictComp)):
            return True
        if isinstance(v, ast.Call) and isinstance(v.func, ast.Name) and v.func.id == "dict":
            return True
    return False


def count(root: Path) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {"annotated": [], "bare": [], "literal": [], "either": [], "structured": []}
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            where = f"{path}:{node.lineno} {node.name}"
            annotated, bare = _is_dict(node.returns)
            literal = _returns_literal(node)
            boundary = node.name in BOUNDARY
            for key, on in (
                ("annotated", annotated),
                ("bare", bare),
                ("literal", literal),
                ("either", annotated or literal),
                ("structured", (annotated or literal) and not boundary),
            ):
                if on:
                    found[key].append(where)
    return found


def main(argv: list[str]) -> int:
    listing = "--list" in argv
    args = [a for a in argv if a != "--list"]
    root = Path(args[0]) if args else Path(__file__).resolve().parent.parent / "rocmport"
    found = count(root)
    for key, items in found.items():
        print(f"{key}: {len(items)}")
        if listing:
            for item in items:
                print(f"  {item}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
