"""Issue 41's hostile inputs (rows 4-7, 9-12, 14-18, 20): the series' component matrix type-checked,
a hostile last.json told as "not a verify report", terminal escapes stripped, the codemod runner's
per-file parsing limits, contradictory options refused at the command line, TE wheels checked before
any stage, and status flagging a lock the work tree does not match. Each test runs the real CLI (in a
subprocess where the exit code and stderr are the contract)."""

from __future__ import annotations

import json
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
    """The single line a refused command prints on stderr (no traceback, nothing else)."""
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
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
