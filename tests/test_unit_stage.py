"""verify stage 3: upstream's unit tests under torchrun with rocmport's pytest plugin, outcomes
merged over ranks, each failure labelled against the unported tree at the same commit (cached)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
import re
import textwrap
from pathlib import Path

import pytest

from rocmport.errors import BadInput
from rocmport.patches.series import load_series
from rocmport.nvidia_only import blocked
from rocmport.verify.orchestration import environment
from rocmport.verify.orchestration import firewall, te_layer
from rocmport.verify.runtime import protocol
from rocmport.verify.stages.unit_tests import suite
from rocmport.verify.stages.unit_tests import baseline as unit_baseline
from rocmport.verify.stages.unit_tests.labels import label
from rocmport.verify.stages.unit_tests.results import FileRun, SuiteRun, UnitTestsRun
from rocmport.verify.stages.unit_tests.runner import _first_hang, run_tests
from rocmport.verify.stages.unit_tests.stage import stage_unit_tests
from tests.helpers import te_probe
from tests.helpers.sync import g

TESTS = textwrap.dedent("""\
    import os
    import pytest
    from megatron.core import mathops

    def test_add():
        assert mathops.add(2, 3) == 5

    def test_upstream_broken():
        assert mathops.mul(2, 3) == 6

    def test_listed():
        assert mathops.scale(2) == 4

    @pytest.mark.skipif(True, reason="needs CUDA")
    def test_skipped():
        pass

    def test_fails_on_rank_one_only():
        assert os.environ.get("RANK") != "1" or mathops.add(1, 1) == 2
    """)


def upstream_repo(root: Path) -> tuple[Path, str]:
    """An upstream-shaped repo whose port (second commit) breaks add() and scale(); mul() is broken
    upstream already; a test module that does not import on either."""
    (root / "megatron" / "core").mkdir(parents=True)
    (root / "megatron" / "__init__.py").write_text("")
    (root / "megatron" / "core" / "__init__.py").write_text("")
    # The RNG hooks the proxy shim backs with the CPU generator (verify's CLI runs in CPU-proxy mode).
    (root / "megatron" / "core" / "tensor_parallel").mkdir(parents=True)
    (root / "megatron" / "core" / "tensor_parallel" / "__init__.py").write_text("")
    (root / "megatron" / "core" / "tensor_parallel" / "random.py").write_text(
        "def _get_cuda_rng_state():\n    pass\n\n\ndef _set_cuda_rng_state(state):\n    pass\n\n\nclass CudaRNGStatesTracker:\n    pass\n"
    )
    (root / "megatron" / "core" / "mathops.py").write_text(
        "def add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n    return a + b\n\n\ndef scale(a):\n    return 2 * a\n"
    )
    (root / "tests" / "unit_tests").mkdir(parents=True)
    (root / "tests" / "unit_tests" / "test_ops.py").write_text(TESTS)
    (root / "tests" / "unit_tests" / "test_needs_te.py").write_text(
        "import transformer_engine\n\n\ndef test_te():\n    pass\n"
    )
    g(root, "init", "-q", "-b", "main")
    g(root, "add", "-A")
    g(root, "-c", "user.name=t", "-c", "user.email=t@e", "commit", "-qm", "upstream")
    base = g(root, "rev-parse", "HEAD")
    text = (root / "megatron" / "core" / "mathops.py").read_text()
    (root / "megatron" / "core" / "mathops.py").write_text(
        text.replace("return a + b\n\n\ndef mul", "return a - b\n\n\ndef mul").replace("2 * a", "3 * a")
    )
    g(root, "-c", "user.name=t", "-c", "user.email=t@e", "commit", "-qam", "port")
    return root, base


@pytest.fixture
def child_env(tmp_path):
    """verify's environment for the started processes (the bootstrap and the cpu-proxy firewall:
    TE is absent), without the proxy shim (these trees have no megatron internals to shim)."""

    def make(tree: Path) -> dict:
        return environment.child_env(
            tree, firewall.write_bootstrap(tmp_path / "boot"), firewall.firewall_env("cpu-proxy")
        )

    return make


BLOCKED = blocked("cpu-proxy")


FILES = ["tests/unit_tests/test_ops.py", "tests/unit_tests/test_needs_te.py"]


@pytest.mark.torch
@pytest.mark.slow
def test_port_run_merges_ranks(tmp_path, child_env):
    tree, _ = upstream_repo(tmp_path / "up")
    res = run_tests(tree, FILES, child_env(tree), nproc=2)
    assert res.ranks == 2
    ops = {k.split("::")[1]: v for k, v in res.outcomes.items() if "::" in k}
    assert ops == {
        "test_add": "failed",
        "test_upstream_broken": "failed",
        "test_listed": "failed",
        "test_skipped": "skipped",
        "test_fails_on_rank_one_only": "failed",
    }
    assert res.outcomes["tests/unit_tests/test_needs_te.py"] == "error"
    assert "No module named 'transformer_engine'" in res.details["tests/unit_tests/test_needs_te.py"]
    assert res.missing == {"tests/unit_tests/test_needs_te.py": "transformer_engine"}
    assert res.kinds["tests/unit_tests/test_ops.py::test_add"] == "AssertionError"


@pytest.mark.torch
@pytest.mark.slow
def test_stage_labels_against_cached_baseline(tmp_path, child_env):
    tree, base = upstream_repo(tmp_path / "up")
    known = {"tests/unit_tests/test_ops.py::test_listed": "AMD's fork skips it on ROCm"}
    res = stage_unit_tests(tree, child_env(tree), FILES, 2, known, tmp_path / "cache", base, blocked=BLOCKED)
    d = res.to_dict()
    assert res.status == "fail"  # a port regression fails the stage
    labels = {k.split("::")[-1]: v for k, v in d["labels"].items()}
    # test_needs_te.py: TE is absent by the firewall's doing on both trees, the one absence that may explain a module error;
    # it is what this environment lacks by design, not upstream's bug.
    assert labels == {
        "test_add": "port-regression",
        "test_upstream_broken": "upstream-known",
        "test_listed": "known-failure",
        "tests/unit_tests/test_needs_te.py": "needs-nvidia-only",
        "test_fails_on_rank_one_only": "port-regression",
    }
    assert d["label_reasons"]["tests/unit_tests/test_ops.py::test_add"] == "passed on the unported tree"
    assert (
        d["outcomes"]["tests/unit_tests/test_ops.py::test_skipped"] == "skipped"
    )  # per-test outcomes, not only counts
    assert d["counts"] == {"passed": 0, "skipped": 1, "failed": 4, "error": 1}
    on_base = {k.split("::")[-1]: v for k, v in d["on_baseline"].items()}
    assert on_base["test_add"] == "passed" and on_base["test_upstream_broken"] == "failed"
    assert on_base["tests/unit_tests/test_needs_te.py"] == "error"
    assert d["baseline"]["commit"] == base and not d["baseline"]["cached"]
    # the unported tree ran what the port did not pass, no more: test_skipped never ran there
    failing = [f"tests/unit_tests/test_ops.py::{t}" for t in ("test_add", "test_fails_on_rank_one_only", "test_listed")]
    ran = sorted([*failing, "tests/unit_tests/test_needs_te.py", "tests/unit_tests/test_ops.py::test_upstream_broken"])
    assert d["baseline"]["ran"] == ran and d["baseline"]["tests_not_on_port"] == 0
    assert d["baseline"]["counts"] == {"passed": 3, "skipped": 0, "failed": 1, "error": 1}
    (kept,) = (tmp_path / "cache" / "unit-baselines").glob("*.json")
    assert sorted(json.loads(kept.read_text())["outcomes"]) == ran
    assert f"baseline run at {base[:12]} on what the port did not pass (4 of its 5 tests and 1 file)" in res.reason
    assert "2 port-regression, 1 upstream-known, 1 needs-nvidia-only, 1 known-failure" in res.reason
    assert g(tree, "worktree", "list").count("\n") == 0  # the baseline checkout is gone
    again = stage_unit_tests(
        tree, child_env(tree), FILES, 2, known, tmp_path / "cache", base, blocked=BLOCKED
    ).to_dict()
    assert again["baseline"]["cached"] and again["labels"] == d["labels"]
    assert len(list((tmp_path / "cache" / "unit-baselines").glob("*.json"))) == 1


# A baseline cache file as `baseline()` wrote it before run_tests returned a SuiteRun (PLUGIN_VERSION 17,
# the run a dict, its files FileRun dicts): the unported toy tree of upstream_repo, FILES on 2 ranks.
OLD_CACHE = Path(__file__).parent / "data" / "unit-baseline-plugin17.json"


def test_a_baseline_cached_in_the_earlier_layout_loads_and_writes_back_byte_for_byte():
    """The cache outlives the code that wrote it (PLUGIN_VERSION unchanged): a record in the layout the
    dict-returning run_tests wrote loads as a SuiteRun (its files FileRun objects) and writes back the same bytes."""
    text = OLD_CACHE.read_text()
    run = SuiteRun.from_dict(json.loads(text))
    assert run.files["tests/unit_tests/test_ops.py"] == FileRun("ran", {"failed": 1, "passed": 3, "skipped": 1})
    assert run.files["tests/unit_tests/test_needs_te.py"].status == "collection-error"
    assert run.outcomes["tests/unit_tests/test_ops.py::test_upstream_broken"] == "failed" and run.ranks == 2
    assert json.dumps(run.to_dict(), indent=1, sort_keys=True) == text
    # the fields this record left empty, filled: a file not run, a hang rerun alone, no machine share
    record = json.loads(text)
    record["files"]["tests/unit_tests/test_ops.py"] = {
        "status": "not-run",
        "counts": {"passed": 1},
        "hangs": 7,
        "reason": "4 of its 5 tests did not run: its restart budget ran out",
        "not_run": ["tests/unit_tests/test_ops.py::test_add", "tests/unit_tests/test_ops.py::test_listed"],
    }
    record.update(hung=["t.py::h"], alone={"t.py::h": "failed"}, alone_kinds={"t.py::h": "RuntimeError"}, machine=None)
    again = SuiteRun.from_dict(record)
    assert again.files["tests/unit_tests/test_ops.py"].not_run == (
        "tests/unit_tests/test_ops.py::test_add",
        "tests/unit_tests/test_ops.py::test_listed",
    )
    assert json.dumps(again.to_dict(), indent=1, sort_keys=True) == json.dumps(record, indent=1, sort_keys=True)


@pytest.mark.torch
@pytest.mark.slow
def test_the_stage_labels_against_a_baseline_cached_in_the_earlier_layout(tmp_path, child_env):
    """That record, where `baseline()` looks for the toy tree's baseline of the port's failures: stage 3
    reuses it (no run of the unported tree) and labels the port against it as against a fresh run."""
    tree, base = upstream_repo(tmp_path / "up")
    env = child_env(tree)
    ops = [f"tests/unit_tests/test_ops.py::{t}" for t in ("test_add", "test_upstream_broken", "test_listed")]
    failing = [*ops, "tests/unit_tests/test_ops.py::test_fails_on_rank_one_only", "tests/unit_tests/test_needs_te.py"]
    cache = unit_baseline.baseline_cache(
        tree, base, FILES, env, 2, tmp_path / "cache", unit_baseline.overlay_files(tree, base), failing
    )
    cache.parent.mkdir(parents=True)
    cache.write_text(OLD_CACHE.read_text())
    res = stage_unit_tests(tree, env, FILES, 2, {}, tmp_path / "cache", base, blocked=BLOCKED)
    d = res.details
    assert isinstance(d, UnitTestsRun) and d.baseline.cached and d.baseline_seconds == 0.0
    assert {k.split("::")[-1]: v for k, v in d.labels.items()} == {
        "test_add": "port-regression",
        "test_upstream_broken": "upstream-known",
        "test_listed": "port-regression",
        "tests/unit_tests/test_needs_te.py": "needs-nvidia-only",
        "test_fails_on_rank_one_only": "port-regression",
    }
    assert d.baseline.counts == {"passed": 3, "skipped": 1, "failed": 1, "error": 1} and d.baseline.tests == 5
    assert d.on_baseline["tests/unit_tests/test_ops.py::test_add"] == "passed"
    assert cache.read_text() == OLD_CACHE.read_text()  # read, not rewritten


def test_the_baseline_s_cache_key_is_the_set_of_tests_it_runs(tmp_path, child_env):
    """The unported tree runs the port's failures (to_label): another set of them is another run there,
    the same set in another order the same one."""
    tree, base = upstream_repo(tmp_path / "up")
    env, overlay = child_env(tree), unit_baseline.overlay_files(tree, base)
    a, b = "tests/unit_tests/test_ops.py::test_add", "tests/unit_tests/test_needs_te.py"

    def key(only):
        return unit_baseline.baseline_cache(tree, base, FILES, env, 2, tmp_path, overlay, only)

    assert key([a, b]) == key([b, a])
    assert len({key([a]), key([a, b]), key([b]), key(None)}) == 4


def test_the_baseline_runs_the_port_s_failures_a_module_s_error_as_its_file_and_nothing_more(tmp_path):
    """What the labels read of the unported tree: each failed or errored test id (odd parametrisations
    as written), a test module that does not import on the port as its whole file (its tests there are
    what the port-regression of a broken import counts), a conftest.py's error as the selected files
    below it, a not-run file's tests that have no outcome (the file where none is named); never a test
    the port passed or skipped; nothing at all when the port passed everything."""
    names = ("test_a.py", "test_b.py", "sub/conftest.py", "sub/test_c.py", "test_d.py", "test_e.py")
    names += ("pkg/__init__.py", "pkg/test_f.py")
    root = tmp_path / "t" / "tests" / "unit_tests"
    (root / "sub").mkdir(parents=True)
    (root / "pkg").mkdir()
    for name in names:
        (root / name).write_text("")
    ut = "tests/unit_tests/"
    port = SuiteRun(
        outcomes={
            ut + "test_a.py::test_ok": "passed",
            ut + "test_a.py::test_skip": "skipped",
            ut + "test_a.py::test_p[x::y-[z] a b]": "failed",
            ut + "test_a.py::TestK::test_hung": "failed",
            ut + "test_b.py": "error",
            ut + "sub/conftest.py": "error",
            ut + "pkg/__init__.py": "error",  # a package that does not import: its test files, not it
            ut + "test_d.py::test_one": "passed",
        },
        files={
            ut + "test_d.py": FileRun("not-run", {"passed": 1}, 7, "budget", (ut + "test_d.py::test_two",)),
            ut + "test_e.py": FileRun("not-run", {}, 0, "pytest never collected it"),
        },
    )
    assert unit_baseline.to_label(tmp_path / "t", ["tests/unit_tests"], port) == sorted(
        [
            ut + "test_a.py::TestK::test_hung",
            ut + "test_a.py::test_p[x::y-[z] a b]",
            ut + "test_b.py",
            ut + "sub/test_c.py",
            ut + "pkg/test_f.py",
            ut + "test_d.py::test_two",
            ut + "test_e.py",
        ]
    )
    passed = SuiteRun(outcomes={ut + "test_a.py::test_ok": "passed", ut + "test_a.py::test_skip": "skipped"})
    assert unit_baseline.to_label(tmp_path / "t", ["tests/unit_tests"], passed) == []


REACHES_A_NEW_MODULE = textwrap.dedent("""\
    from megatron.core import extra

    def test_extra():
        assert extra.value() == 2
    """)
ODD_PARAMETRISATIONS = textwrap.dedent("""\
    import os
    import pytest

    @pytest.mark.parametrize("v", ["x::y [z]", "a b", "ok"])
    def test_p(v):
        assert v == "ok" or "ROCMPORT_BASELINE_GUARDS" in os.environ  # fails on the port only
    """)


@pytest.mark.torch
@pytest.mark.slow
def test_the_baseline_runs_only_the_port_s_failures_even_where_its_module_does_not_import(tmp_path, child_env):
    """The unported tree is given the port's failing tests: parametrised ids with brackets, spaces and
    `::` in them get their outcome there, a test the port passed does not run there, and a failing test
    whose module does not import on the unported tree (a module the port added) has that module's
    error there while the other files' tests still run: pytest, given a test id it cannot collect,
    ends the whole session ("found no collectors"), so the ids travel to the plugin, not on its
    command line."""
    tree, base = upstream_repo(tmp_path / "up")
    g(tree, "checkout", "-q", base, "--", "megatron")  # the port: no bug but what follows
    (tree / "megatron" / "core" / "extra.py").write_text("def value():\n    return 3\n")
    (tree / "tests" / "unit_tests" / "test_extra.py").write_text(REACHES_A_NEW_MODULE)
    (tree / "tests" / "unit_tests" / "test_params.py").write_text(ODD_PARAMETRISATIONS)
    g(tree, "add", "-A")
    g(tree, "-c", "user.name=t", "-c", "user.email=t@e", "commit", "-qm", "port")
    files = ["tests/unit_tests/test_extra.py", "tests/unit_tests/test_params.py", "tests/unit_tests/test_ops.py"]
    res = stage_unit_tests(tree, child_env(tree), files, 2, {}, tmp_path / "cache", base, blocked=BLOCKED)
    d = res.details
    assert isinstance(d, UnitTestsRun)
    params = [f"tests/unit_tests/test_params.py::test_p[{v}]" for v in ("a b", "x::y [z]")]
    extra, broken = "tests/unit_tests/test_extra.py::test_extra", "tests/unit_tests/test_ops.py::test_upstream_broken"
    assert d.baseline.ran == sorted([extra, *params, broken])
    assert d.labels == {
        extra: "unverified",
        params[0]: "port-regression",
        params[1]: "port-regression",
        broken: "upstream-known",
    }, d.label_reasons
    assert d.label_reasons[extra].startswith("its module does not import on the unported tree: ")
    assert d.on_baseline[params[0]] == "passed" and d.on_baseline[broken] == "failed"
    (kept,) = (tmp_path / "cache" / "unit-baselines").glob("*.json")
    assert sorted(json.loads(kept.read_text())["outcomes"]) == sorted(
        [*params, broken, "tests/unit_tests/test_extra.py"]
    )
    assert d.baseline.counts == {"passed": 2, "skipped": 0, "failed": 1, "error": 1}


@pytest.mark.torch
@pytest.mark.slow
def test_no_baseline_runs_when_the_port_has_nothing_to_label(tmp_path, child_env):
    tree, base = upstream_repo(tmp_path / "up")
    passing = ["tests/unit_tests/test_ops.py::test_add", "tests/unit_tests/test_ops.py::test_skipped"]
    g(tree, "checkout", "-q", base, "--", "megatron")
    res = stage_unit_tests(tree, child_env(tree), passing, 2, {}, tmp_path / "cache", base, blocked=BLOCKED)
    d = res.details
    assert res.status == "pass" and isinstance(d, UnitTestsRun) and d.counts["passed"] == 1
    assert d.baseline.ran == [] and d.baseline.counts == {"passed": 0, "skipped": 0, "failed": 0, "error": 0}
    assert d.baseline_seconds == 0.0 and f"no baseline run at {base[:12]}: nothing to label" in res.reason
    assert not (tmp_path / "cache" / "unit-baselines").exists()
    assert g(tree, "worktree", "list").count("\n") == 0  # no checkout made either


def test_a_baseline_made_on_another_proxy_is_kept_apart(tmp_path, child_env, monkeypatch):
    """The unported tree's run stood on the proxy (shim, plugin, TE's CPU layer): once those sources change,
    its kept run answers for another proxy, and the cache looks elsewhere."""
    from rocmport.verify import runtime

    tree, base = upstream_repo(tmp_path / "up")
    overlay = unit_baseline.overlay_files(tree, base)
    here = unit_baseline.baseline_cache(tree, base, FILES, child_env(tree), 2, tmp_path, overlay)
    assert unit_baseline.baseline_cache(tree, base, FILES, child_env(tree), 2, tmp_path, overlay) == here
    monkeypatch.setattr(runtime, "source_digest", lambda: "another-proxy")
    assert unit_baseline.baseline_cache(tree, base, FILES, child_env(tree), 2, tmp_path, overlay) != here


def test_label_rules():
    port = {
        "outcomes": {
            "a.py::x": "failed",
            "a.py::y": "failed",
            "b.py": "error",
            "c.py::z": "failed",
            "d/e.py::w": "failed",
            "a.py::ok": "passed",
            "a.py::diff": "failed",
            "a.py::te": "failed",
            "a.py::gone": "failed",
            "f.py": "error",
            "a.py::dep": "failed",
            "a.py::hang1": "failed",
            "a.py::hang2": "failed",
            "a.py::hang3": "failed",
            "a.py::rope": "failed",
            "a.py::nvrx": "failed",
            "g.py": "error",
            "a.py::cuda": "failed",
            "a.py::eagain": "failed",
        },
        "kinds": {
            "a.py::eagain": "RuntimeError",
            "a.py::y": "AssertionError",
            "b.py": "ImportError",
            "a.py::diff": "TypeError",
            "a.py::te": "AssertionError",
            "a.py::hang1": "hang",
            "a.py::hang2": "hang",
            "a.py::hang3": "hang",
        },
        "missing": {"f.py": "yaml", "g.py": "transformer_engine.pytorch"},
        "details": {
            "a.py::dep": "ModuleNotFoundError: No module named 'mock' at a.py:3",
            "a.py::rope": "ValueError: apply_rope_fusion is not available. Please install TE >= 1.4. at megatron/core/x.py:9",
            "a.py::nvrx": "ModuleNotFoundError: A compatible `nvidia-resiliency-ext` installation is required",
            "a.py::cuda": "AssertionError: expected torch.cuda.FloatTensor, Apex is not installed at a.py:5",
            "a.py::eagain": "RuntimeError: Resource temporarily unavailable at rocmport/verify/runtime/proxy_shim.py:171",
        },
        "local_spec": ["a.py::te"],
        "hung": ["a.py::hang1", "a.py::hang2", "a.py::hang3"],
        "alone": {"a.py::hang1": "passed", "a.py::hang2": "hung", "a.py::hang3": "hung"},
    }
    base = {
        "outcomes": {
            "a.py::x": "passed",
            "a.py::y": "failed",
            "b.py": "error",
            "c.py": "error",
            "d/e.py::w": "passed",
            "a.py::diff": "failed",
            "a.py::te": "failed",
            "f.py": "error",
            "a.py::dep": "failed",
            "a.py::hang2": "failed",
            "a.py::hang3": "passed",
            "a.py::rope": "failed",
            "a.py::nvrx": "failed",
            "g.py": "error",
            "a.py::cuda": "failed",
            "a.py::eagain": "failed",
        },
        "kinds": {
            "a.py::eagain": "RuntimeError",
            "a.py::y": "AssertionError",
            "b.py": "ImportError",
            "a.py::diff": "AssertionError",
            "a.py::te": "AssertionError",
            "a.py::hang2": "hang",
        },
        "hung": ["a.py::hang2"],
        "alone": {"a.py::hang2": "hung"},
    }
    labels, why = label(
        SuiteRun.from_dict(port),
        SuiteRun.from_dict(base),
        {"d/": "whole directory skipped on ROCm"},
        blocked=("transformer_engine", "nvidia_resiliency_ext", "cuda", "apex"),
    )
    assert (
        labels
        == {
            "a.py::x": "port-regression",
            "a.py::y": "upstream-known",
            "b.py": "upstream-known",
            "c.py::z": "unverified",  # its module did not import on the unported tree: no outcome there
            "d/e.py::w": "known-failure",
            "a.py::diff": "unverified",  # fails differently on the unported tree
            "a.py::te": "proxy-artifact",  # same failure on both, but with the local spec in place of TE's
            "a.py::gone": "unverified",  # never ran on the unported tree
            "f.py": "missing-dependency",  # a missing ordinary package is never upstream-known
            "a.py::dep": "missing-dependency",
            "a.py::hang1": "flaky",  # hung in the suite, passed alone
            "a.py::hang2": "flaky",  # hangs on both trees
            "a.py::hang3": "port-regression",  # hangs alone too, passes on the unported tree
            "a.py::rope": "needs-nvidia-only",  # same failure on both, naming a firewalled package (TE, as megatron spells it)
            "a.py::nvrx": "needs-nvidia-only",
            "g.py": "needs-nvidia-only",
            "a.py::cuda": "upstream-known",  # torch.cuda and "Apex" in a message are not the firewalled cuda/apex modules
            "a.py::eagain": "proxy-artifact",
        }
    )  # both trees ran out of threads creating a gloo group: the machine, not upstream
    assert why["a.py::eagain"].startswith(
        "fails the same way on the unported tree: this machine ran out of a resource (Resource temporarily unavailable)"
    )
    assert why["a.py::diff"].startswith("fails differently on the unported tree (AssertionError there, TypeError here)")
    assert why["f.py"] == "the ordinary package yaml is not installed"
    assert (
        why["a.py::rope"]
        == "fails the same way on the unported tree: it needs transformer_engine, which the firewall removes here"
    )
    assert why["a.py::nvrx"].endswith("it needs nvidia_resiliency_ext, which the firewall removes here")
    # v0.19's one unverified test read "hung; alone: failed; unported tree: failed": the same, in words.
    port["alone"]["a.py::hang3"] = "failed"
    labels, why = label(SuiteRun.from_dict(port), SuiteRun.from_dict(base), {})
    assert labels["a.py::hang3"] == "unverified"
    assert (
        why["a.py::hang3"]
        == "it hung in the suite and failed when rerun alone; the unported tree passed it without hanging"
    )
    base["outcomes"]["a.py::hang3"] = "failed"
    assert label(SuiteRun.from_dict(port), SuiteRun.from_dict(base), {})[1]["a.py::hang3"] == (
        "it hung in the suite and failed when rerun alone; the unported tree failed it without hanging"
    )
    # A kernel TE's Python reached that the proxy's CPU layer lacks (verify --te): the proxy's gap,
    # named, never "needs-nvidia-only" (v0.16 with TE 2.12.0 said the firewall removed transformer_engine_torch).
    port["outcomes"]["a.py::tek"], base["outcomes"]["a.py::tek"] = "failed", "failed"
    port["details"]["a.py::tek"] = (
        "rocmport.verify.runtime.te_cpu.UnsupportedInProxy: unsupported-in-proxy: "
        "transformer_engine_torch.fused_qkv_rope_forward has no CPU reference implementation at x.py:1"
    )
    labels, why = label(SuiteRun.from_dict(port), SuiteRun.from_dict(base), {}, blocked=("transformer_engine_torch",))
    assert (
        labels["a.py::tek"] == "proxy-artifact"
        and "transformer_engine_torch.fused_qkv_rope_forward" in why["a.py::tek"]
    )
    # On a machine other jobs kept busy, a hang verdict says so beside it; other failures do not.
    port["machine"] = {"cpus": 2, "seconds": 300.0, "others_cores": 1.6, "run_cores": 0.4, "overloaded": True}
    why = label(SuiteRun.from_dict(port), SuiteRun.from_dict(base), {})[1]
    assert why["a.py::hang3"].endswith(
        "(on an overloaded machine: other processes kept 1.6 of its 2 cores busy on average for 300 s)"
    )
    assert "overloaded" not in why["a.py::x"]


def test_a_failure_is_compared_with_the_unported_trees_rerun_when_it_hung_there():
    """v0.19 x TE 2.17.1: the unported tree hung on one case in the suite and failed it alone with the
    RuntimeError its 15 sibling cases raise on both trees; the port failed it with that RuntimeError.
    The comparison reads the rerun's failure, not the suite's hang (it was "unverified": hang there,
    RuntimeError here). A rerun that failed another way still does not match."""
    node = "t.py::test_cp[True-2]"
    port = {"outcomes": {node: "failed"}, "kinds": {node: "RuntimeError"}}
    base = {
        "outcomes": {node: "failed"},
        "kinds": {node: "hang"},
        "hung": [node],
        "alone": {node: "failed"},
        "alone_kinds": {node: "RuntimeError"},
    }
    labels, why = label(SuiteRun.from_dict(port), SuiteRun.from_dict(base), {})
    assert labels == {node: "upstream-known"}
    assert why[node] == "fails the same way on the unported tree (there when rerun alone: it hung in the suite)"
    base["alone_kinds"][node] = "AssertionError"
    labels, why = label(SuiteRun.from_dict(port), SuiteRun.from_dict(base), {})
    assert labels == {node: "unverified"}
    assert why[node].startswith("fails differently on the unported tree (AssertionError there, RuntimeError here)")
    del base["alone_kinds"]  # a record from before reruns kept their failure: as it was
    labels, why = label(SuiteRun.from_dict(port), SuiteRun.from_dict(base), {})
    assert labels == {node: "unverified"} and "(hang there, RuntimeError here)" in why[node]


def test_a_module_that_no_longer_imports_on_the_port_is_a_port_regression():
    """Its module imported on the unported tree and its tests ran there: the port broke the import
    (a rewritten module-level site), not an unverifiable failure. Without any outcome there it stays unverified."""
    port = {"outcomes": {"t/test_m.py": "error", "t/test_n.py": "error"}, "kinds": {"t/test_m.py": "NameError"}}
    base = {"outcomes": {"t/test_m.py::test_a": "passed", "t/test_m.py::test_b": "failed"}}
    labels, why = label(SuiteRun.from_dict(port), SuiteRun.from_dict(base), {})
    assert labels == {"t/test_m.py": "port-regression", "t/test_n.py": "unverified"}
    assert (
        why["t/test_m.py"] == "its module does not import here; on the unported tree it imported and 2 of its tests ran"
    )


def test_missing_test_file_and_no_tests_dir(tmp_path, child_env):
    tree, base = upstream_repo(tmp_path / "up")
    res = stage_unit_tests(
        tree, child_env(tree), ["tests/unit_tests/test_nope.py"], 2, {}, tmp_path / "cache", base, blocked=BLOCKED
    )
    assert res.status == "fail" and "tests/unit_tests/test_nope.py" in res.reason and "--unit-test" in res.reason
    (tmp_path / "bare" / "megatron" / "core").mkdir(parents=True)
    res = stage_unit_tests(tmp_path / "bare", {}, FILES, 2, {}, tmp_path / "cache", None)
    assert res.status == "skipped" and "megatron/core only" in res.reason


def test_series_verify_settings_and_known_failures_by_mode(tmp_path):
    series = tmp_path / "series"
    series.write_text(
        "upstream: megatron-lm\nline: v0.16\nversions: '>=0.16.0rc0,<0.17.0rc0'\npatches: []\ncodemods: []\n"
        "verify:\n  unit_tests: [tests/unit_tests/models/test_gpt_model.py]\n"
        "  known_failures: {tests/unit_tests/test_fp8.py: needs FP8 on MI300}\n"
        "  rocm_known_failures: {tests/unit_tests/test_utils.py::test_straggler_detector: skipped by AMD's fork}\n"
        "  hip_known_failures: {tests/unit_tests/test_async_save.py::test_errors: the writer is spawned on HIP}\n"
        "  proxy_known_failures: {tests/unit_tests/dist_checkpointing/: the CPU proxy has no pinned memory}\n"
    )
    cfg = suite.parse_settings(load_series(series).verify, str(series))
    assert cfg.unit_tests == {"tests/unit_tests/models/test_gpt_model.py": ""}  # a plain list: no reasons
    everywhere = {"tests/unit_tests/test_fp8.py": "needs FP8 on MI300"}
    rocm = {**everywhere, "tests/unit_tests/test_utils.py::test_straggler_detector": "skipped by AMD's fork"}
    proxy = {**everywhere, "tests/unit_tests/dist_checkpointing/": "the CPU proxy has no pinned memory"}
    hip = {"tests/unit_tests/test_async_save.py::test_errors": "the writer is spawned on HIP"}
    not_hip = {
        "hip_known_failures": "applied only where the port's HIP branches run (a ROCm GPU or the HIP simulation)"
    }
    assert cfg.known_for("gpu", hip=True) == (
        {**rocm, **hip},
        {"proxy_known_failures": "applied only in CPU-proxy mode"},
    )
    not_rocm = {"rocm_known_failures": "applied only on ROCm (a ROCm GPU or the HIP simulation)"}
    assert cfg.known_for("gpu", hip=False) == (
        everywhere,
        {**not_hip, **not_rocm, "proxy_known_failures": "applied only in CPU-proxy mode"},
    )  # a CUDA GPU: no list
    assert cfg.known_for("cpu-proxy", hip=False) == (proxy, {**not_hip, **not_rocm})
    # The HIP simulation stands in for a ROCm GPU: hip_known_failures and AMD's marks (rocm_known_failures).
    rocm_only = {k: v for k, v in rocm.items() if k not in everywhere}
    assert cfg.known_for("cpu-proxy", hip=False, hip_sim=True) == ({**proxy, **hip, **rocm_only}, {})
    # Applied: a ROCm-listed failure is a known-failure on ROCm (GPU or simulated) and a port-regression on the CUDA path.
    port = {"outcomes": {"tests/unit_tests/test_utils.py::test_straggler_detector": "failed"}}
    base = {"outcomes": {"tests/unit_tests/test_utils.py::test_straggler_detector": "passed"}}
    assert label(SuiteRun.from_dict(port), SuiteRun.from_dict(base), cfg.known_for("gpu", hip=True)[0])[0] == {
        "tests/unit_tests/test_utils.py::test_straggler_detector": "known-failure"
    }
    assert label(SuiteRun.from_dict(port), SuiteRun.from_dict(base), cfg.known_for("cpu-proxy", hip=False)[0])[0] == {
        "tests/unit_tests/test_utils.py::test_straggler_detector": "port-regression"
    }
    series.write_text(series.read_text().replace("known_failures:", "known_fails:", 1))
    with pytest.raises(BadInput, match="key 'verify'"):
        load_series(series)
    series.write_text(
        series.read_text()
        .replace("known_fails:", "known_failures:")
        .replace("{tests/unit_tests/test_fp8.py: needs FP8 on MI300}", "[x]")
    )
    with pytest.raises(BadInput, match="key 'verify.known_failures' must map test ids"):
        load_series(series)


HANGS = textwrap.dedent("""\
    import time
    import torch
    import torch.distributed as dist

    # At collection, outside the watchdog: under load one rank may import torch seconds after the other.
    if not dist.is_initialized():
        dist.init_process_group("gloo")

    def test_first():
        assert dist.is_initialized()
        if dist.get_rank() == 1:
            # Rank 1 lags, as under load: rank 0's watchdog in the barrier starts before rank 1's
            # in the recv. The hang is still the recv's (first in the run order), not the barrier's.
            time.sleep(1)

    def test_collective_only_rank_one_enters():
        if dist.get_rank() == 1:
            dist.recv(torch.zeros(1), src=0)  # rank 0 never sends: gloo would wait 30 minutes

    def test_after_the_hang():
        dist.barrier()

    def test_sleeps_forever():
        if dist.get_rank() == 0:
            time.sleep(3600)
    """)


@pytest.mark.torch
@pytest.mark.slow
def test_hung_test_fails_run_restarts_and_a_stopped_run_keeps_results(tmp_path, child_env):
    tree, _ = upstream_repo(tmp_path / "up")
    (tree / "tests" / "unit_tests" / "test_hangs.py").write_text(HANGS)
    env = {**child_env(tree), "ROCMPORT_UNIT_TEST_TIMEOUT": "6"}
    res = run_tests(tree, ["tests/unit_tests/test_hangs.py"], env, nproc=2, timeout=300)  # a bound, not a target
    ids = {k.split("::")[1]: v for k, v in res.outcomes.items()}
    # The barrier hangs -> failed, the run restarts without it, the next test passes; the sleeper
    # hangs too -> failed.
    assert ids == {
        "test_first": "passed",
        "test_collective_only_rank_one_enters": "failed",
        "test_after_the_hang": "passed",
        "test_sleeps_forever": "failed",
    }, res
    assert res.restarts >= 1 and not res.timed_out  # no restart after the last test's hang: nothing is left to run
    assert res.files["tests/unit_tests/test_hangs.py"].status == "ran"
    assert [h.split("::")[1] for h in res.hung] == ["test_collective_only_rank_one_enters", "test_sleeps_forever"]
    assert (
        "hung: no result after 6 s on rank 1"
        in res.details["tests/unit_tests/test_hangs.py::test_collective_only_rank_one_enters"]
    )
    # A run stopped from outside keeps what ran and fails the test that was running.
    env["ROCMPORT_UNIT_TEST_TIMEOUT"] = "0"
    res = run_tests(
        tree,
        ["tests/unit_tests/test_hangs.py::test_first", "tests/unit_tests/test_hangs.py::test_sleeps_forever"],
        env,
        nproc=2,
        timeout=40,
    )
    assert res.timed_out and res.outcomes["tests/unit_tests/test_hangs.py::test_first"] == "passed"
    assert (
        "still running when the stage stopped it" in res.details["tests/unit_tests/test_hangs.py::test_sleeps_forever"]
    )


@pytest.mark.torch
@pytest.mark.slow
def test_a_rank_that_finishes_first_with_a_failure_does_not_cut_its_peers_short(tmp_path, child_env):
    """torchrun stops every rank once one exits non-zero: rank 0 fails fast and ends, rank 1 is
    still in a test that fails only there; that failure must still be recorded."""
    tree = tmp_path / "up"
    (tree / "tests" / "unit_tests").mkdir(parents=True)
    (tree / "tests" / "unit_tests" / "test_slow.py").write_text(
        textwrap.dedent("""\
        import os, time

        def test_fails_everywhere():
            assert False

        def test_slow_failure_on_rank_one():
            if os.environ["RANK"] == "1":
                time.sleep(4)
                assert False, "rank one's own failure"
        """)
    )
    res = run_tests(tree, ["tests/unit_tests/test_slow.py"], child_env(tree), nproc=2)
    assert res.ranks == 2 and res.peak["threads"] > 0 and res.peak["rss_mb"] > 0
    assert res.outcomes == {
        "tests/unit_tests/test_slow.py::test_fails_everywhere": "failed",
        "tests/unit_tests/test_slow.py::test_slow_failure_on_rank_one": "failed",
    }
    assert "rank one's own failure" in res.details["tests/unit_tests/test_slow.py::test_slow_failure_on_rank_one"]


def test_missing_ordinary_dependency_fails_the_stage_before_it_runs(tmp_path, child_env):
    tree, base = upstream_repo(tmp_path / "up")
    (tree / "tests" / "unit_tests" / "test_plugins.py").write_text(
        "import pytest\nimport rocmport_absent_pkg.sub\ntry:\n    import rocmport_optional_pkg\nexcept ImportError:\n    pass\n\n\n"
        "def test_uses_mocker(mocker):\n    pass\n"
    )
    (tree / "tests" / "unit_tests" / "conftest.py").write_text("import rocmport_absent_conftest_dep\n")
    res = stage_unit_tests(
        tree, child_env(tree), ["tests/unit_tests/test_plugins.py"], 2, {}, tmp_path / "cache", base, blocked=BLOCKED
    )
    assert res.status == "fail" and res.details.missing_dependencies == {
        "rocmport_absent_pkg": "rocmport-absent-pkg",
        "rocmport_absent_conftest_dep": "rocmport-absent-conftest-dep",
        **({} if importlib.util.find_spec("pytest_mock") else {"pytest_mock": "pytest-mock"}),
    }
    assert "-m pip install " in res.reason and res.reason.endswith("rocmport-absent-conftest-dep rocmport-absent-pkg`")
    # NVIDIA-only packages are absent on purpose (the firewall): no pip command for them.
    (tree / "tests" / "unit_tests" / "conftest.py").unlink()
    assert suite.missing_dependencies(tree, ["tests/unit_tests/test_needs_te.py"], BLOCKED) == {}


def test_a_package_of_upstream_s_test_environment_the_library_uses_is_a_dependency(tmp_path, monkeypatch):
    """Like nvtx: megatron.core.utils imports it when present, upstream's test environment has it."""
    tree, _ = upstream_repo(tmp_path / "up")
    monkeypatch.setattr(suite, "TEST_ENVIRONMENT", {"rocmport_absent_env_pkg": "megatron/core/mathops.py"})
    files = ["tests/unit_tests/test_ops.py"]
    assert suite.missing_dependencies(tree, files, BLOCKED) == {}
    (tree / "megatron" / "core" / "mathops.py").write_text(
        "try:\n    import rocmport_absent_env_pkg\nexcept ImportError:\n    pass\n"
    )
    assert suite.missing_dependencies(tree, files, BLOCKED) == {"rocmport_absent_env_pkg": "rocmport-absent-env-pkg"}
    monkeypatch.setattr(suite, "TEST_ENVIRONMENT", {"yaml": "megatron/core/mathops.py"})  # installed: nothing to do
    (tree / "megatron" / "core" / "mathops.py").write_text("import yaml\n")
    assert suite.missing_dependencies(tree, files, BLOCKED) == {}


FLAKY = textwrap.dedent("""\
    import os
    import torch
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("gloo")

    def test_hangs_only_the_first_time():
        marker = os.environ["FLAKY_MARKER"]
        first = not os.path.exists(marker)
        dist.barrier()
        if dist.get_rank() == 0 and first:
            open(marker, "w").close()
        if first and dist.get_rank() == 1:
            dist.recv(torch.zeros(1), src=0)  # rank 0 never sends

    import pytest

    @pytest.mark.parametrize("n", range(10))
    def test_groups_per_test_are_released(n):
        groups = [dist.new_group([0, 1]) for _ in range(3)]  # leaked: nothing destroys them
        dist.all_reduce(torch.ones(1), group=groups[-1])
    """)


@pytest.mark.torch
@pytest.mark.slow
def test_hang_rerun_alone_is_flaky_and_leaked_groups_are_released(tmp_path, child_env):
    tree, base = upstream_repo(tmp_path / "up")
    (tree / "tests" / "unit_tests" / "test_flaky.py").write_text(FLAKY)
    g(tree, "add", "-A")
    g(tree, "-c", "user.name=t", "-c", "user.email=t@e", "commit", "-qm", "a flaky test")
    env = {**child_env(tree), "ROCMPORT_UNIT_TEST_TIMEOUT": "8", "FLAKY_MARKER": str(tmp_path / "marker")}
    res = stage_unit_tests(
        tree, env, ["tests/unit_tests/test_flaky.py"], 2, {}, tmp_path / "cache", base, blocked=BLOCKED
    )
    d = res.details
    hang = "tests/unit_tests/test_flaky.py::test_hangs_only_the_first_time"
    assert d.labels == {hang: "flaky"} and d.rerun_alone == {hang: "passed"}, d
    assert res.status == "pass" and "1 flaky" in res.reason
    # gloo gives every group three threads; ten tests' 30 groups would leave ~90 behind without the release.
    assert d.peak["released_groups"] >= 2 * 30 and d.peak["threads"] < 40, d.peak


# megatron's parallel_state in small: initialize forgets the groups of an earlier one (upstream's
# Utils.initialize_model_parallel calls destroy_model_parallel first), destroy only forgets its own.
PARALLEL_STATE = textwrap.dedent("""\
    import torch.distributed as dist

    _GROUPS = None


    def initialize_model_parallel():
        global _GROUPS
        _GROUPS = [dist.new_group([0, 1]) for _ in range(3)]


    def destroy_model_parallel():
        global _GROUPS
        _GROUPS = None


    def model_parallel_is_initialized():
        return _GROUPS is not None
    """)

FAILS_WITH_MODEL_PARALLEL_UP = textwrap.dedent("""\
    import pytest
    import torch
    import torch.distributed as dist

    from megatron.core import parallel_state as ps

    if not dist.is_initialized():
        dist.init_process_group("gloo")


    @pytest.mark.parametrize("n", range(10))
    def test_fails_before_its_destroy(n):
        ps.destroy_model_parallel()
        ps.initialize_model_parallel()
        held = ps._GROUPS  # the failure's traceback holds them too
        dist.all_reduce(torch.ones(1), group=held[-1])
        assert False, "fails before destroy_model_parallel, as test_attention.py's correctness tests do on the proxy"
        ps.destroy_model_parallel()


    def test_passes():
        ps.initialize_model_parallel()
        ps.destroy_model_parallel()
    """)


@pytest.mark.torch
@pytest.mark.slow
def test_groups_of_tests_that_fail_with_model_parallelism_up_are_released(tmp_path, child_env):
    """Failed tests leave model parallelism up and the next test only forgets their groups: they
    are released all the same (each gloo group holds worker threads; before, a file of such
    failures grew each rank's threads until the machine's limit)."""
    tree, _ = upstream_repo(tmp_path / "up")
    (tree / "megatron" / "core" / "parallel_state.py").write_text(PARALLEL_STATE)
    (tree / "tests" / "unit_tests" / "test_mp_up.py").write_text(FAILS_WITH_MODEL_PARALLEL_UP)
    res = run_tests(tree, ["tests/unit_tests/test_mp_up.py"], child_env(tree), nproc=2)
    failed = [k for k, v in res.outcomes.items() if v == "failed"]
    assert len(failed) == 10 and res.outcomes["tests/unit_tests/test_mp_up.py::test_passes"] == "passed"
    # 33 groups per rank, 3 threads each here (no proxy shim): before, 3 per rank released, 100 threads kept.
    assert res.peak["released_groups"] >= 2 * 30 and res.peak["threads"] < 40, res.peak


# Groups an earlier test left alive, still held through tests that make no group of their own.
HELD_ACROSS_TESTS_WITHOUT_GROUPS = textwrap.dedent("""\
    import torch
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    if not dist.is_initialized():
        dist.init_process_group("gloo")

    HELD = []


    def test_makes_groups_the_module_holds():
        HELD.extend(dist.new_group([0, 1]) for _ in range(3))
        dist.all_reduce(torch.ones(1), group=HELD[-1])


    def test_makes_no_group():
        pass


    def test_lets_go_of_them_and_makes_no_group():
        HELD.clear()


    def test_then_they_are_gone():
        assert len(c10d._world.pg_map) == 1, f"{len(c10d._world.pg_map) - 1} groups besides the default one"
    """)


@pytest.mark.torch
@pytest.mark.slow
def test_groups_held_through_tests_that_make_none_are_released_once_let_go(tmp_path, child_env):
    """A group an earlier test left alive stays the tests' to release, however many tests that make no
    group run before its holder lets go: it is released after the test that let go."""
    tree, _ = upstream_repo(tmp_path / "up")
    (tree / "tests" / "unit_tests" / "test_held.py").write_text(HELD_ACROSS_TESTS_WITHOUT_GROUPS)
    res = run_tests(tree, ["tests/unit_tests/test_held.py"], child_env(tree), nproc=2)
    assert set(res.outcomes.values()) == {"passed"}, res.details
    assert res.peak["released_groups"] == 2 * 3, res.peak


# pytest keeps every test's class instance on its item for the whole session: a test class that keeps
# its model on `self` (upstream's test_attention.py: `self.parallel_attention`) kept every test's model,
# and through it its process groups.
MODEL_ON_SELF = textwrap.dedent("""\
    import pytest
    import torch
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    if not dist.is_initialized():
        dist.init_process_group("gloo")


    class Model:
        def __init__(self):
            self.group = dist.new_group([0, 1])
            self.me = self  # a reference cycle, as a torch module's


    class TestFailsInItsTeardown:
        def test_passes(self):
            self.model = Model()

        def teardown_method(self):
            raise RuntimeError("its own teardown's failure")


    @pytest.mark.parametrize("n", range(5))
    class TestKeepsItsModelOnSelf:
        def setup_method(self):
            self.model = Model()

        def test_uses_it(self, n):
            dist.all_reduce(torch.ones(1), group=self.model.group)


    def test_their_groups_are_gone():
        assert len(c10d._world.pg_map) == 1, f"{len(c10d._world.pg_map) - 1} groups besides the default one"
    """)


@pytest.mark.torch
@pytest.mark.slow
def test_groups_of_a_model_a_test_class_keeps_on_self_are_released(tmp_path, child_env):
    """pytest keeps each test's class instance on its item; the plugin lets go of it after the test's
    teardown, and a failure in that teardown is still reported with its own message."""
    tree, _ = upstream_repo(tmp_path / "up")
    (tree / "tests" / "unit_tests" / "test_on_self.py").write_text(MODEL_ON_SELF)
    res = run_tests(tree, ["tests/unit_tests/test_on_self.py"], child_env(tree), nproc=2)
    teardown = "tests/unit_tests/test_on_self.py::TestFailsInItsTeardown::test_passes"
    assert res.outcomes.pop(teardown) == "error" and "its own teardown's failure" in res.details[teardown]
    assert set(res.outcomes.values()) == {"passed"} and len(res.outcomes) == 6, (res.outcomes, res.details)
    assert res.peak["released_groups"] == 2 * 6, res.peak


# TE's Python layer caches the size of, and this rank in, every group it is asked about: for the session.
ASKS_TE_ABOUT_ITS_GROUPS = textwrap.dedent("""\
    import pytest
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d
    from transformer_engine.pytorch.distributed import get_distributed_rank, get_distributed_world_size

    if not dist.is_initialized():
        dist.init_process_group("gloo")


    @pytest.mark.parametrize("n", range(4))
    def test_asks_te_about_a_group(n):
        group = dist.new_group([0, 1])
        assert get_distributed_world_size(group) == 2 and get_distributed_rank(group) == dist.get_rank()


    def test_their_groups_are_gone():
        assert len(c10d._world.pg_map) == 1, f"{len(c10d._world.pg_map) - 1} groups besides the default one"
    """)


@pytest.mark.network
@pytest.mark.torch
@pytest.mark.slow
def test_groups_te_s_caches_hold_are_released(tmp_path, real_index):
    """TE's `get_distributed_world_size`/`get_distributed_rank` (lru caches keyed by the group) kept
    every test's tp group, 2 gloo threads each, on the proxy: upstream's test_attention.py grew its
    ranks' threads by 2 a test."""
    layer = te_probe.real_layer("2.17.1")
    tree, _ = upstream_repo(tmp_path / "up")
    (tree / "tests" / "unit_tests" / "test_te_groups.py").write_text(ASKS_TE_ABOUT_ITS_GROUPS)
    extra = {**protocol.FIREWALL.entry(tuple(te_layer.unblocked(BLOCKED))), **te_layer.child_env(layer)}
    env = environment.child_env(tree, firewall.write_bootstrap(tmp_path / "boot"), extra)
    res = run_tests(tree, ["tests/unit_tests/test_te_groups.py"], env, nproc=2)
    assert set(res.outcomes.values()) == {"passed"} and len(res.outcomes) == 5, (res.outcomes, res.details)
    assert res.peak["released_groups"] == 2 * 4, res.peak


@pytest.mark.torch
@pytest.mark.slow
def test_injected_port_bug_is_a_port_regression_and_exit_1(tmp_path, capsys):
    """The proof the issue asks for, on an upstream-shaped tree: a bug injected into a module the
    selected tests use fails stage 3 as port-regression, exit 1; JSON and JUnit carry each test."""
    import json
    import xml.etree.ElementTree as ET

    from rocmport.cli import main
    from rocmport.port import worktree as wt

    tree, base = upstream_repo(tmp_path / "up")
    g(tree, "checkout", "-q", base, "--", "megatron")  # the port as it should be: no bug
    wt.write_state(tree, wt.ApplyState(status="done", base=base))
    args = [
        "-C",
        str(tmp_path),
        "verify",
        "--tree",
        str(tree),
        "--stages",
        "unit-tests",
        "--unit-nproc",
        "2",
        "--unit-test",
        "tests/unit_tests/test_ops.py",
        "--json",
        "--junit",
        str(tmp_path / "j.xml"),
    ]
    assert main(args) == 0
    first = json.loads(capsys.readouterr().out)["stages"][2]
    assert first["labels"] == {
        "tests/unit_tests/test_ops.py::test_upstream_broken": "upstream-known"
    }  # upstream's own bug only
    (tree / "megatron" / "core" / "mathops.py").write_text(
        (tree / "megatron" / "core" / "mathops.py").read_text().replace("a + b\n\n\ndef mul", "a + b + 1\n\n\ndef mul")
    )
    assert main(args) == 1
    stage = json.loads(capsys.readouterr().out)["stages"][2]
    assert stage["status"] == "fail" and stage["labels"]["tests/unit_tests/test_ops.py::test_add"] == "port-regression"
    suites = {s.get("name"): s for s in ET.parse(tmp_path / "j.xml").getroot()}
    case = suites["upstream.unit_tests"].find("testcase[@name='test_add']")
    assert case.find("failure").get("type") == "port-regression"
    assert suites["upstream.unit_tests"].find("testcase[@name='test_skipped']/skipped") is not None
    assert main(["verify", "--tree", str(tree), "--stages", "3", "--unit-test", "tests/unit_tests/test_nope.py"]) == 2
    assert "--unit-test tests/unit_tests/test_nope.py: no such file or directory in" in capsys.readouterr().err


def _records(rank1_end: float | None) -> list[dict]:
    """Two ranks' records as the plugin writes them when rank 1 lags into a recv that never returns:
    rank 0 passed it, waited in the next test's barrier, and its watchdog fired first (at 16.0)."""
    first, coll, after = (
        f"tests/unit_tests/test_hangs.py::{n}" for n in ("test_first", "test_collective", "test_after")
    )
    rank0 = {
        "rank": 0,
        "outcomes": {first: "passed", coll: "passed", after: "failed"},
        "hung": [[after, 2, 16.0]],
        "spans": {first: [0, 0.0, 1.0], coll: [1, 1.0, 1.1], after: [2, 1.1, None]},
    }
    rank1 = {
        "rank": 1,
        "outcomes": {first: "passed"},
        "hung": [],
        "spans": {first: [0, 0.0, 2.0], coll: [1, 2.0, rank1_end]},
    }
    if rank1_end is not None:  # rank 0's exit broke rank 1's recv: an error, then the barrier failed at once too
        rank1["outcomes"].update({coll: "failed", after: "failed"})
        rank1["spans"][after] = [2, rank1_end, rank1_end + 0.1]
    return [rank0, rank1]


@pytest.mark.parametrize(
    "rank1_end", [None, 16.1], ids=["rank 1 stopped by torchrun", "rank 1's recv broken by rank 0's exit"]
)
def test_hang_is_the_stuck_rank_s_test_not_the_one_its_peer_waited_in(rank1_end):
    ranks = _records(rank1_end)
    hang = _first_hang(ranks, stopped=False, seconds="6")
    assert hang.nodeid.endswith("::test_collective") and hang.cut == 16.0
    assert hang.detail.startswith("hung: no result after 6 s on rank 1 (it was still in this test")
    coll, after = "tests/unit_tests/test_hangs.py::test_collective", "tests/unit_tests/test_hangs.py::test_after"
    # Rank 0's pass of the stuck test stands; its wait in the barrier, and all rank 1 did after the
    # cut, are collateral and run again.
    assert not hang.collateral(ranks[0], coll, complete=rank1_end is not None)
    assert hang.collateral(ranks[0], after, complete=True)
    assert not hang.collateral(ranks[0], "tests/unit_tests/test_hangs.py::test_first", complete=True)
    if rank1_end is not None:
        assert hang.collateral(ranks[1], coll, complete=True) and hang.collateral(ranks[1], after, complete=True)
    # The stuck rank's own watchdog, when it fires, names the same test.
    ranks[1]["hung"] = [[coll, 1, 8.0]]
    assert _first_hang(ranks, stopped=False, seconds="6").nodeid == coll
    assert _first_hang([{"outcomes": {}, "hung": []}], stopped=False, seconds="6") is None


DRAWS_BY_RANK = textwrap.dedent("""\
    import os
    import random

    import numpy
    import torch
    import torch.distributed as dist

    def test_draws_as_many_as_its_rank():
        n = int(os.environ["RANK"]) + 1  # the ranks' histories differ from here on
        torch.rand(n), random.random() if n > 1 else None, numpy.random.rand(n)

    def test_starts_from_the_same_state_on_every_rank():
        if not dist.is_initialized():
            dist.init_process_group("gloo")
        mine = torch.tensor([torch.rand(1).item(), random.random(), numpy.random.rand()], dtype=torch.float64)
        every = [torch.zeros(3, dtype=torch.float64) for _ in range(dist.get_world_size())]
        dist.all_gather(every, mine)
        assert all(torch.equal(e, every[0]) for e in every), every
    """)


@pytest.mark.torch
@pytest.mark.slow
def test_each_test_starts_from_the_same_random_state_whatever_the_rank_drew_before(tmp_path, child_env):
    """An upstream test that draws without seeding (torch's CPU generator under use_cpu_initialization)
    sees what earlier tests drew: here rank 1 drew more than rank 0, and the next test still draws the
    same numbers on both (the plugin seeds each test from its id), so no rank fails it by chance."""
    tree, _ = upstream_repo(tmp_path / "up")
    (tree / "tests" / "unit_tests" / "test_draws.py").write_text(DRAWS_BY_RANK)
    res = run_tests(tree, ["tests/unit_tests/test_draws.py"], child_env(tree), nproc=2)
    assert res.outcomes == {
        "tests/unit_tests/test_draws.py::test_draws_as_many_as_its_rank": "passed",
        "tests/unit_tests/test_draws.py::test_starts_from_the_same_state_on_every_rank": "passed",
    }, res.details


LEAVES_A_CHILD = textwrap.dedent("""\
    import os
    import subprocess
    import sys

    def test_starts_a_child_that_outlives_it():
        # Like a spawned checkpoint writer whose rank is gone: its own session, re-parented to init.
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
        with open(os.path.join(os.environ["ROCMPORT_UNIT_OUT"], f"child{os.environ['RANK']}"), "w") as fh:
            fh.write(str(child.pid))
    """)


@pytest.mark.torch
@pytest.mark.slow
def test_a_run_leaves_no_process_behind(tmp_path, child_env, monkeypatch):
    import tempfile

    tree, _ = upstream_repo(tmp_path / "up")
    (tree / "tests" / "unit_tests" / "test_child.py").write_text(LEAVES_A_CHILD)
    pids: list[int] = []
    real = tempfile.TemporaryDirectory

    class KeepChildPids(real):  # reads the children's pids before the run's directory goes
        def cleanup(self):
            pids.extend(int(p.read_text()) for p in Path(self.name).glob("child*"))
            super().cleanup()

    monkeypatch.setattr(tempfile, "TemporaryDirectory", KeepChildPids)
    res = run_tests(tree, ["tests/unit_tests/test_child.py"], child_env(tree), nproc=2)
    assert res.outcomes == {"tests/unit_tests/test_child.py::test_starts_a_child_that_outlives_it": "passed"}
    assert len(pids) == 2
    import time

    def dead(pid: int) -> bool:  # no /proc entry, or a zombie on the way out
        try:
            return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z")
        except (OSError, IndexError):
            return True

    # SIGKILL is delivered when the child is next scheduled: on a loaded machine that is not at once.
    deadline = time.monotonic() + 10
    while not all(map(dead, pids)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert all(map(dead, pids)), pids


PROXY_RANK_TESTS = textwrap.dedent("""\
    import multiprocessing as mp
    import os

    import torch
    from megatron.core import ckpt_worker

    def test_one_device_per_rank_of_the_node():  # as upstream's test_utils asserts
        assert torch.cuda.device_count() == int(os.environ["WORLD_SIZE"])

    def test_nvtx_ranges():  # torch's CPU build has no NVTX (its stub raises); CUDA and ROCm builds do
        torch.cuda.nvtx.range_push("outer")
        with torch.cuda.nvtx.range("inner"):
            torch.cuda.nvtx.mark("here")
        torch.cuda.nvtx.range_pop()

    def test_side_stream_and_events():  # as upstream's param-norm and attention tests do
        side = torch.cuda.Stream()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        with torch.cuda.stream(side):
            x = torch.ones(4, device="cuda") * 2
        torch.cuda.current_stream().wait_stream(side)
        end.record()
        torch.cuda.synchronize()
        assert x.sum().item() == 8 and start.elapsed_time(end) >= 0

    def test_spawned_worker_sets_its_device():
        ctx = mp.get_context("spawn")
        queue = ctx.Queue()
        worker = ctx.Process(target=ckpt_worker.loop, args=(1, queue))
        worker.start()
        worker.join(120)
        assert worker.exitcode == 0, f"the spawned worker exited {worker.exitcode}"
        assert queue.get(timeout=5) == "cpu"
    """)

# Like upstream's PersistentAsyncCaller.async_loop: the first thing the spawned worker does.
CKPT_WORKER = textwrap.dedent("""\
    import torch

    def loop(rank, queue):
        torch.cuda.set_device(rank % torch.cuda.device_count())
        queue.put(str(torch.cuda.current_device()))
    """)


@pytest.mark.torch
@pytest.mark.slow
def test_proxy_shim_gives_a_device_per_rank_and_reaches_a_spawned_worker(tmp_path, child_env):
    """Under the CPU-proxy shim a rank sees one device per rank of the node (upstream's tests assert
    it), NVTX ranges (upstream's nvtx_range_push/pop), side streams and events in order on the CPU,
    and a child it starts with multiprocessing's spawn sees the shim too (without it,
    torch.cuda.device_count() is 0 on this machine and the worker dies in its first line)."""
    tree, _ = upstream_repo(tmp_path / "up")
    (tree / "megatron" / "core" / "ckpt_worker.py").write_text(CKPT_WORKER)
    (tree / "tests" / "unit_tests" / "test_spawn.py").write_text(PROXY_RANK_TESTS)
    res = run_tests(tree, ["tests/unit_tests/test_spawn.py"], {**child_env(tree), "ROCMPORT_PROXY": "1"}, nproc=2)
    assert res.outcomes == {
        "tests/unit_tests/test_spawn.py::test_one_device_per_rank_of_the_node": "passed",
        "tests/unit_tests/test_spawn.py::test_nvtx_ranges": "passed",
        "tests/unit_tests/test_spawn.py::test_side_stream_and_events": "passed",
        "tests/unit_tests/test_spawn.py::test_spawned_worker_sets_its_device": "passed",
    }, res.details


# v0.17+'s layer specs: TE's spec is built from its submodules function, which tests also call
# directly (test_attention.py); without TE its provider is None.
LAYER_SPECS = textwrap.dedent("""\
    TESpecProvider = None  # TE absent

    def get_gpt_layer_with_transformer_engine_submodules(num_experts=None, moe_grouped_gemm=False, qk_layernorm=False,
                                                         multi_latent_attention=False, fp8=None, qk_l2_norm=False,
                                                         use_te_op_fuser=False):
        return TESpecProvider()

    def get_gpt_layer_with_transformer_engine_spec(*args, **kwargs):
        return ("spec", get_gpt_layer_with_transformer_engine_submodules(*args, **kwargs))

    def get_gpt_layer_local_submodules(num_experts=None, moe_grouped_gemm=False, qk_layernorm=False,
                                       multi_latent_attention=False, fp8=None, normalization=None, qk_l2_norm=False):
        return ("local", num_experts, qk_layernorm, qk_l2_norm)

    def get_gpt_layer_local_spec(*args, **kwargs):
        return ("spec", get_gpt_layer_local_submodules(*args, **kwargs))
    """)

SPEC_TESTS = textwrap.dedent("""\
    import pytest
    from megatron.core.models.gpt.gpt_layer_specs import (
        get_gpt_layer_with_transformer_engine_spec,
        get_gpt_layer_with_transformer_engine_submodules,
    )

    def test_submodules_called_directly():
        assert get_gpt_layer_with_transformer_engine_submodules(4, False, True, qk_l2_norm=True) == ("local", 4, True, True)

    def test_spec():
        assert get_gpt_layer_with_transformer_engine_spec(use_te_op_fuser=True) == ("spec", ("local", None, False, False))

    @pytest.mark.flaky_in_dev
    def test_upstream_ci_skips_in_dev():
        raise AssertionError("upstream's CI does not run this")
    """)


@pytest.mark.torch
@pytest.mark.slow
def test_te_layer_spec_becomes_local_and_upstream_ci_s_deselection_is_listed(tmp_path, child_env):
    """Without TE, a test that asks for TE's layer submodules (v0.17+, imported by name, called with
    positional arguments) or spec gets the local ones; a test upstream's CI deselects in its dev
    environment (flaky_in_dev) runs on neither tree and is listed with the reason."""
    tree, base = upstream_repo(tmp_path / "up")
    specs = tree / "megatron" / "core" / "models" / "gpt"
    specs.mkdir(parents=True)
    for d in (tree / "megatron" / "core" / "models", specs):
        (d / "__init__.py").write_text("")
    (specs / "gpt_layer_specs.py").write_text(LAYER_SPECS)
    (tree / "tests" / "unit_tests" / "test_specs.py").write_text(SPEC_TESTS)
    g(tree, "add", "-A")
    g(tree, "-c", "user.name=t", "-c", "user.email=t@e", "commit", "-qm", "layer specs")
    env = {**child_env(tree), "ROCMPORT_PROXY": "1"}
    res = stage_unit_tests(
        tree,
        env,
        ["tests/unit_tests/test_specs.py"],
        2,
        {},
        tmp_path / "cache",
        g(tree, "rev-parse", "HEAD"),
        blocked=BLOCKED,
    ).to_dict()
    assert res["outcomes"] == {
        "tests/unit_tests/test_specs.py::test_submodules_called_directly": "passed",
        "tests/unit_tests/test_specs.py::test_spec": "passed",
    }, res["failures"]
    assert sorted(res["local_spec_instead_of_te"]) == [
        "tests/unit_tests/test_specs.py::test_spec",
        "tests/unit_tests/test_specs.py::test_submodules_called_directly",
    ]
    flaky = "tests/unit_tests/test_specs.py::test_upstream_ci_skips_in_dev"
    assert list(res["deselected"]) == [flaky] and "flaky_in_dev" in res["deselected"][flaky]
    assert res["baseline"]["ran"] == []  # nothing to label: the unported tree did not run
    assert "1 deselected as upstream's CI does (flaky_in_dev)" in res["reason"] and res["status"] == "pass"


def test_data_download_stub_answers_every_lines_conftest():
    """Upstream's conftest imports its data downloader by a name of its line's (v0.15
    get_oldest_release_and_assets, v0.16+ download_and_extract_asset): the plugin's stub has any
    name, and each raises ImportError, which upstream's ensure_test_data fixture catches."""
    import importlib

    importlib.import_module("rocmport.verify.runtime.pytest_plugin")
    stub = importlib.import_module("tests.test_utils.python_scripts.download_unit_tests_dataset")
    for name in ("get_oldest_release_and_assets", "download_and_extract_asset"):
        with pytest.raises(ImportError, match="data download is skipped"):
            getattr(stub, name)(assets_dir="/opt/data")
    assert not hasattr(stub, "__wrapped__")


def test_crash_line_names_pytests_own_error():
    from rocmport.verify.stages.unit_tests.runner import _crash_line

    log = (
        "[rank3]: W1125 noise\n"
        "ImportError while loading conftest '/t/tests/unit_tests/conftest.py'.\n"
        "tests/unit_tests/conftest.py:13: in <module>\n"
        "    from tests.test_utils.python_scripts.download_unit_tests_dataset import (\n"
        "E   ImportError: cannot import name 'get_oldest_release_and_assets' from 'tests.test_utils...'\n"
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n"
        "============================================================\n"
    )
    assert _crash_line(log) == (
        "ImportError while loading conftest '/t/tests/unit_tests/conftest.py'. E   ImportError: cannot "
        "import name 'get_oldest_release_and_assets' from 'tests.test_utils...'"
    )
    assert _crash_line("a\nlast line\n\n") == "last line"


def _account_tree(root: Path, files: dict[str, str]) -> Path:
    """A tree with tests/unit_tests holding ``files`` (name -> source), nothing else."""
    (root / "tests" / "unit_tests").mkdir(parents=True)
    for name, text in files.items():
        (root / "tests" / "unit_tests" / name).write_text(textwrap.dedent(text))
    return root


HANGS_THRICE = """\
    import time

    def test_hang_1():
        time.sleep(3600)

    def test_hang_2():
        time.sleep(3600)

    def test_hang_3():
        time.sleep(3600)
    """


@pytest.mark.torch
@pytest.mark.slow
def test_every_selected_file_is_accounted_for_and_one_hanging_file_cannot_starve_the_others(tmp_path, child_env):
    """v0.19: seven hangs in test_attention.py used up the restart budget of its group of files and
    five of the seven files never ran, while the stage said "in 7 files". The budget is per file:
    the file that keeps hanging stops (named, not run, with which budget ran out, failing the
    stage) and the files after it still run; a module that does not import is accounted for too."""
    from rocmport.verify.orchestration import report

    tree = _account_tree(
        tmp_path / "up",
        {
            "test_a.py": "def test_a():\n    pass\n",
            "test_hangs.py": HANGS_THRICE,
            "test_broken.py": "raise RuntimeError('broken at import')\n",
            "test_c.py": "def test_c():\n    pass\n",
        },
    )
    files = [f"tests/unit_tests/{n}" for n in ("test_a.py", "test_hangs.py", "test_broken.py", "test_c.py")]
    env = {**child_env(tree), "ROCMPORT_UNIT_TEST_TIMEOUT": "4"}
    lines: list[str] = []
    stage = stage_unit_tests(
        tree, env, files, 2, {}, tmp_path / "cache", None, blocked=BLOCKED, progress=lines.append, restarts=1
    )
    d = stage.to_dict()
    # The file after the one that hangs ran: the hanging file used its own budget, not theirs.
    assert d["outcomes"]["tests/unit_tests/test_c.py::test_c"] == "passed", d
    accounts = d["files"]
    assert list(accounts) == files
    assert accounts["tests/unit_tests/test_a.py"] == {
        "status": "ran",
        "counts": {"passed": 1},
        "hangs": 0,
        "reason": "",
        "not_run": [],
    }
    assert accounts["tests/unit_tests/test_c.py"]["status"] == "ran"
    assert accounts["tests/unit_tests/test_broken.py"]["status"] == "collection-error"
    assert "RuntimeError: broken at import" in accounts["tests/unit_tests/test_broken.py"]["reason"]
    hangs = accounts["tests/unit_tests/test_hangs.py"]
    assert (
        hangs["status"] == "not-run"
        and hangs["hangs"] == 2
        and hangs["not_run"] == ["tests/unit_tests/test_hangs.py::test_hang_3"]
    )
    assert (
        hangs["reason"]
        == "1 of its 3 tests did not run: its restart budget ran out: 2 hangs in this file, 1 restart per file"
    )
    assert any(
        ln.startswith("port not run: tests/unit_tests/test_hangs.py: 1 of its 3 tests did not run") for ln in lines
    ), lines
    # Progress, a line per update with the elapsed time: per file, per hang and restart, per rerun alone.
    assert any(
        re.fullmatch(r"port \[\d/4\] tests/unit_tests/test_a\.py: 1 passed \(rank 0\), \d+ s elapsed", ln)
        for ln in lines
    ), lines
    assert any(
        ln.startswith(
            "port hung: tests/unit_tests/test_hangs.py::test_hang_2; tests/unit_tests/test_hangs.py used its 1 restarts"
        )
        for ln in lines
    ), lines
    assert any(
        re.fullmatch(r"port rerun alone \[1/2\] tests/unit_tests/test_hangs\.py::test_hang_1: hung, \d+ s elapsed", ln)
        for ln in lines
    ), lines
    # The stage: failed, the file named in its reason and its per-test list (the JSON), and the JUnit.
    assert stage.status == "fail"
    assert (
        "in 3 of 4 files on 2 ranks" in stage.reason
        and "not run: tests/unit_tests/test_hangs.py (1 of its 3 tests" in stage.reason
    )
    assert "restart budget 1 per test file" in stage.reason
    assert d["labels"]["tests/unit_tests/test_hangs.py"] == "not-run" and d["restarts_per_file"] == 1
    junit = report.junit_xml("cpu-proxy", [stage])
    assert 'type="not-run"' in junit and 'file="tests/unit_tests/test_hangs.py"' in junit


@pytest.mark.torch
@pytest.mark.slow
def test_files_a_stopped_run_never_reached_are_not_run_with_the_time_limit(tmp_path, child_env):
    """A module whose import hangs (no test started, so no watchdog): the run stops at its time
    limit and every file of its group is named as not run, for that reason."""
    tree = _account_tree(
        tmp_path / "up",
        {
            "test_a.py": "def test_a():\n    pass\n",
            "test_sleeps_on_import.py": "import time\ntime.sleep(3600)\n\n\ndef test_x():\n    pass\n",
        },
    )
    files = ["tests/unit_tests/test_a.py", "tests/unit_tests/test_sleeps_on_import.py"]
    res = run_tests(tree, files, child_env(tree), nproc=2, timeout=20)
    assert res.timed_out and res.outcomes == {}
    for f in files:
        assert res.files[f].status == "not-run"
        assert "the run was stopped at its time limit (20 s for up to 16 test files)" in res.files[f].reason, res.files


@pytest.mark.torch
@pytest.mark.slow
def test_a_file_under_a_conftest_that_does_not_import_is_not_run_with_that_error(tmp_path, child_env):
    """A directory selected whole (like `--unit-tests all`) whose sub-directory's conftest.py fails:
    the files there have no outcome, and say why; the others run."""
    tree = _account_tree(tmp_path / "up", {"test_a.py": "def test_a():\n    pass\n"})
    (tree / "tests" / "unit_tests" / "sub").mkdir()
    (tree / "tests" / "unit_tests" / "sub" / "conftest.py").write_text("raise RuntimeError('conftest broken')\n")
    (tree / "tests" / "unit_tests" / "sub" / "test_s.py").write_text("def test_s():\n    pass\n")
    res = run_tests(tree, ["tests/unit_tests"], child_env(tree), nproc=2)
    assert res.files["tests/unit_tests/test_a.py"].status == "ran"
    sub = res.files["tests/unit_tests/sub/test_s.py"]
    assert sub.status == "not-run" and "a collection error in tests/unit_tests/sub" in sub.reason, res.files
    assert "conftest broken" in sub.reason


@pytest.mark.torch
@pytest.mark.slow
def test_a_conftest_that_stops_pytest_fails_the_stage_naming_every_file_not_run(tmp_path, child_env):
    tree = _account_tree(
        tmp_path / "up",
        {"test_a.py": "def test_a():\n    pass\n", "conftest.py": "raise RuntimeError('conftest broken')\n"},
    )
    res = stage_unit_tests(
        tree, child_env(tree), ["tests/unit_tests/test_a.py"], 2, {}, tmp_path / "cache", None, blocked=BLOCKED
    )
    assert res.status == "fail" and "(none of the 1 selected files ran)" in res.reason and "conftest" in res.reason, (
        res.reason
    )
    account = res.details.files["tests/unit_tests/test_a.py"]
    assert account.status == "not-run" and "pytest under torchrun recorded nothing" in account.reason, account


SLOW = textwrap.dedent("""\
    import time
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("gloo")

    def _compute(seconds):
        end = time.process_time() + seconds
        while time.process_time() < end:
            sum(range(1000))

    def test_one_rank_computes_past_the_timeout():
        # rank 0 waits in the barrier while rank 1 computes: slow, as on a busy machine, not hung
        if dist.get_rank() == 1:
            _compute(9)
        dist.barrier()

    def test_computes_forever():
        _compute(3600)
    """)


@pytest.mark.torch
@pytest.mark.slow
def test_a_rank_still_computing_is_slow_not_hung_and_a_livelock_still_ends(tmp_path, child_env):
    """Item 21 of the hostile-input round: on a busy machine the watchdog fired on ranks that were only
    slow. It now waits while the run's ranks use CPU, up to SLOW_CAP timeouts (a livelock computes forever)."""
    from rocmport.verify.runtime import pytest_plugin

    tree, _ = upstream_repo(tmp_path / "up")
    (tree / "tests" / "unit_tests" / "test_slow.py").write_text(SLOW)
    env = {**child_env(tree), "ROCMPORT_UNIT_TEST_TIMEOUT": "3"}
    res = run_tests(tree, ["tests/unit_tests/test_slow.py"], env, nproc=2, timeout=300)  # a bound, not a target
    ids = {k.split("::")[1]: v for k, v in res.outcomes.items()}
    assert ids == {"test_one_rank_computes_past_the_timeout": "passed", "test_computes_forever": "failed"}, res
    assert "tests/unit_tests/test_slow.py::test_one_rank_computes_past_the_timeout" in res.slow
    detail = res.details["tests/unit_tests/test_slow.py::test_computes_forever"]
    waited = int(re.match(r"hung: no result after (\d+) s", detail).group(1))
    assert waited >= 3 * pytest_plugin.SLOW_CAP - 3 and "still computing after 10 timeouts: a livelock" in detail, (
        detail
    )
    assert res.machine is not None and res.machine["cpus"] >= 1 and res.machine["run_cores"] > 0


COMPILES = textwrap.dedent("""\
    import subprocess
    import sys
    import time

    BURN = "import time\\nend = time.process_time() + 0.4\\nwhile time.process_time() < end: pass\\n"

    def test_waits_on_a_compiler_past_the_timeout():
        # as torch.compile waits on its C++ compiler: one short process after another, its main thread asleep
        end = time.monotonic() + 10
        while time.monotonic() < end:
            subprocess.run([sys.executable, "-c", BURN], check=True)
    """)


@pytest.mark.torch
@pytest.mark.slow
def test_a_rank_waiting_on_a_compiler_is_slow_not_hung(tmp_path, child_env):
    """v0.16's test_l2_qk_norm (L2Norm under torch.compile) was ended as hung on both trees, its ranks'
    main threads idle while inductor's workers ran the C++ compiler: short processes whose CPU time, once
    they exited, no process the watchdog read still held. The reaped children's time counts now."""
    tree, _ = upstream_repo(tmp_path / "up")
    (tree / "tests" / "unit_tests" / "test_compiles.py").write_text(COMPILES)
    env = {**child_env(tree), "ROCMPORT_UNIT_TEST_TIMEOUT": "3"}
    res = run_tests(tree, ["tests/unit_tests/test_compiles.py"], env, nproc=2, timeout=300)  # a bound, not a target
    test = "tests/unit_tests/test_compiles.py::test_waits_on_a_compiler_past_the_timeout"
    assert res.outcomes == {test: "passed"}, res.details
    assert test in res.slow


def test_machine_share_counts_other_processes_and_not_the_run_s_own_children():
    from rocmport.machine.cpu_meter import MachineShare

    burn = "import time\nend = time.process_time() + 1.5\nwhile time.process_time() < end: pass\n"
    share = MachineShare()
    subprocess.run([sys.executable, "-c", burn], check=True)  # the run's own child, waited for
    reading = share.read()
    assert reading is not None and reading.run_cores * reading.seconds >= 1.3, reading
    # children not yet waited for are not the run's: as other jobs on the machine, they overload it
    share = MachineShare()
    hogs = [subprocess.Popen([sys.executable, "-c", burn.replace("1.5", "2.5")]) for _ in range(os.cpu_count() or 1)]
    time.sleep(2.0)
    reading = share.read()
    for h in hogs:
        h.wait()
    assert reading.overloaded and reading.others_cores >= 0.5 * reading.cpus, reading


def test_a_namespace_package_of_the_tree_is_the_tree_s_own_not_a_missing_dependency(tmp_path):
    """Megatron-LM's `megatron` has no __init__.py: in a 3.12 venv without megatron-core, stage 3 said
    "the selected test files need megatron, which this Python lacks" and ran nothing."""
    tree, _ = upstream_repo(tmp_path / "up")
    (tree / "rocmport_ns_pkg" / "core").mkdir(parents=True)  # a namespace package: no rocmport_ns_pkg/__init__.py
    (tree / "rocmport_ns_pkg" / "core" / "__init__.py").write_text("")
    (tree / "tests" / "unit_tests" / "test_ns.py").write_text(
        "from rocmport_ns_pkg.core import x\n\n\ndef test_x():\n    pass\n"
    )
    assert suite.missing_dependencies(tree, ["tests/unit_tests/test_ns.py"], BLOCKED) == {}


def test_stage_4_names_psutil_when_the_tree_s_checkpoint_writer_needs_it(tmp_path, monkeypatch):
    """v0.19 on a fresh 3.12 venv: pretrain_gpt.py failed after 5 iterations with "psutil is not
    installed" (the persistent checkpoint writer); stage 4 now says so before it runs, with the pip command."""
    tree = tmp_path / "t"
    (tree / "megatron" / "core" / "datasets").mkdir(parents=True)
    (tree / "megatron" / "core" / "datasets" / "Makefile").write_text("all:\n")
    writer = tree / "megatron" / "core" / "dist_checkpointing" / "strategies" / "filesystem_async.py"
    writer.parent.mkdir(parents=True)
    writer.write_text("try:\n    import psutil\nexcept ImportError:\n    psutil = None\n")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "psutil" else real(name, *a))
    why = environment.functional_blockers(tree)
    assert (
        why is not None
        and why.startswith(
            "missing dependency psutil (psutil: the persistent checkpoint writer of upstream's "
            "--async-save cases uses it): `"
        )
        and why.endswith(" -m pip install psutil`")
    ), why
    writer.write_text("import os\n")  # a line whose writer does not use it
    assert environment.functional_blockers(tree) is None or "psutil" not in environment.functional_blockers(tree)
