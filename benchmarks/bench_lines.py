"""Benchmark: the line matrix. For every release line (and upstream `main`), in a fresh project holding
the repository's series: `sync` from local mirrors, `apply`, and `verify --tp 2 --pp 2`, each timed,
with every verify stage's status and seconds.

    python benchmarks/bench_lines.py --mlm /path/to/Megatron-LM.git --bridge /path/to/Megatron-Bridge.git \
        [--lines v0.15,v0.16,v0.17,v0.18,v0.19,main] [--python /path/to/python3.12] [--line-python LINE=PATH ...] [--work DIR] [--json]

`main` is what `rocmport bot --track main` takes (the head of upstream's main branch): the project is
synced to the newest line that has a series, then `rocmport refresh --to main --no-verify` makes its
series (the "apply" column is that refresh), then verify runs on it. Megatron-LM v0.17 and later
need Python 3.12: give `--python` an interpreter that has torch (every command runs with it; default:
this one). Each Megatron-Bridge release pins its own transformers range (v0.5: 5.8.x, and v0.5+
import modules transformers 5.24 removed), so `--line-python v0.18=/path/python` gives a line its own
interpreter. The cache is $ROCMPORT_CACHE_DIR (or rocmport's default): warm codemod results make apply
faster; `--fresh-cache` starts from an empty one. Run on demand (it takes long on 2 cores: upstream's
unit tests run on 8 ranks); figures go in the issue notes."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LINES = ["v0.15", "v0.16", "v0.17", "v0.18", "v0.19", "main"]
STAGES = ["imports", "gpt-training", "unit-tests", "functional", "bridge"]


def _newest_series_line() -> str:
    lines = [p.name for p in (REPO / "patchsets" / "megatron-lm").iterdir() if (p / "series").is_file()]
    return max(lines, key=lambda s: tuple(int(x) for x in s.lstrip("v").split(".")))


def run_line(line: str, root: Path, python: str, mlm: str, bridge: str, env: dict, log) -> dict:
    """sync + apply (or refresh, for main) + verify in a fresh project ``root``; timings and stages."""
    shutil.rmtree(root, ignore_errors=True)
    shutil.copytree(REPO / "patchsets", root / "patchsets")

    def rocmport(*args: str, timeout: float = 3600) -> tuple[int, float, str]:
        start = time.perf_counter()
        proc = subprocess.run(
            [python, "-m", "rocmport", "-C", str(root), *args], env=env, capture_output=True, text=True, timeout=timeout
        )
        log.write(f"$ rocmport {' '.join(args)}  # exit {proc.returncode}\n{proc.stdout}{proc.stderr}\n")
        log.flush()
        return proc.returncode, round(time.perf_counter() - start, 1), (proc.stderr.strip().splitlines() or [""])[-1]

    row: dict = {"line": line, "stages": {}}
    ref = _newest_series_line() if line == "main" else line
    code, row["sync_s"], last = rocmport(
        "sync", "--ref", ref, "--remote", f"megatron-lm={mlm}", "--remote", f"megatron-bridge={bridge}"
    )
    if code != 0:
        return {**row, "error": f"sync exit {code}: {last}"}
    if line == "main":
        code, row["apply_s"], last = rocmport("refresh", "--to", "main", "--no-verify", "--json")
        row["applied_with"] = "refresh --to main"
    else:
        code, row["apply_s"], last = rocmport("apply")
    if code != 0:
        return {**row, "error": f"{row.get('applied_with', 'apply')} exit {code}: {last}"}
    lock = (root / "upstream.lock").read_text()
    row["pins"] = [ln.split(":", 1)[1].strip() for ln in lock.splitlines() if ln.strip().startswith("resolved_ref:")]
    report = root / "verify.json"
    start = time.perf_counter()
    code, _, last = rocmport("verify", "--tp", "2", "--pp", "2", "--report", str(report))
    row["verify_s"], row["verify_exit"] = round(time.perf_counter() - start, 1), code
    if not report.is_file():
        return {**row, "error": f"verify exit {code}: {last}"}
    data = json.loads(report.read_text())
    row["python"], row["torch"] = data["env"]["python"], data["env"]["torch"]
    for stage in data["stages"]:
        row["stages"][stage["name"]] = {
            "status": stage["status"],
            "seconds": stage.get("seconds"),
            "reason": stage.get("reason", ""),
        }
    return row


def table(rows: list[dict]) -> str:
    head = ["line", "pins", "sync s", "apply s"] + STAGES + ["verify exit"]
    out = [head]
    for r in rows:
        cells = [r["line"], " + ".join(r.get("pins", [])) or "-", str(r.get("sync_s", "-")), str(r.get("apply_s", "-"))]
        for name in STAGES:
            s = r["stages"].get(name)
            cells.append(f"{s['status']} {s['seconds']}s" if s else "-")
        cells.append(str(r.get("verify_exit", r.get("error", "-"))))
        out.append(cells)
    widths = [max(len(row[i]) for row in out) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in out)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mlm", required=True, help="local mirror of NVIDIA/Megatron-LM")
    p.add_argument("--bridge", required=True, help="local mirror of NVIDIA-NeMo/Megatron-Bridge")
    p.add_argument("--lines", default=",".join(LINES), help="comma-separated release lines and/or main")
    p.add_argument("--python", default=sys.executable, help="the interpreter every command runs with (3.12 for v0.17+)")
    p.add_argument(
        "--line-python",
        action="append",
        default=[],
        metavar="LINE=PATH",
        help="the interpreter one line's commands run with instead (repeatable)",
    )
    p.add_argument("--work", help="keep the projects here (default: a temporary directory)")
    p.add_argument("--fresh-cache", action="store_true", help="an empty rocmport cache (cold fetch and codemods)")
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = p.parse_args()
    if any("=" not in item for item in args.line_python):
        p.error("--line-python wants LINE=PATH")
    line_python = dict(item.split("=", 1) for item in args.line_python)
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="rocmport-lines-"))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            [str(REPO)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])
        ),
    }
    if args.fresh_cache:
        env["ROCMPORT_CACHE_DIR"] = str(work / "cache")
    rows = []
    with open(work / "bench_lines.log", "w") as log:
        for line in [x.strip() for x in args.lines.split(",") if x.strip()]:
            print(f"... {line}", file=sys.stderr, flush=True)
            rows.append(
                run_line(
                    line, work / f"proj-{line}", line_python.get(line, args.python), args.mlm, args.bridge, env, log
                )
            )
            print(table(rows[-1:]).splitlines()[-1], file=sys.stderr, flush=True)
    print(json.dumps(rows, indent=2) if args.json else table(rows))
    for r in rows:
        for name, s in r["stages"].items():
            if s["status"] not in ("pass", "skipped"):
                print(f"{r['line']} {name}: {s['status']}: {s['reason']}", file=sys.stderr)
        if r.get("error"):
            print(f"{r['line']}: {r['error']}", file=sys.stderr)
    print(f"commands and their output: {work / 'bench_lines.log'}", file=sys.stderr)
    return 0 if all(not r.get("error") and r.get("verify_exit") == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
