"""verify's upstream unit-test stage: upstream's own tests on the port, the way upstream CI runs
them (`torchrun --nproc_per_node N -m pytest ...`), compared with the same tests on the unported
tree at the same commit (cached) so that each failure is labelled by what it is.

The unported tree runs under the port's conditions: the same environment (firewall, proxy swaps,
HIP simulation), the port's test files (their import guards for collection: the codemods rewrite
NVIDIA-only imports in tests too) and the generated helper they import, and the plugin's minimal
guards for collection (see pytest_plugin). Labels of a failing test:

- `port-regression`: the unported tree passed (or skipped) it. Fails the stage.
- `upstream-known`: the unported tree failed it the same way (same exception type and message,
  paths and line numbers normalised: labels.same_message). The same type with another message on
  the port is `port-regression` (both naming a firewalled package: `needs-nvidia-only`).
- `proxy-artifact`: as upstream-known, but the test ran with the local layer spec in place of TE's
  (upstream wrote it for TE): an artifact of the proxy, not upstream's bug.
  Also a failure both trees share that is this machine running out of threads, descriptors or
  memory under the proxy's load ("Resource temporarily unavailable" creating a gloo group).
- `needs-nvidia-only`: as upstream-known, but the failure names a package the firewall removed
  (NVIDIA-only, or without a ROCm build on this machine: "Please install TE >= 1.4", "A compatible
  `nvidia-resiliency-ext` installation is required"): the test needs what this environment lacks
  by design, not upstream's bug either.
- `unverified`: the unported tree has no outcome for it (its module did not import, the test was
  not collected) or failed it differently. Fails the stage unless a known-failure list names it.
- `missing-dependency`: an ordinary (non-NVIDIA) package is missing. Fails the stage, with the pip
  command (checked before the run, too).
- `not-run` (a test file, not a test): some or all of its tests have no outcome (its restart budget,
  RESTARTS_PER_FILE hangs, ran out; the run's time limit stopped it; pytest recorded nothing): see
  FileRun. Fails the stage: a file is never counted as run when it was not.
- `flaky`: hung, then passed when rerun alone, or hangs on both trees. Reported; does not fail.
- `known-failure`: listed by the series for this mode (see suite.VerifySettings)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from rocmport.fsutil import open_log, write_file
from rocmport.output import elapsed
from rocmport.verify.stages.unit_tests import suite
from rocmport.verify.stages.unit_tests.command import FILES_PER_RUN, _file, config_args, pytest_command
from rocmport.verify.stages.unit_tests.results import FileRun, Hang, RESTARTS_PER_FILE, SuiteRun, _counts
from rocmport.machine.cpu_meter import MachineShare
from rocmport.verify.orchestration.launcher import Launcher
from rocmport.verify.runtime import protocol

if TYPE_CHECKING:
    pass

_RANK = {"error": 3, "failed": 2, "skipped": 1, "passed": 0}


Progress = Callable[[str], None]


def _attempt(
    tree: Path,
    tests: list[str],
    done: list[str],
    env: dict,
    nproc: int,
    launcher: Launcher,
    timeout: float,
    on_file: Callable[[str, dict], None] | None = None,
):
    """One torchrun of pytest, without the tests in ``done`` (ids, or `file::` for every test of a
    file); each rank's record, whether it was stopped, torchrun's crash line, and what pytest
    collected (the first rank's collected<RANK>.json; {} when none got that far). ``on_file`` is
    called (each second, maybe again) with each test file rank 0 has moved past, and rank 0's
    outcomes so far; the file rank 0 is in when the run ends is not (it may go on after a restart)."""
    cmd = pytest_command(tests, nproc, launcher)
    with tempfile.TemporaryDirectory(prefix="rocmport-unit-") as out:
        empty_ini = Path(out) / "pytest.ini"
        write_file(empty_ini, "")
        pinned = config_args(tree, tests, empty_ini)
        cmd = cmd[: -len(tests)] + pinned + [a for nodeid in done for a in ("--deselect", nodeid)] + tests
        log = Path(out) / "torchrun.log"
        rank0 = Path(out) / "rank0.json"
        current = None
        with open_log(log) as fh:  # a file, not a pipe: an orphaned worker cannot block the read
            proc = subprocess.Popen(
                cmd,
                cwd=tree,
                text=True,
                start_new_session=True,
                env={**env, **protocol.UNIT_OUT.entry(out)},
                stdout=fh,
                stderr=subprocess.STDOUT,
            )
            deadline = time.monotonic() + timeout
            stopped = False
            while proc.poll() is None:
                if time.monotonic() > deadline:
                    # torchrun stops its workers (their own sessions) on SIGTERM; SIGKILL if it does not.
                    proc.terminate()
                    try:
                        proc.wait(timeout=60)
                    except subprocess.TimeoutExpired:
                        os.killpg(proc.pid, signal.SIGKILL)
                        proc.wait()
                    stopped = True
                    break
                time.sleep(1)
                if on_file:
                    record = _read(rank0)
                    running = record.get("running") or []
                    now = _file(running[0]) if running else None
                    current = now or current
                    outcomes = record.get("outcomes", {})
                    for f in dict.fromkeys(
                        _file(k) for k in outcomes
                    ):  # each file rank 0 has left (a fast one between two polls too)
                        if f != current:
                            on_file(f, outcomes)
        ranks = [r for r in (_read(p) for p in sorted(Path(out).glob("rank*.json"))) if r]
        collected = next((c for c in (_read(p) for p in sorted(Path(out).glob("collected*.json"))) if c), {})
        stdout = log.read_text(errors="replace")
        for pid in stray_processes(protocol.UNIT_OUT.name, out):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:  # gone meanwhile
                pass
    return ranks, stopped, _crash_line(stdout), collected


def _crash_line(log: str) -> str:
    """Why pytest under torchrun recorded nothing, from its log: pytest's own error (a conftest
    that does not import: "ImportError while loading conftest ...", then its "E   ..." line),
    else the log's last line (torchrun's summary)."""
    lines = [
        ln.split("]:", 1)[1].strip() if ln.startswith("[rank") and "]:" in ln else ln.strip() for ln in log.splitlines()
    ]
    for i, line in enumerate(lines):
        if line.startswith(("ImportError while loading conftest", "ERROR: ")):
            detail = next((ln for ln in lines[i + 1 : i + 12] if ln.startswith("E ")), "")
            return f"{line} {detail}".strip()[:400]
    return next((ln for ln in reversed(lines) if ln), "")[:300]


def stray_processes(name: str, value: str) -> list[int]:
    """Processes still alive whose environment has ``name=value``: what a run left behind once its
    ranks ended (a checkpoint writer or multiprocessing manager whose rank the watchdog or torchrun
    ended is re-parented to init, out of reach of the process group). Linux /proc; elsewhere none."""
    needle = f"{name}={value}".encode()
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:  # another user's, or gone
            continue
        if needle in environ.split(b"\0") and int(entry.name) != os.getpid():
            found.append(int(entry.name))
    return found


def _read(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _chunks(tests: list[str]) -> list[list[str]]:
    """The tests in groups of at most FILES_PER_RUN files (file order kept)."""
    groups: dict[str, list[str]] = {}
    for t in tests:
        groups.setdefault(_file(t), []).append(t)
    files = list(groups)
    return [[t for f in files[i : i + FILES_PER_RUN] for t in groups[f]] for i in range(0, len(files), FILES_PER_RUN)]


def _first_hang(ranks: list[dict], stopped: bool, seconds: str) -> Hang | None:
    """The test that hung, if a watchdog fired in this attempt.

    Of the tests the watchdogs ended, and the tests a rank was inside when the first watchdog fired,
    the one first in the run order (the same on every rank) is the hang: a rank that went on to a
    later test and waited there for the stuck one is collateral, even when its watchdog fired first
    (under load a lagging rank enters the stuck test after its peer entered the next collective;
    torchrun then stops it, or the peer's exit breaks its wait, before its own watchdog fires)."""
    fired = [h for r in ranks for h in r.get("hung", [])]
    if not fired:
        return None
    cut = float("inf") if stopped else min(h[2] for h in fired)
    position, waited_in = min((h[1], h[0]) for h in fired)
    candidates = [(position, waited_in, "")]
    for r in ranks:
        own = {h[0] for h in r.get("hung", [])}
        candidates += [
            (
                pos,
                nodeid,
                f"hung: no result after {seconds} s on rank {r.get('rank', '?')} (it was still in this test when "
                f"a peer's watchdog fired in a later one, {waited_in.split('::')[-1]}, waiting for it)",
            )
            for nodeid, (pos, start, end) in r.get("spans", {}).items()
            if start < cut and (end is None or end >= cut) and pos < position and nodeid not in own
        ]
    _, nodeid, detail = min(candidates)
    return Hang(nodeid, detail, cut)


def _account(
    f: str,
    explicit: bool,
    merged: dict[str, str],
    details: dict[str, str],
    collected: set[str],
    modules: dict[str, str],
    deselected: dict[str, str],
    hangs: int,
    exhausted: bool,
    restarts: int,
    why_stopped: str,
) -> FileRun:
    """The FileRun of test file ``f`` after its group's last attempt (see run_tests). ``explicit``:
    named on the command line (pytest always collects such a file), not found in a directory."""
    mine = {k: v for k, v in merged.items() if _file(k) == f}
    counts = {k: n for k, n in _counts(mine).items() if n}
    if mine.get(f) == "error":
        return FileRun("collection-error", counts, hangs, f"its module does not import: {details.get(f, '')}"[:300])
    left = tuple(sorted(i for i in collected if _file(i) == f and i not in mine and i not in deselected))
    if not left and (mine or f in modules):
        none = (
            ""
            if mine
            else (
                "skipped at module level"
                if modules.get(f) == "skipped"
                else "all its tests deselected as upstream's CI does"
                if any(_file(d) == f for d in deselected)
                else "pytest collected no tests from it"
            )
        )
        return FileRun("ran", counts, hangs, none)
    # a conftest.py above it that does not import: pytest records the error on its directory
    above = next(
        (
            k
            for k, v in merged.items()
            if v == "error" and k != f and f.startswith(k.removesuffix("conftest.py").rstrip("/") + "/")
        ),
        None,
    )
    if not left and why_stopped == "" and not explicit and modules and not above:
        return FileRun(
            "not-collected", counts, hangs, "pytest did not collect it (upstream's pytest configuration leaves it out)"
        )
    if exhausted:
        why = (
            f"its restart budget ran out: {hangs} hangs in this file, {restarts} restart{'s' if restarts != 1 else ''} "
            f"per file"
        )
    elif why_stopped:
        why = why_stopped
    elif above:
        why = f"a collection error in {above}: {details.get(above, '')}"[:300]
    elif f not in modules:
        why = "pytest never collected it"
    else:
        why = "the run ended before they had an outcome"
    what = (
        f"{len(left)} of its {len(left) + len(mine)} tests did not run"
        if left and mine
        else f"none of its {len(left)} tests ran"
        if left
        else "it did not run"
    )
    return FileRun("not-run", counts, hangs, f"{what}: {why}", left)


def run_tests(
    tree: Path,
    tests: list[str],
    env: dict,
    nproc: int,
    launcher: Launcher = Launcher(),
    timeout: float = 1500,
    restarts: int = RESTARTS_PER_FILE,
    progress: Progress | None = None,
) -> SuiteRun:
    """Outcomes per test id, merged over ranks (a failure on any rank is a failure). A test that
    hangs (the plugin's watchdog) is a failure and the run starts again without the tests that have
    an outcome; a run stopped at ``timeout`` keeps what the ranks recorded. At most FILES_PER_RUN
    test files share one torchrun (``timeout`` is theirs). ``restarts`` is each test file's budget:
    a file whose tests hang more often than that is not run further (its remaining tests are
    deselected), and the others go on, so that one bad file cannot starve the rest. ``files``
    accounts for every selected test file (FileRun). ``progress`` gets a line per test file."""
    start = time.monotonic()
    share = MachineShare()
    env = {**protocol.UNIT_TEST_TIMEOUT.entry(45.0 if protocol.PROXY.read(env) else 900.0), **env}
    tally = _Tally()
    files_total = len(suite.test_files(tree, tests))
    reported: set[str] = set()

    def file_done(f: str, rank0: dict, whose: str = "rank 0") -> None:
        if progress and f not in reported:
            reported.add(f)
            count = Counter(v for k, v in rank0.items() if _file(k) == f)
            progress(
                f"[{len(reported)}/{files_total}] {f}: "
                + (", ".join(f"{n} {k}" for k, n in sorted(count.items())) or "no outcome")
                + f" ({whose}), {elapsed(time.monotonic() - start)} elapsed"
            )

    for chunk in _chunks(tests):
        _run_chunk(tree, chunk, env, nproc, launcher, timeout, restarts, progress, file_done, tally, start)
    t = tally
    return SuiteRun(
        outcomes=t.merged,
        details=t.details,
        kinds=t.kinds,
        missing=t.missing,
        ranks=t.ran,
        timed_out=t.stopped,
        hung=t.hung,
        restarts=t.attempts - len(_chunks(tests)),
        swaps=t.swaps,
        unsupported=t.unsupported,
        guards=t.guards,
        local_spec=sorted(t.local_spec),
        deselected=dict(sorted(t.deselected.items())),
        peak=t.peak,
        seconds=round(time.monotonic() - start, 1),
        file_seconds={f: round(sec, 2) for f, sec in sorted(t.file_seconds.items())},
        crash="" if t.ran else t.crash,
        files=t.files,
        restarts_per_file=restarts,
        slow=dict(sorted(t.slow.items())),
        watchdog_seconds=protocol.UNIT_TEST_TIMEOUT.read(env) or 0.0,
        machine=(m.to_dict() if (m := share.read()) else None),
    )


@dataclass
class _Tally:
    """What run_tests has gathered so far, over every torchrun of every chunk of test files."""

    merged: dict[str, str] = field(default_factory=dict)  # test id -> its worst outcome over the ranks
    slow: dict[str, float] = field(default_factory=dict)
    details: dict[str, str] = field(default_factory=dict)
    kinds: dict[str, str] = field(default_factory=dict)
    missing: dict[str, str] = field(default_factory=dict)
    swaps: list[str] = field(default_factory=list)
    guards: list[str] = field(default_factory=list)
    hung: list[str] = field(default_factory=list)
    local_spec: set[str] = field(default_factory=set)
    deselected: dict[str, str] = field(default_factory=dict)
    peak: dict[str, float] = field(
        default_factory=lambda: {"threads": 0, "rss_mb": 0.0, "rss_mb_all_ranks": 0.0, "released_groups": 0}
    )
    ran: int = 0
    crash: str = ""
    unsupported: str = ""
    attempts: int = 0
    stopped: bool = False
    files: dict[str, FileRun] = field(default_factory=dict)
    file_seconds: dict[str, float] = field(
        default_factory=dict
    )  # per test file: its tests' seconds (the slowest rank's each)

    def absorb(self, ranks: list[dict], timeout: float, nproc: int, watchdog: str) -> Hang | None:
        """One run's rank records merged in (a failure on any rank is a failure); the test that hung, if any."""
        self.swaps = self.swaps or (ranks[0].get("swaps", []) if ranks else [])
        self.guards = self.guards or (ranks[0].get("guards", []) if ranks else [])
        self.local_spec.update(nodeid for r in ranks for nodeid in r.get("local_spec", []))
        for r in ranks:
            self.deselected.update(r.get("deselected", {}))
            for nodeid, waited in (r.get("slow") or {}).items():
                self.slow[nodeid] = max(self.slow.get(nodeid, 0.0), waited)
        self._peaks(ranks)
        took: dict[str, float] = {}
        for r in ranks:
            for nodeid, (_, began, ended) in (r.get("spans") or {}).items():
                if ended is not None:
                    took[nodeid] = max(took.get(nodeid, 0.0), ended - began)
        for nodeid, sec in took.items():
            self.file_seconds[_file(nodeid)] = self.file_seconds.get(_file(nodeid), 0.0) + sec
        hang = _first_hang(ranks, self.stopped, watchdog)
        if hang:
            self.hung.append(hang.nodeid)
        seen_by = Counter(nodeid for r in ranks for nodeid in r["outcomes"])
        for r in ranks:
            for nodeid in r.get("running", []) if self.stopped else []:
                r["outcomes"][nodeid] = "failed"
                r["details"][nodeid] = f"still running when the stage stopped it after {timeout:g} s"
            for nodeid, outcome in r["outcomes"].items():
                if hang and hang.collateral(r, nodeid, seen_by[nodeid] >= max(nproc, len(ranks))):
                    continue
                if _RANK[outcome] >= _RANK.get(self.merged.get(nodeid, "passed"), 0):
                    self.merged[nodeid] = outcome
                    if nodeid in r["details"]:
                        self.details[nodeid] = r["details"][nodeid]
                    if nodeid in r.get("kinds", {}):
                        self.kinds[nodeid] = r["kinds"][nodeid]
            self.missing.update(r.get("missing", {}))
        if hang and hang.detail:  # the stuck rank did not record it: its outcome, as its own watchdog would have
            self.merged[hang.nodeid], self.kinds[hang.nodeid], self.details[hang.nodeid] = "failed", "hang", hang.detail
        return hang

    def _peaks(self, ranks: list[dict]) -> None:
        peak = self.peak
        for r in ranks:
            p = r.get("peak") or {}
            peak["threads"] = max(peak["threads"], p.get("threads", 0))
            peak["rss_mb"] = max(peak["rss_mb"], p.get("rss_mb", 0.0))
            peak["released_groups"] += p.get("released_groups", 0)
        peak["rss_mb_all_ranks"] = max(
            peak["rss_mb_all_ranks"], round(sum((r.get("peak") or {}).get("rss_mb", 0.0) for r in ranks), 1)
        )


def _run_chunk(
    tree: Path,
    chunk: list[str],
    env: dict,
    nproc: int,
    launcher: Launcher,
    timeout: float,
    restarts: int,
    progress: Progress | None,
    file_done: Callable[..., None],
    t: _Tally,
    start: float,
) -> None:
    """One chunk of test files (one torchrun, ``timeout`` theirs), restarted after each hang without the
    tests that have an outcome until each file's restart budget runs out; every file accounted for."""
    chunk_start = time.monotonic()
    chunk_files = suite.test_files(tree, chunk)
    explicit = {_file(x) for x in chunk}
    file_hangs: Counter[str] = Counter()
    exhausted: set[str] = set()
    collected: set[str] = set()
    modules: dict[str, str] = {}
    why_stopped = ""
    limit = f"its time limit ({timeout:g} s for up to {FILES_PER_RUN} test files)"
    # Each file's budget, and one more run after each file's ran out: a bound, whatever the ranks record.
    for _ in range((restarts + 2) * max(1, len(chunk_files))):
        t.attempts += 1
        left = max(1.0, timeout - (time.monotonic() - chunk_start))
        done = [k for k in t.merged if "::" in k and any(suite.matches(k, c) for c in chunk)]
        skip = done + [f"{f}::" for f in sorted(exhausted)]
        ranks, t.stopped, t.crash, seen = _attempt(
            tree, chunk, skip, env, nproc, launcher, left, file_done if progress else None
        )
        collected.update(seen.get("items", []))
        modules.update(seen.get("modules", {}))
        t.ran = max(t.ran, len(ranks))
        t.unsupported = t.unsupported or next((u[0] for r in ranks for u in [r.get("unsupported")] if u), "")
        if t.unsupported:
            why_stopped = f"the proxy shim stopped the run: {t.unsupported}"
            break
        if not ranks:
            why_stopped = (
                f"the run was stopped at {limit} before any test started"
                if t.stopped
                else f"pytest under torchrun recorded nothing: {t.crash}"
            )
            break
        hang = t.absorb(ranks, timeout, nproc, protocol.UNIT_TEST_TIMEOUT.raw(env))
        if t.stopped:
            why_stopped = f"the run was stopped at {limit}"
            break
        if not hang:
            break
        hung_file = _file(hang.nodeid)
        file_hangs[hung_file] += 1
        if file_hangs[hung_file] > restarts:
            exhausted.add(hung_file)
        if progress:  # minutes may pass before the next file's line: say what the restart is for
            progress(
                f"hung: {hang.nodeid}; "
                + (
                    f"{hung_file} used its {restarts} restarts: its other tests are not run; "
                    if hung_file in exhausted
                    else ""
                )
                + f"restarting without the tests that have an outcome, {elapsed(time.monotonic() - start)} elapsed"
            )
        if collected and not any(
            i not in t.merged and i not in t.deselected and _file(i) not in exhausted for i in collected
        ):
            break  # nothing left to run: no restart
    _account_chunk(
        chunk_files, explicit, collected, modules, file_hangs, exhausted, restarts, why_stopped, t, progress, file_done
    )


def _account_chunk(
    chunk_files: list[str],
    explicit: set[str],
    collected: set[str],
    modules: dict[str, str],
    file_hangs: Counter[str],
    exhausted: set[str],
    restarts: int,
    why_stopped: str,
    t: _Tally,
    progress: Progress | None,
    file_done: Callable[..., None],
) -> None:
    """Every test file of a chunk accounted for (FileRun): run, not run with why, or not collected."""
    for f in chunk_files:
        t.files[f] = _account(
            f,
            f in explicit,
            t.merged,
            t.details,
            collected,
            modules,
            t.deselected,
            file_hangs[f],
            f in exhausted,
            restarts,
            why_stopped,
        )
        if progress and t.files[f].status == "not-run":
            progress(f"not run: {f}: {t.files[f].reason}")
        elif t.files[f].status != "not-collected":
            file_done(f, t.merged, "all ranks")  # the files rank 0 was still in when its last run ended


def rerun_alone(
    tree: Path,
    nodeids: list[str],
    env: dict,
    nproc: int,
    launcher: Launcher,
    progress: Progress | None = None,
    kinds: dict[str, str] | None = None,
) -> dict[str, str]:
    """Each test id run again on its own (a fresh torchrun): its outcome then. ``progress`` gets a line
    per test; ``kinds``, when given, gets the failure kind of each rerun that failed (what the
    comparison with the other tree needs when a test hung in one suite and failed alone)."""
    out = {}
    start = time.monotonic()
    for i, nodeid in enumerate(nodeids, 1):
        res = run_tests(tree, [nodeid], env, nproc, launcher, timeout=600, restarts=0)
        out[nodeid] = "hung" if nodeid in res.hung else res.outcomes.get(nodeid, "not run")
        if kinds is not None and out[nodeid] in ("failed", "error") and nodeid in res.kinds:
            kinds[nodeid] = res.kinds[nodeid]
        if progress:
            progress(
                f"rerun alone [{i}/{len(nodeids)}] {nodeid}: {out[nodeid]}, {elapsed(time.monotonic() - start)} elapsed"
            )
    return out
