"""Benchmark: stage 4 per functional case. Each case is `rocmport -C PROJECT verify --stages 4 --case
NAME [--te ...] --report FILE` (upstream's GPT case through pretrain_gpt.py on the CPU proxy, and its
checkpoint resume), run N times; per case the median wall seconds and CPU seconds (rocmport and
every process under it: getrusage(RUSAGE_CHILDREN) deltas), each run's stage-4 status and seconds
from its JSON report, and where the wall went, read from the times stage 4's progress lines arrive
(each run's launch, its first iteration, its iterations, the time from the last iteration to the
next launch or the end).

    python benchmarks/bench_cases.py -C PROJECT --cases gpt3_mcore_te_tp2_pp2,gpt3_mcore_tp1_pp4 [--runs 3] [--te auto] [--json]
    python benchmarks/bench_cases.py -C PROJECT --all-runnable [--runs 1] [--te auto] [--json]

The project is one where `rocmport sync` and `rocmport apply` ran (its build/megatron-lm).
`--all-runnable` takes every case the proxy can run (rocmport.verify.stages.case_plan.plan_tree:
the tree's own model_config.yaml files), in their order. One case per verify run (`--case`), so
each case's figure is its own. Target (issue 38), 2 cores, quiet machine: the median case with
its resume <= 45 s wall (`--cases reach --unit-tests reach` with TE <= 20 min; `--cases all` on
v0.16 <= 2 h, nightly). The machine's load average is printed beside each run: on a shared
machine the figures are the machine's too. Run on demand (not in CI); figures go in the issue
notes."""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TARGET_S = 45.0
# stage 4's progress line per training iteration (functional._launch): "stage 4 pretrain_gpt.py:
# iteration 3/10, 41 s elapsed" (the resumed run: "stage 4 resumed from iteration 5: ...")
_PROGRESS = re.compile(r"stage 4 (.+?): iteration (\d+)/(\d+), (?:(\d+)m)?(\d+)(?: s|s) elapsed")


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def phases(lines: list[tuple[float, str]], wall: float) -> dict[str, float] | None:
    """Where one verify run's wall went, from its progress lines (seconds since it started, text):
    per pretrain_gpt.py launch (the first run, the resumed one), its start-up (launch to its first
    iteration logged: Python, torch, megatron and TE imported by every rank, the process groups,
    the model and the data, and that first iteration), its iterations (the median gap between two),
    its longest gap between two iterations less that median (the checkpoint save at the save
    interval), and what follows its last iteration (the last save, the ranks' exit; then the next
    launch's start). A launch is its first line's arrival less the elapsed seconds it says (whole
    seconds). None: no line."""
    runs: dict[str, list[tuple[float, float]]] = {}
    for at, text in lines:
        m = _PROGRESS.search(text)
        if m:
            runs.setdefault(m.group(1), []).append((at, float(int(m.group(4) or 0) * 60 + int(m.group(5)))))
    if not runs:
        return None
    out: dict[str, float] = {}
    ordered = sorted(runs.values(), key=lambda steps: steps[0][0])
    launches = [steps[0][0] - steps[0][1] for steps in ordered]
    out["before first launch"] = round(launches[0], 1)
    for n, steps in enumerate(ordered):
        key = "run" if n == 0 else "resume"
        times = [at for at, _ in steps]
        gaps = [b - a for a, b in zip(times, times[1:])]
        each = statistics.median(gaps) if gaps else 0.0
        out[f"{key} start-up + 1st iteration"] = round(times[0] - launches[n], 1)
        out[f"{key} iterations"] = len(times)
        out[f"{key} iteration s"] = round(each, 2)
        out[f"{key} longest gap less one iteration"] = round(max(gaps) - each, 1) if gaps else 0.0
        end = launches[n + 1] if n + 1 < len(ordered) else wall
        out[f"{key} after last iteration"] = round(end - times[-1], 1)
    return out


def run_case(
    project: Path, case: str, te: str | None, python: str, env: dict, work: Path, n: int, extra: tuple[str, ...] = ()
) -> dict:
    """One `verify --stages 4 --case CASE` (``extra``: more verify options): wall, CPU (rocmport and
    all below it), stage 4's status, seconds and reason from the report, and the wall's phases."""
    report = work / f"{case}-{n}.json"
    cmd = [python, "-m", "rocmport", "-C", str(project), "verify", "--stages", "4", "--case", case]
    cmd += ["--report", str(report), "--no-html"] + (["--te", te] if te else []) + list(extra)
    load = os.getloadavg()[0]
    cpu0, start = _children_cpu(), time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: list[tuple[float, str]] = []
    out: list[str] = []
    reader = threading.Thread(target=lambda: out.append(proc.stdout.read() if proc.stdout else ""), daemon=True)
    reader.start()
    for line in proc.stderr or ():
        lines.append((time.perf_counter() - start, line.rstrip("\n")))
    code = proc.wait()
    reader.join()
    wall = time.perf_counter() - start
    cpu = _children_cpu() - cpu0
    row: dict = {
        "case": case,
        "run": n,
        "exit": code,
        "wall_s": round(wall, 1),
        "cpu_s": round(cpu, 1),
        "load_before": round(load, 2),
        "phases": phases(lines, wall),
    }
    with open(work / f"{case}-{n}.log", "w") as log:
        log.write(" ".join(cmd) + "\n" + "".join(out) + "\n".join(f"{at:8.1f} {text}" for at, text in lines) + "\n")
    if not report.is_file():
        return {**row, "status": "no report", "stage_s": None, "reason": (lines[-1][1] if lines else "")[:300]}
    stage = next((s for s in json.loads(report.read_text())["stages"] if s["name"] == "functional"), None)
    if stage is None:
        return {**row, "status": "no stage 4", "stage_s": None, "reason": ""}
    return {**row, "status": stage["status"], "stage_s": stage.get("seconds"), "reason": stage.get("reason", "")}


def runnable_cases(project: Path) -> list[str]:
    from rocmport.verify.stages.case_plan import CasePlan, plan_tree

    return [name for name, plan in plan_tree(project / "build" / "megatron-lm").items() if isinstance(plan, CasePlan)]


def summary(case: str, rows: list[dict]) -> dict:
    """A case's medians over its runs (the stage's seconds over the runs that reported them)."""
    med = lambda xs: round(statistics.median(xs), 1) if xs else None  # noqa: E731
    stage = [r["stage_s"] for r in rows if r["stage_s"] is not None]
    phased = [r["phases"] for r in rows if r["phases"]]
    keys = sorted({k for p in phased for k in p}, key=lambda k: [k for p in phased for k in p].index(k))
    return {
        "case": case,
        "runs": len(rows),
        "statuses": [r["status"] for r in rows],
        "wall_s": med([r["wall_s"] for r in rows]),
        "cpu_s": med([r["cpu_s"] for r in rows]),
        "stage_s": med(stage),
        "phases": {k: med([p[k] for p in phased if k in p]) for k in keys},
    }


def table(summaries: list[dict]) -> str:
    head = [
        "case",
        "runs",
        "status",
        "wall s",
        "cpu s",
        "stage 4 s",
        "start-up",
        "iter s",
        "save",
        "tail",
        "resume start-up",
        "resume tail",
    ]
    out = [head]
    for s in summaries:
        p = s["phases"]
        out.append(
            [
                s["case"],
                str(s["runs"]),
                ",".join(s["statuses"]),
                str(s["wall_s"]),
                str(s["cpu_s"]),
                str(s["stage_s"] if s["stage_s"] is not None else "-"),
                str(p.get("run start-up + 1st iteration", "-")),
                str(p.get("run iteration s", "-")),
                str(p.get("run longest gap less one iteration", "-")),
                str(p.get("run after last iteration", "-")),
                str(p.get("resume start-up + 1st iteration", "-")),
                str(p.get("resume after last iteration", "-")),
            ]
        )
    widths = [max(len(row[i]) for row in out) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in out)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-C", "--project", default=".", help="the rocmport project (its build/megatron-lm is applied)")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument(
        "--cases", help="comma-separated case names (directories under tests/functional_tests/test_cases/gpt)"
    )
    which.add_argument("--all-runnable", action="store_true", help="every case the CPU proxy can run (case_plan)")
    p.add_argument("--runs", type=int, default=3, help="runs per case (the median is reported; default 3)")
    p.add_argument("--te", default=None, help="as for `rocmport verify --te` (VERSION, auto or none)")
    p.add_argument("--python", default=sys.executable, help="the interpreter rocmport runs with (3.12 for v0.17+)")
    p.add_argument("--work", help="keep the reports and logs here (default: a temporary directory)")
    p.add_argument("--json", action="store_true", help="print every run and each case's medians as JSON")
    p.add_argument(
        "--no-fork-ranks",
        action="store_true",
        help="verify --no-fork-ranks: each run's ranks started by torchrun (the rank server's baseline)",
    )
    args = p.parse_args()
    project = Path(args.project).resolve()
    if args.runs < 1:
        p.error(f"--runs {args.runs}: at least 1")
    if not (project / "build" / "megatron-lm").is_dir():
        p.error(f"-C {project}: no build/megatron-lm; run `rocmport sync` and `rocmport apply` there first")
    cases = runnable_cases(project) if args.all_runnable else [c.strip() for c in args.cases.split(",") if c.strip()]
    if not cases:
        p.error("no case to run (--cases is empty, or the tree has no case the proxy can run)")
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="rocmport-cases-"))
    work.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            [str(REPO)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])
        ),
    }
    rows: list[dict] = []
    summaries = []
    for case in cases:
        mine = []
        for n in range(1, args.runs + 1):
            extra = ("--no-fork-ranks",) if args.no_fork_ranks else ()
            row = run_case(project, case, args.te, args.python, env, work, n, extra)
            print(
                f"{case} run {n}: {row['status']} exit {row['exit']}, wall {row['wall_s']} s, cpu {row['cpu_s']} s, "
                f"stage 4 {row['stage_s']} s (load {row['load_before']} before); phases {row['phases']}",
                file=sys.stderr,
                flush=True,
            )
            mine.append(row)
        rows += mine
        summaries.append(summary(case, mine))
    walls = [s["wall_s"] for s in summaries if s["wall_s"] is not None]
    median_case = statistics.median(walls) if walls else None
    if args.json:
        print(json.dumps({"runs": rows, "cases": summaries, "median_case_wall_s": median_case}, indent=2))
    else:
        print(table(summaries))
    if median_case is not None:
        print(
            f"median case (with its resume): {median_case:.1f} s wall, "
            f"{'within' if median_case <= TARGET_S else 'over'} the {TARGET_S:g} s target; reports and logs in {work}",
            file=sys.stderr,
        )
    for r in rows:
        if r["status"] not in ("pass",):
            print(f"{r['case']} run {r['run']}: {r['status']}: {r['reason'][:300]}", file=sys.stderr)
    return 0 if all(r["status"] == "pass" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
