"""`verify --unit-tests impacted --since A`: the test files whose imports reach what upstream changed
in A..B (a static import graph), plus the smoke set; `--unit-tests all` records the full suite's
runs; refresh/bot `--verify-stages`."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from rocmport.cli import main
from rocmport.port import worktree as wt
from rocmport.verify.analyses import impact
from rocmport.verify.stages.unit_tests import suite
from tests.helpers.sync import g

COMMIT = ["-c", "user.name=t", "-c", "user.email=t@e", "commit", "-qm"]


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(textwrap.dedent(text))


def tree_with_hop(root: Path) -> tuple[Path, str, str]:
    """An upstream-shaped repo with two upstream commits A and B (B changes megatron/core/b.py) and
    the port on top of B. test_a reaches b.py through a.py; test_c imports c.py only; a.py imports
    lazy.py inside a function (a library's lazy import is not counted); test_basic.py is the smoke set's."""
    _write(
        root,
        {
            "megatron/__init__.py": "",
            "megatron/core/__init__.py": "from megatron.core import c  # every test loads the package\n",
            "megatron/core/tensor_parallel/__init__.py": "",
            # the RNG hooks the proxy shim backs with the CPU generator
            "megatron/core/tensor_parallel/random.py": (
                "def _get_cuda_rng_state():\n    pass\n\n\ndef _set_cuda_rng_state(state):\n    pass\n\n\n"
                "class CudaRNGStatesTracker:\n    pass\n"
            ),
            "megatron/core/a.py": """\
                from .b import add


                def double(x):
                    from megatron.core import lazy

                    return lazy.twice(x)
                """,
            "megatron/core/b.py": "def add(x, y):\n    return x + y\n",
            "megatron/core/c.py": "def neg(x):\n    return -x\n",
            "megatron/core/lazy.py": "def twice(x):\n    return 2 * x\n",
            "tests/__init__.py": "",
            "tests/unit_tests/__init__.py": "",
            "tests/unit_tests/test_basic.py": "def test_import():\n    import megatron  # noqa: F401\n",
            "tests/unit_tests/test_a.py": """\
                from megatron.core.a import add


                def test_add():
                    assert add(2, 3) == 5


                def test_add_more():
                    assert add(1, 1) == 2
                """,
            "tests/unit_tests/sub/test_c.py": """\
                from megatron.core.c import neg


                def test_neg():
                    assert neg(2) == -2
                """,
        },
    )
    g(root, "init", "-q", "-b", "main")
    g(root, "add", "-A")
    g(root, *COMMIT, "A")
    a = g(root, "rev-parse", "HEAD")
    (root / "megatron/core/b.py").write_text("def add(x, y):\n    # upstream's change\n    return y + x\n")
    g(root, *COMMIT, "B", "-a")
    b = g(root, "rev-parse", "HEAD")
    (root / "megatron/core/port_note.py").write_text("# the port's own file\n")
    g(root, "add", "-A")
    g(root, *COMMIT, "port")
    return root, a, b


SMOKE = {"tests/unit_tests/test_basic.py": "megatron imports"}


def test_selection_follows_imports_transitively_and_keeps_the_smoke_set(tmp_path):
    tree, a, b = tree_with_hop(tmp_path / "up")
    picked = impact.select(tree, a, b, SMOKE, tmp_path / "cache")
    # test_a -> a.py -> b.py (changed); test_c reaches c.py only (megatron/core/__init__.py, which every
    # test runs, is not counted: it would select every test for every change); test_basic is smoke.
    assert picked.selected == {
        "tests/unit_tests/test_a.py": f"reaches megatron/core/b.py, changed in {a[:12]}..{b[:12]}",
        "tests/unit_tests/test_basic.py": "smoke set: megatron imports",
    }
    assert picked.changed == ["megatron/core/b.py"] and picked.total_files == 3
    assert picked.parsed > 0
    # The graph's imports are cached by blob: a second selection parses nothing; an uncommitted edit is read afresh.
    assert impact.select(tree, a, b, SMOKE, tmp_path / "cache").parsed == 0
    (tree / "tests/unit_tests/sub/test_c.py").write_text(
        "from megatron.core.a import add\n\n\ndef test_x():\n    pass\n"
    )
    again = impact.select(tree, a, b, SMOKE, tmp_path / "cache")
    assert again.parsed == 1 and "tests/unit_tests/sub/test_c.py" in again.selected
    g(tree, "checkout", "-q", "--", "tests")
    # A library module's lazy import (in a function) is not a reach; a changed conftest.py selects the tests below it.
    _write(tree, {"megatron/core/lazy.py": "def twice(x):\n    return x + x\n", "tests/unit_tests/sub/conftest.py": ""})
    g(tree, "add", "-A")
    g(tree, *COMMIT, "C")
    c = g(tree, "rev-parse", "HEAD")
    later = impact.select(tree, b, c, {}, tmp_path / "cache")
    assert later.selected == {
        "tests/unit_tests/sub/test_c.py": f"reaches tests/unit_tests/sub/conftest.py, changed in {b[:12]}..{c[:12]}"
    }
    # extra changed files (a refresh hop's changed port rewrites) select too
    assert "tests/unit_tests/test_a.py" in impact.select(tree, c, c, {}, None, ("megatron/core/a.py",)).selected


def test_the_summary_line_and_the_time_saved_come_from_the_recorded_full_run(tmp_path):
    tree, a, b = tree_with_hop(tmp_path / "up")
    picked = impact.select(tree, a, b, SMOKE, None)
    cache = tmp_path / "cache"
    figures = impact.impact_summary(picked, list(picked.selected), 3, 4.0, {})
    line = figures.line
    assert line.startswith("3 tests selected (2 of 3 test files: those whose imports reach the 1 files changed")
    assert "full suite: no pass recorded here (run `rocmport verify --unit-tests all`)" in line
    assert figures.estimated_seconds_saved is None and "time saved not known" in line
    seconds = {
        "tests/unit_tests/test_a.py": 2.0,
        "tests/unit_tests/sub/test_c.py": 30.0,
        "tests/unit_tests/test_basic.py": 1.0,
    }
    impact.record_full_run(
        cache, "v0.16", passed=True, commit="c" * 40, base=b, tests=4, file_seconds=seconds, seconds=40.0
    )
    impact.record_full_run(
        cache, "v0.16", passed=False, commit="d" * 40, base="e" * 40, tests=4, file_seconds=seconds, seconds=40.0
    )
    full = impact.read_full_runs(cache)["v0.16"]
    assert full["last_pass"]["base"] == b and full["last_run"]["passed"] is False  # a failed run is not a pass
    figures = impact.impact_summary(picked, list(picked.selected), 3, 4.0, full)
    line = figures.line
    assert line.startswith("3 tests selected of 4 (")
    assert f"full suite last passed at {b[:12]} (" in line
    # test_c.py's 30 s, and a third of the 7 s the run spent outside tests
    assert figures.estimated_seconds_saved == pytest.approx(32.3) and "about 32 s saved on the port's run" in line


def test_an_empty_selection_skips_the_stage_rather_than_run_the_whole_tree(tmp_path):
    from rocmport.verify.stages.unit_tests.stage import unit_options

    tree, a, b = tree_with_hop(tmp_path / "up")
    (tree / "tests/unit_tests/test_basic.py").unlink()  # the smoke set's one file here
    unit, why = unit_options(suite.VerifySettings(), b, tmp_path / "cache", tree, "impacted", (), 2, since=b)
    assert unit is None
    assert why == f"--unit-tests impacted: no test file reaches the 0 files changed in {b[:12]}..{b[:12]}, " + (
        "and the tree has none of the smoke set's files"
    )
    unit, _ = unit_options(suite.VerifySettings(), b, tmp_path / "cache", tree, "impacted", (), 2, since=a)
    assert unit is not None and unit.tests == ["tests/unit_tests/test_a.py"] and unit.selection == "impacted"


def _ported(tmp_path: Path) -> tuple[Path, str, str]:
    tree, a, b = tree_with_hop(tmp_path / "up")
    wt.write_state(tree, wt.ApplyState(status="done", base=b))
    return tree, a, b


def test_bad_input_is_exit_2_with_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("ROCMPORT_CACHE_DIR", str(tmp_path / "cache"))
    tree, a, b = _ported(tmp_path)
    verify = ["-C", str(tmp_path), "verify", "--tree", str(tree), "--backend", "gloo", "--stages", "3", "--dry-run"]
    cases = {
        ("--unit-tests", "impacted", "--since", "0123456789ab"): "--since 0123456789ab: not a commit in",
        ("--unit-tests", "impacted", "--since", "--json"): "--since '--json': not a commit",
        ("--unit-tests", "impacted"): "--unit-tests impacted: give --since COMMIT",
        ("--since", a): f"--since {a}: only with --unit-tests impacted",
        (
            "--unit-tests",
            "impacted",
            "--since",
            a,
            "--unit-test",
            "tests/unit_tests/test_a.py",
        ): "--unit-test: not with",
    }
    for extra, message in cases.items():
        assert main([*verify, *extra]) == 2, extra
        err = capsys.readouterr().err.strip()
        assert message in err and len(err.splitlines()) == 1, err
    # the dry run launches the impacted selection: test_a and the smoke set's file, not test_c
    assert main([*verify, "--unit-tests", "impacted", "--since", a, "--unit-nproc", "2"]) == 0
    out = capsys.readouterr().out
    launch = next(line for line in out.splitlines() if "-m pytest" in line)
    assert "tests/unit_tests/test_a.py" in launch and "test_c.py" not in launch
    # the smoke set's files this tree has (test_basic.py), never those it lacks
    assert set(suite.SMOKE_TESTS) & set(launch.split()) == {"tests/unit_tests/test_basic.py"}
    project = ["-C", str(tmp_path), "refresh", "--to", "v1"]
    for extra, message in {
        ("--verify-stages", "5"): "--verify-stages 5: a refresh verifies stages 1-4",
        ("--verify-stages", "1,2", "--no-verify"): "--verify-stages: not with --no-verify",
        ("--verify-stages", ""): "--verify-stages '': names no stage",
    }.items():
        assert main([*project, *extra]) == 2, extra
        assert message in capsys.readouterr().err
    assert main(["-C", str(tmp_path), "refresh", "--continue", "--verify-stages", "1"]) == 2
    assert "--verify-stages: only with --to" in capsys.readouterr().err
    assert main(["-C", str(tmp_path), "bot", "--once", "--verify-stages", "5"]) == 2
    assert "--verify-stages 5: a refresh verifies stages 1-4" in capsys.readouterr().err


@pytest.mark.torch
@pytest.mark.slow
def test_impacted_run_catches_a_bug_in_a_changed_module_and_the_full_run_one_in_an_untouched_one(
    tmp_path, capsys, monkeypatch
):
    """On a tree-shaped repo, through the CLI (torchrun, pytest, the baseline): the full run records its
    pass; a port bug in the module upstream changed is caught by the impacted run as port-regression,
    with the summary line; one in a module the hop did not touch is not selected (exit 0) and the full
    run catches it."""
    monkeypatch.setenv("ROCMPORT_CACHE_DIR", str(tmp_path / "cache"))
    tree, a, b = _ported(tmp_path)
    base = ["-C", str(tmp_path), "verify", "--tree", str(tree), "--stages", "3", "--unit-nproc", "2", "--json"]

    def run(*extra: str) -> tuple[int, dict]:
        code = main([*base, *extra])
        return code, json.loads(capsys.readouterr().out)["stages"][2]

    code, full = run("--unit-tests", "all")
    assert code == 0 and full["counts"]["passed"] == 4, full
    assert set(full["file_seconds"]) == {
        "tests/unit_tests/test_a.py",
        "tests/unit_tests/sub/test_c.py",
        "tests/unit_tests/test_basic.py",
    }
    # a port bug where upstream changed b.py
    (tree / "megatron/core/b.py").write_text("def add(x, y):\n    return y + x + 1\n")
    code, hit = run("--unit-tests", "impacted", "--since", a)
    assert code == 1 and hit["status"] == "fail"
    assert hit["labels"] == {
        "tests/unit_tests/test_a.py::test_add": "port-regression",
        "tests/unit_tests/test_a.py::test_add_more": "port-regression",
    }
    # test_a.py (it reaches b.py) and the smoke set's test_basic.py
    assert hit["impact"]["selected_files"] == 2 and hit["impact"]["total_files"] == 3
    assert hit["reason"].startswith(
        f"3 tests selected of 4 (2 of 3 test files: those whose imports reach the 1 files changed in {a[:12]}..{b[:12]}"
    )
    # test_c.py's tests' seconds, and its third of the full run's time outside tests (start, collection)
    own = full["file_seconds"]["tests/unit_tests/sub/test_c.py"]
    share = (full["port_seconds"] - sum(full["file_seconds"].values())) / 3
    assert hit["impact"]["estimated_seconds_saved"] == pytest.approx(own + share, abs=0.06)
    assert f"full suite last passed at {b[:12]} (" in hit["reason"]
    # a port bug that breaks b.py's import: test_a.py's module does not import (its tests hidden on the
    # port, counted from the unported tree), a port-regression since it imported there
    (tree / "megatron/core/b.py").write_text("from megatron.core.c import nothing_by_that_name\n")
    code, hit = run("--unit-tests", "impacted", "--since", a)
    assert code == 1 and hit["labels"] == {"tests/unit_tests/test_a.py": "port-regression"}, hit["labels"]
    # (the unported tree ran test_a.py whole this time: another set to label than the last run's, not cached)
    assert hit["reason"].startswith("3 tests selected of 4 (") and not hit["baseline"]["cached"]
    assert hit["baseline"]["ran"] == ["tests/unit_tests/test_a.py"] and hit["baseline"]["tests_not_on_port"] == 2
    g(tree, "checkout", "-q", "--", "megatron")
    # a port bug in c.py, which the hop did not touch: not selected, the impacted run passes; the full run fails
    (tree / "megatron/core/c.py").write_text("def neg(x):\n    return x\n")
    code, missed = run("--unit-tests", "impacted", "--since", a)
    assert code == 0 and "tests/unit_tests/sub/test_c.py" not in missed["tests"], missed
    code, nightly = run("--unit-tests", "all")
    assert code == 1 and nightly["labels"] == {"tests/unit_tests/sub/test_c.py::test_neg": "port-regression"}
    # the failed full run is recorded, and the last pass is still the first run's
    record = impact.read_full_runs(tmp_path / "cache")
    (entry,) = record.values()
    assert entry["last_run"]["passed"] is False and entry["last_pass"]["base"] == b


@pytest.mark.torch
@pytest.mark.slow
def test_refresh_verify_stage_3_runs_the_tests_the_hop_reaches(tmp_path, monkeypatch):
    """`refresh --verify-stages 3`: stage 3 on the refreshed port runs the unit tests whose imports
    reach what upstream changed since the old pin (real torchrun and pytest, the baseline too), and
    the summary says how many of the suite's tests that is."""
    from tests.helpers.refresh import Ported

    port = Ported(tmp_path, monkeypatch)
    port.tag(
        {
            "megatron/core/tensor_parallel/__init__.py": "",
            "megatron/core/tensor_parallel/random.py": (
                "def _get_cuda_rng_state():\n    pass\n\n\ndef _set_cuda_rng_state(state):\n    pass\n\n\n"
                "class CudaRNGStatesTracker:\n    pass\n"
            ),
            "megatron/core/ops.py": "def add(x, y):\n    return x + y\n",
            "tests/unit_tests/test_ops.py": "from megatron.core.ops import add\n\n\ndef test_add():\n    assert add(1, 2) == 3\n",
            "tests/unit_tests/test_utils.py": "from megatron.core.utils import f\n\n\ndef test_f():\n    assert f() in (1, 2)\n",
        },
        "core_v0.16.2",
        "0.16.2",
    )
    assert port.run("refresh", "--to", "core_v0.16.2", "--no-verify") == 0
    g(port.root, "commit", "-qam", "port at core_v0.16.2")
    old = port.lock["upstreams"]["megatron-lm"]["commit"]
    # the next hop changes ops.py only: test_ops.py reaches it, test_utils.py does not
    port.tag({"megatron/core/ops.py": "def add(x, y):\n    return y + x\n"}, "core_v0.16.3", "0.16.3")
    assert port.run("refresh", "--to", "core_v0.16.3", "--verify-stages", "3", "--tp", "1", "--pp", "1") == 0
    v = port.summary["verify"]
    stages = {s["name"]: s for s in v["stages"]}
    assert stages["imports"]["status"] == "skipped" and stages["functional"]["status"] == "skipped"
    unit = stages["unit-tests"]
    # test_utils.py imports utils.py, which the hop did not change (the port's patch did, at both pins)
    assert unit["status"] == "pass" and unit["tests"] == ["tests/unit_tests/test_ops.py"], unit
    assert unit["impact"]["since"] == old and unit["impact"]["total_files"] == 2
    assert v["unit_tests_selection"].startswith("1 tests selected (1 of 2 test files")
    md = (port.root / "build" / "refresh" / "summary.md").read_text()
    assert "Unit tests: 1 tests selected (1 of 2 test files" in md and port.summary["status"] == "ready"


@pytest.mark.torch
@pytest.mark.slow
def test_bot_stage_3_from_a_pin_without_upstream_tests(tmp_path, monkeypatch, capsys):
    """The old pin has no tests/unit_tests; the release adds one test file (no __init__.py, no pytest
    configuration: pytest's rootdir would be tests/unit_tests and its ids `test_ops.py::...`).
    The test that ran and passed is reported as run, never as "pytest never collected it"."""
    from tests.helpers.refresh import Ported

    port = Ported(tmp_path, monkeypatch)
    (port.root / "pyproject.toml").write_text("[tool.rocmport]\ntp = 1\npp = 1\n")
    g(port.root, "add", "-A")
    g(port.root, "commit", "-qm", "tp 1")
    port.tag(
        {
            "megatron/core/tensor_parallel/__init__.py": "",
            "megatron/core/tensor_parallel/random.py": (
                "def _get_cuda_rng_state():\n    pass\n\n\ndef _set_cuda_rng_state(state):\n    pass\n\n\n"
                "class CudaRNGStatesTracker:\n    pass\n"
            ),
            "megatron/core/ops.py": "def add(x, y):\n    return x + y\n",
            "tests/unit_tests/test_ops.py": "from megatron.core.ops import add\n\n\ndef test_add():\n    assert add(1, 2) == 3\n",
        },
        "core_v0.16.2",
        "0.16.2",
    )
    capsys.readouterr()
    code = port.run("bot", "--once", "--verify-stages", "3", "--json")
    out = capsys.readouterr()
    (done,) = json.loads(out.out)["processed"]
    unit = {s["name"]: s for s in port.summary["verify"]["stages"]}["unit-tests"]
    assert "never collected" not in out.err + json.dumps(unit), out.err
    assert code == 0 and done["status"] == "ready", (done, unit)
    assert unit["status"] == "pass" and unit["counts"]["passed"] == 1, unit


@pytest.mark.torch
def test_bot_stage_3_on_a_tree_without_upstream_tests_is_a_skip(tmp_path, monkeypatch, capsys):
    """Neither pin has tests/unit_tests: stage 3, asked for, is skipped with the reason; the release
    is not verified (no test ran), never ready, never needs-a-human."""
    from tests.helpers.refresh import Ported

    port = Ported(tmp_path, monkeypatch)
    port.tag({"megatron/core/ops.py": "def add(x, y):\n    return x + y\n"}, "core_v0.16.2", "0.16.2")
    capsys.readouterr()
    code = port.run("bot", "--once", "--verify-stages", "3", "--json")
    out = capsys.readouterr()
    (done,) = json.loads(out.out)["processed"]
    unit = {s["name"]: s for s in port.summary["verify"]["stages"]}["unit-tests"]
    assert unit["status"] == "skipped" and "no tests/unit_tests" in unit["reason"], unit
    assert "passed" not in json.dumps(unit), unit  # never claims a test ran
    assert code == 0 and done["status"] == "not-verified", (code, done)
    why = "stage unit-tests did not run (skipped: the tree has no tests/unit_tests"
    assert port.summary["status"] == "not-verified" and port.summary["why"].startswith(why), port.summary["why"]
    md = (port.root / "build" / "refresh" / "summary.md").read_text()
    assert why in md and "ready" not in out.err, out.err


def test_pytest_is_pinned_to_the_trees_own_configuration(tmp_path):
    """A tree inside a project whose pyproject.toml configures pytest: pytest's rootdir and
    configuration are the tree's (its own file, else an empty one), never the project's."""
    from rocmport.verify.stages.unit_tests.command import config_args, tree_config

    (tmp_path / "pyproject.toml").write_text("[tool.pytest.ini_options]\naddopts = '-x'\n")
    tree = tmp_path / "build" / "refresh" / "megatron-lm"
    _write(tree, {"tests/unit_tests/test_ops.py": "def test_x():\n    pass\n"})
    tests = ["tests/unit_tests/test_ops.py"]
    assert tree_config(tree, tests) is None
    empty = tmp_path / "empty.ini"
    assert config_args(tree, tests, empty) == ["--rootdir", str(tree), "-c", str(empty), "--confcutdir", str(tree)]
    # a pyproject.toml without a pytest table is not pytest's configuration; one with it is
    (tree / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    assert tree_config(tree, tests) is None
    (tree / "pyproject.toml").write_text("[tool.pytest.ini_options]\ntestpaths = ['tests']\n")
    assert config_args(tree, tests, empty) == ["--rootdir", str(tree), "-c", str(tree / "pyproject.toml")]
    (tree / "tests/unit_tests/pytest.ini").write_text("[pytest]\n")  # nearer the tests: pytest's first pick
    assert tree_config(tree, tests) == tree / "tests/unit_tests/pytest.ini"
    assert tree_config(tree, ["tests/unit_tests"]) == tree / "tests/unit_tests/pytest.ini"
