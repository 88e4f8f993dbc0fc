"""Fixtures shared by the test modules (helpers to import live in tests/helpers/)."""

from __future__ import annotations

import importlib.util
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


HAVE_TORCH = importlib.util.find_spec("torch") is not None


def pytest_collection_modifyitems(config, items):
    """Tests marked `torch` run code that imports torch: without one (a torch-free Python 3.10
    environment, say) they are skipped with that reason instead of failing on the import."""
    if HAVE_TORCH:
        return
    skip = pytest.mark.skip(reason="needs torch, which this interpreter does not have (pip install torch)")
    for item in items:
        if item.get_closest_marker("torch"):
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _fresh_machine_probe():
    """verify probes the machine once per process (rocmport.machine.probe is cached): a test that changes
    what torch answers (no torch, a simulated GPU) gets its own probe."""
    from rocmport.machine import probe

    probe.probe.cache_clear()
    yield
    probe.probe.cache_clear()
