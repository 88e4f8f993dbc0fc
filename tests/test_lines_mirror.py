"""The line matrix on the real upstreams (local mirrors; skipped unless given): every release line,
and upstream main, syncs, applies and passes `rocmport verify --tp 2 --pp 2` with every stage
verify has, under the Python the line needs (3.12). `main` is the commit `rocmport bot --track
main` takes: the project is synced to the newest line, and `rocmport refresh --to main` makes its
series. The chain test carries one port v0.16 -> v0.17 -> v0.18 -> v0.19 with refresh, verify on.
Figures: benchmarks/bench_lines.py."""

from __future__ import annotations

import json
import time

import pytest
import yaml

from tests.helpers.lines import needs_python312, python_for, rocmport
from tests.helpers.real import BRIDGE, MLM, REAL_CACHE, needs_mirrors, project_with
from tests.helpers.sync import g

pytestmark = [pytest.mark.mirror, pytest.mark.slow, needs_mirrors, needs_python312]

# Shared between runs: warm codemod results and unit-test baselines keep a second run short.
CACHE = REAL_CACHE / "lines"
# Stages every line runs from a mirror (the Bridge stage only where the lock pins a companion).
STAGES = ["imports", "gpt-training", "unit-tests", "functional", "bridge"]


def _remotes() -> list[str]:
    return ["--remote", f"megatron-lm={MLM}", "--remote", f"megatron-bridge={BRIDGE}"]


@pytest.mark.parametrize("line", ["v0.15", "v0.16", "v0.17", "v0.18", "v0.19", "main"])
def test_line_syncs_applies_and_verifies(tmp_path, line, capsys):
    root = project_with(tmp_path / "project")
    python = python_for(line)
    start = time.monotonic()
    ref = "v0.19" if line == "main" else line
    proc = rocmport(root, "sync", "--ref", ref, *_remotes(), cache=CACHE, python=python)
    assert proc.returncode == 0, proc.stderr[-3000:]
    sync_s = time.monotonic() - start
    start = time.monotonic()
    if line == "main":  # what `bot --track main` takes: the head of upstream main, its series made by refresh
        proc = rocmport(root, "refresh", "--to", "main", "--no-verify", cache=CACHE, python=python)
        assert proc.returncode == 0, proc.stderr[-3000:]
        lock = yaml.safe_load((root / "upstream.lock").read_text())["upstreams"]
        assert lock["megatron-lm"]["commit"] == g(MLM, "rev-parse", "refs/heads/main")
        assert (
            root
            / "patchsets"
            / "megatron-lm"
            / f"v{'.'.join(lock['megatron-lm']['version'].split('.')[:2])}"
            / "series"
        ).is_file()
    else:
        proc = rocmport(root, "apply", cache=CACHE, python=python)
        assert proc.returncode == 0, proc.stderr[-3000:]
    apply_s = time.monotonic() - start
    lock = yaml.safe_load((root / "upstream.lock").read_text())["upstreams"]
    proc = rocmport(
        root, "verify", "--tp", "2", "--pp", "2", "--report", str(root / "verify.json"), cache=CACHE, python=python
    )
    report = json.loads((root / "verify.json").read_text()) if (root / "verify.json").is_file() else {}
    stages = {s["name"]: s for s in report.get("stages", [])}
    with capsys.disabled():
        print(
            f"\n{line}: sync {sync_s:.1f}s, {'refresh --to main' if line == 'main' else 'apply'} {apply_s:.1f}s; "
            + ", ".join(f"{n} {s['status']} {s['seconds']}s" for n, s in stages.items())
        )
        unit = stages.get("unit-tests", {})
        if "counts" in unit:  # what the closing notes quote: outcomes, and what each failure was labelled
            labels: dict[str, int] = {}
            for label in unit.get("labels", {}).values():
                labels[label] = labels.get(label, 0) + 1
            print(
                f"{line}: unit-tests {unit['counts']}, baseline cached {unit.get('baseline', {}).get('cached')}, labels {labels}"
            )
    assert report, proc.stderr[-3000:]
    assert report["env"]["python"].startswith("3.12") and report["mode"] == "cpu-proxy"
    assert list(stages) == STAGES
    # No Bridge release admits upstream main's version (the companion rule pins none, `refresh` says
    # so): stage 5 is listed as skipped with that reason, never silently absent.
    expected = dict.fromkeys(STAGES, "pass") | ({} if "megatron-bridge" in lock else {"bridge": "skipped"})
    assert {n: s["status"] for n, s in stages.items()} == expected, {n: s["reason"] for n, s in stages.items()}
    if "megatron-bridge" not in lock:
        assert "the lock pins no Bridge" in stages["bridge"]["reason"]
    assert proc.returncode == 0


def test_refresh_chain_v016_to_v019_with_verify(tmp_path, capsys):
    """One port carried v0.16 -> v0.17 -> v0.18 -> v0.19 by `refresh --to` with verify on, each new
    line started from the previous one (the project holds only the v0.16 series, as the bot's
    stacked branches do). Every hop ends ready, or stops at a conflict that names the patch and
    the upstream files (then the chain cannot go on without a human, and the test says so)."""
    root = project_with(tmp_path / "project", {"megatron-lm": "v0.16", "megatron-bridge": "v0.3"})
    proc = rocmport(root, "sync", "--ref", "v0.16", *_remotes(), cache=CACHE)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert rocmport(root, "apply", cache=CACHE).returncode == 0
    hops = []
    for to in ("v0.17", "v0.18", "v0.19"):
        start = time.monotonic()
        proc = rocmport(root, "refresh", "--to", to, "--json", cache=CACHE)
        seconds = time.monotonic() - start
        summary = json.loads((root / "build" / "refresh" / "summary.json").read_text())
        verify = summary.get("verify") or {}
        hops.append(
            (
                to,
                proc.returncode,
                summary["status"],
                round(seconds, 1),
                {s["name"]: s["status"] for s in verify.get("stages", [])},
                summary.get("conflict"),
            )
        )
        with capsys.disabled():
            print(
                f"\nrefresh -> {to}: exit {proc.returncode}, {summary['status']}, {seconds:.1f}s; verify {hops[-1][4]}"
                + (
                    f"; conflict {summary['conflict']['patch']} in {summary['conflict']['files']}"
                    if summary.get("conflict")
                    else ""
                )
            )
        if proc.returncode == 1 and summary.get("conflict"):  # a real upstream conflict: named, for a human
            conflict = summary["conflict"]
            assert (
                conflict["patch"] and conflict["files"] and (root / "build" / "refresh" / conflict["upstream"]).is_dir()
            )
            pytest.fail(
                f"refresh to {to} stops at a real upstream conflict in {conflict['patch']} ({conflict['files']}): "
                f"the chain needs a human there"
            )
        assert proc.returncode == 0, (proc.stderr[-3000:], verify)
        assert summary["status"] == "ready" and not verify.get("skipped") and verify["failed"] == []
        # refresh verifies stages 1-2 (the bot's per-release gate) and lists the rest as not run.
        assert hops[-1][4] == {
            "imports": "pass",
            "gpt-training": "pass",
            "unit-tests": "skipped",
            "functional": "skipped",
            "bridge": "skipped",
        }
        assert all("refresh verifies imports and GPT training" in st["reason"] for st in verify["stages"][2:])
        lock = yaml.safe_load((root / "upstream.lock").read_text())["upstreams"]
        assert lock["megatron-lm"]["resolved_ref"].startswith(f"core_{to}")
        # The port in build/ is what apply makes from the promoted series: the next apply is a no-op.
        proc = rocmport(root, "apply", cache=CACHE)
        assert proc.returncode == 0 and "megatron-lm: up to date" in proc.stderr, proc.stderr[-2000:]
    assert [h[0] for h in hops] == ["v0.17", "v0.18", "v0.19"]
