"""Which upstream unit tests a hop can affect (`verify --unit-tests impacted --since A`).

A static import graph of the tree (`ast`, never an import): from each `tests/unit_tests/**/test_*.py`
and the `conftest.py` files pytest loads for it, every module of the tree it reaches transitively.
An import counts wherever it is written (inside a function, under `try:`): a test that runs the
function imports it, and selecting a test too many costs seconds where one too few misses a
regression. Importing `a.b.c` runs `a/__init__.py` and `a/b/__init__.py` too, so those count.
Dynamic imports other than `importlib.import_module("<literal>")` are not seen.

The selection: the test files that reach a file changed between the upstream commits ``since`` and
the tree's base (plus files the caller names, e.g. the ones whose port rewrite changed in a refresh
hop), and the fixed smoke set (suite.SMOKE_TESTS). The graph of a commit is cached (parsing every
reached module costs seconds); files with uncommitted changes are parsed again each time.

Each full-suite run (`--unit-tests all`) records its per-file seconds, its test count and, when it
passes, the commit and date (`<cache>/unit-full-runs.json`, per release line): an impacted run's
summary names them ("N tests selected of M; full suite last passed at <commit>") and estimates the
time it saved from those seconds."""

from __future__ import annotations

import ast
import json
import os
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from rocmport.errors import BadInput
from rocmport.fsutil import atomic_write_text
from rocmport.gitutil import run_git
from rocmport.inputs import has_control

GRAPH_VERSION = "2"  # part of the cache file's name: a graph computed another way is not reused
TESTS_DIR = "tests/unit_tests"
FULL_RUNS = "unit-full-runs.json"
_SKIP_DIRS = {".git", "__pycache__", "build", "dist", ".venv", "node_modules"}


def _modules(tree: Path) -> dict[str, str]:
    """Every Python module of the tree: dotted name -> its file (relative). A package is its __init__.py."""
    out: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(tree):
        dirnames[:] = [d for d in dirnames if d not in _SKIP_DIRS and not d.startswith(".")]
        rel_dir = Path(dirpath).relative_to(tree)
        for name in filenames:
            if not name.endswith(".py"):
                continue
            parts = list(rel_dir.parts) + ([] if name == "__init__.py" else [name[:-3]])
            if parts:
                out.setdefault(".".join(parts), str(rel_dir / name))
    return out


def _import_nodes(tree: ast.AST, everywhere: bool):
    """The nodes of a module that may import: every one (``everywhere``), else those that run when
    the module is imported (not inside a function, not under `if TYPE_CHECKING:`)."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if not everywhere and isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                todo += child.orelse
                continue
            todo.append(child)


def _imported_names(source: str, module: str, is_package: bool, everywhere: bool = True) -> list[str]:
    """The dotted names a module's source imports (relative imports resolved against ``module``):
    anywhere in it (``everywhere``), else when it is imported (module level, see _import_nodes)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    package = module if is_package else module.rpartition(".")[0]
    names: list[str] = []
    for node in _import_nodes(tree, everywhere):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".") if package else []
                parts = parts[: len(parts) - (node.level - 1)] if node.level > 1 else parts
                base = ".".join(parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            if not base:
                continue
            # `from a.b import c`: the module a.b.c, or a.b when c is a name it defines (_resolve)
            names += [base if a.name == "*" else f"{base}.{a.name}" for a in node.names]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            names.append(node.args[0].value)
    return names


def _resolve(name: str, modules: dict[str, str]) -> set[str]:
    """The tree's file ``name`` names: the module itself, else the nearest package that holds it
    (``from a.b import f``: f is an attribute of a.b). The packages on its way are not counted: a test
    of megatron.core.ssm.mamba_block runs megatron/core/__init__.py, which imports half the library
    (DDP, parallel_state, ...), and counting that would select every test for every change."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        p = ".".join(parts[:i])
        if p in modules:
            return {modules[p]}
    return set()


@dataclass
class ImportGraph:
    """file -> the tree's files it imports (directly), for the files reached from the tests."""

    edges: dict[str, list[str]] = field(default_factory=dict)
    parsed: int = 0  # files parsed for this graph (the rest came from the cache)

    def reach(self, roots: list[str]) -> set[str]:
        seen = set(roots)
        todo = deque(roots)
        while todo:
            for nxt in self.edges.get(todo.popleft(), ()):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen


def unit_test_files(tree: Path) -> list[str]:
    """Every test file of the tree's tests/unit_tests (pytest's default pattern), sorted."""
    root = tree / TESTS_DIR
    return sorted(str(p.relative_to(tree)) for p in root.rglob("test_*.py") if "__pycache__" not in p.parts)


def _blobs(tree: Path) -> dict[str, str]:
    """Each tracked file's blob id in the index (`git ls-files -s`): what a file's cached imports are keyed by."""
    out = run_git("ls-files", "-s", "--", "*.py", cwd=tree, check=False).stdout
    return {line.split("\t", 1)[1]: line.split()[1] for line in out.splitlines() if "\t" in line}


def _dirty(tree: Path) -> set[str]:
    """Python files that differ from the index in the working tree (modified, added, untracked)."""
    out = run_git("status", "--porcelain", "-uall", "--no-renames", cwd=tree, check=False).stdout
    return {line[3:] for line in out.splitlines() if line[3:].endswith(".py")}


def build_graph(tree: Path, cache_dir: Path | None, roots: list[str]) -> ImportGraph:
    """The import graph reached from ``roots``. What a file imports is cached by its blob id and path
    (`<cache>/impact-imports.json`): a hop parses only the files upstream (or the port) changed, about
    3 s for every reached module of a Megatron-LM tree otherwise; a file with uncommitted changes is
    parsed afresh each time."""
    modules = _modules(tree)
    blobs = _blobs(tree)
    dirty = _dirty(tree)
    cache = cache_dir / f"impact-imports-{GRAPH_VERSION}.json" if cache_dir else None
    known: dict[str, list[str]] = {}
    if cache is not None and cache.is_file():
        try:
            known = json.loads(cache.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            known = {}
    by_file = {f: m for m, f in modules.items()}
    graph = ImportGraph()
    todo = deque(r for r in roots if (tree / r).is_file())
    seen = set(todo)
    fresh: dict[str, list[str]] = {}
    while todo:
        rel = todo.popleft()
        key = f"{blobs[rel]}:{rel}" if rel in blobs and rel not in dirty else None
        names = known.get(key) if key else None
        if names is None:
            try:
                source = (tree / rel).read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                source = ""
            # A test (or conftest) runs the imports in its functions; a library module's lazy imports
            # in a function run only when something calls it: counted, a hub such as core/utils.py
            # (its helpers import DDP, FSDP, inference lazily) would make every test reach everything.
            everywhere = rel.startswith("tests/")
            names = sorted(set(_imported_names(source, by_file.get(rel, ""), rel.endswith("__init__.py"), everywhere)))
            graph.parsed += 1
            if key:
                fresh[key] = names
        found: set[str] = set()
        for name in names:
            found |= _resolve(name, modules)
        targets = sorted(found - {rel})
        graph.edges[rel] = targets
        for t in targets:
            if t not in seen:
                seen.add(t)
                todo.append(t)
    if cache is not None and fresh:
        atomic_write_text(cache, json.dumps({**known, **fresh}, sort_keys=True))
    return graph


def changed_files(tree: Path, since: str, until: str) -> list[str]:
    """The files upstream changed between ``since`` and ``until`` (both sides of a rename), or BadInput
    naming --since when ``since`` is not a commit of the tree's history."""
    if not since.strip() or has_control(since) or since.startswith("-"):
        raise BadInput(f"--since {since[:80]!r}: not a commit; give the upstream commit the port was last verified at")
    found = run_git("rev-parse", "--verify", "--quiet", f"{since}^{{commit}}", cwd=tree, check=False)
    if found.returncode != 0:
        raise BadInput(
            f"--since {since[:80]}: not a commit in {tree}'s history; give the upstream commit the port was last "
            f"verified at (the lock's megatron-lm commit before the hop)"
        )
    diff = run_git("diff", "--name-only", "--no-renames", found.stdout.strip(), until, cwd=tree)
    return sorted(set(diff.stdout.split()))


@dataclass(frozen=True)
class Selection:
    """What an impacted run selected and why."""

    since: str
    until: str
    changed: list[str]  # the files upstream changed (and the extra ones the caller named)
    selected: dict[str, str]  # test file -> why (the changed file it reaches, or the smoke set's reason)
    total_files: int  # test files in tests/unit_tests
    parsed: int  # modules parsed for the graph (0: all from the cache)

    def to_dict(self) -> dict:
        return {
            "since": self.since,
            "until": self.until,
            "changed": self.changed,
            "selected_files": len(self.selected),
            "total_files": self.total_files,
            "graph_files_parsed": self.parsed,
        }


def select(
    tree: Path,
    since: str,
    until: str,
    smoke: dict[str, str],
    cache_dir: Path | None = None,
    extra_changed: tuple[str, ...] = (),
) -> Selection:
    """The test files of the tree that reach a file changed in ``since``..``until`` (or in
    ``extra_changed``), then the smoke set's files the tree has; each with why."""
    changed = sorted(set(changed_files(tree, since, until)) | set(extra_changed))
    tests = unit_test_files(tree)
    roots = tests
    graph = build_graph(tree, cache_dir, roots)
    watched = set(changed)
    selected: dict[str, str] = {}
    # A changed conftest.py: its fixtures may serve any test below it. What a conftest only imports
    # is not a test's reach: every session loads it, so an import-time break there fails the smoke set.
    changed_conftests = [c.removesuffix("conftest.py") for c in changed if c.endswith("conftest.py")]
    for t in tests:
        hit = sorted(graph.reach([t]) & watched) + [c + "conftest.py" for c in changed_conftests if t.startswith(c)]
        if hit:
            more = f" (and {len(hit) - 1} more changed file{'s' if len(hit) > 2 else ''})" if len(hit) > 1 else ""
            selected[t] = f"reaches {hit[0]}{more}, changed in {since[:12]}..{until[:12]}"
    for t, why in smoke.items():
        if t not in selected and (tree / t).is_file():
            selected[t] = f"smoke set: {why}"
    return Selection(since, until, changed, selected, len(tests), graph.parsed)


# --- the full suite's record: per release line, its last run's per-file seconds and its last pass ---


def _runs_path(cache_dir: Path) -> Path:
    return cache_dir / FULL_RUNS


def read_full_runs(cache_dir: Path) -> dict:
    try:
        data = json.loads(_runs_path(cache_dir).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def record_full_run(
    cache_dir: Path,
    key: str,
    *,
    passed: bool,
    commit: str | None,
    base: str | None,
    tests: int,
    file_seconds: dict[str, float],
    seconds: float,
) -> dict:
    """Record a full-suite run (`--unit-tests all`) of ``key`` (the release line): its per-file seconds
    and test count always, and as the last pass (commit, base, date) when it passed."""
    data = read_full_runs(cache_dir)
    found = data.get(key)
    entry: dict = found if isinstance(found, dict) else {}
    now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    entry["last_run"] = {
        "date": now,
        "commit": commit,
        "base": base,
        "passed": passed,
        "tests": tests,
        "seconds": seconds,
        "file_seconds": file_seconds,
    }
    if passed:
        entry["last_pass"] = {"date": now, "commit": commit, "base": base, "tests": tests}
    data[key] = entry
    atomic_write_text(_runs_path(cache_dir), json.dumps(data, indent=1, sort_keys=True) + "\n")
    return entry


@dataclass
class ImpactFigures:
    """An impacted run's figures (`impact` of stage 3's entry): the selection, the
    tests selected of the total, the port's seconds and the time saved by the files left out, the full
    suite's last pass, and ``line``: the summary's line saying all that."""

    selection: Selection
    selected_tests: int
    total_tests: int | None
    seconds: float
    estimated_seconds_saved: float | None
    full_suite_last_passed: dict[str, Any] | None
    line: str

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.selection.to_dict(),
            "selected_tests": self.selected_tests,
            "total_tests": self.total_tests,
            "seconds": self.seconds,
            "estimated_seconds_saved": self.estimated_seconds_saved,
            "full_suite_last_passed": self.full_suite_last_passed,
            "line": self.line,
        }


def impact_summary(
    selection: Selection, selected_files: list[str], selected_tests: int, port_seconds: float, full: dict
) -> ImpactFigures:
    """The summary's line ("N tests selected of M; full suite last passed at <commit>") and the
    report's figures: files and tests selected of the total, and the time saved, estimated from the
    last full run's per-file seconds (the files left out, at what they took then). ``full``: the
    line's record (record_full_run)."""
    run = full.get("last_run") or {}
    last = full.get("last_pass") or {}
    per_file = run.get("file_seconds") or {}
    total_tests = run.get("tests")
    chosen = set(selected_files)
    # A file's own tests' seconds, and its share of what the run spent outside tests (torchrun's
    # start, pytest's collection, the imports), spread evenly over the run's files.
    overhead = max(0.0, float(run.get("seconds") or 0.0) - sum(per_file.values())) / max(1, len(per_file))
    saved = round(sum(sec + overhead for f, sec in per_file.items() if f not in chosen), 1) if per_file else None
    of = f"{selected_tests} tests selected of {total_tests}" if total_tests else f"{selected_tests} tests selected"
    since, until = selection.since[:12], selection.until[:12]
    line = (
        f"{of} ({len(selection.selected)} of {selection.total_files} test files: those whose imports reach "
        f"the {len(selection.changed)} files changed in {since}..{until}, and the smoke set); "
        + (
            f"full suite last passed at {str(last.get('base') or last.get('commit'))[:12]} ({str(last.get('date'))[:10]})"
            if last
            else "full suite: no pass recorded here (run `rocmport verify --unit-tests all`)"
        )
        + (
            f"; about {saved:.0f} s saved on the port's run (what the files left out took in "
            f"the last full run, at {str(run.get('base') or run.get('commit'))[:12]})"
            if saved is not None
            else "; time saved not known: no full run recorded"
        )
    )
    return ImpactFigures(
        selection=selection,
        selected_tests=selected_tests,
        total_tests=total_tests,
        seconds=port_seconds,
        estimated_seconds_saved=saved,
        full_suite_last_passed=last or None,
        line=line,
    )


def head_commit(tree: Path) -> str | None:
    out = run_git("rev-parse", "HEAD", cwd=tree, check=False)
    return out.stdout.strip() if out.returncode == 0 else None
