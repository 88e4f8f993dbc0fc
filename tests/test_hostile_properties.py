"""Property tests (Hypothesis) for issue 41: every command's options driven through the real cli with
generated values, and the readers of the series' component matrix and of verify's last.json fed
generated documents. Whatever the input: the exit code is one the command documents, no traceback
(never 70), a refusal is one line, and nothing is written outside the test's own directory.

ROCMPORT_FUZZ_EXAMPLES sets the examples per target (CI: the default below); -s prints how many ran."""

from __future__ import annotations

import contextlib
import copy
import io
import json
import os
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from rocmport import components
from rocmport.cli import main

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = int(os.environ.get("ROCMPORT_FUZZ_EXAMPLES", "60"))
FUZZ = settings(
    max_examples=EXAMPLES, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck)
)
COUNTED: dict[str, int] = {}

HOSTILE = st.sampled_from(
    [
        "",
        " ",
        "-",
        "--json",
        "--upload-pack=touch x",
        "\x1b]0;title\x07",
        "a" * 300,
        "../../etc/passwd",
        "/dev/null",
        "nan",
        "inf",
        "1e-300",
        "0",
        "-1",
        "99999999999999999999",
        "٤",
        "2.12.0",
        "==2.5.0",
        "auto",
        "none",
        "gfx942",
        "v0.16",
        "main",
        "a" * 64 + ".example",
    ]
)
TEXT = st.text(st.characters(blacklist_characters="\0", blacklist_categories=("Cs",)), max_size=12)
VALUE = st.one_of(HOSTILE, TEXT)


def run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(argv)
    return rc, out.getvalue(), err.getvalue()


def check(rc: int, err: str, allowed: set[int], argv) -> None:
    assert rc in allowed, (argv, rc, err)
    assert "Traceback" not in err and "internal error" not in err, (argv, err)
    if rc == 2:  # one error line: rocmport's, or click's usage error (after its Usage/Try lines)
        lines = [ln for ln in err.splitlines() if ln.startswith(("rocmport: error", "Error:"))]
        assert len(lines) == 1, (argv, err)


@pytest.fixture()
def sandbox(tmp_path, monkeypatch):
    """An empty working directory, the cache, HOME and the package index all inside tmp_path (the
    index on a loopback port nothing listens on: nothing leaves the machine)."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("ROCMPORT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("ROCMPORT_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("ROCMPORT_INDEX_TIMEOUT", "2")
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    return tmp_path


def written_outside(tmp_path: Path, allowed: tuple[Path, ...] = ()) -> list[Path]:
    """What appeared in the working directory (nothing a command is asked for goes there)."""
    return [p for p in (tmp_path / "cwd").rglob("*") if not any(p.is_relative_to(a) for a in allowed)]


# ---- env -------------------------------------------------------------------------------------------


@st.composite
def env_argv(draw, out: str) -> list[str]:
    parts: list[list[str]] = [["--no-fabric"]]  # the fabric reads /sys and resolves the master: not here
    if draw(st.booleans()):
        parts.append(["--arch", draw(st.one_of(st.sampled_from(["gfx942", "gfx950", "gfx90a", "auto"]), VALUE))])
    if draw(st.booleans()):
        mode = draw(st.sampled_from(["record", "replay", "x", ""]))
        where = draw(st.sampled_from(["", "tune", "a-file", "missing/deeper"]))
        parts.append(["--tune", mode, f"{out}/{where}" if where else ""])
    if draw(st.booleans()):
        parts.append(["--master-addr", draw(VALUE)])
    for flag in ("--deterministic", "--explain", "--json"):
        if draw(st.booleans()):
            parts.append([flag])
    return [t for part in draw(st.permutations(parts)) for t in part]


@FUZZ
@given(data=st.data())
@example(data=None)
def test_fuzz_env_options(sandbox, data):
    COUNTED["env"] = COUNTED.get("env", 0) + 1
    out = sandbox / "out"
    out.mkdir(exist_ok=True)
    (out / "a-file").write_text("")
    argv = ["--no-fabric", "--master-addr", "a" * 64 + ".example"] if data is None else data.draw(env_argv(str(out)))
    rc, _, err = run(["env", *argv])
    check(rc, err, {0, 2}, argv)
    assert written_outside(sandbox) == []
    assert "\x1b" not in err


# ---- verify (--dry-run: the option checks a run makes, nothing launched) ---------------------------


@pytest.fixture()
def vtree(sandbox) -> Path:
    from tests.test_verify_inputs import fake_tree

    return fake_tree(sandbox / "tree")


@st.composite
def verify_argv(draw) -> list[str]:
    parts: list[list[str]] = []
    for option, values in (
        ("--te", st.one_of(st.sampled_from(["none", "auto", "2.12.0", "==2.5.0", "0.0.0"]), VALUE)),
        ("--unit-tests", st.sampled_from(["default", "all", "impacted", "x"])),
        ("--unit-test", st.one_of(st.just("tests/unit_tests/test_x.py"), VALUE)),
        ("--since", VALUE),
        ("--tp", st.sampled_from(["1", "2", "3", "0", "-1", "99999999999999999999"])),
        ("--pp", st.sampled_from(["1", "2", "3"])),
        ("--dp", st.sampled_from(["1", "2", "-2"])),
        ("--nproc", st.sampled_from(["1", "4", "0"])),
        ("--stages", st.one_of(st.sampled_from(["1", "1,2", ",,", "9", "imports"]), VALUE)),
        ("--hip-version", st.one_of(st.sampled_from(["6.4", "7.0"]), VALUE)),
        ("--iters", st.sampled_from(["10", "1", "2"])),
    ):
        if draw(st.booleans()):
            parts.append([option, draw(values)])
    for flag in ("--moe", "--no-moe", "--no-unit-tests", "--no-functional", "--no-bridge", "--json"):
        if draw(st.integers(0, 3)) == 0:
            parts.append([flag])
    return [t for part in draw(st.permutations(parts)) for t in part]


VERIFY_FUZZ = settings(FUZZ, max_examples=max(EXAMPLES // 2, 10))


@VERIFY_FUZZ
@given(argv=verify_argv())
@example(argv=["--te", "none", "--moe"])
@example(argv=["--unit-tests", "all", "--unit-test", "tests/unit_tests/test_x.py"])
@example(argv=["--no-unit-tests", "--unit-tests", "all"])
def test_fuzz_verify_options(sandbox, vtree, argv):
    COUNTED["verify"] = COUNTED.get("verify", 0) + 1
    rc, out, err = run(["-C", str(sandbox), "verify", "--tree", str(vtree), *argv, "--dry-run"])
    check(rc, err, {0, 2}, argv)
    assert written_outside(sandbox) == []
    assert not (sandbox / "build").exists()  # a dry run writes no report
    if rc == 0:
        assert not ("--moe" in argv and "--te" not in argv)
        assert not ("--no-unit-tests" in argv and ("--unit-tests" in argv or "--unit-test" in argv))


# ---- emit docker, status, codemod: on an applied project -----------------------------------------


@pytest.fixture()
def applied(sandbox, monkeypatch) -> Path:
    from tests.helpers.patches import Project

    proj = Project(sandbox, monkeypatch)
    data = yaml.safe_load((proj.series_dir / "series").read_text())
    data["rocm"] = yaml.safe_load((REPO / "patchsets/megatron-lm/v0.16/series").read_text())["rocm"]
    (proj.series_dir / "series").write_text(yaml.safe_dump(data, sort_keys=False))
    assert run(["-C", str(proj.root), "apply"])[0] == 0
    return proj.root


@st.composite
def emit_argv(draw, out: str) -> list[str]:
    parts: list[list[str]] = []
    if draw(st.booleans()):
        parts.append(
            ["-o", draw(st.one_of(st.sampled_from(["", f"{out}/D", f"{out}/a-file/x"]), st.just(f"{out}/D2")))]
        )
    if draw(st.booleans()):
        parts.append(
            ["--components", draw(st.one_of(st.sampled_from(["all", "none", "apex", "apex,apex", "x"]), VALUE))]
        )
    if draw(st.booleans()):
        parts.append(["--arch", draw(st.one_of(st.sampled_from(["gfx942", "gfx950;gfx90a", "sm_90"]), VALUE))])
    for _ in range(draw(st.integers(0, 2))):
        parts.append(
            [
                "--extra",
                draw(st.one_of(st.sampled_from(["megatron-core:mlm", "megatron-core:nope", "x:y", "x"]), VALUE)),
            ]
        )
    if draw(st.booleans()):
        parts.append(["--base-tag", draw(VALUE)])
    if draw(st.booleans()):
        parts.append(["--max-jobs", draw(st.sampled_from(["1", "0", "-3", "x"]))])
    return [t for part in draw(st.permutations(parts)) for t in part]


@settings(FUZZ, max_examples=max(EXAMPLES // 2, 10))
@given(data=st.data())
def test_fuzz_emit_status_and_codemod_options(applied, sandbox, data):
    COUNTED["emit/status/codemod"] = COUNTED.get("emit/status/codemod", 0) + 1
    out = sandbox / "out"
    out.mkdir(exist_ok=True)
    (out / "a-file").write_text("")
    argv = data.draw(emit_argv(str(out)))
    rc, _, err = run(["-C", str(applied), "emit", "docker", *argv])
    # 1: the file system refused the write (-o under a file): the exit table's "file-system failure",
    # one line naming the path (the output writer's own rules are issue 41's rows 1 and 22)
    check(rc, err, {0, 1, 2}, argv)
    if rc == 1:
        assert [ln for ln in err.splitlines() if ln.startswith("rocmport: error")] and "/a-file" in err, err
    tree = applied / "build" / "megatron-lm"
    before = {p: p.read_bytes() for p in tree.rglob("*.py")}
    cm = data.draw(
        st.lists(
            st.sampled_from(
                [["--check"], ["--diff"], ["--json"], ["--jobs", "2"], ["--only", "x"], ["--only", "apex-to-torch"]]
            ),
            max_size=3,
        )
    )
    cm_argv = [t for part in cm for t in part]
    rc, _, err = run(["codemod", *cm_argv, str(tree)])
    check(rc, err, {0, 1, 2}, cm_argv)
    if "--check" in cm_argv or "--diff" in cm_argv:
        assert {p: p.read_bytes() for p in tree.rglob("*.py")} == before
    rc, _, err = run(["-C", str(applied), "status", *data.draw(st.sampled_from([[], ["--json"]]))])
    check(rc, err, {0}, "status")
    assert written_outside(sandbox) == []


# ---- bot (its refresh replaced by a recorder: the parser is under test) ---------------------------


class Done(BaseException):
    pass


@st.composite
def bot_argv(draw) -> list[str]:
    parts: list[list[str]] = [draw(st.sampled_from([["--once"], ["--watch"]]))]
    if draw(st.booleans()):
        parts.append(["--interval", draw(st.one_of(st.sampled_from(["5", "10", "3600", "1e-300", "0.5"]), VALUE))])
    if draw(st.booleans()):
        parts.append(["--track", draw(st.sampled_from(["release", "main"]))])
    if draw(st.booleans()):
        parts.append(["--lines", draw(st.one_of(st.sampled_from(["v0.16", "v0.16,v0.17"]), VALUE))])
    parts.append(["--no-verify"])
    return [t for part in draw(st.permutations(parts)) for t in part]


@FUZZ
@given(argv=bot_argv())
def test_fuzz_bot_options_refuse_ignored_combinations(sandbox, monkeypatch, argv):
    from rocmport.commands import bot as bot_command

    COUNTED["bot"] = COUNTED.get("bot", 0) + 1
    calls: list = []
    monkeypatch.setattr(bot_command, "run_once", lambda settings, **kw: calls.append(kw) or [])

    def sleep(seconds):
        calls.append({"slept": seconds})
        raise Done

    monkeypatch.setattr(bot_command.time, "sleep", sleep)
    (sandbox / "cwd" / ".keep").parent.mkdir(exist_ok=True)
    try:
        rc, _, err = run(["-C", str(sandbox), "bot", *argv])
    except Done:
        rc, err = None, ""
    assert rc in (0, 2, None), (argv, rc, err)
    if rc == 2:
        check(rc, err, {2}, argv)
        return
    assert not ("--once" in argv and "--interval" in argv)
    assert not ("main" in argv and "--lines" in argv)
    if calls and "slept" in calls[-1]:
        assert calls[-1]["slept"] >= bot_command.MIN_INTERVAL


# ---- the readers: the series' component matrix and verify's last.json ----------------------------

MATRIX = yaml.safe_load((REPO / "patchsets/megatron-lm/v0.16/series").read_text())["rocm"]


def _paths(value, prefix=()) -> list[tuple]:
    out = [prefix] if prefix else []
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, (*prefix, i))
    return out


PATHS = _paths(MATRIX)
JSONISH = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), TEXT, HOSTILE),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(TEXT, inner, max_size=3)),
    max_leaves=8,
)


@FUZZ
@given(path=st.sampled_from(PATHS), value=JSONISH)
@example(path=("components", "transformer_engine", "versions"), value=5)
@example(path=("components", "transformer_engine", "versions"), value=2.9)
def test_fuzz_the_component_matrix_reader(path, value):
    COUNTED["matrix"] = COUNTED.get("matrix", 0) + 1
    data = copy.deepcopy(MATRIX)
    node = data
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    matrix, errors = components.validate(data, "s/series")  # never raises
    assert (matrix is None) == bool(errors)
    assert all(e.startswith("s/series: key 'rocm") for e in errors), errors


@FUZZ
@given(doc=st.one_of(JSONISH, st.fixed_dictionaries({"tree": VALUE, "stages": JSONISH, "verdict": JSONISH})))
def test_fuzz_the_last_verify_reader(tmp_path_factory, doc):
    from rocmport.errors import terminal_safe
    from rocmport.verify.orchestration.report import last_verify

    COUNTED["last.json"] = COUNTED.get("last.json", 0) + 1
    root = tmp_path_factory.mktemp("last")
    (root / "build" / "verify").mkdir(parents=True)
    (root / "build" / "verify" / "last.json").write_text(json.dumps(doc))
    last = last_verify(root)
    assert last is not None
    if last.error is None:
        for value in (last.started, last.line, last.commit, last.verdict, last.report):
            assert value is None or isinstance(value, str)
        assert isinstance(last.tree, str) and all(isinstance(f, str) for f in last.failed)
    else:
        assert "not a verify report" in last.error
    shown = terminal_safe(json.dumps(last.to_dict(), ensure_ascii=False))
    assert not any(ord(c) < 0x20 and c not in "\n\t" for c in shown)


# ---- the settings readers: [tool.rocmport] and .rocmport/local.yaml ------------------------------


def _toml_value(value) -> str:
    """``value`` written as TOML (JSON's strings, numbers, booleans and arrays are TOML too)."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {_toml_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, float) and value != value:
        return "nan"
    return json.dumps(value)


SETTING_KEYS = ["remotes", "cache-dir", "worktree-dir", "tp", "pp", "release-lines", "python", "unknown-key"]
TOML_VALUE = st.recursive(
    st.one_of(st.booleans(), st.integers(-(10**6), 10**6), st.floats(allow_nan=False, allow_infinity=False), VALUE),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(["megatron-lm", "x", ""]), inner, max_size=2)
    ),
    max_leaves=5,
)


@FUZZ
@given(
    table=st.dictionaries(st.sampled_from(SETTING_KEYS), TOML_VALUE, max_size=4),
    local=st.one_of(st.none(), JSONISH),
)
@example(table={"tp": 8}, local=None)
@example(table={}, local=[1])
def test_fuzz_the_settings_readers(tmp_path_factory, table, local):
    from rocmport.config import load_settings
    from rocmport.errors import BadInput

    COUNTED["settings"] = COUNTED.get("settings", 0) + 1
    root = tmp_path_factory.mktemp("settings")
    (root / "pyproject.toml").write_text(
        "[tool.rocmport]\n" + "".join(f"{json.dumps(k)} = {_toml_value(v)}\n" for k, v in table.items())
    )
    if local is not None:
        (root / ".rocmport").mkdir()
        (root / ".rocmport" / "local.yaml").write_text(yaml.safe_dump(local))
    try:
        settings = load_settings(root)
    except BadInput as exc:
        assert "\n" not in str(exc)
        assert str(root) in str(exc) or "pyproject.toml" in str(exc) or "local.yaml" in str(exc), str(exc)
        return
    assert isinstance(settings.tp, int) and isinstance(settings.pp, int)
    assert settings.root == root.resolve()


def test_fuzz_example_counts_are_reported():
    """Runs last in this file: the property tests' example counts (-s shows them)."""
    print(f"\nissue 41 property tests, examples run: {COUNTED}")
