"""The real upstreams: local mirrors of Megatron-LM and Megatron-Bridge (mirror tests, skipped unless
given), the repository's own patch series, and the cache the real package-index tests share."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MLM = os.environ.get("ROCMPORT_TEST_MLM_MIRROR")
BRIDGE = os.environ.get("ROCMPORT_TEST_BRIDGE_MIRROR")
# Real sdists and their imported commits, kept between runs (the index serves the same bytes).
REAL_CACHE = Path.home() / ".cache" / "rocmport-test"

needs_mirrors = pytest.mark.skipif(
    not (MLM and BRIDGE), reason="set ROCMPORT_TEST_MLM_MIRROR and ROCMPORT_TEST_BRIDGE_MIRROR to local mirrors"
)
needs_mlm_mirror = pytest.mark.skipif(not MLM, reason="set ROCMPORT_TEST_MLM_MIRROR to a local Megatron-LM mirror")


def project_with(root: Path, series: dict[str, str] | None = None) -> Path:
    """A project directory holding the repository's series: every one, or only ``series`` (upstream -> line)."""
    if series is None:
        shutil.copytree(REPO / "patchsets", root / "patchsets")
    for upstream, line in (series or {}).items():
        shutil.copytree(REPO / "patchsets" / upstream / line, root / "patchsets" / upstream / line)
    return root
