"""verify's inputs, hostile or unlucky (issue 30): every path from the user confined where the README
says it must be, every size validated at the edge, every malformed option exit 2 with one line
naming it, a stage that checks nothing does not pass, and verify leaves nothing in the tree it
verifies. Each test here failed before its fix."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from rocmport.cli import main
from rocmport.port import worktree as wt
from rocmport.verify.orchestration import environment
from rocmport.verify.orchestration import firewall
from rocmport.verify.orchestration.device_kind import DeviceKind
from rocmport.verify.stages.functional import CASES
from rocmport.verify.orchestration.registry import NAMES

CASE = "gpt3_mcore_tp2_pp2_uninstall_te"
MODEL_CONFIG = (
    "MODEL_ARGS:\n  --num-layers: 2\n  --data-path: ${DATA_PATH}/text/shard00/my-gpt3_00_text_document\n"
    "  --vocab-file: ${DATA_PATH}/text/shard00/bpe/vocab.json\n  --data-cache-path: ${DATA_CACHE_PATH}\n"
)


def fake_tree(root: Path) -> Path:
    """A Megatron-LM-shaped tree: megatron.core with a module, pretrain_gpt.py, a unit test and a functional case."""
    files = {
        "megatron/__init__.py": "",
        "megatron/core/__init__.py": "X = 1\n",
        "megatron/core/utils.py": "Y = 2\n",
        "pretrain_gpt.py": "import megatron.core\n",
        "tests/unit_tests/test_a.py": "def test_a():\n    pass\n",
        f"{CASES}/{CASE}/model_config.yaml": MODEL_CONFIG,
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


@pytest.fixture()
def tree(tmp_path) -> Path:
    return fake_tree(tmp_path / "t")


def verify(capsys, tree: Path, *args: str) -> tuple[int, str, str]:
    rc = main(["verify", "--tree", str(tree), *args])
    out, err = capsys.readouterr()
    return rc, out, err


def files_under(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


# Items 1 and 2: --case is a case name under the tree's tests/functional_tests/test_cases/gpt.


@pytest.mark.torch
@pytest.mark.parametrize(
    "case",
    [
        "/ABS/evilcase",
        "../../../../../outside/evilcase",
        "/nonexistent/case",
        "..",
        ".",
        "gpt/../../evilcase",
        "",
        "a\nb",
        "evil\0case",
    ],
)
def test_case_outside_the_cases_directory_is_exit_2_before_anything_runs(tmp_path, capsys, tree, case):
    outside = tmp_path / "outside" / "evilcase"
    outside.mkdir(parents=True)
    (outside / "model_config.yaml").write_text(MODEL_CONFIG)
    case = case.replace("/ABS", str(tmp_path / "outside"))
    before = files_under(tmp_path)
    rc, out, err = verify(capsys, tree, "--case", case, "--stages", "4", "--dry-run")
    assert rc == 2, (out, err)
    assert "--case" in err and "tests/functional_tests/test_cases/gpt" in err and len(err.strip().splitlines()) == 1
    assert out == ""  # no launch planned with the outside case's args
    assert files_under(tmp_path) == before


@pytest.mark.torch
def test_record_golden_with_an_outside_case_writes_nothing(tmp_path, capsys, tree):
    """The probe: `verify --case /tmp/x/evilcase --stages 4 --record-golden` wrote /tmp/x/evilcase.cpu-proxy.json."""
    import shutil

    series = tmp_path / "patchsets" / "v0.16"  # a tree `apply` made, so --record-golden is taken
    shutil.copytree(Path(__file__).resolve().parents[1] / "patchsets" / "megatron-lm" / "v0.16", series)
    (tree / ".git").mkdir()
    wt.write_state(tree, wt.ApplyState(status="done", series=str(series / "series")))
    outside = tmp_path / "x" / "evilcase"
    outside.mkdir(parents=True)
    (outside / "model_config.yaml").write_text(MODEL_CONFIG)
    before = files_under(tmp_path / "x")
    rc, _, err = verify(capsys, tree, "--case", str(outside), "--stages", "4", "--record-golden", "--dry-run")
    assert rc == 2 and f"--case '{outside}': not a case name" in err
    assert files_under(tmp_path / "x") == before


@pytest.mark.torch
def test_case_that_is_a_symlink_out_of_the_tree_is_refused(tmp_path, capsys, tree):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "model_config.yaml").write_text(MODEL_CONFIG)
    (tree / CASES / "linked").symlink_to(outside)
    rc, _, err = verify(capsys, tree, "--case", "linked", "--stages", "4", "--dry-run")
    assert rc == 2 and "--case 'linked'" in err and "outside" in err


@pytest.mark.torch
def test_unknown_case_name_is_exit_2_naming_the_cases_there(capsys, tree):
    rc, _, err = verify(capsys, tree, "--case", "gpt3_typo", "--stages", "4")
    assert rc == 2 and "--case 'gpt3_typo'" in err and CASE in err


@pytest.mark.torch
def test_a_case_name_that_exists_still_plans_the_launch(capsys, tree):
    rc, out, err = verify(capsys, tree, "--case", CASE, "--stages", "4", "--dry-run")
    assert rc == 0, err
    assert "pretrain_gpt.py" in out


def test_golden_path_stays_in_the_goldens_directory(tmp_path):
    from rocmport.errors import BadInput
    from rocmport.verify.stages.functional import golden_path

    assert golden_path(tmp_path, CASE, "cpu-proxy") == tmp_path / "goldens" / f"{CASE}.cpu-proxy.json"
    for case in (str(tmp_path / "x" / "evil"), "../evil", "a/b"):
        with pytest.raises(BadInput):
            golden_path(tmp_path, case, "cpu-proxy")
    with pytest.raises(BadInput):
        golden_path(tmp_path, CASE, "../../x")
    # verify --te's device kind names the TE release: its dots are part of a plain name
    # (the v0.16 goldens `cpu-proxy-te2.9.0`, `cpu-proxy-te2.12.0` are read and written through it)
    assert golden_path(tmp_path, CASE, "cpu-proxy-te2.12.0").name == f"{CASE}.cpu-proxy-te2.12.0.json"
    for kind in ("cpu-proxy/../x", "", ".hidden", "cpu proxy"):
        with pytest.raises(BadInput):
            golden_path(tmp_path, CASE, kind)


def test_a_golden_that_cannot_be_named_is_refused_before_the_case_runs(tmp_path):
    """Stage 4 names its golden before it trains: a bad device kind costs no training run."""
    from rocmport.errors import BadInput
    from rocmport.verify.stages.functional import stage_functional

    tree = tmp_path / "tree"
    (tree / "tests" / "functional_tests" / "test_cases" / "gpt" / CASE).mkdir(parents=True)
    with pytest.raises(BadInput, match="not plain names"):
        stage_functional(
            tree,
            {},
            case=CASE,
            dp=1,
            iters=4,
            proxy=True,
            data_path=None,
            series_dir=tmp_path / "series",
            record=True,
            device_kind=DeviceKind("rocm", "../x"),
        )


# Item 8: sizes are validated at the edge, in a run and a --dry-run alike.


@pytest.mark.torch
@pytest.mark.parametrize(
    "args, message",
    [
        (["--dp", "-2"], "'--dp'"),
        (["--dp", "0"], "'--dp'"),
        (["--nproc", "-4"], "'--nproc'"),
        (["--nproc", "0"], "'--nproc'"),
        (["--tp", "99999999999999999999"], "'--tp'"),
        (["--pp", "99999999999999999999"], "'--pp'"),
        (["--dp", "99999999999999999999"], "'--dp'"),
        (["--tp", "-1"], "'--tp'"),
        (["--iters", "1"], "'--iters'"),
        (["--unit-nproc", "0"], "'--unit-nproc'"),
        (["--nnodes", "0"], "'--nnodes'"),
        (["--tp", "3"], "--tp 3: the verify model has 4 heads"),
        (["--pp", "3"], "--pp 3: the verify model has"),
        (["--dp", "65536"], "world size 262144"),
        (["--nproc", "6"], "--nproc 6 is not a multiple of tp×pp = 4"),
    ],
)
def test_bad_sizes_are_refused_even_with_dry_run(capsys, tree, args, message):
    rc, out, err = verify(capsys, tree, *args, "--stages", "2", "--dry-run")
    assert rc == 2, (out, err)
    assert message in err and out == ""


# Item 9: --unit-test paths resolve inside the tree's tests/unit_tests.


@pytest.mark.torch
@pytest.mark.parametrize(
    "path",
    [
        "/etc/passwd",
        "tests/unit_tests/../../../x",
        "tests/unit_tests/../../pretrain_gpt.py",
        "pretrain_gpt.py",
        "tests/unit_tests/link_out/x.py",
        "/ABS/tests/unit_tests/test_a.py",
    ],
)
def test_unit_test_paths_outside_tests_unit_tests_are_exit_2(tmp_path, capsys, tree, path):
    (tmp_path / "x").write_text("")
    (tree / "tests" / "unit_tests" / "link_out").symlink_to(tmp_path)
    (tmp_path / "x.py").write_text("def test_x():\n    pass\n")
    path = path.replace("/ABS", str(tree))
    rc, out, err = verify(capsys, tree, "--unit-test", path, "--stages", "3", "--dry-run")
    assert rc == 2, (out, err)
    assert "--unit-test" in err and "tests/unit_tests" in err and out == ""


@pytest.mark.torch
@pytest.mark.parametrize(
    "path",
    [
        "tests/unit_tests/test_a.py",
        "tests/unit_tests/test_a.py::test_a",
        "tests/unit_tests",
        "tests/unit_tests/sub/../test_a.py",
    ],
)
def test_unit_test_paths_inside_are_planned(capsys, tree, path):
    (tree / "tests" / "unit_tests" / "sub").mkdir()
    rc, out, err = verify(capsys, tree, "--unit-test", path, "--stages", "3", "--dry-run")
    assert rc == 0, err
    assert out.count(path) == 2  # the run and the baseline


@pytest.mark.torch
def test_the_planned_pytest_command_is_pinned_to_each_tree_as_the_run_is(capsys, tree):
    """`--dry-run` printed pytest without the --rootdir/-c that each run adds (a tree without a
    pytest configuration of its own gets an empty one): the plan is the command that runs."""
    rc, out, err = verify(
        capsys, tree, "--unit-test", "tests/unit_tests/test_a.py", "--stages", "3", "--dry-run", "--json"
    )
    assert rc == 0, err
    steps = [s for s in json.loads(out) if s["stage"].startswith("unit-tests")]
    run, base = (" ".join(s["command"]) for s in steps)
    assert f"--rootdir {tree} -c $TMP/pytest.ini --confcutdir {tree} " in run
    assert "--rootdir $TMP/baseline -c $TMP/pytest.ini --confcutdir $TMP/baseline " in base
    (tree / "pyproject.toml").write_text("[tool.pytest.ini_options]\ntestpaths = ['tests']\n")
    rc, out, err = verify(
        capsys, tree, "--unit-test", "tests/unit_tests/test_a.py", "--stages", "3", "--dry-run", "--json"
    )
    run, base = (" ".join(s["command"]) for s in json.loads(out) if s["stage"].startswith("unit-tests"))
    assert f"--rootdir {tree} -c {tree}/pyproject.toml tests/unit_tests/test_a.py" in run
    assert "--rootdir $TMP/baseline -c $TMP/baseline/pyproject.toml tests/unit_tests/test_a.py" in base


# Item 10: a malformed --hip-version is exit 2, never the CUDA path.


@pytest.mark.parametrize(
    "version", ["", " ", "7", "7.", "x.y", "².³", "7.1-", "7.1\0", "7.1 x", "-7.1", "7.1.25424-41795/31"]
)
def test_malformed_hip_version_is_exit_2(capsys, tree, version):
    rc, out, err = verify(capsys, tree, "--hip-version", version, "--stages", "1", "--backend", "gloo", "--dry-run")
    assert rc == 2, (out, err)
    assert "--hip-version" in err and "MAJOR.MINOR" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("version", ["7.1", "6.4", "6.4.43482-0f2d60242", "7.1.25424-4179531dcd"])
def test_good_hip_versions_pass(capsys, tree, version):
    rc, _, err = verify(capsys, tree, "--hip-version", version, "--stages", "1", "--backend", "gloo", "--dry-run")
    assert rc == 0, err


# Item 11: --stages names at least one stage.


# One past the last stage's number: a stage added to the registry moves it, not this test.
@pytest.mark.parametrize("text", ["", ",,", " , ", "0", str(len(NAMES) + 1), "²", "9" * 5000, "imports,,nope"])
def test_stages_that_name_no_stage_are_exit_2_naming_the_stages(capsys, tree, text):
    rc, out, err = verify(capsys, tree, "--stages", text, "--backend", "gloo", "--dry-run")
    assert rc == 2, (out, err)
    assert "--stages" in err and ", ".join(NAMES) in err
    assert len(err.strip().splitlines()) == 1 and out == ""


# Item 12: --data-path is upstream CI's data root ($DATA_PATH), the case's paths under it; checked whole.


@pytest.mark.torch
def test_data_path_is_the_data_root_and_is_not_split_on_spaces(tmp_path, capsys, tree):
    root = tmp_path / "my data"
    for rel in (
        "text/shard00/my-gpt3_00_text_document.bin",
        "text/shard00/my-gpt3_00_text_document.idx",
        "text/shard00/bpe/vocab.json",
    ):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("")
    rc, out, err = verify(capsys, tree, "--case", CASE, "--data-path", str(root), "--stages", "4", "--dry-run")
    assert rc == 0, err
    assert f"{root}/text/shard00/my-gpt3_00_text_document" in out and "--mock-data" not in out
    (root / "text/shard00/my-gpt3_00_text_document.idx").unlink()
    rc, out, err = verify(capsys, tree, "--case", CASE, "--data-path", str(root), "--stages", "4", "--dry-run")
    assert rc == 2 and "--data-path" in err and "my-gpt3_00_text_document.idx" in err and out == ""


@pytest.mark.torch
def test_data_path_relative_is_taken_from_the_working_directory(tmp_path, capsys, tree, monkeypatch):
    root = tmp_path / "data"
    for rel in (
        "text/shard00/my-gpt3_00_text_document.bin",
        "text/shard00/my-gpt3_00_text_document.idx",
        "text/shard00/bpe/vocab.json",
    ):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("")
    monkeypatch.chdir(tmp_path)
    rc, out, err = verify(capsys, tree, "--case", CASE, "--data-path", "data", "--stages", "4", "--dry-run")
    assert rc == 0, err
    assert f"{root}/text/shard00/my-gpt3_00_text_document" in out  # pretrain_gpt.py runs in the tree: an absolute path


@pytest.mark.torch
@pytest.mark.parametrize("value", ["/nonexistent/data", "FILE"])
def test_data_path_that_is_not_a_directory_is_exit_2(tmp_path, capsys, tree, value):
    (tmp_path / "f").write_text("")
    rc, out, err = verify(
        capsys,
        tree,
        "--case",
        CASE,
        "--data-path",
        value.replace("FILE", str(tmp_path / "f")),
        "--stages",
        "4",
        "--dry-run",
    )
    assert rc == 2 and "--data-path" in err and "directory" in err and out == ""


def test_readme_documents_data_path_as_the_data_root():
    root = Path(__file__).resolve().parents[1]  # the manual: the README and docs/
    readme = "".join(p.read_text() for p in [root / "README.md", *sorted((root / "docs").rglob("*.md"))])
    assert "--data-path DIR" in readme and "--data-path PREFIX" not in readme


# Item 19: a stage that checks nothing does not pass.


@pytest.mark.torch
@pytest.mark.parametrize("make", ["empty-dirs", "empty-package", "namespace-package"])
def test_a_tree_with_nothing_to_import_fails_stage_1(tmp_path, capsys, make):
    """`mkdir -p fake/megatron/core; verify --tree fake --stages 1` (a namespace package imports, and
    proves nothing), an empty package, and code in a megatron/core without __init__.py: stage 1 fails."""
    import json

    fake = tmp_path / "fake"
    (fake / "megatron" / "core").mkdir(parents=True)
    if make == "empty-package":
        for rel in ("megatron/__init__.py", "megatron/core/__init__.py", "megatron/core/sub/__init__.py"):
            (fake / rel).parent.mkdir(parents=True, exist_ok=True)
            (fake / rel).write_text("\n")
    if make == "namespace-package":
        (fake / "megatron" / "core" / "utils.py").write_text("X = 1\n")
    rc, out, err = verify(capsys, fake, "--stages", "1", "--json")
    assert rc == 1, (out, err)
    imports = json.loads(out)["stages"][0]
    assert imports["status"] == "fail"
    assert ("namespace package" if make == "namespace-package" else "holds no Python code") in imports["reason"]


@pytest.mark.torch
def test_stage_1_fails_when_megatron_core_is_imported_from_outside_the_tree(tmp_path):
    """The probe checks where each module came from: a tree whose megatron is a bare directory (a
    namespace portion) loses to a regular megatron package anywhere on the path, and then stage 1
    checked nothing of the tree."""
    from rocmport.verify.stages.imports import stage_imports

    tree = fake_tree(tmp_path / "t")
    other = fake_tree(tmp_path / "other")  # an installed megatron-core, say
    boot = firewall.write_bootstrap(tmp_path / "boot")
    env = environment.child_env(tree, boot, {})
    env["PYTHONPATH"] = os.pathsep.join([str(boot), str(tree), str(other)])
    res = stage_imports(tree, env, ())
    assert res.status == "pass", res.reason
    (tree / "megatron" / "__init__.py").unlink()
    (tree / "megatron" / "core" / "__init__.py").unlink()
    res = stage_imports(tree, env, ())
    assert res.status == "fail" and "not from the tree" in res.reason and str(other) in res.reason, res.reason
    env["PYTHONPATH"] = os.pathsep.join([str(boot), str(tree)])
    res = stage_imports(tree, env, ())
    assert res.status == "fail" and "namespace package" in res.reason, res.reason


def test_stage_1_says_why_the_import_probe_itself_died(tmp_path):
    """A module that ends the probe's process (no result line printed): stage 1 fails with the last
    error line the process wrote, as stage 5 says it (one probe for both)."""
    from rocmport.verify.stages.imports import stage_imports

    tree = fake_tree(tmp_path / "t")
    (tree / "megatron" / "core" / "__init__.py").write_text(
        "import os, sys\nsys.stderr.write('Fatal Python error: boom\\n')\nsys.stderr.flush()\nos._exit(1)\n"
    )
    env = environment.child_env(tree, firewall.write_bootstrap(tmp_path / "boot"), {})
    res = stage_imports(tree, env, ())
    assert (res.status, res.reason) == ("fail", "the import probe crashed: Fatal Python error: boom")


# Item 20: verify leaves nothing in the tree it verifies (its processes' bytecode goes elsewhere).


def _git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout


def test_bytecode_of_verify_processes_leaves_the_tree_clean(tmp_path):
    tree = fake_tree(tmp_path / "t")
    (tree / ".gitignore").write_text("*.so\n")  # a tree whose .gitignore does not name __pycache__
    _git("init", "-q", cwd=tree)
    _git("add", "-A", cwd=tree)
    _git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "tree", cwd=tree)
    boot = firewall.write_bootstrap(tmp_path / "boot")
    env = environment.child_env(tree, boot, {}, pycache=tmp_path / "pycache")
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    subprocess.run([sys.executable, "-c", "import megatron.core.utils, pretrain_gpt"], cwd=tree, env=env, check=True)
    assert not list(tree.rglob("__pycache__")) and not list(tree.rglob("*.pyc"))
    assert wt.dirty_paths(tree) == []
    assert list((tmp_path / "pycache").rglob("utils*.pyc"))  # still cached: the speed 25491d1 bought is kept


# Property tests: whatever a user types into verify's options, the answer is 0 or 2 (with --dry-run:
# nothing runs), never 70 (a bug), and a plan only ever names paths inside the tree.

EXAMPLES = int(os.environ.get("ROCMPORT_FUZZ_EXAMPLES", "60"))
FUZZ = settings(
    max_examples=EXAMPLES, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck)
)
SIZE_TEXT = st.one_of(
    st.integers(min_value=-3, max_value=9).map(str),
    st.integers(min_value=-3, max_value=9).map(str),
    st.integers(min_value=-(10**30), max_value=10**30).map(str),
    st.sampled_from(["", " ", "1.5", "0x4", "1e3", "²", "٤", "+2", "--"]),
    st.text(max_size=12),
)
HOSTILE = st.lists(
    st.sampled_from(["..", "/", "tests", "unit_tests", "test_a.py", "::", "x", "\0", "\n", " ", ".", "~", "²", "link"]),
    max_size=4,
).map("".join)


@pytest.fixture(scope="module")
def ftree(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("fuzz")
    tree = fake_tree(root / "t")
    (root / "outside.py").write_text("def test_out():\n    pass\n")
    (tree / "tests" / "unit_tests" / "link").symlink_to(root)  # a way out for the fuzzer to find
    return tree


def dry_run(ftree: Path, *args: str) -> tuple[int, str]:
    import contextlib
    import io

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["verify", "--tree", str(ftree), "--backend", "gloo", "--no-functional", *args, "--dry-run"])
    assert rc in (0, 2), (args, rc, err.getvalue())
    if rc == 2:
        assert len(err.getvalue().strip().splitlines()) >= 1 and "internal error" not in err.getvalue()
    return rc, out.getvalue()


@pytest.mark.torch
@FUZZ
@given(
    text=st.one_of(
        st.text(max_size=30),
        st.lists(
            st.sampled_from(["1", "2", "3", "4", "5", "0", "6", "imports", "bridge", "", " ", "99999999999999999999"]),
            max_size=6,
        ).map(",".join),
    )
)
@example(text="")
@example(text=",,")
def test_fuzz_stages(ftree, text):
    rc, _ = dry_run(ftree, "--stages", text)
    assert rc == 2 or any(p.strip() for p in text.split(","))


@pytest.mark.torch
@FUZZ
@given(tp=SIZE_TEXT, pp=SIZE_TEXT, dp=SIZE_TEXT, nproc=st.one_of(st.none(), SIZE_TEXT), iters=SIZE_TEXT)
@example(tp="99999999999999999999", pp="2", dp="1", nproc=None, iters="10")
@example(tp="2", pp="2", dp="-2", nproc=None, iters="10")
@example(tp="2", pp="2", dp="1", nproc="-4", iters="10")
def test_fuzz_sizes(ftree, tp, pp, dp, nproc, iters):
    args = ["--tp", tp, "--pp", pp, "--dp", dp, "--iters", iters, "--stages", "2"] + (
        ["--nproc", nproc] if nproc is not None else []
    )
    rc, out = dry_run(ftree, *args)
    if rc == 0:  # a plan only for sizes that make a world of 1..65536 processes
        from rocmport.verify.runtime.gpt_worker import HEADS, LAYERS

        world = int(nproc) if nproc is not None else int(tp) * int(pp) * int(dp)
        assert 1 <= world <= 65536 and f"--nproc_per_node={world}" in out
        assert HEADS % int(tp) == 0 and LAYERS % int(pp) == 0 and 2 <= int(iters)


@pytest.mark.torch
@FUZZ
@given(
    version=st.one_of(
        st.text(max_size=24), st.from_regex(r"[0-9]{1,3}\.[0-9]{1,3}(\.[0-9]{1,6})?(-[0-9a-f]{1,10})?", fullmatch=True)
    )
)
@example(version="")
def test_fuzz_hip_version(ftree, version):
    rc, _ = dry_run(ftree, "--hip-version", version, "--stages", "1")
    assert rc == 2 or version.split(".")[0].isdigit()


@pytest.mark.torch
@FUZZ
@given(parts=st.lists(HOSTILE, max_size=6), absolute=st.booleans())
@example(parts=["tests", "unit_tests", "..", "..", "..", "x"], absolute=False)
@example(parts=["etc", "passwd"], absolute=True)
def test_fuzz_unit_test_paths(ftree, parts, absolute):
    path = ("/" if absolute else "") + "/".join(parts)
    rc, out = dry_run(ftree, "--unit-test", path, "--stages", "3")
    if rc == 0:
        target = (ftree / path.split("::")[0]).resolve()
        assert target.is_relative_to((ftree / "tests" / "unit_tests").resolve()) and target.exists()


@pytest.mark.torch
@FUZZ
@given(case=st.one_of(st.text(max_size=30), st.lists(HOSTILE, max_size=5).map("/".join)))
@example(case="/nonexistent/case")
def test_fuzz_case_names(ftree, case):
    import contextlib
    import io

    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        rc = main(["verify", "--tree", str(ftree), "--backend", "gloo", "--case", case, "--stages", "4", "--dry-run"])
    assert rc in (0, 2), (case, rc, err.getvalue())
    assert rc == 2 or case == CASE


@pytest.mark.torch
@pytest.mark.slow  # a fresh cache: torch's bytecode is compiled into it once (~6 s quiet, ~30 s on a loaded machine)
def test_a_verify_run_leaves_the_tree_as_it_found_it(tmp_path, capsys, monkeypatch):
    """Through the command: stage 1's processes import the tree; its bytecode is in the cache, not the tree."""
    monkeypatch.setenv("ROCMPORT_CACHE_DIR", str(tmp_path / "cache"))
    tree = fake_tree(tmp_path / "t")
    before = files_under(tree)
    rc, out, err = verify(capsys, tree, "--stages", "1")
    assert rc == 0, err
    assert files_under(tree) == before
    assert list((tmp_path / "cache" / "pycache").rglob("utils*.pyc"))
    assert not [
        p for p in (tmp_path / "cache" / "pycache").rglob("*") if "rocmport-verify-" in p.name
    ]  # the run's own: pruned
