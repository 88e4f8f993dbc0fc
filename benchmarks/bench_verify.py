"""Benchmark: verify stages 1-3 on a ported tree (CPU proxy on gloo at tp2×pp2; stage 3 runs
upstream's unit tests on 8 ranks and compares with the unported tree).

    python benchmarks/bench_verify.py --tree build/megatron-lm [--iters 10] [--unit-tests --cache-dir DIR]

With --unit-tests it runs twice: cold (empty baseline cache in DIR) and warm (cached baseline).
Targets on 2 cores: stage 2 <= 30 s; stages 1-3 <= 180 s warm. Run on demand; figures go in the
issue notes."""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

from rocmport.port import worktree as wt
from rocmport.verify.run import run_verify
from rocmport.verify.unit_tests import DEFAULT_TESTS


def once(tree: Path, iters: int, unit: dict | None) -> float:
    start = time.perf_counter()
    result = run_verify(tree, 2, 2, None, None, "auto", iters, unit=unit)
    total = time.perf_counter() - start
    for s in result["stages"]:
        print(f"  {s['name']}: {s['status']} in {s['seconds']}s — {s['reason']}")
    print(f"  stages 1-{len(result['stages'])} {total:.1f}s (mode {result['mode']}, world {result['world_size']})")
    return total


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tree", default="build/megatron-lm")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--unit-tests", action="store_true", help="include stage 3, cold then warm")
    p.add_argument("--cache-dir", default="build/bench-verify-cache", help="baseline cache (emptied for the cold run)")
    args = p.parse_args()
    tree = Path(args.tree).resolve()
    if not args.unit_tests:
        once(tree, args.iters, None)
        return
    cache = Path(args.cache_dir).resolve()
    shutil.rmtree(cache / "unit-baselines", ignore_errors=True)
    unit = {"tests": list(DEFAULT_TESTS), "nproc": 8, "known": {}, "cache_dir": cache, "base": (wt.read_state(tree) or {}).get("base")}
    print("cold baseline cache:")
    cold = once(tree, args.iters, unit)
    print("warm baseline cache:")
    warm = once(tree, args.iters, unit)
    print(f"stages 1-3: cold {cold:.1f}s, warm {warm:.1f}s (target warm <= 180 s)")


if __name__ == "__main__":
    main()
