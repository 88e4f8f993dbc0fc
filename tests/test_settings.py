"""[tool.rocmport] and .rocmport/local.yaml as one typed, checked settings object: a value of the wrong
type is exit 2 naming the file and the key, alike for every command, through the real CLI."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from rocmport.config import DEFAULT_PP, DEFAULT_TP, load_settings
from rocmport.errors import BadInput

BAD_TOOL_VALUES = [
    ('tp = "two"', "tp must be a whole number >= 1"),
    ("tp = [2]", "tp must be a whole number >= 1"),
    ("release-lines = 5", "release-lines must be a list of release lines"),
    ('release-lines = "v0.16"', "release-lines must be a list of release lines"),
    ("cache-dir = 5", "cache-dir must be a directory path string"),
    ("worktree-dir = 5", "worktree-dir must be a directory path string"),
    ('worktree-dir = ["a"]', "worktree-dir must be a directory path string"),
    ("python = 3.12", "python must be the path of a Python interpreter"),
]
MORE_BAD_VALUES = [
    ("tp = 0", "tp must be a whole number >= 1"),
    ("pp = true", "pp must be a whole number >= 1"),
    ('release-lines = ["v0.16", "next"]', "release-lines[1] must be a release line of the form v0.16"),
    ('cache-dir = ""', "cache-dir must be a directory path string"),
]
COMMANDS = [["status"], ["refresh", "--to", "v0.17"], ["bot", "--once"]]


def _rocmport(root: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "ROCMPORT_CACHE_DIR": str(root / "cache")}
    return subprocess.run(
        [sys.executable, "-m", "rocmport", "-C", str(root), *args], capture_output=True, text=True, env=env, timeout=120
    )


@pytest.mark.parametrize("body,expected", BAD_TOOL_VALUES, ids=[b for b, _ in BAD_TOOL_VALUES])
def test_a_bad_tool_setting_is_exit_2_naming_file_and_key_for_every_command(tmp_path, body, expected):
    (tmp_path / "pyproject.toml").write_text(f"[tool.rocmport]\n{body}\n")
    for args in COMMANDS + [["verify", "--dry-run"]] * body.startswith("tp"):
        proc = _rocmport(tmp_path, *args)
        assert proc.returncode == 2, (body, args, proc.stderr)
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in proc.stderr, (body, args, proc.stderr)
        assert f"pyproject.toml: [tool.rocmport] {expected}" in lines[0], (body, args, lines[0])


@pytest.mark.parametrize("body,expected", MORE_BAD_VALUES, ids=[b for b, _ in MORE_BAD_VALUES])
def test_more_bad_tool_values(tmp_path, body, expected):
    (tmp_path / "pyproject.toml").write_text(f"[tool.rocmport]\n{body}\n")
    with pytest.raises(BadInput, match=re.escape(f"pyproject.toml: [tool.rocmport] {expected}")):
        load_settings(tmp_path)


def test_a_bad_local_setting_is_exit_2_naming_file_and_key(tmp_path):
    (tmp_path / ".rocmport").mkdir()
    (tmp_path / ".rocmport" / "local.yaml").write_text("worktree_dir: [a]\n")
    for args in COMMANDS[:1]:
        proc = _rocmport(tmp_path, *args)
        assert proc.returncode == 2 and "local.yaml: key 'worktree_dir' must be a directory path" in proc.stderr, (
            args,
            proc.stderr,
        )


def test_settings_are_typed_with_one_default(tmp_path, monkeypatch):
    monkeypatch.setenv("ROCMPORT_CACHE_DIR", str(tmp_path / "cache"))
    s = load_settings(tmp_path)
    assert (s.tp, s.pp, s.release_lines, s.python) == (DEFAULT_TP, DEFAULT_PP, (), None)
    with pytest.raises(Exception):  # frozen: every command sees the settings as loaded
        s.tp = 3  # type: ignore[misc]
    (tmp_path / "pyproject.toml").write_text(
        '[tool.rocmport]\ntp = 4\npp = 1\nrelease-lines = ["0.16", " core_v0.17"]\npython = "python3.12"\n'
    )
    s = load_settings(tmp_path)
    assert (s.tp, s.pp, s.release_lines, s.python) == (4, 1, ("v0.16", "v0.17"), "python3.12")


def test_verify_honours_the_tool_tp_and_pp(tmp_path):
    """`verify` reads [tool.rocmport] tp/pp as refresh and bot do; a flag still wins."""
    tree = tmp_path / "tree"
    (tree / "megatron" / "core").mkdir(parents=True)
    (tree / "megatron" / "core" / "__init__.py").write_text("")
    (tmp_path / "pyproject.toml").write_text("[tool.rocmport]\ntp = 1\npp = 4\n")  # sizes the verify model takes
    proc = _rocmport(tmp_path, "verify", "--tree", str(tree), "--stages", "2", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert "--tp 1 --pp 4" in proc.stdout
    proc = _rocmport(tmp_path, "verify", "--tree", str(tree), "--stages", "2", "--dry-run", "--tp", "2", "--pp", "1")
    assert proc.returncode == 0 and "--tp 2 --pp 1" in proc.stdout and "--pp 4" not in proc.stdout
    # a tool value the verify model cannot take is refused as a flag would be, before anything runs
    (tmp_path / "pyproject.toml").write_text("[tool.rocmport]\ntp = 1\npp = 3\n")
    proc = _rocmport(tmp_path, "verify", "--tree", str(tree), "--stages", "2", "--dry-run")
    # named by its file and key, not as an option the user never gave (#41 row 17)
    assert proc.returncode == 2 and "[tool.rocmport] pp = 3: the verify model has 4 layers" in proc.stderr


def test_refresh_names_where_a_size_the_verify_model_cannot_take_came_from(tmp_path):
    """refresh and bot check the sizes they will verify with before anything runs: the message names
    the setting ([tool.rocmport] in the file) or the option, whichever gave the bad value."""
    (tmp_path / "pyproject.toml").write_text("[tool.rocmport]\ntp = 3\npp = 4\n")
    proc = _rocmport(tmp_path, "refresh", "--to", "v0.17")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == (
        f"rocmport: error: {tmp_path / 'pyproject.toml'}: [tool.rocmport] tp = 3: the verify model has 4 heads; "
        "use a tp that divides 4"
    )
    proc = _rocmport(tmp_path, "refresh", "--to", "v0.17", "--tp", "1", "--pp", "3")
    assert proc.returncode == 2 and proc.stderr.strip() == (
        "rocmport: error: --pp 3: the verify model has 4 layers; use a pp that divides 4"
    ), proc.stderr
    proc = _rocmport(tmp_path, "bot", "--once")
    assert proc.returncode == 2 and "pyproject.toml: [tool.rocmport] tp = 3: the verify model" in proc.stderr
