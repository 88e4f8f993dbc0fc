"""verify's upstream unit-test stage: upstream's own tests on the port, the way upstream CI runs
them (`torchrun --nproc_per_node N -m pytest ...`), compared with the same tests on the unported
tree at the same commit (cached by commit) so each failure is a port regression or upstream's."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import signal
import subprocess
import tempfile
import time
from collections import Counter
from pathlib import Path

from rocmport.fsutil import atomic_write_text
from rocmport.gitutil import git, run_git
from rocmport.verify.launcher import Launcher
from rocmport.verify.stages import FAIL, PASS, SKIPPED, StageResult

DEFAULT_TESTS = ("tests/unit_tests/models/test_gpt_model.py", "tests/unit_tests/pipeline_parallel/test_schedules.py")
PLUGIN_VERSION = "6"
_RANK = {"error": 3, "failed": 2, "skipped": 1, "passed": 0}


def pytest_command(tests: list[str], nproc: int, launcher: Launcher = Launcher()) -> list[str]:
    """Upstream CI's invocation (`torchrun --nproc_per_node N -m pytest`, one node), plus rocmport's
    plugin; conftest.py (the test-data download) skipped."""
    return launcher.command(nproc, ["-m", "pytest", "-p", "rocmport.verify.pytest_plugin", "--noconftest", "-p", "no:cacheprovider",
                                    "--continue-on-collection-errors", "-q", "-o", "addopts=", *tests], "unit-tests", single_node=True)


def _attempt(tree: Path, tests: list[str], done: list[str], env: dict, nproc: int, launcher: Launcher, timeout: float):
    """One torchrun of pytest, without the tests in ``done``; each rank's record and whether it was stopped."""
    cmd = pytest_command(tests, nproc, launcher)
    cmd = cmd[:-len(tests)] + [a for nodeid in done for a in ("--deselect", nodeid)] + tests
    with tempfile.TemporaryDirectory(prefix="rocmport-unit-") as out:
        log = Path(out) / "torchrun.log"
        with open(log, "w") as fh:  # a file, not a pipe: an orphaned worker cannot block the read
            proc = subprocess.Popen(cmd, cwd=tree, text=True, start_new_session=True, env={**env, "ROCMPORT_UNIT_OUT": out},
                                    stdout=fh, stderr=subprocess.STDOUT)
            try:
                proc.wait(timeout=timeout)
                stopped = False
            except subprocess.TimeoutExpired:
                # torchrun stops its workers (their own sessions) on SIGTERM; SIGKILL if it does not.
                proc.terminate()
                try:
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
                stopped = True
        ranks = [json.loads(p.read_text()) for p in sorted(Path(out).glob("rank*.json"))]
        stdout, stderr = log.read_text(errors="replace"), ""
    tail = (stderr.strip() or stdout.strip()).splitlines()[-1:] or [""]
    return ranks, stopped, tail[0][:300]


def run_tests(tree: Path, tests: list[str], env: dict, nproc: int, launcher: Launcher = Launcher(), timeout: float = 1500,
              restarts: int = 6) -> dict:
    """Outcomes per test id, merged over ranks (a failure on any rank is a failure). A test that
    hangs (the plugin's watchdog) is a failure and the run starts again without the tests that have
    an outcome; a run stopped at ``timeout`` keeps what the ranks recorded."""
    start = time.monotonic()
    env = {"ROCMPORT_UNIT_TEST_TIMEOUT": "45" if env.get("ROCMPORT_PROXY") == "1" else "900", **env}
    merged: dict[str, str] = {}
    details: dict[str, str] = {}
    swaps: list[str] = []
    hung: list[str] = []
    local_spec: set[str] = set()
    ran = 0
    crash = ""
    for attempt in range(restarts + 1):
        ranks, stopped, crash = _attempt(tree, tests, list(merged), env, nproc, launcher, max(1.0, timeout - (time.monotonic() - start)))
        ran = max(ran, len(ranks))
        swaps = swaps or (ranks[0]["swaps"] if ranks else [])
        local_spec.update(nodeid for r in ranks for nodeid in r.get("local_spec", []))
        # The test that hung first is the hang; ranks that then waited on it in later tests, or
        # failed because a peer was killed, are collateral: those tests run again.
        first = min((h for r in ranks for h in r.get("hung", [])), key=lambda h: h[1], default=None)
        new_hang = first[0] if first else None
        if new_hang:
            hung.append(new_hang)
        seen = Counter(nodeid for r in ranks for nodeid in r["outcomes"])
        for r in ranks:
            for nodeid in r.get("running", []) if stopped else []:
                r["outcomes"][nodeid] = "failed"
                r["details"][nodeid] = f"still running when the stage stopped it after {timeout:g} s"
            for nodeid, outcome in r["outcomes"].items():
                if new_hang and nodeid != new_hang and (seen[nodeid] < len(ranks) or nodeid in {h[0] for h in r.get("hung", [])}):
                    continue
                if _RANK[outcome] >= _RANK.get(merged.get(nodeid, "passed"), 0):
                    merged[nodeid] = outcome
                    if nodeid in r["details"]:
                        details[nodeid] = r["details"][nodeid]
        if stopped or not new_hang:
            break
    return {"outcomes": merged, "details": details, "ranks": ran, "timed_out": stopped, "hung": hung, "restarts": attempt,
            "swaps": swaps, "local_spec": sorted(local_spec), "seconds": round(time.monotonic() - start, 1), "crash": "" if ran else crash}


def _swap_tree(env: dict, old: Path, new: Path) -> dict:
    return {**env, "PYTHONPATH": os.pathsep.join(str(new) if p == str(old) else p for p in env["PYTHONPATH"].split(os.pathsep))}


def baseline(tree: Path, base: str, tests: list[str], env: dict, nproc: int, cache_dir: Path,
             launcher: Launcher = Launcher()) -> tuple[dict, bool]:
    """The same tests on the unported tree at ``base``, from the cache when it has them."""
    import torch

    key = hashlib.sha256(json.dumps([base, sorted(tests), nproc, PLUGIN_VERSION, torch.__version__, platform.python_version(),
                                     env.get("ROCMPORT_PROXY", "")]).encode()).hexdigest()[:20]
    cached = cache_dir / "unit-baselines" / f"{base[:12]}-{key}.json"
    if cached.is_file():
        return json.loads(cached.read_text()), True
    with tempfile.TemporaryDirectory(prefix="rocmport-base-") as tmp:
        checkout = Path(tmp) / "tree"
        git("worktree", "add", "-q", "--detach", str(checkout), base, cwd=tree)
        try:
            result = run_tests(checkout, tests, _swap_tree(env, tree, checkout), nproc, launcher)
        finally:
            run_git("worktree", "remove", "--force", str(checkout), cwd=tree, check=False)
    atomic_write_text(cached, json.dumps(result, indent=1, sort_keys=True))
    return result, False


def label(port: dict, base: dict, known: dict[str, str]) -> dict[str, str]:
    """Each failing test of the port: known-failure | upstream-known | port-regression."""
    labels = {}
    for nodeid, outcome in port["outcomes"].items():
        if outcome not in ("failed", "error"):
            continue
        if any(nodeid == k or nodeid.startswith(k.rstrip("/") + "::") or nodeid.startswith(k.rstrip("/") + "/") for k in known):
            labels[nodeid] = "known-failure"
        elif base["outcomes"].get(nodeid) in ("failed", "error") or base["outcomes"].get(nodeid.split("::")[0]) == "error":
            labels[nodeid] = "upstream-known"
        else:
            labels[nodeid] = "port-regression"
    return labels


def _counts(values: dict[str, str], keys=("passed", "skipped", "failed", "error")) -> dict[str, int]:
    """How many of ``values`` are each of ``keys`` (outcomes by default, or labels)."""
    tally = Counter(values.values())
    return {k: tally[k] for k in keys}


def stage_unit_tests(tree: Path, env: dict, tests: list[str], nproc: int, known: dict[str, str], cache_dir: Path,
                     base: str | None, launcher: Launcher = Launcher()) -> StageResult:
    start = time.monotonic()
    if not launcher.runs_stage(single_node=True):
        return StageResult("unit-tests", SKIPPED, "upstream's unit tests run on one node, like upstream CI: node 0 runs them")
    if not (tree / "tests" / "unit_tests").is_dir():
        return StageResult("unit-tests", SKIPPED, "the tree has no tests/unit_tests (a package-index source ships megatron/core only)")
    missing = [t for t in tests if not (tree / t.split("::")[0]).exists()]
    if missing:
        return StageResult("unit-tests", FAIL, f"not in the tree: {', '.join(missing)}; fix --unit-test or the series' verify.unit_tests")
    port = run_tests(tree, tests, env, nproc, launcher)
    if not port["ranks"]:
        return StageResult("unit-tests", FAIL, f"pytest under torchrun produced no results: {port['crash']}", time.monotonic() - start)
    base_result, cached = (baseline(tree, base, tests, env, nproc, cache_dir, launcher) if base else ({"outcomes": {}}, False))
    labels = label(port, base_result, known)
    counts = _counts(port["outcomes"])
    by_label = _counts(labels, ("port-regression", "upstream-known", "known-failure"))
    details = {"tests": tests, "nproc": nproc, "counts": counts, "labels": labels, "failures": {k: port["details"].get(k, "") for k in labels},
               # what the unported tree did with each labelled test: its outcome, or why its module did not import
               "on_baseline": {k: base_result["outcomes"].get(k) or (f"module error: {base_result.get('details', {}).get(k.split('::')[0], '')}"
                                                                     if base_result["outcomes"].get(k.split("::")[0]) == "error" else "not run")
                               for k in labels},
               "swaps": port["swaps"], "hung": port["hung"],
               # a failure here may be the local spec's, not the port's: upstream wrote the test for TE
               "local_spec_instead_of_te": port["local_spec"], "restarts": port["restarts"],
               "baseline": {"commit": base, "cached": cached, "counts": _counts(base_result["outcomes"])},
               "known_failures": known, "port_seconds": port["seconds"], "baseline_seconds": base_result.get("seconds") if not cached else 0.0}
    summary = (f"{counts['passed']} passed, {counts['skipped']} skipped, {counts['failed'] + counts['error']} failed "
               f"({by_label['port-regression']} port-regression, {by_label['upstream-known']} upstream-known, "
               f"{by_label['known-failure']} known-failure) on {nproc} ranks; baseline {'cached' if cached else 'run'} at {str(base)[:12]}")
    status = FAIL if by_label["port-regression"] else PASS
    return StageResult("unit-tests", status, summary, time.monotonic() - start, details)
