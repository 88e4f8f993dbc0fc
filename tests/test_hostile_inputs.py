"""Issue 41's hostile inputs (rows 4-7, 9-12, 14-18, 20): the series' component matrix type-checked,
a hostile last.json told as "not a verify report", terminal escapes stripped, the codemod runner's
per-file parsing limits, contradictory options refused at the command line, TE wheels checked before
any stage, and status flagging a lock the work tree does not match. Each test runs the real CLI (in a
subprocess where the exit code and stderr are the contract)."""

from __future__ import annotations

import json
import re
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rocmport import components

REPO = Path(__file__).resolve().parents[1]


def rocmport(*args: str, cwd: Path, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rocmport", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def one_error_line(proc: subprocess.CompletedProcess) -> str:
    """The single error line a refused command prints on stderr (no traceback; progress lines,
    "... step", aside)."""
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip() and not ln.startswith("... ")]
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    return lines[0]


# ---- row 4: the series' component matrix, type-checked ------------------------------------------


def _matrix() -> dict:
    return yaml.safe_load((REPO / "patchsets/megatron-lm/v0.16/series").read_text())["rocm"]


@pytest.mark.parametrize("versions", [5, 2.9, True, ["2.9"], {"a": 1}])
def test_a_wrong_typed_te_versions_is_named_by_file_and_key(versions):
    data = _matrix()
    data["components"]["transformer_engine"]["versions"] = versions
    matrix, errors = components.validate(data, "s/series")
    assert matrix is None
    assert any(e.startswith("s/series: key 'rocm.components.transformer_engine.versions'") for e in errors), errors


@pytest.fixture()
def te_versions_project(tmp_path, monkeypatch):
    """An applied project whose series then gets ``versions`` for transformer_engine."""
    from tests.helpers.patches import Project
    from rocmport.cli import main

    proj = Project(tmp_path, monkeypatch)
    data = yaml.safe_load((proj.series_dir / "series").read_text())
    data["rocm"] = _matrix()
    (proj.series_dir / "series").write_text(yaml.safe_dump(data, sort_keys=False))
    assert main(["-C", str(proj.root), "apply"]) == 0

    def set_versions(value) -> Path:
        data["rocm"]["components"]["transformer_engine"]["versions"] = value
        (proj.series_dir / "series").write_text(yaml.safe_dump(data, sort_keys=False))
        return proj.root

    return proj, set_versions


@pytest.mark.parametrize(
    "args",
    [
        ("status",),
        ("patches", "list"),
        ("emit", "docker", "--components", "none"),
        ("verify", "--te", "auto", "--dry-run"),
    ],
)
def test_every_command_reading_the_matrix_refuses_versions_5_with_one_line(te_versions_project, tmp_path, args):
    proj, set_versions = te_versions_project
    root = set_versions(5)
    proc = rocmport("-C", str(root), *args, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    line = one_error_line(proc)
    assert f"{proj.series_dir / 'series'}: key 'rocm.components.transformer_engine.versions'" in line


# ---- rows 5 and 20: status and a hostile last.json -----------------------------------------------

LAST_OK = {
    "started": "2026-01-01T00:00:00",
    "tree": "/x/megatron-lm",
    "line": "v0.16",
    "commit": "0" * 40,
    "verdict": "all stages pass",
    "stages": [{"name": "imports", "status": "pass"}],
    "report": "/x/r.json",
}


def _project_with_last(tmp_path: Path, text: str) -> Path:
    root = tmp_path / "p"
    (root / "build" / "verify").mkdir(parents=True)
    (root / "build" / "verify" / "last.json").write_text(text)
    return root


@pytest.mark.parametrize(
    "text",
    [
        "[]",
        "null",
        '"x"',
        "3",
        "[" * 100_000,
        '{"tree": ' * 50_000 + "1" + "}" * 50_000,
        json.dumps({**LAST_OK, "stages": 5}),
        json.dumps({**LAST_OK, "stages": [5]}),
        json.dumps({**LAST_OK, "stages": [{"name": [1], "status": "fail"}]}),
        json.dumps({**LAST_OK, "verdict": [1]}),
        json.dumps({**LAST_OK, "tree": {"a": 1}}),
        json.dumps({**LAST_OK, "commit": 7}),
        "\xff not json",
    ],
    ids=lambda t: t[:20],
)
def test_status_calls_a_hostile_last_json_not_a_verify_report(tmp_path, text):
    root = _project_with_last(tmp_path, text)
    last = root / "build" / "verify" / "last.json"
    if text.startswith("\xff"):
        last.write_bytes(b"\xff not json")
    for args in (("status",), ("status", "--json")):
        proc = rocmport("-C", str(root), *args, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr
        said = proc.stdout + proc.stderr
        assert f"{last}: not a verify report" in said, said
        assert "all stages pass" not in said  # nothing of a wrong-typed report is shown as if real


def test_status_strips_terminal_escapes_from_last_json(tmp_path):
    verdict = "\x1b]0;pwned\x07all \x1b[2Jstages\x9b31m pass\u202e"
    root = _project_with_last(tmp_path, json.dumps({**LAST_OK, "verdict": verdict, "tree": "/x/\x1b[31mred"}))
    proc = rocmport("-C", str(root), "status", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    said = proc.stdout + proc.stderr
    assert "\x1b" not in said and "\x07" not in said and "\x9b" not in said and "\u202e" not in said
    assert "stages" in said and "pass" in said


# ---- rows 15 and 17: contradictory or ignored options refused at the command line ---------------


@pytest.fixture()
def tree(tmp_path) -> Path:
    from tests.test_verify_inputs import fake_tree

    return fake_tree(tmp_path / "tree")


@pytest.mark.parametrize(
    "args, names",
    [
        (("--te", "none", "--moe"), ("--moe", "--te")),
        (("--moe",), ("--moe", "--te")),
        (("--unit-tests", "all", "--unit-test", "tests/unit_tests/test_x.py"), ("--unit-tests all", "--unit-test")),
        (("--no-unit-tests", "--unit-tests", "all"), ("--no-unit-tests", "--unit-tests")),
        (("--no-unit-tests", "--unit-test", "tests/unit_tests/test_x.py"), ("--no-unit-tests", "--unit-test")),
    ],
)
def test_verify_refuses_contradictory_options_naming_both(tmp_path, tree, args, names):
    proc = rocmport("-C", str(tmp_path), "verify", "--tree", str(tree), *args, "--dry-run", cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    line = one_error_line(proc)
    assert all(n in line for n in names), line


def test_verify_names_the_file_and_key_of_a_bad_tool_rocmport_tp(tmp_path, tree):
    (tmp_path / "pyproject.toml").write_text("[tool.rocmport]\ntp = 8\n")
    proc = rocmport("-C", str(tmp_path), "verify", "--tree", str(tree), "--dry-run", cwd=tmp_path)
    assert proc.returncode == 2
    line = one_error_line(proc)
    assert f"{tmp_path / 'pyproject.toml'}: [tool.rocmport] tp = 8" in line and "--tp" not in line, line
    # the option, when given, is what is named (and wins over the file)
    proc = rocmport("-C", str(tmp_path), "verify", "--tree", str(tree), "--tp", "3", "--dry-run", cwd=tmp_path)
    assert proc.returncode == 2 and one_error_line(proc).startswith("rocmport: error: --tp 3")
    assert (
        rocmport("-C", str(tmp_path), "verify", "--tree", str(tree), "--tp", "1", "--dry-run", cwd=tmp_path).returncode
        == 0
    )


@pytest.fixture()
def git_project(tmp_path) -> Path:
    from tests.helpers.sync import commit, init

    root = init(tmp_path / "project")
    commit(root, {"README.md": "x\n"}, "project")
    return root


@pytest.mark.parametrize(
    "args, names",
    [
        (("--once", "--interval", "5"), ("--interval", "--once")),
        (("--once", "--interval", "3600"), ("--interval", "--once")),
        (("--once", "--track", "main", "--lines", "v0.16"), ("--track main", "--lines")),
        (("--watch", "--interval", "1e-300"), ("--interval",)),
        (("--watch", "--interval", "9.99"), ("--interval",)),
    ],
)
def test_bot_refuses_ignored_options_and_a_tiny_interval(tmp_path, git_project, args, names):
    proc = rocmport("-C", str(git_project), "bot", *args, "--no-verify", cwd=tmp_path, timeout=60)
    assert proc.returncode == 2, proc.stderr
    line = one_error_line(proc)
    assert all(n in line for n in names), line


def test_bot_backs_off_after_failed_cycles_and_resets_after_a_good_one(tmp_path, git_project, monkeypatch):
    from rocmport.cli import main
    from rocmport.commands import bot as bot_command
    from rocmport.errors import RocmportError

    class Stop(BaseException):
        pass

    outcomes = iter([RocmportError("network down")] * 3 + [[]] + [RocmportError("again")])
    slept: list[float] = []

    def run_once(settings, **kw):
        result = next(outcomes)
        if isinstance(result, Exception):
            raise result
        return result

    def sleep(seconds):
        slept.append(seconds)
        if len(slept) == 5:
            raise Stop

    monkeypatch.setattr(bot_command, "run_once", run_once)
    monkeypatch.setattr(bot_command.time, "sleep", sleep)
    with pytest.raises(Stop):
        main(["-C", str(git_project), "bot", "--watch", "--interval", "60", "--no-verify"])
    assert slept == [120, 240, 480, 60, 120]
    assert bot_command.backoff(60, 40) == 3600 and bot_command.backoff(7200, 3) == 7200


def test_emit_docker_refuses_an_empty_output_and_an_unknown_extra(tmp_path, te_versions_project):
    proc = rocmport("emit", "docker", "-o", "", cwd=tmp_path)
    assert proc.returncode == 2 and "-o ''" in one_error_line(proc)
    assert not list(tmp_path.glob("*")) or all(p.name != "" for p in tmp_path.iterdir())
    proj, set_versions = te_versions_project
    root = set_versions(">=2.9.0a0,<2.13")
    (proj.root / "build" / "megatron-lm" / "pyproject.toml").write_text(
        '[project]\nname = "megatron-core"\nversion = "0.16.1"\ndependencies = ["numpy"]\n'
        '[project.optional-dependencies]\nmlm = ["flask"]\ndev = ["pytest"]\n'
    )
    out = tmp_path / "Dockerfile"
    for extra, said in (
        (
            "megatron-core:nosuchextra",
            "--extra megatron-core:nosuchextra: megatron-core has no extra 'nosuchextra'; its extras: dev, mlm",
        ),
        ("nosuchdist:mlm", "--extra nosuchdist:mlm: no ported package is named nosuchdist"),
    ):
        proc = rocmport(
            "-C", str(root), "emit", "docker", "--components", "none", "--extra", extra, "-o", str(out), cwd=tmp_path
        )
        assert proc.returncode == 2, proc.stderr
        assert said in one_error_line(proc)
        assert not out.exists()


# ---- rows 7, 9, 14: env's inputs -------------------------------------------------------------------


def test_env_tune_replay_names_a_non_utf8_or_outside_linked_table(tmp_path):
    d = tmp_path / "tune"
    d.mkdir()
    (d / "te_hipblaslt_algos_1.csv").write_bytes(b"M,N,K\n\xff\xfe1,2,3\n")
    proc = rocmport("env", "--no-fabric", "--tune", "replay", str(d), cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert f"{d / 'te_hipblaslt_algos_1.csv'}: not UTF-8 at byte 6 (line 2, byte 0xff)" in one_error_line(proc)
    (d / "te_hipblaslt_algos_1.csv").unlink()
    secret = tmp_path / "outside.csv"
    secret.write_text("M,N,K\nsecret\n")
    (d / "te_hipblaslt_algos_1.csv").symlink_to(secret)
    proc = rocmport("env", "--no-fabric", "--tune", "replay", str(d), cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "is a link that leads out of" in one_error_line(proc) and "secret" not in proc.stderr.split("(to")[0]


@pytest.mark.parametrize(
    "args, env",
    [
        (("--master-addr", "a" * 64 + ".example"), {}),
        ((), {"MASTER_ADDR": "a" * 64 + ".example"}),
        (("--master-addr", "a..b"), {}),
        (("--master-addr", "x" * 300), {}),
    ],
)
def test_env_refuses_a_master_addr_that_is_not_a_host_in_one_line(tmp_path, args, env):
    proc = rocmport("env", *args, cwd=tmp_path, env=env)
    assert proc.returncode == 2, proc.stderr
    line = one_error_line(proc)
    assert ("--master-addr" if args else "MASTER_ADDR") in line and "not a host name" in line


def test_env_master_addr_accepts_hosts_and_addresses(tmp_path):
    for host in ("10.1.2.3", "fe80::1", "node-01.cluster.local", "a" * 63, "localhost."):
        proc = rocmport("env", "--master-addr", host, cwd=tmp_path)
        assert proc.returncode == 0, (host, proc.stderr)


@pytest.mark.parametrize("args", [("--arch", ""), ("--tune", "record", ""), ("--tune", "replay", "")])
def test_env_refuses_empty_values(tmp_path, args):
    proc = rocmport("env", "--no-fabric", *args, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    one_error_line(proc)
    assert list(tmp_path.iterdir()) == []  # nothing recorded into the cwd


def test_env_tune_record_refuses_a_directory_it_cannot_write(tmp_path):
    import shutil

    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    cmd = [sys.executable, "-m", "rocmport", "env", "--no-fabric", "--tune", "record", str(ro)]
    if os.geteuid() == 0:  # root writes through the permission bits: drop that power, as a user has none
        if not shutil.which("setpriv"):
            pytest.skip("root without setpriv: a 0555 directory is writable here")
        cmd = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--", *cmd]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=120)
    ro.chmod(0o755)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"--tune record {ro}: cannot write in the directory" in one_error_line(proc)
    assert list(ro.iterdir()) == []


# ---- rows 10, 11, 12: TE inputs (a local index on loopback; nothing leaves the machine) ----------


def _te_wheel(path: Path, version: str, python_layer: bool = True) -> Path:
    import zipfile

    whl = path / f"transformer_engine-{version}-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as zf:
        if python_layer:
            zf.writestr("transformer_engine/__init__.py", f"__version__ = '{version}'\n")
        zf.writestr(
            f"transformer_engine-{version}.dist-info/METADATA", f"Name: transformer_engine\nVersion: {version}\n"
        )
    return whl


def _verify_te(tmp_path: Path, tree: Path, index_url: str, *args: str, timeout: float = 120):
    return rocmport(
        "-C",
        str(tmp_path),
        "verify",
        "--tree",
        str(tree),
        *args,
        cwd=tmp_path,
        timeout=timeout,
        env={"ROCMPORT_INDEX_URL": index_url, "ROCMPORT_CACHE_DIR": str(tmp_path / "cache")},
    )


@pytest.mark.parametrize("version", ["0.0.0", "1.9.0"])
def test_a_te_wheel_without_a_python_layer_is_refused_before_any_stage(tmp_path, tree, version):
    from tests.helpers.pypi import Index

    files = tmp_path / "files"
    files.mkdir()
    with Index(files) as index:
        index.add("transformer-engine", _te_wheel(files, version, python_layer=False))
        proc = _verify_te(tmp_path, tree, index.url, "--te", version, "--stages", "1")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "holds no transformer_engine package (no Python layer" in one_error_line(proc)
    assert not (tmp_path / "build" / "verify").exists()  # no stage ran, no report claims TE


def test_a_te_wheel_that_is_not_a_zip_is_refused_even_with_a_matching_hash(tmp_path, tree):
    from tests.helpers.pypi import Index

    files = tmp_path / "files"
    files.mkdir()
    bad = files / "transformer_engine-2.12.0-py3-none-any.whl"
    bad.write_bytes(b"this is not a zip file\n")
    with Index(files) as index:
        index.add("transformer-engine", bad)  # its real sha256
        proc = _verify_te(tmp_path, tree, index.url, "--te", "2.12.0", "--dry-run")
    assert proc.returncode == 2, proc.stderr
    assert "transformer_engine-2.12.0-py3-none-any.whl from the package index is not a wheel" in one_error_line(proc)
    assert not list((tmp_path / "cache").rglob("*.whl"))  # not kept: a later index may serve a good one


def test_a_cached_te_release_is_used_offline(tmp_path, tree):
    from tests.helpers.pypi import Index

    files = tmp_path / "files"
    files.mkdir()
    with Index(files) as index:
        index.add("transformer-engine", _te_wheel(files, "2.12.0"))
        assert _verify_te(tmp_path, tree, index.url, "--te", "2.12.0", "--dry-run").returncode == 0
    unreachable = "http://127.0.0.1:9/simple"  # the discard port: nothing listens
    proc = _verify_te(tmp_path, tree, unreachable, "--te", "2.12.0", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    proc = _verify_te(tmp_path, tree, unreachable, "--te", "auto", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert "using Transformer Engine 2.12.0, the newest in the cache" in proc.stderr
    proc = _verify_te(tmp_path, tree, unreachable, "--te", "2.9.0", "--dry-run")
    assert proc.returncode == 2
    line = one_error_line(proc)
    assert "--source git" not in line and "give a --te release already in the cache (2.12.0)" in line, line


def test_a_stalled_index_times_out_with_a_hint_that_fits_verify(tmp_path, tree):
    import socket
    import threading
    import time

    stalled = socket.socket()
    stalled.bind(("127.0.0.1", 0))
    stalled.listen(8)
    held: list = []
    threading.Thread(target=lambda: held.append(stalled.accept()), daemon=True).start()
    url = f"http://127.0.0.1:{stalled.getsockname()[1]}/simple"
    started = time.monotonic()
    try:
        proc = rocmport(
            "-C",
            str(tmp_path),
            "verify",
            "--tree",
            str(tree),
            "--te",
            "auto",
            "--dry-run",
            cwd=tmp_path,
            env={
                "ROCMPORT_INDEX_URL": url,
                "ROCMPORT_CACHE_DIR": str(tmp_path / "cache"),
                "ROCMPORT_INDEX_TIMEOUT": "2",
            },
        )
    finally:
        stalled.close()
    assert proc.returncode == 2, proc.stderr
    line = one_error_line(proc)
    assert "no answer in 2 s" in line and "--te none" in line and "--source git" not in line, line
    assert time.monotonic() - started < 60


def test_a_te_release_outside_the_lines_range_is_refused_unless_asked_exactly(tmp_path):
    from rocmport.errors import BadInput
    from rocmport.verify.orchestration import te_layer

    wheels = [
        te_layer.WheelFile(te_layer.Version(v), f"transformer_engine-{v}-py3-none-any.whl", f"/f/{v}", "0" * 64)
        for v in ("2.5.0", "2.12.0")
    ]
    with pytest.raises(
        BadInput, match=r"--te 2\.5\.0: outside this line's Transformer Engine range >=2\.9\.0a0,<2\.13"
    ):
        te_layer.choose("2.5.0", ">=2.9.0a0,<2.13", wheels)
    assert str(te_layer.choose("==2.5.0", ">=2.9.0a0,<2.13", wheels).version) == "2.5.0"
    # the layer a run gets says so, and the verdict carries it
    (tmp_path / "cache" / "te" / "2.5.0" / "transformer_engine").mkdir(parents=True)
    (tmp_path / "cache" / "te" / "2.5.0" / "transformer_engine" / "__init__.py").write_text("")
    layer = te_layer.resolve("==2.5.0", ">=2.9.0a0,<2.13", tmp_path / "cache")
    assert layer is not None and layer.outside_range == ">=2.9.0a0,<2.13"
    assert layer.to_dict()["outside_range"] == ">=2.9.0a0,<2.13"
    with pytest.raises(BadInput, match="outside this line's"):
        te_layer.resolve("2.5.0", ">=2.9.0a0,<2.13", tmp_path / "cache")
    assert te_layer.resolve("2.5.0", None, tmp_path / "cache").outside_range is None


# ---- row 6: parsing limits of the codemod runner --------------------------------------------------

APEX = "from apex.normalization import FusedLayerNorm\n"  # a file the codemods parse (apex-to-torch's trigger)
HOSTILE_SOURCES = {
    "nested3000.py": APEX + "x = " + "(" * 3000 + "1" + ")" * 3000 + "\n",
    "unclosed1000.py": APEX + "x = " + "(" * 1000 + "\n",
    "unclosed50.py": APEX + "x = " + "(" * 50 + "\n",
    "sum20000.py": APEX + "x = " + "+".join(["1"] * 20000) + "\n",
}


def _codemod_tree(tmp_path: Path, files: dict[str, str]) -> Path:
    tree = tmp_path / "tree"
    (tree / "megatron" / "core").mkdir(parents=True)
    # a file the codemods do rewrite, so that the run's other files are seen to go on
    (tree / "megatron" / "core" / "ok.py").write_text(APEX)
    for name, text in files.items():
        (tree / "megatron" / "core" / name).write_text(text)
    return tree


@pytest.mark.parametrize("name", sorted(HOSTILE_SOURCES))
def test_codemod_check_names_a_file_the_parser_cannot_handle_and_goes_on(tmp_path, name):
    import time

    tree = _codemod_tree(tmp_path, {name: HOSTILE_SOURCES[name], "also_ok.py": "import torch\n"})
    started = time.monotonic()
    proc = rocmport(
        "codemod",
        "--check",
        "--jobs",
        "2",
        str(tree),
        cwd=tmp_path,
        timeout=90,
        env={"ROCMPORT_CACHE_DIR": str(tmp_path / "c")},
    )
    assert time.monotonic() - started < 90
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr
    failed = [ln for ln in proc.stderr.splitlines() if name in ln]
    assert len(failed) == 1, proc.stderr
    # over the limits: refused before libcst; a small syntax error: libcst's own message
    assert ("not parsed" in failed[0]) == (name != "unclosed50.py"), failed[0]
    assert "1 failed" in proc.stderr and "apex-to-torch: 1 sites" in proc.stderr  # ok.py still rewritten
    assert (tree / "megatron" / "core" / "ok.py").read_text().startswith("from apex")  # --check writes nothing


def test_codemod_runner_survives_every_hostile_file_in_one_pool(tmp_path):
    from rocmport.codemods.catalog import registry
    from rocmport.codemods.runner import compute_layers

    tree = _codemod_tree(tmp_path, HOSTILE_SOURCES)
    result = compute_layers(tree, sorted(registry), jobs=2, cache_dir=tmp_path / "c")
    assert sorted(f.path for f in result.failures) == sorted(f"megatron/core/{n}" for n in HOSTILE_SOURCES)
    assert "megatron/core/ok.py" in result.changed_files()


def test_a_worker_that_dies_on_a_file_is_that_files_failure_and_the_rest_are_rewritten(tmp_path, monkeypatch):
    """A crash the parse limits do not foresee (a worker killed by a signal inside the parser): the
    run goes on, the file is named, every other file is rewritten (was: BrokenProcessPool, exit 70)."""
    import signal

    from rocmport.codemods import runner
    from rocmport.codemods.catalog import registry
    from rocmport.codemods.runner import CRASHED, compute_layers

    real = runner.transform_text

    def dies_on_crash_py(relpath, text, specs, *args, **kwargs):
        if relpath.endswith("crash.py"):
            # dies by a signal, as libcst's native parser does on some inputs (SIGKILL: a SIGSEGV would
            # have faulthandler print "Fatal Python error" into the suite's log)
            os.kill(os.getpid(), signal.SIGKILL)
        return real(relpath, text, specs, *args, **kwargs)

    monkeypatch.setattr(runner, "transform_text", dies_on_crash_py)  # the forked workers inherit it
    tree = _codemod_tree(tmp_path, {"crash.py": "from apex import amp\n"})
    result = compute_layers(tree, sorted(registry), jobs=2, cache_dir=tmp_path / "c")
    assert [(f.path, f.message) for f in result.failures] == [("megatron/core/crash.py", CRASHED)]
    assert "megatron/core/ok.py" in result.changed_files()


# ---- row 18: status flags a work tree the lock does not describe ------------------------------------


def test_status_flags_a_work_tree_on_another_release_than_the_lock(tmp_path, monkeypatch, capsys):
    from rocmport.cli import main
    from tests.helpers.patches import LAYERS
    from tests.helpers.refresh import Ported, edit_line

    port = Ported(tmp_path, monkeypatch)
    capsys.readouterr()
    assert main(["-C", str(port.root), "status", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["mismatches"] == {}
    port.tag({"megatron/core/layers.py": edit_line(LAYERS, 30, "line 30 rocm")}, "core_v0.17.0", "0.17.0")
    # the bot builds the new release's tree and returns the project to its branch, whose lock pins 0.16.1
    assert main(["-C", str(port.root), "bot", "--once", "--no-verify", "--lines", "v0.17"]) in (0, 1)
    capsys.readouterr()
    lock = (port.root / "upstream.lock").read_text()
    assert "core_v0.16.1" in lock
    proc = rocmport("-C", str(port.root), "status", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    warned = [ln for ln in proc.stderr.splitlines() if "does not match the lock" in ln]
    assert warned and "pins core_v0.16.1" in warned[0], proc.stdout + proc.stderr
    # the table folds a long cell onto the next lines (100 columns in a log): read it unfolded
    assert "NOT THE LOCK'S COMMIT" in " ".join(re.sub(r"[│┃┆]", " ", proc.stdout).split())
    proc = rocmport("-C", str(port.root), "status", "--json", cwd=tmp_path)
    assert "megatron-lm" in json.loads(proc.stdout)["mismatches"]


def test_status_does_not_follow_a_last_json_link_out_of_the_project(tmp_path):
    outside = tmp_path / "outside.json"
    outside.write_text(json.dumps({**LAST_OK, "verdict": "SECRET all stages pass"}))
    root = tmp_path / "p"
    (root / "build" / "verify").mkdir(parents=True)
    (root / "build" / "verify" / "last.json").symlink_to(outside)
    proc = rocmport("-C", str(root), "status", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    said = proc.stdout + proc.stderr
    assert "not a verify report" in said and "leads out of" in said and "SECRET" not in said
