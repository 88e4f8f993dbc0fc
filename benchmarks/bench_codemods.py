"""Benchmark: rocmport's codemod pass over Megatron-LM core_v0.16.1, cold and warm, against
`python -m libcst.tool codemod` running libcst's no-op codemod over every file.

    python benchmarks/bench_codemods.py [--mirror PATH | --tree PATH] [--skip-libcst]

Targets on 2 cores: cold <= 3 s, warm <= 0.5 s. Run on demand; figures go in the issue notes."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rocmport.codemods import compute_layers, registry


def tree_from_mirror(mirror: str, tag: str, dest: Path) -> Path:
    dest.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", mirror, "archive", tag], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--mirror", default=os.environ.get("ROCMPORT_TEST_MLM_MIRROR"))
    p.add_argument("--tag", default="core_v0.16.1")
    p.add_argument("--tree")
    p.add_argument("--skip-libcst", action="store_true")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        if args.tree:
            tree = Path(args.tree)
        elif args.mirror:
            tree = tree_from_mirror(args.mirror, args.tag, tmp / "tree")
        else:
            sys.exit("give --tree or --mirror (or set ROCMPORT_TEST_MLM_MIRROR)")
        cache = tmp / "cache"
        start = time.perf_counter()
        cold = compute_layers(tree, list(registry), cache_dir=cache)
        t_cold = time.perf_counter() - start
        start = time.perf_counter()
        warm = compute_layers(tree, list(registry), cache_dir=cache)
        t_warm = time.perf_counter() - start
        print(
            f"rocmport codemods: {cold.files_total} files, {cold.files_parsed} parsed; cold {t_cold:.2f}s, "
            f"warm {t_warm:.3f}s ({warm.cache_hits} cache hits); cores {os.cpu_count()}"
        )
        if args.skip_libcst:
            return
        copy = tmp / "libcst-tree"
        shutil.copytree(tree, copy)
        (tmp / "cfg").mkdir()
        subprocess.run(
            [sys.executable, "-m", "libcst.tool", "initialize", "."], cwd=tmp / "cfg", check=True, capture_output=True
        )
        start = time.perf_counter()
        subprocess.run(
            [
                sys.executable,
                "-m",
                "libcst.tool",
                "codemod",
                "noop.NOOPCommand",
                str(copy),
                "--no-format",
                "--jobs",
                str(os.cpu_count()),
                "--hide-progress",
            ],
            cwd=tmp / "cfg",
            check=True,
            capture_output=True,
        )
        t_libcst = time.perf_counter() - start
        print(
            f"python -m libcst.tool codemod (no-op, every file): {t_libcst:.2f}s; ratio cold {t_libcst / t_cold:.1f}x, "
            f"warm {t_libcst / t_warm:.0f}x"
        )


if __name__ == "__main__":
    main()
