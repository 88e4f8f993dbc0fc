"""Fixtures shared by the test modules (helpers to import live in tests/helpers/)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.real import REAL_CACHE


@pytest.fixture()
def real_index(monkeypatch) -> Path:
    """The real package index (no ROCMPORT_INDEX_URL override) with the shared cache of real sdists
    as ROCMPORT_CACHE_DIR; returns that cache."""
    monkeypatch.setenv("ROCMPORT_CACHE_DIR", str(REAL_CACHE))
    monkeypatch.delenv("ROCMPORT_INDEX_URL", raising=False)
    return REAL_CACHE
