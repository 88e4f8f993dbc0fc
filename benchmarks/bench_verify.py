"""Benchmark: verify stage 2 (GPT training, tp2×pp2, CPU proxy on gloo, including the tp1/pp1
equivalence run) on a ported tree.

    python benchmarks/bench_verify.py --tree build/megatron-lm [--iters 10]

Target on 2 cores: <= 30 s. Run on demand; figures go in the issue notes."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from rocmport.commands.verify import run_verify


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tree", default="build/megatron-lm")
    p.add_argument("--iters", type=int, default=10)
    args = p.parse_args()
    start = time.perf_counter()
    result = run_verify(Path(args.tree).resolve(), 2, 2, None, None, "auto", args.iters)
    total = time.perf_counter() - start
    for s in result["stages"]:
        print(f"{s['name']}: {s['status']} in {s['seconds']}s — {s['reason']}")
    print(f"verify total {total:.1f}s (mode {result['mode']}, world {result['world_size']})")


if __name__ == "__main__":
    main()
