"""Benchmark: a no-op `rocmport apply` as a user runs it, the whole process (interpreter start, imports,
the check that nothing changed), beside `rocmport --version`, `--help` and `status` for scale.

    python benchmarks/bench_noop_apply.py [--mlm /path/to/Megatron-LM.git] [--ref v0.16] [--repeat 10]
    python benchmarks/bench_noop_apply.py --project DIR    # a project already synced and applied
    python benchmarks/bench_noop_apply.py --project DIR --code /tmp/old-checkout   # another version's code

Without --project a temporary project is synced (from --mlm, $ROCMPORT_TEST_MLM_MIRROR, or the package
index) and applied once (not timed). Each command then runs once untimed (Python writes its bytecode,
as an installed package has it) and --repeat times timed, as a subprocess of this checkout's code (or
--code's; PYTHONPATH first); median and min wall seconds are printed. --no-bytecode keeps
PYTHONDONTWRITEBYTECODE as set (every run compiles rocmport's modules: about 50 ms more).
Target on 2 cores, quiet machine: the no-op apply <= 0.3 s. Run on demand; figures go in the issue notes."""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def timed(argv: list[str], env: dict[str, str], repeat: int) -> list[float]:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        # cwd: `python -m` puts the working directory first on sys.path; the root holds no rocmport.
        proc = subprocess.run(
            [sys.executable, "-m", "rocmport", *argv], env=env, capture_output=True, text=True, cwd="/"
        )
        times.append(time.perf_counter() - start)
        if proc.returncode != 0:
            sys.exit(f"rocmport {' '.join(argv)} exited {proc.returncode}: {proc.stderr.strip()[-500:]}")
    return times


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument(
        "--mlm",
        default=os.environ.get("ROCMPORT_TEST_MLM_MIRROR"),
        help="a local Megatron-LM mirror (default: $ROCMPORT_TEST_MLM_MIRROR, else the package index)",
    )
    p.add_argument("--ref", default="v0.16")
    p.add_argument("--repeat", type=int, default=10)
    p.add_argument("--project", help="an already applied project to time (nothing is synced or applied)")
    p.add_argument("--code", default=str(REPO), help="the rocmport checkout whose code runs (default: this one)")
    p.add_argument("--no-bytecode", action="store_true", help="leave PYTHONDONTWRITEBYTECODE as the environment has it")
    args = p.parse_args()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([args.code, *filter(None, [os.environ.get("PYTHONPATH")])])}
    if not args.no_bytecode:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
    with tempfile.TemporaryDirectory(prefix="rocmport-bench-") as tmp:
        if args.project:
            root = Path(args.project).resolve()
        else:
            root = Path(tmp) / "project"
            env["ROCMPORT_CACHE_DIR"] = str(Path(tmp) / "cache")
            shutil.copytree(REPO / "patchsets", root / "patchsets")
            source = ["--remote", f"megatron-lm={args.mlm}"] if args.mlm else ["--source", "pypi"]
            timed(["-C", str(root), "sync", "--ref", args.ref, "--no-bridge", *source], env, 1)
            timed(["-C", str(root), "apply"], env, 1)
        for name, argv in (
            ("--version", ["--version"]),
            ("--help", ["--help"]),
            ("status", ["-C", str(root), "status"]),
            ("no-op apply", ["-C", str(root), "apply"]),
        ):
            timed(argv, env, 1)
            t = timed(argv, env, args.repeat)
            print(
                f"rocmport {name:12} median {statistics.median(t):.3f} s, min {min(t):.3f} s over {args.repeat}"
                + (" (target <= 0.3 s)" if name == "no-op apply" else "")
            )


if __name__ == "__main__":
    main()
