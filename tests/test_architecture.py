"""The layout's rules, read from the source with ast: the engine never imports the command layer,
no import cycle (function-level imports included, so none can hide one), every package imports
only from the packages before it in the pipeline, the code that runs inside verify's ranks
(verify/runtime/) imports nothing of the orchestration, and the parent<->rank protocol's
environment variables are spelled only in verify/runtime/protocol.py."""

from __future__ import annotations

import ast
import re
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


RUNTIME = "rocmport.verify.runtime"


def orchestration_imports(deps: dict[str, set[str]]) -> dict[str, list[str]]:
    """What each rank-side module imports of the orchestration side: verify outside runtime/, or any
    layer after verify (refresh, package, commands, the CLI). Lower layers (errors, launch_env,
    machine) are shared ground."""
    runtime = [n for n in deps if n == RUNTIME or n.startswith(f"{RUNTIME}.")]
    bad = {
        n: sorted(
            d
            for d in deps[n]
            if not (d == RUNTIME or d.startswith(f"{RUNTIME}.")) and layer(d) >= layer("rocmport.verify.x")
        )
        for n in runtime
    }
    return {n: d for n, d in bad.items() if d}


def test_runtime_imports_nothing_of_the_orchestration():
    """verify/runtime/ runs inside the ranks and their children: it talks to the parent through
    runtime.protocol, never by importing the orchestration (run, stages, the registry, commands)."""
    deps = graph()
    assert any(n.startswith(f"{RUNTIME}.") for n in deps), "no modules in rocmport/verify/runtime/"
    assert orchestration_imports(deps) == {}


def test_the_runtime_rule_sees_an_import_of_the_orchestration():
    deps = {f"{RUNTIME}.worker": {"rocmport.verify.stages", "rocmport.errors", f"{RUNTIME}.protocol"}}
    deps.update({"rocmport.verify.stages": set(), "rocmport.errors": set(), f"{RUNTIME}.protocol": set()})
    assert orchestration_imports(deps) == {f"{RUNTIME}.worker": ["rocmport.verify.stages"]}


PROTOCOL_MODULE = "rocmport/verify/runtime/protocol.py"
ROCMPORT_NAME = re.compile(r"\bROCMPORT_[A-Z0-9_]+")
# ROCMPORT_* names that are not the parent<->rank protocol, and where each may be spelled (path ->
# why); docs/runtime-protocol.md says the same. Anything else is declared in protocol.py.
NOT_PROTOCOL: dict[str, dict[str, str]] = {
    "ROCMPORT_CACHE_DIR": {
        "rocmport/config.py": "the user's mirror cache setting, read with the other settings",
        "rocmport/refresh/summary.py": "names the setting a cache path came from",
        "rocmport/commands/sync.py": "--cache-dir's help names its default",
    },
    "ROCMPORT_INDEX_URL": {
        "rocmport/upstream/package_index.py": "the user's package index setting",
        "rocmport/verify/orchestration/te_layer.py": "verify --te's hint names the setting when the index does not answer",
    },
    "ROCMPORT_INDEX_TIMEOUT": {
        "rocmport/verify/orchestration/te_layer.py": "the user's wait for the package index (verify --te)"
    },
    "ROCMPORT_REPORT_ARTIFACT": {
        "rocmport/refresh/report.py": "the bot workflow's name for its report-page artifact, linked from the PR body"
    },
    "ROCMPORT_RUN": {"rocmport/procs.py": "every rocmport run's process marker (any command); no rank reads it"},
    "ROCMPORT_EMPTY_CACHE_INTERVAL": {
        "rocmport/codemods/empty_cache_interval.py": "the ported tree's knob, named in its codemod's notes",
        "rocmport/codemods/runtime/empty_cache_interval.py": "the ported tree's knob, read by the tree's helper",
    },
    "ROCMPORT_DATALOADER_MP_CONTEXT": {
        "rocmport/codemods/dataloader_mp_context.py": "the ported tree's knob, named in its codemod's notes",
        "rocmport/codemods/runtime/dataloader_mp_context.py": "the ported tree's knob, read by the tree's helper",
    },
    # The protocol's one variable the port's own helper reads: the helper is copied byte for byte into
    # every ported tree (megatron/core/_rocm.py), where rocmport cannot be imported.
    "ROCMPORT_PORT_SITES": {"rocmport/codemods/runtime/core.py": "the tree's helper records its call sites there"},
}


def misplaced_names(files: dict[str, str]) -> dict[str, list[str]]:
    """``{path: ["line: NAME", ...]}`` for each ROCMPORT_* name spelled (code, string, comment or
    docstring alike) in a file that neither is protocol.py nor is listed for it in NOT_PROTOCOL."""
    found: dict[str, list[str]] = {}
    for rel, text in files.items():
        if rel == PROTOCOL_MODULE:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            for name in ROCMPORT_NAME.findall(line):
                if rel not in NOT_PROTOCOL.get(name, {}):
                    found.setdefault(rel, []).append(f"{number}: {name}")
    return found


def package_texts() -> dict[str, str]:
    return {
        p.relative_to(PACKAGE.parent).as_posix(): p.read_text(encoding="utf-8", errors="replace")
        for p in sorted(PACKAGE.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


def test_rocmport_variables_are_spelled_only_in_the_protocol():
    """Every ROCMPORT_* environment variable the parent and its ranks share is declared once, in
    verify/runtime/protocol.py; the rest of rocmport/ reads and writes it through that declaration."""
    assert misplaced_names(package_texts()) == {}


def test_the_spelling_rule_sees_a_name_in_code_and_in_a_comment():
    files = {
        "rocmport/verify/x.py": 'import os\nos.environ.get("ROCMPORT_PROXY")  # $ROCMPORT_TE too\n',
        "rocmport/config.py": 'os.environ.get("ROCMPORT_CACHE_DIR")\n',  # allowed there
        "rocmport/verify/y.py": '"ROCMPORT_CACHE_DIR"\n',  # but nowhere else
        PROTOCOL_MODULE: 'PROXY = flag("ROCMPORT_PROXY")\n',
    }
    assert misplaced_names(files) == {
        "rocmport/verify/x.py": ["2: ROCMPORT_PROXY", "2: ROCMPORT_TE"],
        "rocmport/verify/y.py": ["1: ROCMPORT_CACHE_DIR"],
    }


def test_the_protocol_declares_each_variable_once_and_no_setting():
    from rocmport.verify.runtime import protocol

    names = [v.name for v in protocol.VARIABLES]
    declared = [v.name for v in vars(protocol).values() if isinstance(v, protocol.Var)]
    assert sorted(names) == sorted(declared) and len(set(names)) == len(names)
    assert all(ROCMPORT_NAME.fullmatch(n) for n in names)
    # A user's setting or the tree's knob is not the protocol (PORT_SITES is both: the tree reads it).
    assert set(names) & set(NOT_PROTOCOL) == {"ROCMPORT_PORT_SITES"}


def test_the_port_s_helper_reads_the_protocol_s_port_sites_variable():
    """The one protocol name spelled outside protocol.py (the port's helper cannot import rocmport)
    is the declared one: renamed in protocol.py alone, verify would record no call site, silently."""
    from rocmport.verify.runtime import protocol

    helper = (PACKAGE / "codemods" / "runtime" / "core.py").read_text(encoding="utf-8")
    assert f'environ.get("{protocol.PORT_SITES.name}")' in helper
    assert set(ROCMPORT_NAME.findall(helper)) == {protocol.PORT_SITES.name}


# verify's rooms: the analyses (port sites, impact) know no stage and no run; a stage module keeps the
# contract and uses the orchestration's tools (contract, launcher, environment, firewall, TE layer,
# stage results, device kind, sizes) but never the run that lists and drives the stages (registry, run,
# options, result, report, summary): those read the stages, not the other way round.
VERIFY_RUN = {
    f"rocmport.verify.orchestration.{m}" for m in ("registry", "run", "options", "result", "report", "summary")
}


def test_verify_rooms_import_only_downward():
    deps = graph()
    rooms = {n: n.split(".")[2] for n in deps if n.startswith("rocmport.verify.") and len(n.split(".")) > 3}
    assert {"orchestration", "stages", "analyses"} <= set(rooms.values())
    upward = {
        n: sorted(
            d
            for d in deps[n]
            if (rooms[n] == "analyses" and d.startswith(("rocmport.verify.stages", "rocmport.verify.orchestration")))
            or (rooms[n] != "orchestration" and d in VERIFY_RUN)
            or (n not in VERIFY_RUN and rooms[n] == "orchestration" and d.startswith("rocmport.verify.stages"))
        )
        for n in rooms
    }
    assert {n: d for n, d in upward.items() if d} == {}


# Stage 3 and stage 4 were split by concern (#40, #38): each function small enough to read whole.
FUNCTION_LINES = 80


def long_functions(folder: Path, limit: int = FUNCTION_LINES) -> list[str]:
    found = []
    for path in sorted(folder.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > limit:
                found.append(f"{path.name}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)")
    return found


@pytest.mark.parametrize("room", ["unit_tests", "functional"])
def test_stage_3_and_4_have_no_function_over_80_lines(room):
    assert long_functions(PACKAGE / "verify" / "stages" / room) == []


def test_the_length_rule_sees_a_long_function(tmp_path):
    (tmp_path / "m.py").write_text("def f():\n" + "    x = 1\n" * FUNCTION_LINES)
    assert long_functions(tmp_path) == [f"m.py:1 f ({FUNCTION_LINES + 1} lines)"]
