"""Reach: each case's and test file's port sites recorded in their own directories, the line's
reach record (reach.json: schema-checked), the greedy set cover under a budget, `--unit-tests
reach` with its fallback, every unreached site classified, and a refresh hop's cases."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rocmport.cli import main
from rocmport.codemods.declared import DECLARED
from rocmport.codemods.runner import helper_text
from rocmport.errors import BadInput
from rocmport.port import worktree as wt
from rocmport.verify.analyses import port_sites, reach
from rocmport.verify.analyses.reach import Entry
from rocmport.verify.orchestration import environment, firewall
from rocmport.verify.runtime import protocol
from rocmport.verify.stages import case_plan, functional
from rocmport.verify.stages.unit_tests import suite
from rocmport.verify.stages.unit_tests.stage import unit_options
from tests.helpers.sync import g

A_AFTER = (
    "import torch\nfrom megatron.core._rocm import nvidia_arch_major\n\n\n"
    "def arch():\n    return nvidia_arch_major()\n\n\n"
    "def probe():\n    from megatron.core._rocm import is_hip\n    if is_hip():\n        return 0\n    return 1\n"
)
FA_AFTER = "from megatron.core._rocm import is_hip\n\n\ndef flash():\n    return is_hip()\n"
CASE = "gpt3_mcore_te_tp1_pp1"
TEST_ARCH = "tests/unit_tests/test_arch.py"
TEST_PROBE = "tests/unit_tests/test_probe.py"


def commit(root: Path, message: str) -> str:
    g(root, "add", "-A")
    g(root, "-c", "user.name=t", "-c", "user.email=t@e", "commit", "-qm", message)
    return g(root, "rev-parse", "HEAD")


def ported_tree(root: Path) -> tuple[Path, Path, str]:
    """A port made of three codemod commits that call the generated helper (capability-gates in
    a.py and legacy/b.py, flash-attention-hooks in fa.py), with one GPT case and two unit-test files;
    its series directory beside it. (tree, series_dir, base)"""
    files = {
        "megatron/__init__.py": "",
        "megatron/core/__init__.py": "",
        "megatron/core/a.py": "import torch\n\n\ndef arch():\n    return 7\n\n\ndef probe():\n    return 1\n",
        "megatron/core/fa.py": "def flash():\n    return False\n",
        "megatron/legacy/__init__.py": "",
        "megatron/legacy/b.py": "def old():\n    return 7\n",
        f"tests/functional_tests/test_cases/gpt/{CASE}/model_config.yaml": "MODEL_ARGS:\n  --num-layers: 2\n",
        TEST_ARCH: "from megatron.core import a\n\n\ndef test_arch():\n    try:\n        a.arch()\n    except Exception:\n        pass\n",
        TEST_PROBE: "from megatron.core import a\n\n\ndef test_probe():\n    assert a.probe() == 1\n",
    }
    tree = root / "tree"
    for rel, text in files.items():
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree / rel).write_text(text)
    g(tree, "init", "-q", "-b", "main")
    base = commit(tree, "upstream")
    (tree / "megatron/core/_rocm.py").write_text(helper_text(["capability-gates", "device-probes"]))
    (tree / "megatron/core/a.py").write_text(A_AFTER)
    (tree / "megatron/legacy/b.py").write_text(
        "from megatron.core._rocm import nvidia_arch_major\n\n\ndef old():\n    return nvidia_arch_major()\n"
    )
    commit(tree, "codemod: capability-gates 1")
    (tree / "megatron/core/fa.py").write_text(FA_AFTER)
    commit(tree, "codemod: flash-attention-hooks 1")
    series_dir = root / "patchsets" / "megatron-lm" / "v0.16"
    series_dir.mkdir(parents=True)
    (series_dir / "series").write_text(
        'upstream: megatron-lm\nline: v0.16\nversions: ">=0.16.0rc0,<0.17.0rc0"\npatches: []\ncodemods: [capability-gates]\n'
    )
    wt.write_state(
        tree,
        wt.ApplyState(
            status="done",
            base=base,
            series=str(series_dir / "series"),
            codemods=[{"name": "capability-gates", "sites": 3}, {"name": "flash-attention-hooks", "sites": 1}],
        ),
    )
    return tree, series_dir, base


def run_in(tree: Path, boot: Path, env_extra: dict, code: str) -> None:
    env = environment.child_env(tree, boot, env_extra)
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=tree)
    assert proc.returncode == 0, proc.stderr


def keys_of(tree: Path, base: str) -> dict[str, str]:
    """'path:line helper' -> its stable key, for the tree's sites."""
    return {s.key: s.stable_key for s in port_sites.find_sites(tree, base)}


# --- the set cover -----------------------------------------------------------------------------


def entries(**spec: tuple[float, str]) -> dict[str, Entry]:
    return {name: Entry(frozenset(sites.split()), seconds) for name, (seconds, sites) in spec.items()}


def test_greedy_takes_the_most_new_sites_per_second_within_the_budget():
    # big: 6 sites in 60 s (0.1/s); fast: 3 in 10 s (0.3/s); mid: 4 in 20 s (0.2/s); tiny: 1 in 10 s.
    # First fast (0.3/s). Then, of what is new: mid 3 in 20 s (0.15/s), big 3 in 60 s (0.05/s),
    # tiny nothing: mid. Then big, 2 new, fits a 100 s budget (30 + 60 s); tiny never adds a site.
    spec = entries(
        big=(60.0, "s1 s2 s3 s4 s5 s6"), fast=(10.0, "s1 s2 s3"), mid=(20.0, "s3 s4 s7 s8"), tiny=(10.0, "s1")
    )
    assert reach.greedy_cover(spec, 100.0) == ["fast", "mid", "big"]
    # A budget big cannot fit into after the first two: left out, never over budget.
    assert reach.greedy_cover(spec, 89.0) == ["fast", "mid"]
    assert sum(spec[n].seconds for n in reach.greedy_cover(spec, 35.0)) <= 35.0
    # Sites covered before any pick (a session's start) are worth nothing.
    assert reach.greedy_cover(spec, 100.0, covered={"s1", "s2", "s3"}) == ["mid", "big"]


def test_greedy_breaks_ties_by_name_and_is_deterministic():
    spec = entries(zeta=(10.0, "a b"), alpha=(10.0, "c d"), mid=(10.0, "e"))
    picks = {tuple(reach.greedy_cover(dict(reversed(list(spec.items()))), 100.0)) for _ in range(5)}
    assert picks == {("alpha", "zeta", "mid")}  # 0.2/s each for alpha and zeta: alpha first, by name


def test_the_cases_given_first_are_picked_first_while_they_fit_then_the_greedy_cover():
    spec = entries(golden=(120.0, "s1 s2"), fast=(10.0, "s1 s2 s3"), mid=(20.0, "s4"))
    # the golden case first (it fits), then what adds sites per second
    assert reach.greedy_cover(spec, 200.0, first=["golden"]) == ["golden", "fast", "mid"]
    # one that does not fit the budget is not forced in
    assert reach.greedy_cover(spec, 100.0, first=["golden"]) == ["fast", "mid"]


# The v0.16 record's three cases as measured (docs/reach.md): the tensorwise FSDP case stops in argument
# validation on both trees (8 sites in 14 s), the FP8 delayed case passes (18 in 81 s, one of them new),
# the default case passes and has the line's golden (18 in 121 s).
V016_SITES = {
    "fsdp": " ".join(f"v{i}" for i in range(8)),
    "fp8": " ".join([*(f"v{i}" for i in range(8)), *(f"d{i}" for i in range(9)), "delayed"]),
    "default": " ".join([*(f"v{i}" for i in range(8)), *(f"d{i}" for i in range(9)), "arch"]),
}


def v016_record(series_dir: Path, outcomes: dict[str, str | None]) -> None:
    seconds = {"fsdp": 14.0, "fp8": 81.0, "default": 121.0}
    cases = {n: Entry(frozenset(V016_SITES[n].split()), seconds[n], outcome=outcomes.get(n)) for n in seconds}
    write_record(series_dir, "c0ffee", cases, {})


def test_a_case_whose_recorded_run_failed_is_not_selected_but_its_sites_still_explain(tmp_path):
    v016_record(tmp_path, {"fsdp": "fail", "fp8": "pass", "default": "pass"})
    names, why = reach.select(tmp_path, "cases", 720.0) or ([], "")
    assert "fsdp" not in names and names == ["fp8", "default"]
    assert "1 recorded case did not pass when recorded (fsdp: fail): not selected" in why
    assert reach.read_record(tmp_path).ran_by()["v0"] == ["default", "fp8", "fsdp"]  # still the explanation's


def test_the_case_with_a_golden_for_the_runs_device_kind_is_picked_first(tmp_path):
    v016_record(tmp_path, {"fsdp": "fail", "fp8": "pass", "default": "pass"})
    names, why = reach.select(tmp_path, "cases", 720.0, golden=["default"]) or ([], "")
    assert names == ["default", "fp8"] and "default first: it has a golden for this run's device kind" in why
    # a budget the golden case does not fit: the cover as before, the line says why
    names, why = reach.select(tmp_path, "cases", 100.0, golden=["default"]) or ([], "")
    assert names == ["fp8"] and "default has a golden but does not fit the budget" in why


def test_of_many_cases_with_goldens_only_the_one_running_most_sites_per_second_is_picked_first(tmp_path):
    # A line whose sweep recorded goldens for dozens of cases (v0.19: 34): taking them all first, by name,
    # filled the budget with cases that add no site (11 cases, the first ones alphabetically) and left
    # out the cases the cover is for. One golden case is the check a golden gives; the rest are picked
    # only for the sites they add.
    cases = {
        "a_dup": Entry(frozenset("s1 s2".split()), 100.0, outcome="pass"),
        "b_dup": Entry(frozenset("s1 s2".split()), 100.0, outcome="pass"),
        "default": Entry(frozenset("s1 s2 s3".split()), 100.0, outcome="pass"),
        "fp8": Entry(frozenset("s1 s4".split()), 100.0, outcome="pass"),
    }
    write_record(tmp_path, "c0ffee", cases, {})
    names, why = reach.select(tmp_path, "cases", 720.0, golden=["a_dup", "b_dup", "default"]) or ([], "")
    assert names == ["default", "fp8"]
    assert (
        "default first: of the 3 cases with a golden for this run's device kind, it runs the most port sites per second"
        in why
    )
    # the best golden case does not fit: the next best that does
    names, why = reach.select(tmp_path, "cases", 100.0, golden=["a_dup", "default"]) or ([], "")
    assert names == ["default"]
    cases["default"] = Entry(frozenset("s1 s2 s3".split()), 150.0, outcome="pass")
    write_record(tmp_path, "c0ffee", cases, {})
    names, why = reach.select(tmp_path, "cases", 120.0, golden=["a_dup", "default"]) or ([], "")
    assert names == ["a_dup"] and "a_dup first" in why


def test_a_record_without_outcomes_treats_them_as_unknown_and_says_so(tmp_path):
    v016_record(tmp_path, {})  # written before outcomes were recorded
    data = json.loads((tmp_path / "reach.json").read_text())
    assert "outcome" not in data["cases"]["fsdp"]
    names, why = reach.select(tmp_path, "cases", 720.0, golden=["default"]) or ([], "")
    # the golden case first; the FSDP case then adds no site: v0.16's record picks default and fp8
    assert names == ["default", "fp8"]
    assert "3 recorded cases have no recorded outcome (recorded before outcomes were): treated as unknown" in why


def test_an_outcome_round_trips_and_a_bad_one_is_named(tmp_path):
    v016_record(tmp_path, {"fsdp": "fail", "fp8": "pass"})
    record = reach.read_record(tmp_path)
    assert record is not None and record.cases["fsdp"].outcome == "fail" and record.cases["default"].outcome is None
    data = json.loads((tmp_path / "reach.json").read_text())
    data["cases"]["fp8"]["outcome"] = 3
    (tmp_path / "reach.json").write_text(json.dumps(data))
    with pytest.raises(BadInput, match=r"cases\['fp8'\].outcome is not a stage status"):
        reach.read_record(tmp_path)


# The v0.16 record's unit-test files as measured (docs/reach.md): test_upcycling.py and
# test_te_layers_batch_invariant.py each had 3 tests `unverified` (the unported tree raised another
# exception type), which fails stage 3; test_gpt_model.py was clean; test_attention.py recorded before
# outcomes were.
UPCYCLING = "tests/unit_tests/transformer/moe/test_upcycling.py"
INVARIANT = "tests/unit_tests/transformer/test_te_layers_batch_invariant.py"
GPT_MODEL = "tests/unit_tests/models/test_gpt_model.py"
ATTENTION = "tests/unit_tests/transformer/test_attention.py"


def v016_unit_record(series_dir: Path) -> None:
    blocking = ("port-regression", "unverified", "missing-dependency", "not-run")
    tests = {
        UPCYCLING: reach.unit_entry(frozenset({"v0", "grouped", "u1"}), 110.0, {"unverified": 3}, blocking),
        INVARIANT: reach.unit_entry(
            frozenset({"v0", "gemm", "own"}), 11.0, {"unverified": 3, "upstream-known": 11}, blocking
        ),
        GPT_MODEL: reach.unit_entry(frozenset({"v0", "v1"}), 20.0, {}, blocking),
        ATTENTION: Entry(frozenset({"v0", "v1", "cp"}), 86.0),
    }
    write_record(series_dir, "c0ffee", {}, tests)


def test_a_test_file_whose_recorded_run_had_blocking_labels_is_not_selected_and_the_line_names_it(tmp_path):
    v016_unit_record(tmp_path)
    data = json.loads((tmp_path / "reach.json").read_text())
    assert data["unit_tests"][INVARIANT] == {
        "sites": ["gemm", "own", "v0"],
        "seconds": 11.0,
        "outcome": "blocks",
        "labels": {"unverified": 3, "upstream-known": 11},
        "blocking": ["unverified"],
    }
    assert data["unit_tests"][GPT_MODEL]["outcome"] == "clean" and data["unit_tests"][GPT_MODEL]["blocking"] == []
    assert "outcome" not in data["unit_tests"][ATTENTION]  # as a record made before outcomes were
    names, why = reach.select(tmp_path, "unit_tests", 480.0) or ([], "")
    # by the cover alone the two blocking files came first (new sites per second); left out, they are not run
    assert reach.greedy_cover(reach.read_record(tmp_path).unit_tests, 480.0)[0] == INVARIANT
    assert names == [GPT_MODEL, ATTENTION]
    assert (
        f"; 2 recorded test files had tests labelled to fail stage 3 when recorded ({UPCYCLING}: 3 unverified; "
        f"{INVARIANT}: 3 unverified): not selected"
    ) in why
    assert "1 recorded test file has no recorded outcome (recorded before outcomes were): treated as unknown" in why
    # their sites still explain an unreached site (reachable, not selected)
    assert reach.read_record(tmp_path).ran_by()["grouped"] == [UPCYCLING]


def test_a_test_file_s_outcome_is_made_from_stage_3_s_labels_of_its_tests():
    from rocmport.verify.stages.unit_tests.results import BLOCKING, FileRun, UnitTestsRun

    run = UnitTestsRun(
        labels={
            f"{UPCYCLING}::TestTEUpcycling::test_a[2]": "unverified",
            f"{UPCYCLING}::TestTEUpcycling::test_b[2]": "unverified",
            f"{INVARIANT}::test_c": "upstream-known",
            "tests/unit_tests/test_broken.py": "port-regression",  # its module does not import
        },
        files={
            UPCYCLING: FileRun("ran"),
            INVARIANT: FileRun("ran"),
            GPT_MODEL: FileRun("ran"),
            "tests/unit_tests/test_broken.py": FileRun("collection-error"),
            "tests/unit_tests/test_left.py": FileRun("not-collected"),
        },
    )
    by_file = run.labels_by_file()
    assert by_file == {
        UPCYCLING: {"unverified": 2},
        INVARIANT: {"upstream-known": 1},
        GPT_MODEL: {},
        "tests/unit_tests/test_broken.py": {"port-regression": 1},
    }
    outcomes = {f: reach.unit_entry(frozenset(), 1.0, c, BLOCKING) for f, c in by_file.items()}
    assert {f: (e.outcome, e.blocking) for f, e in outcomes.items()} == {
        UPCYCLING: ("blocks", ("unverified",)),
        INVARIANT: ("clean", ()),  # upstream-known does not fail stage 3
        GPT_MODEL: ("clean", ()),
        "tests/unit_tests/test_broken.py": ("blocks", ("port-regression",)),
    }
    # stage 3 did not label its tests (it stopped): no outcome, as before
    assert reach.unit_entry(frozenset(), 1.0, None, BLOCKING).outcome is None


@pytest.mark.parametrize(
    "entry, says",
    [
        ({"outcome": "pass", "labels": {}, "blocking": []}, "outcome is 'pass', a test file's is clean or blocks"),
        ({"outcome": "blocks", "labels": {"unverified": True}, "blocking": ["unverified"]}, ".labels is not a mapping"),
        ({"outcome": "blocks", "labels": {"unverified": 0}, "blocking": ["unverified"]}, ".labels is not a mapping"),
        ({"outcome": "clean", "labels": {}}, ".blocking is not a list of labels among its labels"),
        ({"outcome": "blocks", "labels": {"flaky": 1}, "blocking": ["unverified"]}, ".blocking is not a list of"),
        ({"outcome": "clean", "labels": {"unverified": 1}, "blocking": ["unverified"]}, "outcome clean disagrees"),
        ({"outcome": "blocks", "labels": {"flaky": 1}, "blocking": []}, "outcome blocks disagrees"),
        ({"labels": {"flaky": 1}}, "has labels or blocking but no outcome"),
    ],
)
def test_a_bad_test_file_outcome_is_one_line_naming_the_file(tmp_path, entry, says):
    v016_unit_record(tmp_path)
    data = json.loads((tmp_path / "reach.json").read_text())
    data["unit_tests"][UPCYCLING] = {"sites": ["v0"], "seconds": 1.0, **entry}
    (tmp_path / "reach.json").write_text(json.dumps(data))
    with pytest.raises(BadInput) as err:
        reach.read_record(tmp_path)
    message = str(err.value)
    assert message.startswith(f"{tmp_path / 'reach.json'}: not a reach record (unit_tests[{UPCYCLING!r}]")
    assert says in message and "\n" not in message


def test_a_test_file_run_in_part_is_not_recorded_as_the_whole_file():
    """`--unit-test FILE::test` runs some of a file's tests: its sites and seconds are not the file's,
    which is what `--unit-tests reach` would run for them."""
    a2a = "tests/unit_tests/a2a_overlap/test_schedule_layer_1f1b.py"
    selected = [
        f"{a2a}::TestA2AOverlap::test_transformer_layer_overlap",
        f"{GPT_MODEL}::TestGPTModel::test_constructor",
        GPT_MODEL,  # named whole too: recorded
        f"{ATTENTION}::test_x",
        "tests/unit_tests/transformer/",  # a directory named whole: its files are whole
    ]
    assert reach.files_run_in_part(selected) == {a2a}
    assert reach.files_run_in_part([GPT_MODEL, UPCYCLING]) == set()


# --- the record's schema -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, says",
    [
        ("{not json", "not valid JSON"),
        ("[]", "not a JSON object"),
        (json.dumps({"schema": 9}), "schema 9"),
        (
            json.dumps(
                {
                    "schema": 1,
                    "line": "v0.16",
                    "partial": True,
                    "recorded_on": {"upstream": "a", "recipe": "b"},
                    "cases": {"c": {"sites": ["x"], "seconds": -3}},
                }
            ),
            "cases['c'].seconds is not a number of seconds",
        ),
        (
            json.dumps(
                {
                    "schema": 1,
                    "line": "v0.16",
                    "partial": True,
                    "recorded_on": {"upstream": "a", "recipe": "b"},
                    "unit_tests": {"t.py": {"sites": "x", "seconds": 1}},
                }
            ),
            "unit_tests['t.py'].sites is not a list of strings",
        ),
        (
            json.dumps(
                {
                    "schema": 1,
                    "line": "v0.16",
                    "partial": True,
                    "recorded_on": {"upstream": "a", "recipe": "b"},
                    "cases": {"c": {"sites": ["x"], "seconds": 1, "codemods": {"capability-gates": 3}}},
                }
            ),
            "cases['c'].codemods is not a mapping of codemod names to versions (strings)",
        ),
        (
            json.dumps(
                {
                    "schema": 1,
                    "line": "v0.16",
                    "partial": True,
                    "recorded_on": {"upstream": "a", "recipe": "b"},
                    "unit_tests": {"t.py": {"sites": ["x"], "seconds": 1, "codemods": ["capability-gates"]}},
                }
            ),
            "unit_tests['t.py'].codemods is not a mapping of codemod names to versions (strings)",
        ),
    ],
)
def test_a_broken_record_is_one_line_naming_the_file(tmp_path, text, says):
    (tmp_path / "reach.json").write_text(text)
    with pytest.raises(BadInput) as err:
        reach.read_record(tmp_path)
    message = str(err.value)
    assert str(tmp_path / "reach.json") in message and says in message and "\n" not in message


@pytest.mark.torch
def test_unit_tests_reach_with_a_broken_record_exits_2_naming_it(tmp_path, capsys):
    tree, series_dir, _ = ported_tree(tmp_path)
    (series_dir / "reach.json").write_text('{"schema": 1}')
    code = main(["-C", str(tmp_path), "verify", "--tree", str(tree), "--unit-tests", "reach", "--dry-run"])
    err = capsys.readouterr().err
    assert code == 2 and str(series_dir / "reach.json") in err and "not a reach record" in err


# --- recording, per case and per test file -----------------------------------------------------


@pytest.mark.torch
def test_each_case_and_test_file_records_its_own_sites_and_the_record_names_them_stably(tmp_path):
    tree, series_dir, base = ported_tree(tmp_path)
    boot = firewall.write_bootstrap(tmp_path / "boot")
    records = tmp_path / "sites"
    (records / "functional").mkdir(parents=True)
    # stage 4's seam: the case's processes record into the case's own directory, its seconds beside them
    case_env = functional.case_sites_env(protocol.PORT_SITES.entry(str(records / "functional")), CASE)
    run_in(tree, boot, case_env, "from megatron.core import a; a.probe()")
    functional.note_case_seconds(case_env, 42.5, "pass")
    # stage 3: verify's pytest plugin points the records at each test file's directory in turn
    (records / "unit-tests").mkdir()
    env = environment.child_env(tree, boot, protocol.PORT_SITES.entry(str(records / "unit-tests")))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "rocmport.verify.runtime.pytest_plugin",
            "-p",
            "no:cacheprovider",
            "--rootdir",
            str(tree),
            TEST_ARCH,
            TEST_PROBE,
        ],
        env=env,
        cwd=tree,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    units = port_sites.read_units(records, tree)
    assert {k for k in units if k[0] != "stage"} == {("case", CASE), ("test", TEST_ARCH), ("test", TEST_PROBE)}
    assert units["case", CASE].seconds == 42.5 and "megatron/core/a.py" in units["case", CASE].modules
    assert units["case", CASE].outcome == "pass" and units["test", TEST_ARCH].outcome is None
    assert units["test", TEST_ARCH].calls == {("megatron/core/a.py", 6)}  # arch() only: probe() is the other file's
    assert units["test", TEST_PROBE].calls == {("megatron/core/a.py", 11)}

    seconds = {("test", TEST_ARCH): 3.0, ("test", TEST_PROBE): 2.0}
    # stage 3 labelled test_probe.py's test unverified (its own label counts; test_arch.py's: none)
    labels = {TEST_PROBE: {"unverified": 1}}
    path, record = reach.record_run(
        series_dir, tree, records, seconds, None, (1, 2), file_labels=labels, blocking=("unverified",)
    )
    key = keys_of(tree, base)
    data = json.loads(path.read_text())
    assert path == series_dir / "reach.json" and data["recorded_on"]["upstream"] == base
    assert data["cases"][CASE] == {
        "sites": [key["megatron/core/a.py:11 is_hip"]],
        "seconds": 42.5,
        "modules": sorted(units["case", CASE].modules),
        "outcome": "pass",
    }
    # test_arch.py: no labels given for it (stage 3 did not label it): no outcome recorded
    assert data["unit_tests"][TEST_ARCH] == {"sites": [key["megatron/core/a.py:6 nvidia_arch_major"]], "seconds": 3.0}
    assert data["unit_tests"][TEST_PROBE] == {
        "sites": [key["megatron/core/a.py:11 is_hip"]],
        "seconds": 2.0,
        "outcome": "blocks",
        "labels": {"unverified": 1},
        "blocking": ["unverified"],
    }
    assert (
        key["megatron/core/a.py:6 nvidia_arch_major"]
        == "megatron/core/a.py::arch nvidia_arch_major#1 [capability-gates]"
    )
    # 1 of 1 case and 2 of 2 test files: a full record of this tree
    assert data["partial"] is False and data["holds"].startswith("1 of 1 GPT cases and 2 of 2 unit-test files")
    assert reach.read_record(series_dir) == record
    # recorded again on the same recipe, against a tree with more cases than recorded: the entries
    # stay, and the record says it is partial
    _, again = reach.record_run(series_dir, tree, records, seconds, None, (5, 2))
    assert again.cases == record.cases and again.partial and again.holds.startswith("1 of 5 GPT cases")
    # a run that ran test_arch.py in part (a test id): its entry stays as the whole file's run left it
    _, part = reach.record_run(series_dir, tree, records, {("test", TEST_ARCH): 0.5}, None, (5, 2), in_part=[TEST_ARCH])
    assert part.unit_tests[TEST_ARCH] == record.unit_tests[TEST_ARCH] and part.unit_tests[TEST_ARCH].seconds == 3.0


def test_stable_keys_survive_lines_moving(tmp_path):
    """The same site after an upstream edit above it: another line, the same key."""
    tree, _, base = ported_tree(tmp_path)
    before = keys_of(tree, base)
    (tree / "megatron/core/a.py").write_text("# a comment upstream added\n\n" + A_AFTER)
    commit(tree, "codemod: capability-gates 1")  # the same codemod's commit rewrote the file again
    after = keys_of(tree, base)
    assert "megatron/core/a.py:6 nvidia_arch_major" in before and "megatron/core/a.py:8 nvidia_arch_major" in after
    assert before["megatron/core/a.py:6 nvidia_arch_major"] == after["megatron/core/a.py:8 nvidia_arch_major"]


# --- selection: --unit-tests reach and the reach cases -----------------------------------------


def write_record(series_dir: Path, upstream: str, cases: dict[str, Entry], tests: dict[str, Entry]) -> None:
    reach.write_record(
        series_dir,
        reach.ReachRecord(
            line=series_dir.name,
            upstream=upstream,
            recipe=reach.recipe_digest(series_dir),
            cases=cases,
            unit_tests=tests,
            partial=True,
            holds="a hand-made record",
        ),
    )


@pytest.mark.torch
def test_unit_tests_reach_selects_by_the_record_and_falls_back_to_the_default_files_without_one(tmp_path):
    tree, series_dir, base = ported_tree(tmp_path)
    settings = suite.VerifySettings()
    unit, _ = unit_options(settings, base, tmp_path / "c", tree, "reach", (), 2, series_dir=series_dir)
    assert unit is not None and unit.selection == "fallback"  # no record: the default files
    assert unit.tests == list(suite.FALLBACK_TESTS) and unit.reach_why.startswith("reach: no recorded test file in ")

    write_record(
        series_dir,
        base,
        {},
        {
            TEST_ARCH: Entry(frozenset({"s1", "s2"}), 30.0),
            TEST_PROBE: Entry(frozenset({"s1"}), 5.0),
            "tests/unit_tests/test_gone.py": Entry(frozenset({"s9", "s8", "s7"}), 1.0),  # not in this tree
        },
    )
    unit, _ = unit_options(settings, base, tmp_path / "c", tree, "reach", (), 2, series_dir=series_dir)
    assert unit is not None and unit.selection == "reach" and unit.tests == [TEST_PROBE, TEST_ARCH]
    assert "2 of 3 recorded test files run 2 of the 2 port sites" in unit.reach_why
    assert "1 recorded test files not in this tree" in unit.reach_why
    # a budget only the cheaper file fits
    unit, _ = unit_options(
        settings, base, tmp_path / "c", tree, "reach", (), 2, series_dir=series_dir, reach_budget=10.0
    )
    assert unit is not None and unit.tests == [TEST_PROBE]
    with pytest.raises(BadInput, match="--unit-reach-budget 10: only with --unit-tests reach"):
        unit_options(settings, base, tmp_path / "c", tree, "default", (), 2, series_dir=series_dir, reach_budget=10.0)


@pytest.mark.torch
def test_reach_cases_picks_the_tree_s_recorded_cases_and_says_when_the_recipe_changed(tmp_path):
    tree, series_dir, base = ported_tree(tmp_path)
    assert reach.reach_cases(series_dir, tree) is None  # no record
    write_record(
        series_dir,
        base,
        {CASE: Entry(frozenset({"s1"}), 40.0), "gpt3_not_here": Entry(frozenset({"s2", "s3"}), 10.0)},
        {},
    )
    names, why = reach.reach_cases(series_dir, tree) or ([], "")
    assert names == [CASE] and "recorded on another recipe" not in why
    (series_dir / "series").write_text((series_dir / "series").read_text() + "# changed\n")
    _, why = reach.reach_cases(series_dir, tree) or ([], "")
    assert "recorded on another recipe" in why
    # the tree at another upstream commit than the record's: said once, after the recipe's note (said once)
    state = wt.read_state(tree)
    assert state is not None
    other = "f" * 40
    wt.write_state(tree, wt.ApplyState(status="done", base=other, series=state.series, codemods=state.codemods))
    _, why = reach.reach_cases(series_dir, tree) or ([], "")
    assert why.endswith(f"; recorded at upstream {base[:12]}, the tree is at {other[:12]}"), why
    assert why.count("recorded on another recipe") == 1 and why.count("recorded at upstream") == 1


# --- every site run or explained ---------------------------------------------------------------


@pytest.mark.torch
def test_each_unreached_site_is_classified_and_the_share_of_non_gpu_sites_counted(tmp_path):
    tree, series_dir, base = ported_tree(tmp_path)
    key = keys_of(tree, base)
    # the record: a case ran probe(); nothing recorded ran arch() or the legacy module
    write_record(series_dir, base, {CASE: Entry(frozenset({key["megatron/core/a.py:11 is_hip"]}), 30.0)}, {})
    boot = firewall.write_bootstrap(tmp_path / "boot")
    records = tmp_path / "sites"
    (records / "gpt-training").mkdir(parents=True)
    # this run imports a.py (and calls arch()): probe() is left to the case reach did not select
    run_in(
        tree,
        boot,
        protocol.PORT_SITES.entry(str(records / "gpt-training")),
        "from megatron.core import a\ntry:\n    a.arch()\nexcept Exception:\n    pass",
    )

    def explain(coverage, sites):
        reach.classify(coverage, sites, series_dir, case_plan.gpu_only_reasons(tree))

    cov = port_sites.tree_coverage(tree, records, ("gpt-training",), explain=explain)
    gates, fa = cov["capability-gates"], cov["flash-attention-hooks"]
    assert gates.classified["megatron/core/a.py:11 is_hip"] == f"reachable, not selected (ran by {CASE} when recorded)"
    legacy = gates.classified["megatron/legacy/b.py:5 nvidia_arch_major"]
    assert legacy.startswith("not-on-proxy (module never imported: legacy model code") and "no recorded case" in legacy
    assert fa.classified["megatron/core/fa.py:5 is_hip"].startswith("gpu-only (--use-flash-attn")
    assert gates.by_class == {"gpu-only": 0, "not-on-proxy": 1, "reachable, not selected": 1}
    assert reach.share_run(cov) == (1, 3)  # arch() ran; 4 sites, 1 gpu-only
    # with a GPU-only case in the tree, its case_plan reason is the one given
    flash_case = tree / "tests/functional_tests/test_cases/gpt/gpt3_flash/model_config.yaml"
    flash_case.parent.mkdir()
    flash_case.write_text("MODEL_ARGS:\n  --use-flash-attn: true\n")
    cov = port_sites.tree_coverage(tree, records, ("gpt-training",), explain=explain)
    assert cov["flash-attention-hooks"].classified["megatron/core/fa.py:5 is_hip"] == (
        "gpu-only (--use-flash-attn: the flash-attn package's CUDA kernels (e.g. case gpt3_flash))"
    )


def test_a_site_taken_only_with_a_gpu_feature_on_is_gpu_only_by_its_condition():
    """The TE gates under `if self.config.tp_comm_overlap` (TE's userbuffers) were counted not-on-proxy:
    their condition says the flag, and the flag is GPU-only."""
    key = "megatron/core/extensions/transformer_engine.py::TELinear.__init__ te_gate#2 [te-version-gates]"
    args = ("te-version-gates", "megatron/core/extensions/transformer_engine.py", "te_gate", key, "why", {}, {})
    when = "self.config.tp_comm_overlap and parallel_mode != 'duplicated'"
    assert reach.site_class(*args, None, when) == (
        f"gpu-only (--tp-comm-overlap: TE's userbuffers (CUDA IPC); taken only when `{when}`)"
    )
    # a field that merely contains the name is not it; no condition: port coverage's reason
    assert reach.site_class(*args, None, "self.config.tp_comm_overlap_ag") == "not-on-proxy (why)"
    assert reach.site_class(*args, None) == "not-on-proxy (why)"
    # ran by a recorded entry: reachable, whatever its condition
    assert reach.site_class(*args[:5], {key: ["t.py"]}, {}, None, when).startswith("reachable, not selected")


def test_a_site_that_needs_a_device_torch_sees_is_not_on_proxy_saying_why_and_a_test_file_s_rewrite_is_not_gpu_only():
    """test_module.py's module-level `if torch.cuda.is_available(): nvidia_capability()` ran on no
    proxy run (the unit-test processes see no device): not-on-proxy, its reason the condition and why
    stage 3 does not take it; not gpu-only (no GPU feature: a ROCm GPU takes it, and stage 4's shim answers
    it). A flash-attention-hooks rewrite in a test file (`if is_hip(): HAVE_FA3 = False`) runs when the
    file is collected, and was counted gpu-only for its codemod."""
    cap = ("capability-gates", "tests/unit_tests/transformer/test_module.py", "nvidia_capability", "k", "why", {}, {})
    cls = reach.site_class(*cap, None, "torch.cuda.is_available()")
    assert cls.startswith("not-on-proxy (stage 3's processes see no device: torch.cuda.is_available() is False")
    assert cls.endswith("taken only when `torch.cuda.is_available()`)")
    assert reach.site_class(*cap, None, "not (torch.cuda.is_available())") == "not-on-proxy (why)"
    assert reach.site_class(*cap, None, "device.type == 'cuda'").startswith("gpu-only (a tensor on a GPU")
    ssm = ("capability-gates", "megatron/core/ssm/ops/mamba_ssm.py", "nvidia_arch_major", "k", "why", {}, {}, None)
    assert reach.site_class(*ssm) == "gpu-only (Mamba's Triton kernels, launched on a GPU)"
    fa = ("flash-attention-hooks", "tests/unit_tests/transformer/test_te_layers_batch_invariant.py", "is_hip")
    assert reach.site_class(*fa, "k", "why", {}, {}, None) == "not-on-proxy (why)"
    assert reach.site_class(
        "flash-attention-hooks", "megatron/core/a.py", "is_hip", "k", "why", {}, {}, None
    ).startswith("gpu-only (--use-flash-attn")


# --- a refresh hop's cases ---------------------------------------------------------------------


@pytest.mark.torch
def test_a_hop_runs_the_recorded_cases_its_upstream_change_reaches(tmp_path):
    from rocmport.refresh.report import hop_functional

    tree, series_dir, base = ported_tree(tmp_path)
    key = keys_of(tree, base)
    write_record(
        series_dir,
        base,
        {
            CASE: Entry(frozenset(), 30.0, frozenset({"megatron/core/a.py", "megatron/core/__init__.py"})),
            "gpt3_legacy": Entry(frozenset({key["megatron/legacy/b.py:5 nvidia_arch_major"]}), 30.0),
        },
        {},
    )
    # upstream moves on from the old pin: a.py changes (the hop's new pin), b.py does not
    g(tree, "checkout", "-q", "-b", "upstream-next", base)
    (tree / "megatron/core/a.py").write_text((tree / "megatron/core/a.py").read_text() + "\nX = 1\n")
    new = commit(tree, "upstream: a.py changed")
    g(tree, "checkout", "-q", "main")
    state = wt.read_state(tree)
    assert state is not None
    wt.write_state(tree, wt.ApplyState(status="done", base=new, series=state.series, codemods=state.codemods))
    assert reach.hop_cases(series_dir, ["megatron/core/a.py"]) == (
        [CASE],
        "1 of 2 recorded cases import a file or run a port site of the 1 files this hop changed",
    )
    assert reach.hop_cases(series_dir, ["megatron/legacy/b.py"])[0] == ["gpt3_legacy"]  # type: ignore[index]
    given, why = hop_functional(tree, base, ())
    assert given["with_functional"] is True and CASE in why and "gpt3_legacy" not in why
    assert given.get("cases", given.get("case")) == CASE
    given, why = hop_functional(tree, new, ())  # nothing changed since: stage 4 does not run
    assert given == {"with_functional": False} and why.endswith("stage 4 not run")


@pytest.mark.torch
def test_record_reach_writes_the_line_s_record_and_needs_a_series(tmp_path, capsys):
    tree, series_dir, base = ported_tree(tmp_path)
    assert main(["-C", str(tmp_path), "verify", "--tree", str(tree), "--stages", "1", "--record-reach"]) == 0
    record = reach.read_record(series_dir)
    assert record is not None and record.upstream == base and record.recipe == reach.recipe_digest(series_dir)
    # stage 1 runs no case and no test file: an empty, partial record of this tree's 1 case and 2 files
    assert (record.cases, record.unit_tests, record.partial) == ({}, {}, True)
    assert record.holds.startswith("0 of 1 GPT cases and 0 of 2 unit-test files")
    out, err = capsys.readouterr()
    assert f"reach record: {series_dir / 'reach.json'}" in err
    # the summary: each codemod's unreached sites by class, and the share of the non-GPU-only ones that ran
    assert "capability-gates: 0 of 3 rewritten sites ran" in out and "[unreached: 3 not-on-proxy]" in out
    assert "[unreached: 1 gpu-only]" in out and "0 of the 3 sites that are not gpu-only ran (0%)" in out
    # a tree `rocmport apply` did not make has no series to record beside
    state = wt.read_state(tree)
    assert state is not None
    wt.write_state(tree, wt.ApplyState(status="done", base=base, codemods=state.codemods))
    code = main(["-C", str(tmp_path), "verify", "--tree", str(tree), "--stages", "1", "--record-reach"])
    err = capsys.readouterr().err
    assert code == 2 and "--record-reach needs a tree made by `rocmport apply`" in err and len(err.splitlines()) == 1


@pytest.mark.torch
def test_a_copied_project_records_into_its_own_series_not_the_one_it_was_copied_from(tmp_path, capsys):
    """apply keeps the series' absolute path in the tree's state; a project copied with `cp -a` kept
    the original's, and --record-reach in the copy wrote the original project's reach.json (seen: an
    engineer's copy wrote into the shared project). The tree's own project's series is the one read."""
    tree, series_dir, _ = ported_tree(tmp_path / "orig")
    copy = tmp_path / "copy"
    shutil.copytree(tmp_path / "orig", copy, symlinks=True)
    copied_tree = copy / tree.relative_to(tmp_path / "orig")
    copied_series = copy / series_dir.relative_to(tmp_path / "orig")
    assert main(["-C", str(copy), "verify", "--tree", str(copied_tree), "--stages", "1", "--record-reach"]) == 0
    assert reach.read_record(copied_series) is not None
    assert reach.read_record(series_dir) is None, "the original project's record was written"
    assert f"reach record: {copied_series / 'reach.json'}" in capsys.readouterr().err


@pytest.mark.torch
def test_a_verify_run_finds_the_port_s_sites_once_for_its_three_readers(tmp_path, capsys, monkeypatch):
    """Stage 1's guard probe, --record-reach's record and the report's coverage read the same sites:
    one run parses and blames the files the codemods touched once (find_sites), not once per reader."""
    tree, series_dir, base = ported_tree(tmp_path)
    searched: list[Path] = []
    find_sites = port_sites.find_sites

    def counted(tree: Path, base: str) -> list[port_sites.Site]:
        searched.append(tree)
        return find_sites(tree, base)

    monkeypatch.setattr(port_sites, "find_sites", counted)
    # --no-html: the report's page, rendered from the written JSON, finds the sites' extents on its own
    code = main(["-C", str(tmp_path), "verify", "--tree", str(tree), "--stages", "1", "--record-reach", "--no-html"])
    out = capsys.readouterr().out
    assert code == 0 and searched == [tree.resolve()]
    # and each reader had them: the record counts the tree's 4 sites, the report's coverage each codemod's
    assert reach.read_record(series_dir).holds.endswith("of the 4 port sites run")
    assert "capability-gates: 0 of 3 rewritten sites ran" in out and "flash-attention-hooks: 0 of 1" in out


# --- a record made of several runs -------------------------------------------------------------


def record_case(tree: Path, boot: Path, records: Path, case: str, code: str, seconds: float) -> None:
    """Stage 4's seam for one case: its processes record into the case's own directory under
    ``records``, its wall seconds and outcome beside them."""
    (records / "functional").mkdir(parents=True, exist_ok=True)
    env = functional.case_sites_env(protocol.PORT_SITES.entry(str(records / "functional")), case)
    run_in(tree, boot, env, code)
    functional.note_case_seconds(env, seconds, "pass")


@pytest.mark.torch
def test_recording_again_replaces_the_entries_it_ran_and_keeps_the_others(tmp_path):
    """A record grown over several runs (one case at a time, as `--cases NAME --record-reach` makes
    it): what a run recorded replaces its entries, the others stay as they were."""
    tree, series_dir, base = ported_tree(tmp_path)
    boot = firewall.write_bootstrap(tmp_path / "boot")
    key = keys_of(tree, base)
    probe, arch, flash = (
        key["megatron/core/a.py:11 is_hip"],
        key["megatron/core/a.py:6 nvidia_arch_major"],
        key["megatron/core/fa.py:5 is_hip"],
    )
    first = tmp_path / "run1"
    record_case(tree, boot, first, CASE, "from megatron.core import a; a.probe()", 40.0)
    record_case(tree, boot, first, "gpt3_other", "from megatron.core import a; a.probe()", 30.0)
    reach.record_run(series_dir, tree, first, {}, "2.12.0", (3, 2))
    second = tmp_path / "run2"
    arch_code = "from megatron.core import a\ntry:\n    a.arch()\nexcept Exception:\n    pass\n"
    record_case(tree, boot, second, "gpt3_other", arch_code, 20.0)
    record_case(tree, boot, second, "gpt3_third", "from megatron.core import fa; fa.flash()", 10.0)
    _, record = reach.record_run(series_dir, tree, second, {}, "2.12.0", (3, 2))
    got = {name: (sorted(e.sites), e.seconds) for name, e in record.cases.items()}
    assert got == {
        CASE: ([probe], 40.0),  # not run again: kept
        "gpt3_other": ([arch], 20.0),  # run again: replaced, its old site and seconds gone
        "gpt3_third": ([flash], 10.0),  # new
    }
    assert reach.read_record(series_dir) == record
    assert record.holds.startswith("3 of 3 GPT cases and 0 of 2 unit-test files, 3 of the")


def port_record(tree: Path, series_dir: Path, base: str) -> bytes:
    """The line's record of this port with TE 2.12.0, holding one case; its bytes."""
    reach.write_record(
        series_dir,
        reach.ReachRecord(
            line=series_dir.name,
            upstream=base,
            recipe=reach.recipe_digest(series_dir),
            te="2.12.0",
            cases={CASE: Entry(frozenset({"s1"}), 40.0)},
            holds="1 of 1 GPT cases",
        ),
    )
    return reach.record_path(series_dir).read_bytes()


@pytest.mark.parametrize(
    "other, says",
    [
        ("upstream", "made on upstream 000000000000 (this run: "),
        ("recipe", "made on another recipe (the series file or its patches changed since)"),
        ("te", "made on TE 2.12.0 (this run: 2.17.1)"),
    ],
)
def test_a_record_of_another_port_is_refused_naming_the_file_and_left_as_it_was(tmp_path, other, says):
    tree, series_dir, base = ported_tree(tmp_path)
    before = port_record(tree, series_dir, base)
    te = "2.12.0"
    if other == "upstream":  # the record was made at another upstream commit
        data = json.loads(before)
        data["recorded_on"]["upstream"] = "0" * 40
        reach.record_path(series_dir).write_text(json.dumps(data))
        before = reach.record_path(series_dir).read_bytes()
    elif other == "recipe":  # the series changed since
        (series_dir / "series").write_text((series_dir / "series").read_text() + "# a new patch\n")
    else:
        te = "2.17.1"
    (tmp_path / "sites" / "functional").mkdir(parents=True)
    with pytest.raises(BadInput) as err:
        reach.record_run(series_dir, tree, tmp_path / "sites", {}, te, (1, 2))
    message = str(err.value)
    assert message.startswith(f"{series_dir / 'reach.json'}: --record-reach adds to this record, {says}")
    assert "move reach.json aside" in message and "\n" not in message
    assert reach.record_path(series_dir).read_bytes() == before  # nothing lost


@pytest.mark.torch
def test_verify_record_reach_refuses_a_record_of_another_port_before_running_anything(tmp_path, capsys):
    tree, series_dir, base = ported_tree(tmp_path)
    before = port_record(tree, series_dir, base)
    # a run without --te would add Megatron's local spec to a record made with TE 2.12.0: refused at
    # once (--dry-run: before any launch), not after the run's minutes
    code = main(["-C", str(tmp_path), "verify", "--tree", str(tree), "--stages", "1", "--record-reach", "--dry-run"])
    out, err = capsys.readouterr()
    assert code == 2 and len(err.splitlines()) == 1 and "made on TE 2.12.0 (this run: none)" in err
    assert str(series_dir / "reach.json") in err and "python" not in out  # no launch listed
    assert reach.record_path(series_dir).read_bytes() == before


# --- the codemod versions each entry was recorded with -------------------------------------------

REPO = Path(__file__).resolve().parents[1]
GATES = DECLARED["capability-gates"].version  # what an apply of the recipe runs now
HOOKS = DECLARED["flash-attention-hooks"].version
OLDER = str(int(GATES) - 1)  # capability-gates before its last bump
PROBE = "from megatron.core import a; a.probe()"


def applied(tree: Path, series_dir: Path, gates: str) -> None:
    """The tree as `rocmport apply` leaves it with capability-gates at version ``gates``: its state
    names each codemod layer it ran with its version; the series runs both codemods."""
    (series_dir / "series").write_text(
        'upstream: megatron-lm\nline: v0.16\nversions: ">=0.16.0rc0,<0.17.0rc0"\npatches: []\n'
        "codemods: [capability-gates, flash-attention-hooks]\n"
    )
    state = wt.read_state(tree)
    assert state is not None
    for layer in state.codemods:
        layer["version"] = gates if layer["name"] == "capability-gates" else HOOKS
    wt.write_state(tree, state)


@pytest.mark.torch
def test_each_entry_keeps_the_codemod_versions_it_ran_and_a_bumped_codemod_is_named_until_re_recorded(tmp_path):
    """A codemod's bump can add, move or remove port sites (async-save-strategy 2 added one on v0.17+)
    without the series file changing: the record names the entries recorded on the older version."""
    tree, series_dir, _ = ported_tree(tmp_path)
    boot = firewall.write_bootstrap(tmp_path / "boot")
    applied(tree, series_dir, OLDER)  # the tree was applied before capability-gates' bump
    record_case(tree, boot, tmp_path / "run1", CASE, PROBE, 40.0)
    path, _ = reach.record_run(series_dir, tree, tmp_path / "run1", {}, None, (2, 2))
    data = json.loads(path.read_text())
    assert data["cases"][CASE]["codemods"] == {"capability-gates": OLDER, "flash-attention-hooks": HOOKS}
    names, why = reach.reach_cases(series_dir, tree) or ([], "")
    assert names == [CASE]  # the note is the line's; the selection is the record's as before
    assert f"recorded with capability-gates {OLDER}, the recipe now runs {GATES}: re-record with --record-reach" in why
    assert "flash-attention-hooks" not in why and "not recorded" not in why
    # re-applied at the new version and another case recorded: the first case is still on the old one
    applied(tree, series_dir, GATES)
    record_case(tree, boot, tmp_path / "run2", "gpt3_other", PROBE, 30.0)
    reach.record_run(series_dir, tree, tmp_path / "run2", {}, None, (2, 2))
    _, why = reach.select(series_dir, "cases", 720.0) or ([], "")
    assert (
        f"1 of 2 cases were recorded with capability-gates {OLDER}, the recipe now runs {GATES}: "
        "re-record them with --record-reach" in why
    )
    # and re-recorded: every entry on the recipe's versions, nothing to say
    record_case(tree, boot, tmp_path / "run3", CASE, PROBE, 40.0)
    _, record = reach.record_run(series_dir, tree, tmp_path / "run3", {}, None, (2, 2))
    assert record.cases[CASE].codemods == (("capability-gates", GATES), ("flash-attention-hooks", HOOKS))
    _, why = reach.select(series_dir, "cases", 720.0) or ([], "")
    assert "capability-gates" not in why and "recipe now runs" not in why
    assert reach.read_record(series_dir) == record


def test_a_codemod_the_recipe_added_or_dropped_since_the_entries_were_recorded_is_named(tmp_path):
    (tmp_path / "series").write_text(
        'upstream: megatron-lm\nline: v0.16\nversions: ">=0.16.0rc0,<0.17.0rc0"\npatches: []\n'
        "codemods: [capability-gates, device-probes]\n"
    )
    ran = (("capability-gates", GATES), ("flash-attention-hooks", HOOKS))
    write_record(tmp_path, "c0ffee", {"a": Entry(frozenset({"s1"}), 10.0, codemods=ran)}, {})
    names, why = reach.select(tmp_path, "cases", 720.0) or ([], "")
    assert names == ["a"]
    probes = DECLARED["device-probes"].version
    assert f"recorded without device-probes, the recipe now runs it ({probes}): re-record with --record-reach" in why
    assert f"recorded with flash-attention-hooks {HOOKS}, which the recipe no longer runs" in why
    assert "capability-gates" not in why


@pytest.mark.parametrize("line", ["v0.16", "v0.19"])
def test_a_committed_record_made_before_codemod_versions_says_so_and_selects_as_before(tmp_path, line):
    """The committed records hold no codemod versions (their entries were recorded over days of
    codemod bumps): they load, their selection stands, and the line says the versions are unknown."""
    series_dir = tmp_path / line
    series_dir.mkdir()
    src = REPO / "patchsets" / "megatron-lm" / line
    for path in [src / "series", src / "reach.json", *src.glob("*.patch")]:
        shutil.copy(path, series_dir / path.name)
    names, why = reach.select(series_dir, "cases", reach.CASES_BUDGET_S) or ([], "")
    assert names and "codemod versions not recorded (recorded before records held them" in why
    # the same record with every entry stamped with the recipe's versions: the same selection, no note
    recipe = reach.recipe_codemods(series_dir)
    assert recipe is not None and "async-save-strategy" in recipe
    data = json.loads((series_dir / "reach.json").read_text())
    for kind in reach.KINDS:
        for entry in data.get(kind, {}).values():
            entry["codemods"] = recipe
    (series_dir / "reach.json").write_text(json.dumps(data))
    again, why = reach.select(series_dir, "cases", reach.CASES_BUDGET_S) or ([], "")
    assert again == names and "codemod versions" not in why and "recipe now runs" not in why


@pytest.mark.torch
def test_record_reach_says_which_entries_a_codemod_bump_left_on_the_old_version(tmp_path, capsys):
    tree, series_dir, _ = ported_tree(tmp_path)
    boot = firewall.write_bootstrap(tmp_path / "boot")
    applied(tree, series_dir, OLDER)
    record_case(tree, boot, tmp_path / "run1", CASE, PROBE, 40.0)
    reach.record_run(series_dir, tree, tmp_path / "run1", {}, None, (1, 2))
    applied(tree, series_dir, GATES)
    assert main(["-C", str(tmp_path), "verify", "--tree", str(tree), "--stages", "1", "--record-reach"]) == 0
    err = capsys.readouterr().err
    assert (
        f"reach record: recorded with capability-gates {OLDER}, the recipe now runs {GATES}: "
        "re-record with --record-reach" in err
    )
