"""Which upstream unit tests stage 3 runs, what they need, and which failures are known.

A series' `verify:` block (patchsets/<upstream>/<line>/series; parsed by rocmport.patches.verify_settings):

    verify:
      unit_tests:                     # the default suite of the line: test file -> why it is in it
        tests/unit_tests/models/test_gpt_model.py: "GPTModel through the rewritten attention backend"
      known_failures:                 # every mode: test id, file or directory -> reason
        tests/unit_tests/test_x.py::test_y: "upstream bug #123"
      rocm_known_failures:            # a ROCm GPU or the HIP simulation (AMD's fork's marks)
        tests/unit_tests/test_utils.py::test_straggler_detector: "skipped on ROCm by AMD's fork (source)"
      rocm_arch_known_failures:       # the same, only where the device's arch is the one named
        gfx90a: {tests/unit_tests/...: "failing_on_rocm_mi250 in AMD's fork (source)"}
      hip_known_failures:             # wherever the port's HIP branches run, a ROCm GPU or the HIP
        tests/unit_tests/...: "reason"  # simulation (tests the port's ROCm behaviour changes on purpose)
      proxy_known_failures:           # only in CPU-proxy mode (what the proxy cannot run)
        tests/unit_tests/...: "reason"

`unit_tests` may also be a plain list of paths (no reasons)."""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path

from rocmport.patches.verify_settings import KEYS, VerifySettings, parse_settings  # noqa: F401 (verify's names for them)

# Without a series (a tree not made by `rocmport apply`): upstream's GPT model and pipeline schedules.
FALLBACK_TESTS = {
    "tests/unit_tests/models/test_gpt_model.py": "GPTModel end to end (attention backend, layer specs)",
    "tests/unit_tests/pipeline_parallel/test_schedules.py": "megatron's pipeline schedules (p2p, microbatches)",
}
ALL = "tests/unit_tests"
# `--unit-tests impacted` always runs these besides the files a hop's changes reach: fast files that
# every session's setup goes through (the conftest.py files load megatron.training and the
# checkpointing helpers: an import-time break anywhere they reach fails these too), on every line
# from v0.15 to main (a file a tree lacks is left out).
SMOKE_TESTS = {
    "tests/unit_tests/test_basic.py": "megatron imports behind the firewall, the conftest.py files load (seconds)",
    "tests/unit_tests/tensor_parallel/test_mappings.py": "tensor-parallel collectives over the proxy's nccl -> gloo swap",
    "tests/unit_tests/transformer/test_mlp.py": "a small MLP through the port's tensor-parallel layers, forward and sharded state",
}

# Import name -> what to pip install, where they differ.
PIP_NAMES = {
    "pytest_mock": "pytest-mock",
    "yaml": "pyyaml",
    "PIL": "pillow",
    "sklearn": "scikit-learn",
    "pytest_asyncio": "pytest-asyncio",
    "google": "protobuf",
    "github": "pygithub",
    "cv2": "opencv-python",
}
# Packages upstream's test environment has (its `dev` extra) that the library uses only where they
# are installed: without one, a test of that branch fails on both trees for the environment's
# sake, not upstream's. Module -> the library file whose import of it makes it needed.
TEST_ENVIRONMENT = {"nvtx": "megatron/core/utils.py"}
# Fixtures that come from pytest plugins: fixture -> the plugin's module.
PLUGIN_FIXTURES = {
    "mocker": "pytest_mock",
    "class_mocker": "pytest_mock",
    "module_mocker": "pytest_mock",
    "session_mocker": "pytest_mock",
    "benchmark": "pytest_benchmark",
}


def matches(nodeid: str, pattern: str) -> bool:
    """Is ``nodeid`` the test id (any of its parametrisations), file or directory ``pattern`` names?"""
    p = pattern.rstrip("/")
    return nodeid == p or nodeid.startswith((p + "::", p + "/", p + "["))


def test_files(tree: Path, tests: list[str]) -> list[str]:
    """The test files ``tests`` (files, directories, test ids) select, relative to the tree."""
    files = []
    for t in tests:
        path = tree / t.split("::")[0]
        if path.is_dir():
            files += [str(p.relative_to(tree)) for p in sorted(path.rglob("test_*.py"))]
        else:
            files.append(t.split("::")[0])
    return list(dict.fromkeys(files))


def _guarded(node: ast.AST, parents: dict) -> bool:
    """Is ``node`` inside a `try:` that handles ImportError (or Exception)?"""
    child, cur = node, parents.get(node)
    while cur is not None:
        if isinstance(cur, ast.Try) and child in cur.body:
            for h in cur.handlers:
                names = [h.type] if not isinstance(h.type, ast.Tuple) else list(h.type.elts)
                if h.type is None or any(
                    isinstance(n, ast.Name) and n.id in ("ImportError", "ModuleNotFoundError", "Exception")
                    for n in names
                ):
                    return True
        child, cur = cur, parents.get(cur)
    return False


def needed_modules(path: Path) -> set[str]:
    """Top-level modules a test file (or conftest.py) needs to import: its unguarded module-level
    imports and the plugins behind the fixtures its tests ask for."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (SyntaxError, UnicodeDecodeError, OSError):
        return set()
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and _module_level(node, parents) and not _guarded(node, parents):
            out.update(a.name.split(".")[0] for a in node.names)
        elif (
            isinstance(node, ast.ImportFrom)
            and not node.level
            and node.module
            and _module_level(node, parents)
            and not _guarded(node, parents)
        ):
            out.add(node.module.split(".")[0])
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out.update(PLUGIN_FIXTURES[a.arg] for a in node.args.args if a.arg in PLUGIN_FIXTURES)
    return out


def _imported(path: Path) -> set[str]:
    """Every top-level module a file imports anywhere, guarded or not."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (SyntaxError, UnicodeDecodeError, OSError):
        return set()
    return {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names} | {
        n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module and not n.level
    }


def _module_level(node: ast.AST, parents: dict) -> bool:
    """Runs when the module is imported (not inside a function)."""
    cur = parents.get(node)
    while cur is not None:
        if isinstance(cur, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            return False
        cur = parents.get(cur)
    return True


def missing_dependencies(tree: Path, files: list[str], blocked: tuple[str, ...]) -> dict[str, str]:
    """Ordinary packages the selected test files (and the conftest.py files pytest loads for them)
    need, and those of upstream's test environment the library uses (TEST_ENVIRONMENT), that this
    interpreter lacks: module -> what to pip install. NVIDIA-only packages are left
    out (the firewall removes them on purpose), and so are the tree's own packages."""
    # The tree's own top-level packages, namespace packages included (Megatron-LM's `megatron` has no
    # __init__.py: found only on the tree's path, never in this interpreter unless megatron-core is installed).
    own = {p.name for p in tree.iterdir() if p.is_dir() and (any(p.glob("*.py")) or any(p.glob("*/__init__.py")))}
    own |= {p.stem for p in tree.glob("*.py")}
    paths: set[Path] = set()
    for rel in files:
        path = tree / rel
        paths.add(path)
        parent = path.parent
        while parent != tree and tree in parent.parents:
            if (parent / "conftest.py").is_file():
                paths.add(parent / "conftest.py")
            parent = parent.parent
    names: set[str] = set()
    for path in paths:
        names |= needed_modules(path)
    names |= {name for name, user in TEST_ENVIRONMENT.items() if name in _imported(tree / user)}
    stdlib = set(sys.stdlib_module_names)
    out = {}
    for name in sorted(names - stdlib - own - set(blocked) - {"rocmport", "__future__"}):
        if importlib.util.find_spec(name) is None:
            out[name] = PIP_NAMES.get(name, name.replace("_", "-"))
    return out


def pip_command(missing: dict[str, str]) -> str:
    return f"{sys.executable} -m pip install {' '.join(sorted(set(missing.values())))}"
