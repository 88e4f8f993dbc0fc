"""Benchmark: `rocmport refresh --no-verify` of one release line on the real upstreams, from a
project holding only the old line's series (so the new line is started from it).

    python benchmarks/bench_refresh.py --mlm /path/to/Megatron-LM.git --bridge /path/to/Megatron-Bridge.git \
        [--from v0.16 --to v0.17]

Target on 2 cores: <= 60 s for v0.16 -> v0.17 (refresh only; sync and the first apply are not counted).
Run on demand; figures go in the issue notes."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from rocmport.cli import main as cli

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--mlm", required=True)
    p.add_argument("--bridge", required=True)
    p.add_argument("--from", dest="old", default="v0.16")
    p.add_argument("--to", dest="new", default="v0.17")
    p.add_argument("--bridge-line", default="v0.3", help="the Bridge series of the old line")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="rocmport-bench-") as tmp:
        root = Path(tmp) / "project"
        os.environ["ROCMPORT_CACHE_DIR"] = str(Path(tmp) / "cache")
        shutil.copytree(REPO / "patchsets/megatron-lm" / args.old, root / "patchsets/megatron-lm" / args.old)
        shutil.copytree(
            REPO / "patchsets/megatron-bridge" / args.bridge_line, root / "patchsets/megatron-bridge" / args.bridge_line
        )
        run = lambda *a: cli(["-C", str(root), *a])  # noqa: E731
        assert (
            run(
                "sync",
                "--ref",
                args.old,
                "--remote",
                f"megatron-lm={args.mlm}",
                "--remote",
                f"megatron-bridge={args.bridge}",
            )
            == 0
        )
        assert run("apply") == 0
        start = time.perf_counter()
        code = run("refresh", "--to", args.new, "--no-verify")
        seconds = time.perf_counter() - start
        summary = json.loads((root / "build/refresh/summary.json").read_text())
        for name, up in summary["upstreams"].items():
            outcomes = {}
            for row in up["patches"]:
                outcomes[f"{row['bucket']}/{row['action']}"] = outcomes.get(f"{row['bucket']}/{row['action']}", 0) + 1
            print(
                f"{name}: {up['from']['ref']} -> {up['to']['ref']}; patches {outcomes or 'none'}; "
                f"codemod sites {sum(c['old_sites'] for c in up['codemods'])} -> {sum(c['new_sites'] for c in up['codemods'])}"
            )
        print(f"refresh {args.old} -> {args.new}: exit {code}, {seconds:.1f} s (target <= 60 s)")


if __name__ == "__main__":
    main()
