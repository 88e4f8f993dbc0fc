"""The layout's rules, read from the source with ast: the engine never imports the command layer,
no import cycle (function-level imports included, so none can hide one), and every package
imports only from the packages before it in the pipeline."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "rocmport"
# The pipeline, in order: a package may import from itself and from the ones before it.
# Top-level modules (errors, output, config, gitutil, upstreams ...) come first; the command layer
# and its entry points last.
PIPELINE = [
    "",
    "components",
    "upstream",
    "patches",
    "codemods",
    "port",
    "machine",
    "verify",
    "report",  # the HTML page of a verify report: reads its JSON (and the ported tree); refresh writes one
    "refresh",
    "package",
    "commands",
    "cli",
]
ENTRY_POINTS = {"rocmport.cli", "rocmport.__main__"}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The rocmport modules ``name`` imports anywhere in its file (function bodies included)."""
    is_package = path.name == "__init__.py"
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".")[: len(name.split(".")) - node.level + (1 if is_package else 0)]
                base = ".".join([*anchor, *([base] if base else [])])
            # `from pkg import mod` imports the module pkg.mod; `from mod import name` imports mod.
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target.startswith("rocmport") and target != name:
                found.add(target)
    return found


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def layer(name: str) -> int:
    if name in ENTRY_POINTS:
        return PIPELINE.index("cli")
    parts = name.split(".")
    return PIPELINE.index(parts[1]) if len(parts) > 2 or (len(parts) == 2 and parts[1] in PIPELINE) else 0


def test_the_graph_sees_function_level_and_relative_imports(tmp_path):
    """The reader itself: an import inside a function body and a relative import both count."""
    known = {
        "rocmport.a": tmp_path / "a.py",
        "rocmport.b": tmp_path / "b.py",
        "rocmport.p": tmp_path / "p" / "__init__.py",
        "rocmport.p.c": tmp_path / "p" / "c.py",
    }
    (tmp_path / "a.py").write_text("def f():\n    from rocmport.b import x\n")
    assert imports("rocmport.a", known["rocmport.a"], known) == {"rocmport.b"}
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "__init__.py").write_text("from . import c\nfrom ..a import y\n")
    assert imports("rocmport.p", known["rocmport.p"], known) == {"rocmport.p.c", "rocmport.a"}


def test_only_the_command_layer_imports_the_command_layer():
    offenders = {
        name: sorted(d for d in deps if d.startswith("rocmport.commands") or d in ENTRY_POINTS)
        for name, deps in graph().items()
        if not name.startswith("rocmport.commands") and name not in ENTRY_POINTS
    }
    assert {n: d for n, d in offenders.items() if d} == {}


def test_no_import_cycle():
    deps = graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(deps[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(deps):
        if v not in index:
            visit(v)
    assert cycles == []


@pytest.mark.parametrize("package", PIPELINE[1:-1])
def test_packages_import_only_what_comes_before_them_in_the_pipeline(package):
    deps = graph()
    mine = [n for n in deps if n.startswith(f"rocmport.{package}.") or n == f"rocmport.{package}"]
    assert mine, f"no modules in rocmport/{package}/"
    upward = {n: sorted(d for d in deps[n] if layer(d) > layer(n)) for n in mine}
    assert {n: d for n, d in upward.items() if d} == {}


def test_top_level_modules_import_no_package():
    deps = graph()
    top = [n for n in deps if layer(n) == 0 and n != "rocmport"]
    assert "rocmport.config" in top and "rocmport.upstreams" in top
    assert {n: sorted(d for d in deps[n] if layer(d) > 0) for n in top if any(layer(d) > 0 for d in deps[n])} == {}


# Where an upstream fact may be spelled outside rocmport/upstreams.py, and why (path -> literals).
UPSTREAM_LITERALS_ALLOWED: dict[str, dict[str, str]] = {}


def upstream_facts() -> tuple[set[str], set[str]]:
    """What upstreams.py owns: whole literals (names, URLs, distributions, package directories and
    modules, helper paths) and fragments no other literal may contain (URLs, helper paths)."""
    from rocmport.upstreams import UPSTREAMS

    whole = {
        f
        for u in UPSTREAMS.values()
        for f in (
            u.name,
            u.url,
            u.web_url,
            u.distribution,
            u.package_dir,
            u.module,
            u.package_info,
            u.helper_path,
            u.helper_module,
        )
    }
    parts = {
        f
        for u in UPSTREAMS.values()
        for f in (u.web_url.removeprefix("https://"), u.helper_path, u.helper_module, u.package_info)
    }
    return whole, parts


def upstream_literals(source: str, whole: set[str], parts: set[str]) -> list[tuple[int, str]]:
    """The string literals of ``source`` (docstrings aside) that spell an upstream fact."""
    tree = ast.parse(source)
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return sorted(
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in docstrings
        and (node.value in whole or any(p in node.value for p in parts))
    )


def test_the_literal_reader_finds_facts_in_code_not_in_docstrings():
    whole, parts = upstream_facts()
    source = (
        '"""megatron-lm"""\ndef f():\n    """megatron/core/_rocm.py"""\n'
        '    return ("megatron-lm", "megatron-lm/x",\n'
        '            f"see https://github.com/NVIDIA/Megatron-LM/commit/{1}", "megatron.core._rocm")\n'
    )
    assert upstream_literals(source, whole, parts) == [
        (4, "megatron-lm"),
        (5, "megatron.core._rocm"),
        (5, "see https://github.com/NVIDIA/Megatron-LM/commit/"),
    ]


def test_upstream_facts_are_spelled_only_in_upstreams_py():
    """No module but upstreams.py spells an upstream's name, URL, distribution, package directory or
    helper path: the rest asks `UPSTREAMS` / `MEGATRON_LM` / `MEGATRON_BRIDGE`."""
    whole, parts = upstream_facts()
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).as_posix()
        if rel == "rocmport/upstreams.py":
            continue
        allowed = UPSTREAM_LITERALS_ALLOWED.get(rel, {})
        literals = upstream_literals(path.read_text(encoding="utf-8"), whole, parts)
        hits = [f"{line}: {value!r}" for line, value in literals if value not in allowed]
        if hits:
            found[rel] = hits
    assert found == {}


# -- one writer: every file rocmport writes goes through rocmport/fsutil.py (#41) --------------------
#
# write_file (atomic replace of regular files only, the umask respected, a full disk named),
# tree_write_bytes (a tree's files, never through a link) and open_log (a subprocess's log). Any other
# way of writing a file (open(..., "w"), Path.write_text/write_bytes, json.dump/yaml.dump into a
# handle, shutil.copy*, os.replace/os.rename of files) is a writer that does not refuse devices, FIFOs
# and links, and the test names it. Exempt: code that rocmport ships into the ported tree and that
# runs there without rocmport (the codemods' runtime helpers).
THE_WRITER = "rocmport.fsutil"
SHIPPED_INTO_THE_TREE = ("rocmport.codemods.runtime",)
_WRITE_METHODS = {"write_text", "write_bytes"}
_WRITE_CALLS = {
    ("json", "dump"),
    ("yaml", "dump"),
    ("yaml", "safe_dump"),
    ("shutil", "copy"),
    ("shutil", "copy2"),
    ("shutil", "copyfile"),
    ("shutil", "copyfileobj"),
    ("shutil", "move"),
    ("os", "replace"),
    ("os", "rename"),
    ("os", "open"),
    ("os", "write"),
    ("tempfile", "mkstemp"),
    ("tempfile", "NamedTemporaryFile"),
}


def _open_mode(call: ast.Call) -> str | None:
    """The literal mode of an open()/Path.open()/os.fdopen()/io.open() call ("r" when none is given)."""
    # open(path, mode), io.open, os.fdopen(fd, mode), tarfile/gzip.open(path, mode): the mode comes
    # second; a method (Path(...).open(mode)) takes it first.
    module_level = _dotted(call.func) in ("io.open", "os.fdopen", "tarfile.open", "gzip.open", "bz2.open", "lzma.open")
    args = call.args[1:] if isinstance(call.func, ast.Name) or module_level else call.args
    for kw in call.keywords:
        if kw.arg == "mode":
            return kw.value.value if isinstance(kw.value, ast.Constant) and isinstance(kw.value.value, str) else "?"
    if args:
        first = args[0]
        return first.value if isinstance(first, ast.Constant) and isinstance(first.value, str) else "?"
    return "r"


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


def file_writes(source: str, filename: str = "<source>") -> list[str]:
    """Each place in ``source`` that writes a file by other means than fsutil's writer, as 'line: what'."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = _dotted(func)
        what = None
        if isinstance(func, ast.Attribute) and func.attr in _WRITE_METHODS:
            what = f".{func.attr}()"
        elif name in ("open", "io.open", "os.fdopen") or (
            isinstance(func, ast.Attribute) and func.attr == "open" and name != "os.open"
        ):
            mode = _open_mode(node)
            if mode is None or any(c in mode for c in "wax+?"):
                what = f"{name or 'open'}(..., {mode!r})"
        elif isinstance(func, ast.Attribute) and (_dotted(func.value), func.attr) in _WRITE_CALLS:
            if (
                func.attr in ("dump", "safe_dump")
                and len(node.args) < 2
                and not any(k.arg == "stream" for k in node.keywords)
            ):
                continue  # yaml.safe_dump(data): returns the text, writes nothing
            what = f"{name}()"
        if what:
            found.append(f"{node.lineno}: {what}")
    return found


def test_the_write_finder_finds_every_kind_of_write():
    src = (
        "import json, os, shutil\nfrom pathlib import Path\n"
        "open('x', 'w')\nopen('x', mode='ab')\nPath('x').write_text('t')\nPath('x').open('w')\n"
        "json.dump({}, fh)\nshutil.copyfile('a', 'b')\nos.replace('a', 'b')\nos.fdopen(3, 'wb')\n"
        "open('x')\nopen('x', 'rb')\njson.dumps({})\nPath('x').read_text()\nyaml.safe_dump({})\n"
        "tarfile.open(p, 'r:gz')\ntarfile.open(p, 'w:gz')\n"
    )
    assert [w.split(":")[0] for w in file_writes(src)] == ["3", "4", "5", "6", "7", "8", "9", "10", "17"]


def test_every_file_write_goes_through_the_one_writer():
    offenders = {
        name: writes
        for name, path in modules().items()
        if name != THE_WRITER and not name.startswith(SHIPPED_INTO_THE_TREE)
        for writes in [file_writes(path.read_text(encoding="utf-8"), str(path))]
        if writes
    }
    assert offenders == {}, "write these through rocmport.fsutil.write_file (or tree_write_bytes / open_log)"
