"""Benchmark: `rocmport report` on a full-size report, the whole process (interpreter start, imports,
jinja2, matplotlib's plots, the page written): the page's size and the wall time.

    python benchmarks/bench_report.py [--report FULL.json] [--repeat 5] [--keep DIR]

Without --report the report is SYNTHETIC, scaled from the real v0.16 failing run committed as test
data (tests/data/reports/v0.16-fail.json, its keys and value shapes): the size of a v0.19 full run
(stage 3 with --unit-tests all: 4,200 tests of which 620 labelled, 14 of them blocking, each with
the messages of a real failure; 130 rewritten sites over 20 codemods, 96 of them unreached in 48
files; stage 2's and stage 4's curves at 100 iterations with a resume and a golden). It measures the
renderer only: its numbers are not a verify result. Its tree is not on this machine (as for a CI
artifact): the source around the sites is not read. With --report, a real report is rendered as it is.

Each run is a subprocess of this checkout's code, once untimed (bytecode written), then --repeat
times; the median and min wall seconds and the page's size are printed.
Target on 2 cores: under 3 s and under 2 MB. Run on demand (HEAVY: under the machine's heavy lock)."""

from __future__ import annotations

import argparse
import copy
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SEED_REPORT = REPO / "tests" / "data" / "reports" / "v0.16-fail.json"
LABELS = {  # the non-blocking labels of a full run and how many tests carry each (blocking: 14)
    "needs-nvidia-only": 310,
    "upstream-known": 160,
    "proxy-artifact": 90,
    "known-failure": 30,
    "flaky": 16,
}
BLOCKING = {"port-regression": 6, "unverified": 6, "not-run": 2}


def synthetic(tests: int = 4200, sites: int = 130, iters: int = 100) -> dict:
    rng = random.Random(42)
    seed = json.loads(SEED_REPORT.read_text())
    r = copy.deepcopy(seed)
    r["line"], r["tree"] = "v0.19", "/nonexistent/build/megatron-lm"
    stage3 = next(s for s in r["stages"] if s["name"] == "unit-tests")
    port_msg = next(iter(stage3["failures"].values()), "AssertionError: x")
    labels, reasons, failures, outcomes, baseline = {}, {}, {}, {}, {}
    kinds = [lab for lab, n in {**LABELS, **BLOCKING}.items() for _ in range(n)]
    for i in range(tests):
        nodeid = f"tests/unit_tests/pkg{i % 60}/test_mod{i % 300}.py::TestCase{i % 7}::test_case_{i}[param{i % 5}]"
        outcomes[nodeid] = "passed"
        if i < len(kinds):
            lab = kinds[i]
            labels[nodeid], outcomes[nodeid] = lab, "failed" if lab != "needs-nvidia-only" else "skipped"
            reasons[nodeid] = f"{lab}: the unported tree at the same commit did the same ({rng.randrange(10**6)})"
            failures[nodeid] = (port_msg + "\n") * rng.randint(1, 4)
            baseline[nodeid] = "failed: " + port_msg[: rng.randint(80, 400)]
    stage3.update(labels=labels, label_reasons=reasons, failures=failures, outcomes=outcomes, on_baseline=baseline)
    codemods = [f"codemod-{i:02d}" for i in range(20)]
    r["port_sites"] = {name: {"exercised": 0, "total": 0, "rewrites": 0, "unreached": {}} for name in codemods}
    for i in range(sites):
        cm = r["port_sites"][codemods[i % 20]]
        cm["total"] += 1
        cm["rewrites"] += 1
        if i % 4 == 0:
            cm["exercised"] += 1
        else:
            cm["unreached"][f"megatron/core/sub{i % 48}/module_{i % 48}.py:{100 + 7 * i} helper_{i % 9}"] = (
                "module never imported: MoE layers: stage 2's MoE case runs with TE (verify --te)"
            )

    def curve(start: float) -> list[float]:
        return [start * (0.985**k) + rng.uniform(-0.01, 0.01) for k in range(iters)]

    r["training"]["losses"], r["training"]["reference_losses"] = curve(10.8), curve(10.8)
    r["functional"] = {
        "case": "gpt3_mcore_te_tp2_pp2",
        "command": "torchrun ...",
        "losses": curve(10.9),
        "iters": iters,
        "proxy_env": {},
        "chosen_args": [],
        "log_tail": [],
        "resume": {
            "from_iteration": iters // 2,
            "loaded_iteration": iters // 2,
            "max_abs_diff": 0.0,
            "tolerance": 1e-5,
            "async_save": True,
            "losses": curve(10.9)[iters // 2 :],
        },
        "golden": {"path": "/nonexistent/goldens/x.json", "max_rel_drift": 0.0, "tolerance": 1e-4, "hip_sim": "7.1"},
        "upstream_golden_a100": {
            "path": "a100.json",
            "steps": [{"step": k, "a100": 10.9 * 0.985**k, "here": 10.9 * 0.985**k} for k in range(1, iters + 1, 5)],
            "summary": "",
        },
    }
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--report", type=Path, help="a real report to render (default: the synthetic full-size one)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--keep", type=Path, help="leave the report and the page in this directory")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="rocmport-bench-report-") as tmp:
        where = args.keep or Path(tmp)
        where.mkdir(parents=True, exist_ok=True)
        report = args.report
        if report is None:
            report = where / "synthetic-v0.19-full.json"
            report.write_text(json.dumps(synthetic(), indent=2, sort_keys=True))
        page = where / "page.html"
        env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        argv = [sys.executable, "-m", "rocmport", "report", str(report), "--html", str(page)]
        times, cpu = [], []
        for i in range(args.repeat + 1):
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            start = time.perf_counter()
            proc = subprocess.run(argv, env=env, capture_output=True, text=True, cwd="/")
            took = time.perf_counter() - start
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            if proc.returncode != 0:
                sys.exit(f"rocmport report exited {proc.returncode}: {proc.stderr.strip()[-500:]}")
            if i:  # the first run writes bytecode, as an installed package has it
                times.append(took)
                # CPU seconds too: on a shared machine the wall time also holds the waits for a core
                cpu.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
        data = json.loads(report.read_text())
        unit = next((s for s in data["stages"] if s["name"] == "unit-tests"), {})
        sites = sum(c["total"] for c in data.get("port_sites", {}).values())
        print(
            f"report: {report.name} ({report.stat().st_size / 1e6:.2f} MB JSON; {len(unit.get('outcomes', {}))} tests, "
            f"{len(unit.get('labels', {}))} labelled, {sites} sites){' SYNTHETIC' if args.report is None else ''}"
        )
        print(f"page: {page.stat().st_size / 1e6:.2f} MB (target < 2 MB)")
        print(
            f"rocmport report, whole process, {len(times)} runs on {os.cpu_count()} cores: "
            f"median {statistics.median(times):.2f} s, min {min(times):.2f} s (target < 3 s); "
            f"CPU (user+sys) median {statistics.median(cpu):.2f} s; load average {os.getloadavg()[0]:.1f}"
        )


if __name__ == "__main__":
    main()
