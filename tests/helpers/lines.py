"""Release lines under the Python they need: Megatron-LM v0.17+ (and main) require 3.12, so the
mirror tests that verify them run rocmport with a 3.12 interpreter that has torch — this one when
it is 3.12, else $ROCMPORT_TEST_PYTHON312 (skipped, saying so, when neither). Each Megatron-Bridge
release pins its own transformers range (v0.2: ==4.57.1, v0.3: <5, v0.4: 5.0-5.3, v0.5: 5.8.x,
v0.6: 5.8-5.12.1) and v0.5+ import modules newer releases removed, so one environment cannot serve
every line's Bridge stage: $ROCMPORT_TEST_LINE_PYTHONS ("v0.18=/path/python,main=/path/python")
gives a line its own interpreter."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.real import REPO

PYTHON312 = os.environ.get("ROCMPORT_TEST_PYTHON312")
LINE_PYTHON = sys.executable if sys.version_info[:2] >= (3, 12) else PYTHON312
needs_python312 = pytest.mark.skipif(
    not LINE_PYTHON,
    reason="Megatron-LM v0.17+ need Python 3.12: run the tests with it, or set ROCMPORT_TEST_PYTHON312 "
    "to a Python 3.12 that has torch",
)


def _line_pythons(text: str) -> dict[str, str]:
    pairs = [item.split("=", 1) for item in text.split(",") if item.strip()]
    assert all(len(p) == 2 for p in pairs), f"ROCMPORT_TEST_LINE_PYTHONS: want LINE=PATH[,LINE=PATH...], got {text!r}"
    return {line.strip(): path.strip() for line, path in pairs}


LINE_PYTHONS = _line_pythons(os.environ.get("ROCMPORT_TEST_LINE_PYTHONS", ""))


def python_for(line: str) -> str:
    """The interpreter a line's commands run with."""
    assert LINE_PYTHON
    return LINE_PYTHONS.get(line, LINE_PYTHON)


def rocmport(
    root: Path, *args: str, cache: Path, timeout: float = 5400, python: str | None = None
) -> subprocess.CompletedProcess:
    """`rocmport -C root ARGS` with the lines' Python (or `python`) and this checkout's rocmport."""
    assert LINE_PYTHON
    env = {**os.environ, "PYTHONPATH": str(REPO), "ROCMPORT_CACHE_DIR": str(cache)}
    return subprocess.run(
        [python or LINE_PYTHON, "-m", "rocmport", "-C", str(root), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        cwd=root,
    )
