"""The tree hash of every line's port, for "behaviour unchanged: every line's port byte-identical"
(issue #32): sync each release line from local mirrors, apply, and print the tree (and the tree of every
commit on the port branch) of build/megatron-lm and build/megatron-bridge. Run it with two checkouts'
code and compare the outputs (`diff`): equal tree hashes are byte-identical ports.

    PYTHONPATH=<checkout> python scripts/port_tree_hashes.py --mlm MIRROR --bridge MIRROR --work DIR [LINE ...]

The project's series are the checkout's own (<checkout>/patchsets). Heavy (~30 s a line): take
/work/heavy.lock or its equivalent."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

LINES = ("v0.15", "v0.16", "v0.17", "v0.18", "v0.19")


def git(tree: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=tree, check=True, capture_output=True, text=True).stdout.strip()


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mlm", required=True)
    ap.add_argument("--bridge", required=True)
    ap.add_argument("--work", required=True, type=Path)
    ap.add_argument("lines", nargs="*", default=list(LINES))
    a = ap.parse_args(argv)
    import rocmport
    from rocmport.cli import main as rocmport_main

    checkout = Path(rocmport.__file__).resolve().parents[1]
    os.environ["ROCMPORT_CACHE_DIR"] = str(a.work / "cache")
    for line in a.lines:
        root = a.work / line
        shutil.rmtree(root, ignore_errors=True)
        shutil.copytree(checkout / "patchsets", root / "patchsets")
        remotes = ["--remote", f"megatron-lm={a.mlm}", "--remote", f"megatron-bridge={a.bridge}"]
        with contextlib.redirect_stdout(sys.stderr):  # rocmport's tables: stdout holds only the hashes
            rc = rocmport_main(["-C", str(root), "sync", "--ref", line, *remotes])
            if not rc:
                rc = rocmport_main(["-C", str(root), "apply"])
        if not (root / "upstream.lock").is_file():
            print(f"{line}: sync exit {rc}")
            continue
        for upstream in ("megatron-lm", "megatron-bridge"):
            tree = root / "build" / upstream
            if not (tree / ".git").exists():
                print(f"{line} {upstream}: no tree (apply exit {rc})")
                continue
            head = git(tree, "rev-parse", "HEAD^{tree}")
            base = json.loads((root / "build" / f"{upstream}.report.json").read_text())["base"]
            per_commit = git(tree, "log", "--reverse", "--format=%T %s", f"{base}..HEAD")
            print(f"{line} {upstream}: tree {head} (apply exit {rc})")
            for row in per_commit.splitlines():
                print(f"    {row}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
