"""The type checker over rocmport/ (configured in pyproject.toml's [tool.mypy]), so CI's
`python -m pytest` runs it. Skipped only where mypy is not installed (it is in the `test` extra)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(importlib.util.find_spec("mypy") is None, reason="mypy is not installed (pip install -e '.[test]')")
@pytest.mark.parametrize("python", [None, "3.10", "3.12"])
def test_mypy_passes_on_rocmport(tmp_path, python):
    """As configured (3.11), and against the standard library of the other Pythons rocmport runs on:
    a 3.11-only module or function (tomllib, typing.Self ...) or one 3.12 removed fails here."""
    target = ["--python-version", python] if python else []
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path / "mypy-cache"), *target],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert proc.stdout.startswith("Success: no issues found")
