"""Against local mirrors of the real upstreams (skipped unless the env vars name them)."""

from __future__ import annotations

import time

import pytest
import yaml

from rocmport.cli import main
from tests.helpers.real import BRIDGE, MLM, needs_mirrors

pytestmark = [pytest.mark.mirror, needs_mirrors]

# Release line -> (Megatron-LM tag, companion Bridge tag, rule). Facts of the real upstreams.
EXPECTED = {
    "v0.15": ("core_v0.15.3", "v0.2.2", "declared-range"),
    "v0.16": ("core_v0.16.1", "v0.3.1", "gitlink-exact"),
    "v0.17": ("core_v0.17.1", "v0.4.2", "gitlink-minor"),
    "v0.18": ("core_v0.18.2", "v0.5.1", "gitlink-minor"),
    "v0.19": ("core_v0.19.0", "v0.6.0", "gitlink-minor"),
}


def test_every_release_line_pins_the_right_companion(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ROCMPORT_CACHE_DIR", str(tmp_path / "cache"))
    args = ["--remote", f"megatron-lm={MLM}", "--remote", f"megatron-bridge={BRIDGE}"]
    timings = {}
    for line, (tag, bridge, rule) in EXPECTED.items():
        start = time.monotonic()
        assert main(["-C", str(tmp_path), "sync", "--ref", line, *args]) == 0
        timings[line] = time.monotonic() - start
        pins = yaml.safe_load((tmp_path / "upstream.lock").read_text())["upstreams"]
        assert pins["megatron-lm"]["resolved_ref"] == tag
        assert (pins["megatron-bridge"]["resolved_ref"], pins["megatron-bridge"]["chosen_by"]) == (bridge, rule)
        assert pins["megatron-lm"]["url"] == "https://github.com/NVIDIA/Megatron-LM.git"
    assert main(["-C", str(tmp_path), "sync", "--ref", "v0.16"]) == 0  # remembered remotes
    start = time.monotonic()
    assert main(["-C", str(tmp_path), "sync"]) == 0
    timings["verify"] = time.monotonic() - start
    with capsys.disabled():
        print("\nsync timings (s): " + ", ".join(f"{k} {v:.2f}" for k, v in timings.items()))
