"""The codemods' fast path changes no output: with the prefilter on (what apply and refresh run) and
off (every pass in full), each file comes out byte for byte the same, with the same per-site reports.

The small cases below spell every name a prefilter looks for in the way that slips past the easy
checks (an alias, an odd spacing, a def nested in blocks, a TE class inside a function); the real
trees (megatron-core 0.16.1 from the package index, and every Python file of a Megatron-LM line's
tree from a mirror) hold the two runs to each other on every file the codemods touch."""

from __future__ import annotations

import json
import subprocess

import libcst as cst
import pytest
from libcst.metadata import MetadataWrapper, QualifiedNameProvider, ScopeProvider

from rocmport.codemods import compute_layers, registry
from rocmport.codemods.base import NAMES, qualified_names
from rocmport.codemods.runner import _specs, transform_text
from rocmport.patches.series import load_series
from rocmport.procs import pool_map
from tests.helpers.real import MLM, REPO, needs_mlm_mirror

ALL = [{"name": name, "options": {}} for name in registry]
SERIES_V018 = REPO / "patchsets" / "megatron-lm" / "v0.18" / "series"

# (path, text, codemod that must act on it: the comparison is never between two no-ops)
CASES = [
    (  # apex-to-torch's amp pass: the name only in an aliased import
        "megatron/core/a.py",
        "from torch.cuda.amp import GradScaler as GS\nimport apex\n\ns = GS()\n",
        "apex-to-torch",
    ),
    (  # capability-gates' pass: an aliased function
        "megatron/core/b.py",
        "from torch.cuda import get_device_capability as cap\n\nif cap()[0] >= 9:\n    x = 1\n",
        "capability-gates",
    ),
    (  # te-version-gates: a CALL_DRIFT function under an alias
        "megatron/core/c.py",
        "from transformer_engine.pytorch.cpp_extensions import general_gemm as gg\n"
        "from megatron.core.utils import is_te_min_version\n\n"
        "def f(a, b):\n    return gg(a, b, workspace=get_workspace())\n",
        "te-version-gates",
    ),
    (  # te-version-gates: a class deriving from a TE class, inside a function whose **spread it sets
        "megatron/core/d.py",
        "import transformer_engine as te\nfrom megatron.core.utils import is_te_min_version\n\n\n"
        "def build(config):\n    extra = {}\n\n    class Local(te.pytorch.Linear):\n"
        '        if is_te_min_version("2.3.0"):\n            extra["delay_wgrad_compute"] = True\n\n'
        "    return te.pytorch.Linear(**extra)\n",
        "te-version-gates",
    ),
    (  # te-version-gates: no TE class, only gates left numeric (reported as skips)
        "tests/unit_tests/e.py",
        "import transformer_engine\nfrom megatron.core.utils import is_te_min_version as te_min\n\n"
        'if te_min("2.0"):\n    x = 1\n\n\ndef g():\n    assert is_te_min_version("1.0")\n',
        "te-version-gates",
    ),
    (  # te-version-gates: a feature gate (a raise naming NVFP4BlockScaling)
        "megatron/core/f.py",
        "from megatron.core.utils import is_te_min_version\n\n\ndef check():\n"
        '    if not is_te_min_version("2.8.0"):\n'
        '        raise ValueError("NVFP4BlockScaling needs TE 2.8")\n',
        "te-version-gates",
    ),
    (  # device-probes: a module-level def under blocks
        "megatron/training/h.py",
        "import os\n\nif os:\n    with open(os.devnull):\n        def set_ideal_affinity_for_current_gpu():\n"
        "            return 1\n",
        "device-probes",
    ),
    (  # te-version-gates: an attribute gate in an elif, the helper named in the body only
        "megatron/core/i.py",
        "from megatron.core.utils import is_te_min_version\n\n\ndef f(config, module):\n"
        "    if config.fp8_recipe:\n        pass\n"
        '    elif config.fp8 and is_te_min_version("2.6.0"):\n        module.set_save_original_input(True)\n',
        "te-version-gates",
    ),
    (  # empty-cache-interval: calls under the gate in a nested def, an else and a with, torch aliased
        "megatron/training/training.py",
        "import torch.cuda as tc\n\n\ndef train_step(args):\n    if args.empty_unused_memory_level >= 1:\n"
        "        tc.empty_cache()\n    else:\n        def later():\n            tc.empty_cache()\n\n"
        "        with later():\n            tc.empty_cache()\n    tc.empty_cache()\n",
        "empty-cache-interval",
    ),
    (  # fused-kernel-fallbacks: a kernel imported in a function with odd spacing, and validate_args
        "megatron/training/arguments.py",
        "import  amp_C\n\n\ndef f():\n    import  fused_weight_gradient_mlp_cuda\n    return 1\n\n\n"
        "def validate_args(args, defaults={}):\n    if args.async_strategy:\n        pass\n    return args\n",
        "fused-kernel-fallbacks",
    ),
    (  # prepend_to_function: defs nested in if/try/with/else blocks and a class, a path of two defs
        "megatron/core/g.py",
        "import os\n\nif os:\n    try:\n        with open(os.devnull):\n            pass\n    finally:\n"
        "        pass\nelse:\n    class Holder:\n        def _set_attention_backend(self):\n"
        "            try:\n                def check_and_set_env_variable(name, value, attn_type):\n"
        '                    """Doc."""\n                    return name\n'
        "            finally:\n                pass\n",
        "attention-backend-env",
    ),
    # capability-gates and empty-cache-interval where the text settles what `torch.…` means
    # (spelled_plainly: SPELLED below) and where it does not
    (  # plain: module-level `import torch` and `import torch.distributed`
        "megatron/core/cp0.py",
        "import torch\nimport torch.distributed\n\n\ndef f(args):\n"
        "    if torch.cuda.get_device_capability()[0] >= 9:\n        pass\n"
        "    dc = torch.cuda.get_device_capability()\n    x = torch.cuda.get_device_properties(0).major < 8\n"
        "    return dc[0] >= 8\n",
        "capability-gates",
    ),
    (  # a parameter named torch: f's call means nothing, g's the capability
        "megatron/core/cp1.py",
        "import torch\n\n\ndef f(torch):\n    return torch.cuda.get_device_capability()[0] >= 9\n\n\n"
        "def g():\n    return torch.cuda.get_device_capability()[0] >= 9\n",
        "capability-gates",
    ),
    (  # `import torch.distributed` in a function binds torch there: left to the scope analysis
        "megatron/core/cp2.py",
        "import torch\n\n\ndef f():\n    import torch.distributed\n\n"
        "    return torch.cuda.get_device_properties(0).major >= 9\n\n\n"
        "def g():\n    return torch.cuda.get_device_properties(0).major >= 9\n",
        "capability-gates",
    ),
    (  # through `from torch import cuda`
        "megatron/core/cp3.py",
        "import torch\nfrom torch import cuda\n\n\ndef f():\n    return cuda.get_device_capability()[0] >= 9\n",
        "capability-gates",
    ),
    (  # plain: train_step's level-1 gate
        "megatron/training/training1.py",
        "import torch\nimport torch.distributed\n\n\ndef train_step(args):\n"
        "    if args.empty_unused_memory_level >= 1:\n        torch.cuda.empty_cache()\n",
        "empty-cache-interval",
    ),
    (  # an alias of torch.cuda
        "megatron/training/training2.py",
        "import torch\nimport torch.cuda as tc\n\n\ndef train_step(args):\n"
        "    if args.empty_unused_memory_level >= 1:\n        tc.empty_cache()\n        torch.cuda.empty_cache()\n",
        "empty-cache-interval",
    ),
]
# te-version-gates' scope-free path (_plain_gate_lines): gates it answers from the text alone, and the
# spellings that must leave it to the full analysis. (path, text, whether the text alone settles it)
GATE_CASES = [
    (  # the common test module: imported at module level, called in functions and a decorator, multi-line
        "tests/unit_tests/j.py",
        "import pytest\nimport transformer_engine as te\nfrom megatron.core.utils import is_te_min_version\n\n\n"
        '@pytest.mark.skipif(not is_te_min_version("2.1"), reason="x")\ndef test_a():\n'
        '    assert is_te_min_version("1.0")\n\n\nclass TestB:\n    def test_b(self):\n'
        '        if (\n            True\n            and is_te_min_version(\n                "2.5.0"\n            )\n'
        "        ):\n            x = te.pytorch.Linear(1, 1)\n",
        True,
    ),
    (  # imported inside a function (a lazy import): where else it means the gate is the scope's question
        "megatron/core/k.py",
        'def f():\n    from megatron.core.utils import is_te_min_version\n\n    return is_te_min_version("2.0")\n\n\n'
        'def g():\n    return is_te_min_version("2.1")\n',
        False,
    ),
    (  # a parameter of the same name shadows the import
        "megatron/core/l.py",
        "from megatron.core.utils import is_te_min_version\n\n\n"
        'def f(is_te_min_version):\n    return is_te_min_version("2.0")\n\n\nx = is_te_min_version("1.0")\n',
        False,
    ),
    (  # a parenthesised call, and one through the module
        "megatron/core/m.py",
        "import megatron.core.utils as u\nfrom megatron.core.utils import is_te_min_version\n\n"
        'a = (is_te_min_version("2.0"))\nb = u.is_te_min_version("2.1")\n',
        False,
    ),
    (  # a class deriving from a name a TE import binds
        "megatron/core/n.py",
        "from transformer_engine.pytorch import Linear\nfrom megatron.core.utils import is_te_min_version\n\n\n"
        'class L(Linear):\n    def __init__(self):\n        if is_te_min_version("2.3.0"):\n            pass\n',
        False,
    ),
    (  # never bound: a call the scope cannot resolve means nothing
        "tests/unit_tests/o.py",
        'import transformer_engine\n\n\ndef test_x():\n    assert is_te_min_version("1.0")\n',
        False,
    ),
]


def both(path: str, text: str, specs=ALL) -> tuple[str, str]:
    on = transform_text(path, text, specs, prefilter=True)
    off = transform_text(path, text, specs, prefilter=False)
    return json.dumps(on[0], sort_keys=True) + repr(on[1]), json.dumps(off[0], sort_keys=True) + repr(off[1])


@pytest.mark.parametrize("path,text,acts", CASES, ids=[c[2] + ":" + c[0] for c in CASES])
def test_prefiltered_output_is_the_full_runs(path, text, acts):
    out, failure = transform_text(path, text, ALL)
    assert failure is None
    assert acts in out, f"{acts} did nothing here: the case compares two no-ops"
    on, off = both(path, text)
    assert on == off


@pytest.mark.parametrize("path,text,plain", GATE_CASES, ids=[c[0] for c in GATE_CASES])
def test_te_version_gates_scope_free_path_gives_the_full_runs_output(path, text, plain):
    """A module whose text settles what its gate calls mean is answered without scope analysis or
    positions: the same bytes and reports (lines, versions, reasons) as the full run; in doubt, the
    full analysis runs."""
    from rocmport.codemods.te_version_gates import _plain_gate_lines

    specs = [{"name": "te-version-gates", "options": {}, "version": registry["te-version-gates"].VERSION}]
    out, failure = transform_text(path, text, specs)
    on, off = both(path, text, specs)
    assert failure is None and on == off
    assert (_plain_gate_lines(text) is not None) is plain
    if plain:
        assert [r["line"] for r in out["te-version-gates"]["reports"]] == [6, 8, 15]


# The scope-free path walks only the statements that hold a gate call (a top-level statement, or the
# statements of a top-level class's body): (path, text, the statements it walks, (report kind, line)s)
HOLDER_CASES = [
    (  # a test class: gates in a method's decorator and in a class attribute, a `;` line on both levels
        "tests/unit_tests/p.py",
        'import pytest\nfrom megatron.core.utils import is_te_min_version\n\nA = 1; B = is_te_min_version("1.0")\n\n\n'
        "class TestP:\n    x = 1; y = 2\n\n    def test_a(self):\n        pass\n\n"
        '    @pytest.mark.skipif(not is_te_min_version("2.2.0"), reason="x")\n    def test_b(self):\n        pass\n\n'
        '    z = 3; w = is_te_min_version("2.3")\n\n    def test_c(self):\n        pass\n',
        ["A = 1; B = is_te_min_version", "def test_b", "z = 3; w = is_te_min_version"],
        [("skip", 4), ("skip", 13), ("skip", 17)],
    ),
    (  # a gate in the class's own decorator: the whole class is walked
        "tests/unit_tests/q.py",
        "import pytest\nfrom megatron.core.utils import is_te_min_version\n\n\n"
        '@pytest.mark.skipif(not is_te_min_version("2.0"), reason="x")\nclass TestQ:\n    def test_a(self):\n'
        '        assert is_te_min_version("2.1")\n',
        ["class TestQ"],
        [("skip", 5), ("skip", 8)],
    ),
    (  # a feature gate the full analysis rewrites (arguments.py's NVFP4 check): the text settled the calls
        "megatron/training/arguments.py",
        "from megatron.core.utils import is_te_min_version\n\n\ndef validate_args(args):\n"
        '    if args.fp4 and not is_te_min_version("2.7.0"):\n'
        '        raise ValueError("--fp4 needs NVFP4BlockScaling (TE 2.7.0)")\n'
        '    if args.fp8 and not is_te_min_version("1.0"):\n        raise ValueError("--fp8 needs TE")\n',
        ["def validate_args"],
        [("site", 5), ("skip", 7)],
    ),
]


@pytest.mark.parametrize("path,text,walked,reports", HOLDER_CASES, ids=[c[0] for c in HOLDER_CASES])
def test_te_version_gates_scope_free_path_walks_only_the_statements_holding_a_gate(path, text, walked, reports):
    from rocmport.codemods.te_version_gates import _holding, _plain_gate_lines

    specs = [{"name": "te-version-gates", "options": {}, "version": registry["te-version-gates"].VERSION}]
    found = _plain_gate_lines(text)
    assert found is not None
    module = cst.parse_module(text)
    statements = _holding(module, found[1])
    assert statements is not None
    labels = [
        f"def {s.name.value}"
        if isinstance(s, cst.FunctionDef)
        else f"class {s.name.value}"
        if isinstance(s, cst.ClassDef)
        else module.code_for_node(s).strip().split("(")[0]
        for s in statements
    ]
    assert labels == walked
    out, failure = transform_text(path, text, specs)
    on, off = both(path, text, specs)
    assert failure is None and on == off
    assert [(r["kind"], r["line"]) for r in out["te-version-gates"]["reports"]] == reports


# Whether spelled_plainly settles the cases above (the fast path runs, or the scope analysis does)
SPELLED = {
    "megatron/core/cp0.py": True,
    "megatron/core/cp1.py": False,
    "megatron/core/cp2.py": False,
    "megatron/core/cp3.py": False,
    "megatron/training/training1.py": True,
    "megatron/training/training2.py": False,
}


@pytest.mark.parametrize("path", sorted(SPELLED))
def test_spelled_plainly_decides_the_torch_cases(path):
    from rocmport.codemods.base import spelled_plainly

    text = next(t for p, t, _ in CASES if p == path)
    names = ("torch.cuda.get_device_capability", "torch.cuda.get_device_properties", "torch.cuda.empty_cache")
    assert spelled_plainly(text, names) is SPELLED[path]


def test_qualified_names_are_the_providers_on_every_node():
    """`qualified_names` asks the scope what libcst's QualifiedNameProvider answers, for every node of
    real modules (rocmport's own source and the cases above)."""

    class Both(cst.CSTVisitor):
        METADATA_DEPENDENCIES = (*NAMES, QualifiedNameProvider)

        def __init__(self):
            self.nodes, self.named, self.differ = 0, 0, []

        def on_visit(self, node):
            ours = qualified_names(self, node)
            theirs = {q.name for q in self.get_metadata(QualifiedNameProvider, node, set())}
            self.nodes += 1
            self.named += bool(theirs)
            if ours != theirs:
                self.differ.append((type(node).__name__, ours, theirs))
            return True

    texts = [p.read_text() for p in sorted((REPO / "rocmport" / "codemods").glob("*.py"))]
    texts += [text for _, text, _ in CASES]
    seen = Both()
    for text in texts:
        MetadataWrapper(cst.parse_module(text)).visit(seen)
    assert seen.differ == []
    assert seen.nodes > 50_000 and seen.named > 5_000, (seen.nodes, seen.named)
    assert ScopeProvider in NAMES


def test_start_lines_are_the_providers_on_every_node():
    """`start_lines` (the prefilter's positions: sites, skips) gives every node of real modules the
    start line libcst's PositionProvider gives it: rocmport's own source, the cases above, and line
    breaks spelled \\r\\n and \\r, in strings, comments and continuations."""
    from libcst.metadata import PositionProvider

    from rocmport.codemods.base import start_lines

    texts = [p.read_text() for p in sorted((REPO / "rocmport" / "codemods").glob("*.py"))]
    texts += [text for _, text, _ in CASES] + [text for _, text, _ in GATE_CASES]
    texts += [text for _, text, _, _ in HOLDER_CASES]
    odd = '@dec\n\n# c\n@dec2(\n  1)\nasync def f(a,\n  b):\n    x = """\n\n"""; y = \\\n  2\n\n\nclass C: pass\n'
    texts += [odd, odd.replace("\n", "\r\n"), odd.replace("\n", "\r"), "x = 1\n\n\n# end\n\n"]
    nodes = 0
    for text in texts:
        module = cst.parse_module(text)
        theirs = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
        ours = start_lines(module, list(theirs))
        assert {n: r.start.line for n, r in theirs.items()} == ours
        nodes += len(ours)
    assert nodes > 50_000, nodes


def _compare(args: tuple[str, str, list]) -> tuple[str, bool, bool]:
    path, text, specs = args
    if not any(registry[s["name"]].triggered(text, s["options"]) for s in specs):
        return path, False, True
    on, off = both(path, text, specs)
    return path, True, on == off


def assert_tree_identical(files: dict[str, str], specs: list[dict], at_least: int) -> None:
    results = pool_map(_compare, [(p, t, specs) for p, t in sorted(files.items())], 2)
    ran = [p for p, parsed, _ in results if parsed]
    assert [p for p, parsed, same in results if parsed and not same] == []
    assert len(ran) >= at_least, len(ran)


@pytest.mark.slow
@pytest.mark.network
def test_prefiltered_equals_full_on_every_file_of_megatron_core_0_16_1(tmp_path):
    from tests.codemods.test_real_trees import sdist_tree

    tree = sdist_tree(tmp_path)
    files = {str(p.relative_to(tree)): p.read_text() for p in tree.rglob("*.py")}
    specs = _specs(load_series(REPO / "patchsets" / "megatron-lm" / "v0.16" / "series").codemods)
    assert_tree_identical(files, specs, at_least=30)


@pytest.mark.slow
@pytest.mark.mirror
@needs_mlm_mirror
def test_prefiltered_equals_full_on_every_file_of_the_v0_18_tree():
    """Every Python file of Megatron-LM at core_v0.18.0 (the v0.18 line's recipe): the same bytes and
    reports with and without the prefilter."""

    def git(*args: str) -> str:
        return subprocess.run(["git", "--git-dir", MLM, *args], check=True, capture_output=True, text=True).stdout

    ref = "core_v0.18.0"
    names = [p for p in git("ls-tree", "-r", "--name-only", ref).splitlines() if p.endswith(".py")]
    files = {p: git("show", f"{ref}:{p}") for p in names}
    assert_tree_identical(files, _specs(load_series(SERIES_V018).codemods), at_least=100)


def test_the_runner_gives_the_same_layers_and_failures_in_the_pool(tmp_path, monkeypatch):
    """A hop re-runs a few files: from two on they go to the worker pool, the largest first; the
    layers and the failures (in path order) are what one process gives."""
    import rocmport.codemods.runner as runner

    sent: list[list[str]] = []

    def spy(fn, items, jobs, **kwargs):
        sent.append([rel for rel, _, _ in items])
        return pool_map(fn, items, jobs, **kwargs)

    monkeypatch.setattr(runner, "pool_map", spy)
    files = {
        "megatron/core/a_small.py": "import torch\nf = torch.cuda.amp.custom_fwd\n",
        "megatron/core/b_broken.py": "import apex\ndef f(:\n",
        "megatron/core/c_large.py": "import torch\n"
        + "".join(f"f{i} = torch.cuda.amp.custom_bwd\n" for i in range(300)),
        "megatron/core/d_broken.py": "import apex\nclass (:\n",
    }
    for rel, text in files.items():
        (tmp_path / "t" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "t" / rel).write_text(text)
    serial = compute_layers(tmp_path / "t", ["apex-to-torch"], jobs=1, cache_dir=tmp_path / "a")
    pooled = compute_layers(tmp_path / "t", ["apex-to-torch"], jobs=2, cache_dir=tmp_path / "b")
    assert pooled.layers[0].files == serial.layers[0].files and len(serial.layers[0].files) == 3
    assert (
        [f.path for f in pooled.failures]
        == [f.path for f in serial.failures]
        == [
            "megatron/core/b_broken.py",
            "megatron/core/d_broken.py",
        ]
    )
    assert pooled.layers[0].all_reports() == serial.layers[0].all_reports()
    assert sent == [
        [
            "megatron/core/c_large.py",
            "megatron/core/a_small.py",
            "megatron/core/d_broken.py",
            "megatron/core/b_broken.py",
        ]
    ]
