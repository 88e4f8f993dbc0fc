"""docs/rocm-port-coverage.md is generated (scripts/port_coverage.py): it must be current, and every
codemod a Megatron-LM recipe runs must be accounted for in docs/coverage/items.yaml."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import yaml

from rocmport.codemods import registry

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "port_coverage.py"


def load_script():
    spec = importlib.util.spec_from_file_location("port_coverage", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_document_is_current():
    proc = subprocess.run([sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stderr


def test_a_stale_document_is_caught(tmp_path, monkeypatch):
    """--check fails on a stale document, and regenerating writes the committed document again (the
    expected text is read before DOC is pointed at the stale copy, so a generator that writes
    anything else fails here)."""
    pc = load_script()
    committed = pc.DOC.read_text()
    assert "| covered |" in committed
    stale = tmp_path / "coverage.md"
    stale.write_text(committed.replace("| covered |", "| open |", 1))
    monkeypatch.setattr(pc, "DOC", stale)
    monkeypatch.setattr(sys, "argv", ["port_coverage.py", "--check"])
    assert pc.main() == 1
    assert stale.read_text() != committed  # --check writes nothing
    monkeypatch.setattr(sys, "argv", ["port_coverage.py"])
    assert pc.main() == 0
    assert stale.read_text() == committed
    monkeypatch.setattr(sys, "argv", ["port_coverage.py", "--check"])
    assert pc.main() == 0


def test_every_recipe_codemod_is_an_item_and_every_item_names_real_codemods():
    pc = load_script()
    items = yaml.safe_load(pc.ITEMS.read_text())
    named = {m["codemod"] for item in items for m in item.get("rocmport_by", []) if "codemod" in m}
    assert named <= set(registry)
    used = {n for series in pc.recipes().values() for n in pc.codemod_names(series)}
    assert used <= named, used - named
    assert len({item["id"] for item in items}) == len(items)
    for item in items:  # an item is handled (rocmport_by) or open with its reason
        assert item.get("rocmport_by") or item.get("open"), item["id"]


def test_sites_are_recorded_for_every_line_and_recipe_codemod():
    pc = load_script()
    sites = json.loads(pc.SITES.read_text())
    for line, series in pc.recipes().items():
        assert set(sites[line]) == set(pc.codemod_names(series)), line


def test_cells_follow_the_recipe():
    """A codemod left out of a line's recipe shows in that line's cell and in the item's status."""
    pc = load_script()
    item = {"id": "X", "title": "t", "rocmport_by": [{"codemod": "nccl-allocator-rccl"}]}
    series = pc.recipes()
    sites = {"v0.16": {"nccl-allocator-rccl": [["megatron/core/nccl_allocator.py", 91, "extra_ldflags"]]}}
    assert pc.line_cell(item, "v0.16", series["v0.16"], sites) == (
        "`nccl-allocator-rccl` 1",
        ["`megatron/core/nccl_allocator.py:91`"],
    )
    trimmed = series["v0.16"]
    trimmed.codemods = [c for c in trimmed.codemods if c["name"] != "nccl-allocator-rccl"]
    cell, _ = pc.line_cell(item, "v0.16", trimmed, sites)
    assert cell == "`nccl-allocator-rccl` not in the recipe" and pc.status(item, {"v0.16": cell}) == "partial"
