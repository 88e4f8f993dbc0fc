"""The generated runtime helper is assembled from each codemod's piece (rocmport/codemods/runtime/):
for every line's recipe it parses, defines every name the recipe's rewrites and patches import, and
uses no name it does not define; each piece belongs to one codemod and only that codemod's rewrites
import its names. Read with ast: nothing here imports torch."""

from __future__ import annotations

import ast
import builtins
import re
import sys
from pathlib import Path

import pytest

from rocmport.codemods import helper, registry
from rocmport.codemods.runner import recipe_helper_text
from rocmport.patches.series import load_series

REPO = Path(__file__).resolve().parents[2]
SERIES = sorted(REPO.glob("patchsets/*/*/series"))


def top_level_names(source: str, imports: bool = True) -> set[str]:
    """What a module defines at its top level (and, with ``imports``, the names its imports bind)."""
    names: set[str] = set()
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)) and imports:
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def undefined_names(source: str) -> set[str]:
    """Names the module reads that nothing in it binds and that are not builtins (a coarse check:
    a name bound anywhere counts as bound everywhere)."""
    tree = ast.parse(source)
    bound = set(dir(builtins)) | {"__file__", "__name__"}
    loaded = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (loaded if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
    return loaded - bound


# How a codemod's source names the helper names its rewrites import: every string argument of these
# calls, or (prepend_to_validate_args(module, ctx, "apply_launch_env", ...), capability-gates'
# self._helper(node, "nvidia_arch_major", ...)) the first one; `x.uses.add("te_gate")` collects
# names imported later; the values of a module-level `*_FALLBACKS` dict (fused-kernel-fallbacks:
# kernel -> helper class) are imported too. A codemod that names them another way adds it here.
ALL_STRINGS = {"helper_import", "helper_imports", "visit_with_helper_import", "add"}
FIRST_STRING = {"prepend_to_validate_args", "_helper"}


def codemod_tree(codemod: str) -> ast.Module:
    return ast.parse(Path(sys.modules[type(registry[codemod]).__module__].__file__).read_text())


def referenced(codemod: str) -> set[str]:
    """The helper names a codemod's rewrites import, read from its source (see ALL_STRINGS)."""
    names: set[str] = set()
    tree = codemod_tree(codemod)
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Dict)
            and any(isinstance(t, ast.Name) and t.id.endswith("_FALLBACKS") for t in node.targets)
        ):
            names |= {v.value for v in node.value.values if isinstance(v, ast.Constant) and isinstance(v.value, str)}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = (
            node.func.id
            if isinstance(node.func, ast.Name)
            else node.func.attr
            if isinstance(node.func, ast.Attribute)
            else ""
        )
        if func == "add" and not (
            isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Attribute)
            and node.func.value.attr == "uses"
        ):
            continue
        strings = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        for value in strings if func in ALL_STRINGS else strings[:1] if func in FIRST_STRING else []:
            names |= {part.strip().split(" as ")[0] for part in value.split(",")}
    return {n for n in names if n.isidentifier()}


def spelled(codemod: str, public: set[str]) -> set[str]:
    """Every public helper name a codemod's module spells in a string, docstrings aside (f-strings'
    text included): what `referenced` must find, so that it misses no way of naming one."""
    tree = codemod_tree(codemod)
    docstrings = {
        id(n.body[0].value)
        for n in ast.walk(tree)
        if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef))
        and n.body
        and isinstance(n.body[0], ast.Expr)
        and isinstance(n.body[0].value, ast.Constant)
    }
    words: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            words |= set(re.findall(r"[A-Za-z_]\w*", node.value))
    return words & public


def public_names(source: str) -> set[str]:
    return {n for n in top_level_names(source, imports=False) if not n.startswith("_")}


FULL = helper.helper_text(list(registry))
PUBLIC = public_names(FULL)


def piece_names(piece: str) -> set[str]:
    """The public names a piece's parts define."""
    return public_names("".join(text for _, text in helper.parts(piece)))


def codemod_names(series) -> list[str]:
    return [c if isinstance(c, str) else c["name"] for c in series.codemods]


@pytest.mark.parametrize("path", SERIES, ids=lambda p: f"{p.parts[-3]}-{p.parts[-2]}")
def test_each_lines_helper_defines_what_its_recipe_imports(path):
    series = load_series(path)
    text = recipe_helper_text(series.codemods)
    assert text.startswith("# GENERATED by rocmport (" + ", ".join(codemod_names(series)) + "): do not edit")
    defined = top_level_names(text)
    wanted = {name for c in codemod_names(series) for name in referenced(c)}
    # what the line's patches import from the helper too (patch 0001: hip_runtime_version)
    for patch in series.patches:
        for line in patch.diff.splitlines():
            found = re.match(r"\+\s*from megatron\.\w+\._rocm import (.+)", line)
            wanted |= {n.strip().split(" as ")[0] for n in found.group(1).split(",")} if found else set()
    assert wanted and wanted <= defined, wanted - defined
    assert undefined_names(text) == set()
    compile(text, str(path), "exec")


@pytest.mark.parametrize("codemod", sorted(registry))
def test_a_recipe_of_one_codemod_gets_a_whole_helper(codemod):
    """The pieces a piece imports from come along (fused-kernel-fallbacks' disable_missing_fusions
    reads grouped-gemm's GROUPED_GEMM_ROCM_HINT): the module uses no name it does not define."""
    text = helper.helper_text([codemod])
    assert undefined_names(text) == set()
    assert referenced(codemod) <= top_level_names(text)


def test_each_piece_belongs_to_one_codemod_and_only_its_rewrites_import_it():
    pieces = [p for p in helper.pieces() if p != helper.CORE]
    by_piece = {helper.piece_name(name): name for name in registry}
    assert set(pieces) <= set(by_piece), set(pieces) - set(by_piece)
    core = piece_names(helper.CORE)
    for piece in pieces:
        owner = by_piece[piece]
        assert registry[owner].USES_HELPER, owner
        mine = piece_names(piece)
        assert referenced(owner) & mine, f"{owner} imports nothing of runtime/{piece}.py"
        others = {name: referenced(name) & mine for name in registry if name != owner}
        assert {n: sorted(r) for n, r in others.items() if r} == {}, piece
    for name in registry:  # a codemod imports only core's names and its own piece's
        own = piece_names(helper.piece_name(name)) if helper.piece_name(name) in pieces else set()
        assert referenced(name) <= core | own, name


@pytest.mark.parametrize("codemod", sorted(registry))
def test_the_reader_of_references_misses_none(codemod):
    """What `referenced` reads from a codemod is every helper name its module spells (and its
    rewrites import something: is_hip at least)."""
    assert referenced(codemod) and referenced(codemod) >= spelled(codemod, PUBLIC)


def test_parts_are_numbered_once_and_the_pieces_are_whole():
    numbers = [n for piece in helper.pieces() for n, _ in helper.parts(piece)]
    assert len(numbers) == len(set(numbers))
    assert FULL.count("\n") > 600 and helper.helper_text([]).startswith("# GENERATED by rocmport (): ")
    # every line of a piece below its first marker is in a part (nothing between parts is lost)
    for piece in helper.pieces():
        source = helper.piece_source(piece) or ""
        first = re.search(r"^# >>> helper part ", source, re.M)
        assert first, piece
        body = source[first.start() :]
        outside = helper.PART.sub("", body)
        assert outside.strip() == "", (piece, outside[:200])


def test_the_port_site_recorder_comes_last():
    """It wraps the public helpers defined before it: a part after it would go unrecorded."""
    numbered = sorted((n, piece) for piece in helper.pieces() for n, _ in helper.parts(piece))
    last_number, last_piece = numbered[-1]
    assert last_piece == helper.CORE and "_record_port_sites(__import__" in dict(helper.parts(helper.CORE))[last_number]
    assert FULL.rstrip().endswith('_record_port_sites(__import__("os").environ["ROCMPORT_PORT_SITES"])')


def test_an_unclosed_part_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(helper, "piece_source", lambda piece: "# >>> helper part 5\nX = 1\n")
    with pytest.raises(ValueError, match="without its"):
        helper.parts("core")
