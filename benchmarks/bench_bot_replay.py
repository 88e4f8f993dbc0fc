"""Benchmark: the bot at upstream's pace. Replays upstream main from a local Megatron-LM mirror: every
k-th first-parent commit after a release's branch point, each hop a `rocmport refresh --to <sha>`
from the previous hop's promoted port, in one process as `rocmport bot` runs its refreshes.

    python benchmarks/bench_bot_replay.py [--mirror /path/to/Megatron-LM.git] [--release v0.18] \
        [--every 30] [--hops 5] [--verify-stages 1,2] [--profile 1] [--project DIR]

--mirror defaults to $ROCMPORT_TEST_MLM_MIRROR. The project (a temporary one unless --project) is
synced to the branch point (--no-bridge) and applied once before the first hop (timed apart). Verify
is off in the refresh (--no-verify); --verify-stages runs `rocmport verify --stages ...` on each hop
that came out ready or not-verified, timed apart (a hop whose verify passed counts as ready, as the bot's
hop with verify on does; one whose verify failed as needs-a-human). Per hop it prints: the outcome (ready /
not-verified / needs-a-human, and why: the conflicting patch, the failed stages), wall seconds, CPU
seconds (this process and its children: git, the codemod workers), the files upstream changed
(.py of them), and the codemod runs: files the runner parsed (re-ran) vs took from its cache, over
the Python files of the tree. --profile N writes hop N's cProfile (sorted by cumulative time) to
<project>/hop-N.prof.txt. Figures go in the issue notes and docs/measurements/bot-replay.md; run it
niced, never beside other heavy work (the wall times mean nothing then)."""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import json
import os
import pstats
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def git(mirror: str, *args: str) -> str:
    return subprocess.run(
        ["git", "--git-dir", mirror, *args], check=True, capture_output=True, text=True
    ).stdout.strip()


def cpu() -> float:
    return sum(
        getattr(resource.getrusage(who), f)
        for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
        for f in ("ru_utime", "ru_stime")
    )


class CodemodRuns:
    """Wraps the runner's compute_layers (wherever this rocmport looks it up) to count what each run
    parsed and what it took from the cache."""

    def __init__(self) -> None:
        import rocmport.codemods as package
        import rocmport.codemods.runner as runner
        import rocmport.port.apply as port_apply

        self.calls: list[tuple[int, int, int]] = []
        original = runner.compute_layers

        def counted(*args, **kwargs):
            result = original(*args, **kwargs)
            self.calls.append((result.files_total, result.files_parsed, result.cache_hits))
            return result

        for module in (runner, package, port_apply):  # older rocmports bound the name at import time
            if "compute_layers" in vars(module):
                setattr(module, "compute_layers", counted)

    def take(self) -> list[tuple[int, int, int]]:
        calls, self.calls = self.calls, []
        return calls


class Phases:
    """CPU seconds (this process and its children) and calls of the steps of a hop, each step timed
    inclusively (apply_upstream holds its codemod layers): where a hop's time goes, robust to a busy
    machine as wall seconds are not."""

    STEPS = [
        ("rocmport.refresh.engine", "resolve_lock"),
        ("rocmport.refresh.engine", "stage_series"),
        ("rocmport.refresh.engine", "_merged_upstream"),
        ("rocmport.refresh.engine", "apply_upstream"),
        ("rocmport.port.worktree", "ensure_clone"),
        ("rocmport.port.worktree", "set_sparse"),
        ("rocmport.port.apply", "_codemod_layers"),
        ("rocmport.port.apply", "_manifest_layer"),
        ("rocmport.refresh.engine", "_refresh_patches"),
        ("rocmport.refresh.engine", "codemod_changes"),
        ("rocmport.refresh.engine", "range_diff"),
        ("rocmport.refresh.engine", "_promote"),
        ("rocmport.refresh.engine", "_swap_tree"),
    ]

    def __init__(self) -> None:
        import importlib

        self.totals: dict[str, list[float]] = {}
        for module_name, name in self.STEPS:
            module = importlib.import_module(module_name)
            if hasattr(module, name):
                setattr(module, name, self._timed(name, getattr(module, name)))

    def _timed(self, name, fn):
        def timed(*args, **kwargs):
            c0 = cpu()
            try:
                return fn(*args, **kwargs)
            finally:
                entry = self.totals.setdefault(name, [0.0, 0])
                entry[0] += cpu() - c0
                entry[1] += 1

        return timed

    def take(self) -> str:
        text = ", ".join(f"{name} {sec:.1f}" + (f" (x{n})" if n > 1 else "") for name, (sec, n) in self.totals.items())
        self.totals = {}
        return text


def outcome_of(summary: dict) -> str:
    status = summary.get("status", "?")
    if summary.get("conflict"):
        c = summary["conflict"]
        return f"{status}: {c['patch']} conflicts ({', '.join(h['file'] for h in c.get('hunks', [])) or c.get('detail', '')})"
    if summary.get("problems"):
        return f"{status}: {summary['problems'][0]}"
    why = summary.get("why")
    return f"{status} ({why})" if why and status != "ready" else status


def verify_failure(root: Path, log: Path, since: float) -> str:
    """What failed: the stages the verify report names, or the error line verify stopped with."""
    last = root / "build" / "verify" / "last.json"
    if last.is_file() and last.stat().st_mtime >= since - 1:
        from rocmport.verify.orchestration.report import last_verify

        found = last_verify(root) or {}
        return (
            f"{', '.join(found.get('failed') or []) or 'no stage failed'}; {found.get('verdict') or found.get('error')}"
        )
    errors = [line for line in log.read_text(encoding="utf-8").splitlines() if line.startswith("rocmport: error:")]
    return errors[-1] if errors else "see the log"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument(
        "--mirror", default=os.environ.get("ROCMPORT_TEST_MLM_MIRROR"), help="a Megatron-LM git dir (bare mirror)"
    )
    p.add_argument("--release", default="v0.18", help="replay main from this release line's branch point")
    p.add_argument("--every", type=int, default=30, help="every k-th first-parent commit of main")
    p.add_argument("--hops", type=int, default=5)
    p.add_argument("--skip", type=int, default=0, help="start at this hop (the project is synced to the hop before it)")
    p.add_argument("--verify-stages", help="after each hop, `rocmport verify --stages` these (e.g. 1,2)")
    p.add_argument("--profile", type=int, help="cProfile this hop (1-based)")
    p.add_argument(
        "--project",
        help="keep the project (and its cache) here instead of a temporary directory; "
        "when it holds a replayed project already, go on from the commit its lock pins",
    )
    args = p.parse_args()
    if not args.mirror:
        sys.exit("give --mirror or set ROCMPORT_TEST_MLM_MIRROR")
    mirror = str(Path(args.mirror).resolve())
    major, minor = args.release.lstrip("v").split(".")
    point = git(mirror, "merge-base", f"core_v{major}.{minor}.0", "refs/heads/main")
    commits = git(mirror, "rev-list", "--first-parent", "--reverse", f"{point}..refs/heads/main").split()
    all_targets = [point] + commits[args.every - 1 :: args.every]
    start = all_targets[args.skip]
    targets = all_targets[args.skip + 1 : args.skip + 1 + args.hops]

    from rocmport import __version__
    from rocmport.cli import main as cli

    runs = CodemodRuns()
    phases = Phases()
    with tempfile.TemporaryDirectory(prefix="rocmport-replay-") as tmp:
        base = Path(args.project).resolve() if args.project else Path(tmp)
        root = base / "project"
        os.environ["ROCMPORT_CACHE_DIR"] = str(base / "cache")
        log = base / "replay.log"
        resume = (root / "upstream.lock").is_file() and (root / "build" / "megatron-lm").is_dir()
        if not resume:
            shutil.rmtree(root, ignore_errors=True)
            shutil.copytree(REPO / "patchsets" / "megatron-lm", root / "patchsets" / "megatron-lm")

        def rocmport(*argv: str) -> int:
            with (
                open(log, "a", encoding="utf-8") as out,
                contextlib.redirect_stdout(out),
                contextlib.redirect_stderr(out),
            ):
                print(f"$ rocmport {' '.join(argv)}", flush=True)
                return cli(["-C", str(root), *argv])

        if resume:
            if (root / "build" / "refresh" / "state.json").is_file():
                rocmport("refresh", "--abort")  # a hop cut short (a timeout): started again
            from rocmport.upstream.lock import load_lock

            start = load_lock(root / "upstream.lock").upstreams["megatron-lm"].commit
            if start not in all_targets:
                sys.exit(f"{root}: pins {start[:12]}, not a hop of this replay (--release/--every differ?)")
            at = all_targets.index(start)
            targets = all_targets[at + 1 : at + 1 + args.hops]
            print(f"going on from hop {at} ({start[:12]}), the commit {root / 'upstream.lock'} pins")
            args.skip = at
        else:
            assert rocmport("sync", "--ref", start, "--no-bridge", "--remote", f"megatron-lm={mirror}") == 0, (
                f"sync failed: see {log}"
            )
        print(
            f"rocmport {__version__} ({Path(sys.modules['rocmport'].__file__).parent}); main from {args.release}'s branch point "
            f"{point[:12]}, every {args.every}th first-parent commit, hops {args.skip + 1}..{args.skip + len(targets)}; log {log}"
        )
        t0, c0 = time.perf_counter(), cpu()
        code = rocmport("apply")
        phases.take()
        print(
            f"{'no-op' if resume else 'initial'} apply of {start[:12]}: exit {code}, {time.perf_counter() - t0:.1f} s wall, "
            f"{cpu() - c0:.1f} s CPU, codemods {runs.take()} (files, parsed, cache hits)"
        )
        assert code == 0, f"the apply failed: see {log}"
        rows = []
        prev = start
        for i, sha in enumerate(targets, start=args.skip + 1):
            changed = git(mirror, "diff", "--name-only", prev, sha).splitlines()
            t0, c0 = time.perf_counter(), cpu()
            profiler = cProfile.Profile() if args.profile == i else None
            if profiler:
                profiler.enable()
            code = rocmport("refresh", "--to", sha, "--no-verify")
            if profiler:
                profiler.disable()
                text = io.StringIO()
                pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(60)
                (base / f"hop-{i}.prof.txt").write_text(text.getvalue())
            wall, used = time.perf_counter() - t0, cpu() - c0
            summary = json.loads((root / "build" / "refresh" / "summary.json").read_text())
            outcome = outcome_of(summary)
            calls = runs.take()
            verify = ""
            status = summary.get("status")
            verify_s = None
            if args.verify_stages and status in ("ready", "not-verified"):
                v0, started = time.perf_counter(), time.time()
                vcode = rocmport("verify", "--stages", args.verify_stages)
                verify_s = time.perf_counter() - v0
                verify = f"; verify {args.verify_stages}: {'passed' if vcode == 0 else f'FAILED (exit {vcode})'} in {verify_s:.1f} s"
                # the bot's hop with verify on: ready when its stages passed, needs-a-human when one failed
                if vcode == 0:
                    status, outcome = "ready", f"ready (verify {args.verify_stages} passed)"
                else:
                    status = "needs-a-human"
                    outcome = f"failed verify (stages {args.verify_stages}: {verify_failure(root, log, started)})"
            rows.append(
                {
                    "hop": i,
                    "commit": sha,
                    "status": status,
                    "outcome": outcome,
                    "verify_s": verify_s,
                    "wall": wall,
                    "cpu": used,
                    "changed": len(changed),
                    "changed_py": sum(f.endswith(".py") for f in changed),
                    "codemods": calls,
                }
            )
            runs_text = (
                ", ".join(f"{parsed} parsed + {hits} cached of {total}" for total, parsed, hits in calls) or "none"
            )
            print(
                f"hop {i:2} {sha[:12]}: {outcome}; {wall:.1f} s wall, {used:.1f} s CPU; upstream changed {len(changed)} files "
                f"({rows[-1]['changed_py']} .py); codemod runs: {runs_text}{verify}",
                flush=True,
            )
            print(f"    CPU s by step: {phases.take()}", flush=True)
            if summary.get("status") == "needs-a-human":
                rocmport("refresh", "--abort")
                break
            prev = sha
        if rows:
            ready = sum(r["status"] == "ready" for r in rows)
            unverified = sum(r["status"] == "not-verified" for r in rows)
            human = sum(r["status"] == "needs-a-human" for r in rows)
            print(
                f"{len(rows)} hops: {ready} ready, {unverified} not-verified, {human} needs-a-human; "
                f"median {statistics.median(r['wall'] for r in rows):.1f} s wall, {statistics.median(r['cpu'] for r in rows):.1f} s CPU "
                f"(target for a 30-commit hop without verify: <= 10 s wall, <= 15 s CPU)"
                + (
                    f"; verify {args.verify_stages} median {statistics.median(v):.1f} s ({min(v):.1f}-{max(v):.1f})"
                    if (v := [r["verify_s"] for r in rows if r["verify_s"] is not None])
                    else ""
                )
            )


if __name__ == "__main__":
    main()
