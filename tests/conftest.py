"""Fixtures shared by the test modules (helpers to import live in tests/helpers/)."""

from __future__ import annotations

import importlib.util
import tempfile
from pathlib import Path

import pytest

from tests.helpers.outside_writes import OutsideWrites
from tests.helpers.real import REAL_CACHE, REPO


@pytest.fixture()
def real_index(monkeypatch) -> Path:
    """The real package index (no ROCMPORT_INDEX_URL override) with the shared cache of real sdists
    as ROCMPORT_CACHE_DIR; returns that cache."""
    monkeypatch.setenv("ROCMPORT_CACHE_DIR", str(REAL_CACHE))
    monkeypatch.delenv("ROCMPORT_INDEX_URL", raising=False)
    return REAL_CACHE


HAVE_TORCH = importlib.util.find_spec("torch") is not None


def pytest_configure(config):
    """The run fails when the checkout (its git status, build/) or the user's ~/.cache/rocmport*
    changed during it. The one exemption: REAL_CACHE, the download cache of real sdists and wheels
    the network tests share between runs on purpose (fetched bytes are checked against the index)."""
    config.pluginmanager.register(OutsideWrites(REPO, frozenset({REAL_CACHE.resolve()})), "rocmport-outside-writes")


@pytest.fixture(autouse=True)
def _writes_stay_in_tmp(tmp_path_factory, monkeypatch):
    """Every directory rocmport writes to by default, pointed at a temporary one: its cache
    (ROCMPORT_CACHE_DIR: mirrors, sdists, unit-baselines/, verify's bytecode), XDG_CACHE_HOME (the
    default cache's parent, torch's and others'), and the current directory, which is the default
    project (`-C .`): `rocmport verify` with no -C writes build/verify/<name>-<time>.json and
    last.json there, and the temporary directory (TMPDIR). A test that needs one of them elsewhere
    sets it itself."""
    outside = tmp_path_factory.mktemp("outside")
    # Temporary files too (this process's tempfile and every process it starts: torchrun's
    # torchelastic_*, an interrupted apply's rocmport-apply-*), so nothing outlives pytest's own tmp.
    (outside / "tmp").mkdir()
    monkeypatch.setenv("TMPDIR", str(outside / "tmp"))
    monkeypatch.setattr(tempfile, "tempdir", str(outside / "tmp"))
    monkeypatch.setenv("ROCMPORT_CACHE_DIR", str(outside / "rocmport-cache"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(outside / "xdg-cache"))
    (outside / "project").mkdir()
    monkeypatch.chdir(outside / "project")


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
