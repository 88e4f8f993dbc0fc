"""Benchmark: `rocmport apply` cold, and the no-op apply of unchanged inputs, on a real upstream.

    python benchmarks/bench_apply.py [--mlm /path/to/Megatron-LM.git] [--ref v0.16] [--repeat 5]

Without --mlm the megatron-core sdist from the package index is the source (`sync --source pypi`).
Target on 2 cores: the no-op apply <= 1 s (it reads the state file and HEAD; nothing is checked out
or written). Run on demand; figures go in the issue notes."""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from rocmport.cli import main as cli

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--mlm", help="a local Megatron-LM mirror (default: the package index)")
    p.add_argument("--ref", default="v0.16")
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="rocmport-bench-") as tmp:
        root = Path(tmp) / "project"
        os.environ["ROCMPORT_CACHE_DIR"] = str(Path(tmp) / "cache")
        shutil.copytree(REPO / "patchsets", root / "patchsets")
        run = lambda *a: cli(["-C", str(root), *a])  # noqa: E731
        source = ["--remote", f"megatron-lm={args.mlm}"] if args.mlm else ["--source", "pypi"]
        assert run("sync", "--ref", args.ref, "--no-bridge", *source) == 0
        start = time.perf_counter()
        assert run("apply") == 0
        cold = time.perf_counter() - start
        noop = []
        for _ in range(args.repeat):
            start = time.perf_counter()
            assert run("apply") == 0
            noop.append(time.perf_counter() - start)
        print(
            f"apply {args.ref} ({'mirror' if args.mlm else 'package index'}): cold {cold:.2f} s; "
            f"no-op median {statistics.median(noop):.3f} s, max {max(noop):.3f} s over {args.repeat} (target <= 1 s)"
        )


if __name__ == "__main__":
    main()
