"""verify stage 3: upstream's unit tests under torchrun with rocmport's pytest plugin, outcomes
merged over ranks, each failure labelled against the unported tree at the same commit (cached)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from rocmport.errors import BadInput
from rocmport.patches.series import load_series
from rocmport.verify import environment
from rocmport.verify.unit_tests import label, run_tests, stage_unit_tests
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
    (root / "megatron" / "core" / "mathops.py").write_text("def add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n    return a + b\n\n\n"
                                                           "def scale(a):\n    return 2 * a\n")
    (root / "tests" / "unit_tests").mkdir(parents=True)
    (root / "tests" / "unit_tests" / "test_ops.py").write_text(TESTS)
    (root / "tests" / "unit_tests" / "test_needs_te.py").write_text("import transformer_engine_not_here\n\n\ndef test_te():\n    pass\n")
    g(root, "init", "-q", "-b", "main")
    g(root, "add", "-A")
    g(root, "-c", "user.name=t", "-c", "user.email=t@e", "commit", "-qm", "upstream")
    base = g(root, "rev-parse", "HEAD")
    text = (root / "megatron" / "core" / "mathops.py").read_text()
    (root / "megatron" / "core" / "mathops.py").write_text(text.replace("return a + b\n\n\ndef mul", "return a - b\n\n\ndef mul")
                                                           .replace("2 * a", "3 * a"))
    g(root, "-c", "user.name=t", "-c", "user.email=t@e", "commit", "-qam", "port")
    return root, base


@pytest.fixture
def child_env(tmp_path):
    def make(tree: Path) -> dict:
        (tmp_path / "boot").mkdir(exist_ok=True)
        return environment.child_env(tree, tmp_path / "boot", {})
    return make


FILES = ["tests/unit_tests/test_ops.py", "tests/unit_tests/test_needs_te.py"]


@pytest.mark.torch
@pytest.mark.slow
def test_port_run_merges_ranks(tmp_path, child_env):
    tree, _ = upstream_repo(tmp_path / "up")
    res = run_tests(tree, FILES, child_env(tree), nproc=2)
    assert res["ranks"] == 2
    ops = {k.split("::")[1]: v for k, v in res["outcomes"].items() if "::" in k}
    assert ops == {"test_add": "failed", "test_upstream_broken": "failed", "test_listed": "failed", "test_skipped": "skipped",
                   "test_fails_on_rank_one_only": "failed"}
    assert res["outcomes"]["tests/unit_tests/test_needs_te.py"] == "error"
    assert "transformer_engine_not_here" in res["details"]["tests/unit_tests/test_needs_te.py"]


@pytest.mark.torch
@pytest.mark.slow
def test_stage_labels_against_cached_baseline(tmp_path, child_env):
    tree, base = upstream_repo(tmp_path / "up")
    known = {"tests/unit_tests/test_ops.py::test_listed": "AMD's fork skips it on ROCm"}
    res = stage_unit_tests(tree, child_env(tree), FILES, 2, known, tmp_path / "cache", base)
    d = res.to_dict()
    assert res.status == "fail"  # a port regression fails the stage
    labels = {k.split("::")[-1]: v for k, v in d["labels"].items()}
    assert labels == {"test_add": "port-regression", "test_upstream_broken": "upstream-known", "test_listed": "known-failure",
                      "tests/unit_tests/test_needs_te.py": "upstream-known", "test_fails_on_rank_one_only": "port-regression"}
    assert d["counts"] == {"passed": 0, "skipped": 1, "failed": 4, "error": 1}
    on_base = {k.split("::")[-1]: v for k, v in d["on_baseline"].items()}
    assert on_base["test_add"] == "passed" and on_base["test_upstream_broken"] == "failed"
    assert on_base["tests/unit_tests/test_needs_te.py"] == "error"
    assert d["baseline"]["commit"] == base and not d["baseline"]["cached"]
    assert d["baseline"]["counts"] == {"passed": 3, "skipped": 1, "failed": 1, "error": 1}
    assert "2 port-regression, 2 upstream-known, 1 known-failure" in res.reason
    assert g(tree, "worktree", "list").count("\n") == 0  # the baseline checkout is gone
    again = stage_unit_tests(tree, child_env(tree), FILES, 2, known, tmp_path / "cache", base).to_dict()
    assert again["baseline"]["cached"] and again["labels"] == d["labels"]
    assert len(list((tmp_path / "cache" / "unit-baselines").glob("*.json"))) == 1


def test_label_rules():
    port = {"outcomes": {"a.py::x": "failed", "a.py::y": "failed", "b.py": "error", "c.py::z": "failed", "d/e.py::w": "failed",
                         "a.py::ok": "passed"}}
    base = {"outcomes": {"a.py::x": "passed", "a.py::y": "failed", "b.py": "error", "c.py": "error", "d/e.py::w": "passed"}}
    assert label(port, base, {"d/": "whole directory skipped on ROCm"}) == {
        "a.py::x": "port-regression", "a.py::y": "upstream-known", "b.py": "upstream-known", "c.py::z": "upstream-known",
        "d/e.py::w": "known-failure"}


def test_missing_test_file_and_no_tests_dir(tmp_path, child_env):
    tree, base = upstream_repo(tmp_path / "up")
    res = stage_unit_tests(tree, child_env(tree), ["tests/unit_tests/test_nope.py"], 2, {}, tmp_path / "cache", base)
    assert res.status == "fail" and "tests/unit_tests/test_nope.py" in res.reason and "--unit-test" in res.reason
    (tmp_path / "bare" / "megatron" / "core").mkdir(parents=True)
    res = stage_unit_tests(tmp_path / "bare", {}, FILES, 2, {}, tmp_path / "cache", None)
    assert res.status == "skipped" and "megatron/core only" in res.reason


def test_series_verify_settings(tmp_path):
    series = tmp_path / "series"
    series.write_text("upstream: megatron-lm\nline: v0.16\nversions: '>=0.16.0rc0,<0.17.0rc0'\npatches: []\ncodemods: []\n"
                      "verify:\n  unit_tests: [tests/unit_tests/models/test_gpt_model.py]\n"
                      "  known_failures: {tests/unit_tests/test_fp8.py: needs FP8 on MI300}\n")
    assert load_series(series).verify["known_failures"] == {"tests/unit_tests/test_fp8.py": "needs FP8 on MI300"}
    series.write_text(series.read_text().replace("known_failures:", "known_fails:"))
    with pytest.raises(BadInput, match="key 'verify'"):
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
    ids = {k.split("::")[1]: v for k, v in res["outcomes"].items()}
    # The barrier hangs -> failed, the run restarts without it, the next test passes; the sleeper
    # hangs too -> failed.
    assert ids == {"test_first": "passed", "test_collective_only_rank_one_enters": "failed", "test_after_the_hang": "passed",
                   "test_sleeps_forever": "failed"}, res
    assert res["restarts"] >= 2 and not res["timed_out"]
    assert [h.split("::")[1] for h in res["hung"]] == ["test_collective_only_rank_one_enters", "test_sleeps_forever"]
    assert "hung: no result after 6 s on rank 1" in res["details"]["tests/unit_tests/test_hangs.py::test_collective_only_rank_one_enters"]
    # A run stopped from outside keeps what ran and fails the test that was running.
    env["ROCMPORT_UNIT_TEST_TIMEOUT"] = "0"
    res = run_tests(tree, ["tests/unit_tests/test_hangs.py::test_first", "tests/unit_tests/test_hangs.py::test_sleeps_forever"],
                    env, nproc=2, timeout=40)
    assert res["timed_out"] and res["outcomes"]["tests/unit_tests/test_hangs.py::test_first"] == "passed"
    assert "still running when the stage stopped it" in res["details"]["tests/unit_tests/test_hangs.py::test_sleeps_forever"]


@pytest.mark.torch
@pytest.mark.slow
def test_a_rank_that_finishes_first_with_a_failure_does_not_cut_its_peers_short(tmp_path, child_env):
    """torchrun stops every rank once one exits non-zero: rank 0 fails fast and ends, rank 1 is
    still in a test that fails only there; that failure must still be recorded."""
    tree = tmp_path / "up"
    (tree / "tests" / "unit_tests").mkdir(parents=True)
    (tree / "tests" / "unit_tests" / "test_slow.py").write_text(textwrap.dedent("""\
        import os, time

        def test_fails_everywhere():
            assert False

        def test_slow_failure_on_rank_one():
            if os.environ["RANK"] == "1":
                time.sleep(4)
                assert False, "rank one's own failure"
        """))
    res = run_tests(tree, ["tests/unit_tests/test_slow.py"], child_env(tree), nproc=2)
    assert res["ranks"] == 2
    assert res["outcomes"] == {"tests/unit_tests/test_slow.py::test_fails_everywhere": "failed",
                               "tests/unit_tests/test_slow.py::test_slow_failure_on_rank_one": "failed"}
    assert "rank one's own failure" in res["details"]["tests/unit_tests/test_slow.py::test_slow_failure_on_rank_one"]
