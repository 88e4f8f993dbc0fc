"""Crash test: `rocmport apply` killed (SIGKILL to its process group) at seeded random points, with
and without a user working in the tree afterwards (tests/helpers/crash.py). A few rounds in CI on a
small real upstream; 20+ on the real Megatron-LM mirror:

    ROCMPORT_TEST_MLM_MIRROR=/path/to/Megatron-LM.git python -m pytest -q -s -m mirror tests/test_apply_crash.py
    (ROCMPORT_CRASH_KILLS=N sets the number of rounds of either test)
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.crash import kill_round, run_apply, summary
from tests.helpers.patches import Project, make_patch

MLM = os.environ.get("ROCMPORT_TEST_MLM_MIRROR")
REPO = Path(__file__).resolve().parents[1]
AMP = "import torch\n\n\n@torch.cuda.amp.custom_fwd\ndef f(x):\n    return x\n"


def _timed_fresh_apply(root: Path, tree: Path) -> float:
    """Seconds from the moment the apply is observably under way to its end (the kill window)."""
    shutil.rmtree(tree, ignore_errors=True)
    proc = subprocess.Popen(
        [sys.executable, "-m", "rocmport", "-C", str(root), "apply"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    state = tree / ".git" / "rocmport-state.json"
    while proc.poll() is None and not (state.exists() and "in-progress" in state.read_text(errors="replace")):
        time.sleep(0.005)
    start = time.monotonic()
    assert proc.wait(1800) == 0
    return time.monotonic() - start


def _rounds(root: Path, tree: Path, n: int, capsys) -> None:
    assert run_apply(root)[0] == 0
    reference = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=tree, capture_output=True, text=True, check=True
    ).stdout.strip()
    window = _timed_fresh_apply(root, tree)
    rounds = [kill_round(root, tree, reference, seed, 0.95 * window) for seed in range(n)]
    with capsys.disabled():
        print(f"\nkill window {window:.1f}s; {summary(rounds)}")
        for r in rounds:
            print(
                f"  seed {r.seed}: delay {r.delay}s, {'fresh' if r.fresh else 'rebuild'}, killed={r.killed} at {r.phase}, "
                f"user work={r.user_work} refused={r.refused} kept={r.work_kept}, recovered={r.recovered} {r.notes or ''}"
            )
    bad = [r for r in rounds if not r.ok()]
    assert not bad, bad
    assert any(r.killed for r in rounds), "no round was killed mid-apply: the window is wrong"


def test_kill_apply_at_random_points(tmp_path, monkeypatch, capsys):
    proj = Project(tmp_path, monkeypatch)
    files = {f"megatron/core/amp{i}.py": AMP for i in range(4)}
    files["megatron/core/opt.py"] = "import modelopt\n"
    files["pyproject.toml"] = '[project]\nname = "megatron-core"\ndependencies = ["torch", "transformer-engine"]\n'
    proj.pin(proj.upstream_commit(files))
    proj.refresh_mirror()
    patches = {
        f"{i:04d}-p.patch": make_patch(proj.up, {f"megatron/core/new{i}.py": f"x = {i}\n" * 50}, desc=f"p{i}")
        for i in range(1, 13)
    }
    proj.write_series(patches, codemods=["apex-to-torch", "guard-nvidia-only-imports"])
    _rounds(proj.root, proj.tree, int(os.environ.get("ROCMPORT_CRASH_KILLS", "3")), capsys)


@pytest.mark.mirror
@pytest.mark.slow
@pytest.mark.skipif(not MLM, reason="set ROCMPORT_TEST_MLM_MIRROR to a local Megatron-LM mirror")
def test_kill_apply_on_the_real_megatron_lm(tmp_path, monkeypatch, capsys):
    """The v0.16 port of the real Megatron-LM (its patch, nine codemods over the whole tree, the manifests)."""
    monkeypatch.setenv("ROCMPORT_CACHE_DIR", str(tmp_path / "cache"))
    root = tmp_path / "project"
    root.mkdir()
    shutil.copytree(REPO / "patchsets", root / "patchsets")
    sync = subprocess.run(
        [
            sys.executable,
            "-m",
            "rocmport",
            "-C",
            str(root),
            "sync",
            "--ref",
            "v0.16",
            "--no-bridge",
            "--remote",
            f"megatron-lm={MLM}",
        ],
        capture_output=True,
        text=True,
    )
    assert sync.returncode == 0, sync.stderr
    _rounds(root, root / "build" / "megatron-lm", int(os.environ.get("ROCMPORT_CRASH_KILLS", "20")), capsys)
