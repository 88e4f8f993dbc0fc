"""Benchmark: `rocmport verify --tp 2 --pp 2` stages 1-5 on a project's ported trees (on a machine
without a GPU: the CPU proxy with the HIP simulation), each stage's seconds and the total.

    python benchmarks/bench_verify.py -C PROJECT [--iters 10] [--cold] [--no-hip-sim] [--stages 1,2] [--te VERSION|auto [--no-moe]]

The project is one where `rocmport sync` and `rocmport apply` ran (its build/megatron-lm, and
build/megatron-bridge when the lock pins Bridge). The first run fills the unit-test baseline cache
(`--cold` empties it first); the figure that matters is a warm one. Target on 2 cores, warm: stages
1-5 <= 6 min in all. With --te (TE's Python layer on the CPU proxy), compare against the same stages
(stage 2 with --no-moe: the local spec has no MoE case) without it on the same machine: target TE <= 1.5x the local spec. Run on demand; figures go in the
issue notes."""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

from rocmport.config import load_settings
from rocmport.verify.runtime import hip_sim
from rocmport.verify.orchestration.run import prepare, run_verify

TARGET_S = 360


def once(project: Path, iters: int, hip: str | None, stages: str | None, te: str = "none", moe: bool = True) -> float:
    settings = load_settings(project)
    given = {"tp": 2, "pp": 2, "iters": iters, "stages_text": stages, "te_spec": te, "moe": moe}
    opts = prepare(settings, {**given, "hip_version": hip} if hip is not None else {**given, "no_hip_sim": True})
    start = time.perf_counter()
    report = run_verify(opts)
    total = time.perf_counter() - start
    for s in report.stages:
        print(f"  {s.name:13s} {s.status:21s} {s.seconds:7.1f} s  {s.reason[:150]}")
    unit = report.unit_run()
    if unit is not None and unit.peak:
        peak = unit.peak
        print(
            f"  unit-tests peak: {peak['threads']} threads and {peak['rss_mb']:.0f} MB in one rank, "
            f"{peak['rss_mb_all_ranks']:.0f} MB over all ranks"
        )
    print(
        f"  total {total:.1f} s (mode {report.mode}, HIP simulated: {bool(report.hip_sim)}, world {report.world_size})"
    )
    return total


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("-C", "--project", default=".", help="the rocmport project (holds upstream.lock and build/)")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--cold", action="store_true", help="empty the unit-test baseline cache first")
    p.add_argument("--no-hip-sim", action="store_true")
    p.add_argument("--stages", default=None, help="a subset, as for `rocmport verify --stages`")
    p.add_argument("--te", default="none", help="TE's Python layer, as for `rocmport verify --te`")
    p.add_argument(
        "--no-moe",
        action="store_true",
        help="with --te: stage 2's dense pair alone (like for like with the local spec)",
    )
    args = p.parse_args()
    project = Path(args.project).resolve()
    if args.cold:
        shutil.rmtree(load_settings(project).cache_dir / "unit-baselines", ignore_errors=True)
    total = once(
        project, args.iters, None if args.no_hip_sim else hip_sim.DEFAULT_VERSION, args.stages, args.te, not args.no_moe
    )
    print(
        f"stages {args.stages or '1-5'}: {total:.1f} s ({'within' if total <= TARGET_S else 'over'} the {TARGET_S} s target)"
    )


if __name__ == "__main__":
    main()
