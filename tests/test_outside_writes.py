"""The suite's own guard (tests/helpers/outside_writes.py, registered by tests/conftest.py): a run
whose tests write into the checkout's build/ or the user's ~/.cache/rocmport* fails, naming each
path; a run whose tests write only under their tmp_path passes. Each case is a real pytest session
in a subprocess, over a checkout and a home directory made for it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.helpers.outside_writes import changes, snapshot
from tests.helpers.real import REPO

CONFTEST = """\
from pathlib import Path
from tests.helpers.outside_writes import OutsideWrites

def pytest_configure(config):
    config.pluginmanager.register(OutsideWrites(Path(__file__).parent), "outside-writes")
"""


def session(tmp_path: Path, body: str) -> subprocess.CompletedProcess:
    """pytest over one test file holding ``body``, in a git checkout under tmp_path, HOME its sibling."""
    checkout, home = tmp_path / "checkout", tmp_path / "home"
    checkout.mkdir()
    (home / ".cache" / "rocmport").mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(checkout)], check=True)
    (checkout / ".gitignore").write_text("/build/\n__pycache__/\n")
    (checkout / "conftest.py").write_text(CONFTEST)
    (checkout / "test_it.py").write_text(textwrap.dedent(body))
    env = {k: v for k, v in os.environ.items() if k not in ("XDG_CACHE_HOME", "ROCMPORT_CACHE_DIR")}
    env.update(HOME=str(home), PYTHONPATH=str(REPO))
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_it.py"],
        cwd=checkout,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_run_that_writes_a_report_into_build_and_the_users_cache_fails_naming_them(tmp_path):
    proc = session(
        tmp_path,
        """\
        from pathlib import Path

        def test_writes_outside():
            (Path("build") / "verify").mkdir(parents=True)
            (Path("build") / "verify" / "last.json").write_text("{}")
            baselines = Path.home() / ".cache" / "rocmport" / "unit-baselines"
            baselines.mkdir()
            (baselines / "abc.json").write_text("{}")
        """,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "1 passed" in proc.stdout  # every test passed: the writes alone fail the run
    home, checkout = tmp_path / "home", tmp_path / "checkout"
    named = [ln.strip() for ln in proc.stdout.splitlines() if ln.startswith("  new: ")]
    assert f"new: {checkout}/build/" in named
    assert f"new: {checkout}/build/verify/last.json" in named
    assert f"new: {home}/.cache/rocmport/unit-baselines/abc.json" in named


def test_a_run_that_writes_only_under_tmp_path_passes(tmp_path):
    proc = session(
        tmp_path,
        """\
        def test_writes_in_tmp(tmp_path):
            (tmp_path / "build" / "verify").mkdir(parents=True)
            (tmp_path / "build" / "verify" / "last.json").write_text("{}")
        """,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "writes outside tmp" not in proc.stdout


def test_a_changed_report_under_build_and_an_untracked_file_are_changes(tmp_path):
    checkout, home = tmp_path / "c", tmp_path / "h"
    (checkout / "build" / "verify").mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(checkout)], check=True)
    (checkout / ".gitignore").write_text("/build/\n")
    last = checkout / "build" / "verify" / "last.json"
    last.write_text("{}")
    before = snapshot(checkout, home)
    last.write_text('{"tree": "/tmp/fake"}')
    (checkout / "stray.json").write_text("{}")
    (checkout / "__pycache__").mkdir()  # bytecode is expected, not a change
    assert changes(before, snapshot(checkout, home)) == [f"changed: {last}", f"new: {checkout}/stray.json"]
