"""`rocmport refresh` on the real upstreams (local mirrors; skipped unless given)."""

from __future__ import annotations

import json
import time

import pytest
import yaml

from rocmport.cli import main
from tests.helpers.real import BRIDGE, MLM, needs_mirrors, project_with
from tests.helpers.sync import g


@pytest.mark.mirror
@needs_mirrors
def test_refresh_v016_port_to_v017(tmp_path, monkeypatch):
    monkeypatch.setenv("ROCMPORT_CACHE_DIR", str(tmp_path / "cache"))
    # Only the old line's series: refresh has to start the next line.
    root = project_with(tmp_path / "project", {"megatron-lm": "v0.16", "megatron-bridge": "v0.3"})
    run = lambda *a: main(["-C", str(root), *a])  # noqa: E731
    assert run("sync", "--ref", "v0.16", "--remote", f"megatron-lm={MLM}", "--remote", f"megatron-bridge={BRIDGE}") == 0
    assert run("apply") == 0
    start = time.monotonic()
    assert run("refresh", "--to", "v0.17", "--no-verify") == 0
    seconds = time.monotonic() - start
    summary = json.loads((root / "build" / "refresh" / "summary.json").read_text())
    mlm = summary["upstreams"]["megatron-lm"]
    series = yaml.safe_load((root / "patchsets" / "megatron-lm" / "v0.17" / "series").read_text())
    assert mlm["created"] and series["patches"] and series["line"] == "v0.17"
    assert (root / "patchsets" / "megatron-bridge" / "v0.4" / "series").is_file()
    lock = yaml.safe_load((root / "upstream.lock").read_text())["upstreams"]
    assert lock["megatron-lm"]["resolved_ref"] == "core_v0.17.1" and lock["megatron-bridge"]["resolved_ref"] == "v0.4.2"
    # The new series applies exactly on core_v0.17.1.
    assert run("apply") == 0
    report = json.loads((root / "build" / "megatron-lm.report.json").read_text())
    assert report["totals"] == {"clean": len(series["patches"])}
    assert (
        g(root / "build" / "megatron-lm", "rev-parse", "rocmport/base/core_v0.17.1^{commit}")
        == lock["megatron-lm"]["commit"]
    )
    md = (root / "build" / "refresh" / "summary.md").read_text()
    assert "core_v0.16.1" in md and "core_v0.17.1" in md and "range-diff" in md
    outcomes = {p["name"]: (p["bucket"], p["action"]) for p in mlm["patches"]}
    print(
        f"\nrefresh v0.16 -> v0.17 (--no-verify): {seconds:.1f} s; patches {outcomes}; "
        f"codemods {[(c['name'], c['old_sites'], c['new_sites']) for c in mlm['codemods']]}"
    )


@pytest.mark.mirror
@needs_mirrors
def test_refresh_patch_release_with_verify(tmp_path, monkeypatch):
    """core_v0.16.0 -> core_v0.16.1 in place, verify (tp2 x pp2 CPU proxy) on the refreshed port."""
    monkeypatch.setenv("ROCMPORT_CACHE_DIR", str(tmp_path / "cache"))
    root = project_with(tmp_path / "project", {"megatron-lm": "v0.16"})
    run = lambda *a: main(["-C", str(root), *a])  # noqa: E731
    assert run("sync", "--ref", "core_v0.16.0", "--no-bridge", "--remote", f"megatron-lm={MLM}") == 0
    assert run("apply") == 0
    before = (root / "patchsets" / "megatron-lm" / "v0.16" / "series").read_text()
    start = time.monotonic()
    assert run("refresh", "--to", "v0.16") == 0
    seconds = time.monotonic() - start
    summary = json.loads((root / "build" / "refresh" / "summary.json").read_text())
    assert not summary["upstreams"]["megatron-lm"]["created"]
    assert (root / "patchsets" / "megatron-lm" / "v0.16" / "series").read_text() == before
    stages = {s["name"]: s["status"] for s in summary["verify"]["stages"]}
    # refresh verifies stages 1-2; the others are listed as not run, with the reason
    assert stages == {
        "imports": "pass",
        "gpt-training": "pass",
        "unit-tests": "skipped",
        "functional": "skipped",
        "bridge": "skipped",
    }
    assert summary["verify"]["mode"] == "cpu-proxy"
    print(f"\nrefresh core_v0.16.0 -> core_v0.16.1 with verify: {seconds:.1f} s; stages {stages}")
