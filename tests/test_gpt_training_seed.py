"""Stage 2 (gpt-training) is deterministic: two runs with the same options train from the same weights
and give the same losses to the bit (its worker seeds the host's generators, runtime/seeding.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rocmport.cli import main
from tests.helpers.real import project_with


@pytest.mark.network
@pytest.mark.torch
@pytest.mark.slow
def test_two_stage_2_runs_give_the_same_losses_to_the_bit(tmp_path, real_index):
    """Stage 2 twice on the package-index source (megatron-core 0.16.1, ported; the CPU proxy),
    tp2 against tp1 over 4 iterations as CI's FP8 training test runs it. The proxy draws the weights
    from torch's CPU generator, which torch seeds at random in every process: before the worker
    seeded it (as Megatron's `_set_random_seed` does) each run trained other weights, and the FP8
    tp2-against-tp1 difference moved from run to run."""
    root = project_with(tmp_path / "project", {"megatron-lm": "v0.16"})
    assert main(["-C", str(root), "sync", "--ref", "v0.16", "--source", "pypi", "--no-bridge"]) == 0
    assert main(["-C", str(root), "apply"]) == 0

    def losses(report: Path) -> dict[str, list[str]]:
        options = ["--stages", "2", "--tp", "2", "--pp", "1", "--iters", "4", "--no-html"]
        rc = main(["-C", str(root), "verify", *options, "--report", str(report)])
        data = json.loads(report.read_text())
        stage = next(s for s in data["stages"] if s["name"] == "gpt-training")
        assert rc == 0 and stage["status"] == "pass", stage
        training = data["training"]
        # float.hex: the bits, not a printed rounding of them
        return {k: [float(x).hex() for x in training[k]] for k in ("reference_losses", "losses")}

    first, second = losses(tmp_path / "first.json"), losses(tmp_path / "second.json")
    assert len(first["losses"]) == 4
    assert first == second
