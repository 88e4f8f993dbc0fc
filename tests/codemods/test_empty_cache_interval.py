"""empty-cache-interval (coverage item E6): before/after, what it leaves, and how often train_step's
per-iteration empty_cache() runs on HIP and on CUDA (run in a process, torch.cuda.empty_cache
recorded); on every line's real training.py with a Megatron-LM mirror."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.helpers.codemods import assert_codemod, assert_idempotent, rewrite, rewrite_with_reports, run_tree

REL = "megatron/training/training.py"
# Shaped like megatron/training/training.py's train_step at core_v0.15.3 (l.1283-1322).
TRAINING = '''\
import torch


def train_step(args, optimizer):
    """Single training step."""
    # Empty unused memory.
    if args.empty_unused_memory_level >= 1:
        torch.cuda.empty_cache()

    update_successful = optimizer.step()

    # Empty unused memory.
    if args.empty_unused_memory_level >= 2:
        torch.cuda.empty_cache()
    return update_successful


def evaluate(args):
    if args.empty_unused_memory_level >= 1:
        torch.cuda.empty_cache()
'''


def test_exact_before_after():
    after = TRAINING.replace(
        "import torch\n", "import torch\nfrom megatron.core._rocm import empty_cache_on_interval\n", 1
    ).replace(
        "    if args.empty_unused_memory_level >= 1:\n        torch.cuda.empty_cache()\n\n    update",
        "    if args.empty_unused_memory_level >= 1:\n        empty_cache_on_interval()\n\n    update",
    )
    assert_codemod("empty-cache-interval", TRAINING, after, REL, sites=1)
    assert_idempotent("empty-cache-interval", TRAINING, REL)


def test_only_train_steps_level_1_gate_however_torch_is_imported():
    # The level-2 call after the optimizer step and evaluate's run rarely: left (as Primus leaves them).
    src = (
        "import torch.cuda as tc\n\ndef train_step(args):\n    if args.empty_unused_memory_level >= 1:\n        tc.empty_cache()\n"
        "        if x:\n            tc.empty_cache()\n    tc.empty_cache()\n"
    )
    after, sites = rewrite("empty-cache-interval", src, REL)
    # The gate's own call only: one in a nested if, and one outside the gate, are not per-iteration by that gate.
    assert sites == 1 and after.count("empty_cache_on_interval()") == 1 and after.count("tc.empty_cache()") == 2
    _, _, reports = rewrite_with_reports("empty-cache-interval", TRAINING, REL)
    assert [r.line for r in reports if r.kind == "site"] == [8]


# train_step run 7 times with --empty-unused-memory-level 1: which iterations emptied the cache.
PROBE = """
import json, torch
emptied = []
torch.cuda.empty_cache = lambda: emptied.append(it)
from megatron.training.training import train_step
class Args: empty_unused_memory_level = LEVEL
class Opt:
    def step(self): return True
for it in range(7):
    train_step(Args, Opt())
print(json.dumps(emptied))
"""


def emptied(tmp_path, source: str, hip: str | None, level: int = 1, interval: str | None = None) -> list[int]:
    env = {"ROCMPORT_EMPTY_CACHE_INTERVAL": interval} if interval is not None else {}
    proc = run_tree(
        tmp_path,
        {REL: source, "megatron/training/__init__.py": ""},
        PROBE.replace("LEVEL", str(level)),
        hip=hip,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return __import__("json").loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.torch
def test_interval_on_hip_every_iteration_on_cuda(tmp_path):
    after, _ = rewrite("empty-cache-interval", TRAINING, REL)
    every = list(range(7))
    assert emptied(tmp_path / "h3", after, "7.1.25424", interval="3") == [0, 3, 6]
    assert emptied(tmp_path / "h0", after, "7.1.25424", interval="0") == []
    assert emptied(tmp_path / "h1", after, "7.1.25424") == every  # unset: upstream's behaviour, and says so
    unset = run_tree(
        tmp_path / "h1w",
        {REL: after, "megatron/training/__init__.py": ""},
        PROBE.replace("LEVEL", "1"),
        hip="7.1.25424",
    )
    assert unset.stderr.count("ROCMPORT_EMPTY_CACHE_INTERVAL=N") == 1, unset.stderr
    assert emptied(tmp_path / "hx", after, "7.1.25424", interval="²") == every  # not a number: every iteration, warned
    assert emptied(tmp_path / "lvl0", after, "7.1.25424", level=0, interval="3") == []  # upstream's gate kept
    # The CUDA control: every iteration whatever the variable says, as upstream's tree does.
    assert (
        emptied(tmp_path / "c3", after, None, interval="3")
        == emptied(tmp_path / "up", TRAINING, None, interval="3")
        == every
    )
    cuda = run_tree(tmp_path / "cw", {REL: after, "megatron/training/__init__.py": ""}, PROBE.replace("LEVEL", "1"))
    assert "ROCMPORT_EMPTY_CACHE_INTERVAL" not in cuda.stderr


MLM = os.environ.get("ROCMPORT_TEST_MLM_MIRROR")
RELEASES = {
    "v0.15": "core_v0.15.3",
    "v0.16": "core_v0.16.1",
    "v0.17": "core_v0.17.1",
    "v0.18": "core_v0.18.2",
    "v0.19": "core_v0.19.0",
}


@pytest.mark.mirror
@pytest.mark.skipif(not MLM, reason="set ROCMPORT_TEST_MLM_MIRROR to a local Megatron-LM mirror")
@pytest.mark.parametrize("line", list(RELEASES))
def test_real_train_step_every_line(line):
    text = subprocess.run(
        ["git", "--git-dir", MLM, "show", f"{RELEASES[line]}:{REL}"], capture_output=True, text=True, check=True
    ).stdout
    after, sites = rewrite("empty-cache-interval", text, REL)
    assert sites == 1
    assert text.count("torch.cuda.empty_cache()") - after.count("torch.cuda.empty_cache()") == 1
