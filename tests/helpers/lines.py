"""Release lines under the Python they need: Megatron-LM v0.17+ (and main) require 3.12, so the
mirror tests that verify them run rocmport with a 3.12 interpreter that has torch — this one when
it is 3.12, else $ROCMPORT_TEST_PYTHON312 (skipped, saying so, when neither)."""

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
    not LINE_PYTHON, reason="Megatron-LM v0.17+ need Python 3.12: run the tests with it, or set ROCMPORT_TEST_PYTHON312 "
                            "to a Python 3.12 that has torch")


def rocmport(root: Path, *args: str, cache: Path, timeout: float = 5400) -> subprocess.CompletedProcess:
    """`rocmport -C root ARGS` with the lines' Python and this checkout's rocmport."""
    assert LINE_PYTHON
    env = {**os.environ, "PYTHONPATH": str(REPO), "ROCMPORT_CACHE_DIR": str(cache)}
    return subprocess.run([LINE_PYTHON, "-m", "rocmport", "-C", str(root), *args], capture_output=True, text=True, env=env,
                          timeout=timeout, cwd=root)
