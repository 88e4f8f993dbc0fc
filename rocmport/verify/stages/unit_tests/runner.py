"""verify's upstream unit-test stage: upstream's own tests on the port, the way upstream CI runs
them (`torchrun --nproc_per_node N -m pytest ...`), compared with the same tests on the unported
tree at the same commit (cached) so that each failure is labelled by what it is.

The unported tree runs under the port's conditions: the same environment (firewall, proxy swaps,
HIP simulation), the port's test files (their import guards for collection: the codemods rewrite
NVIDIA-only imports in tests too) and the generated helper they import, and the plugin's minimal
guards for collection (see pytest_plugin). Labels of a failing test:

- `port-regression`: the unported tree passed (or skipped) it. Fails the stage.
- `upstream-known`: the unported tree failed it the same way (same exception type).
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

import hashlib
import json
import os
import platform
import re
import signal
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rocmport.fsutil import atomic_write_text, open_log, tree_read_bytes, tree_write_bytes, write_file
from rocmport.output import elapsed
from rocmport.gitutil import git, run_git
from rocmport.upstreams import UPSTREAMS
from rocmport.verify.stages.unit_tests import suite
from rocmport.machine.cpu_meter import MachineShare, task_limit, task_limit_phrase
from rocmport.verify.orchestration.launcher import Launcher
from rocmport.verify.runtime import protocol
from rocmport.verify.stages.gpt_training import (
    FAIL,
    PASS,
    SKIPPED,
    UNSUPPORTED,
    StageResult,
    exhausted,
    skipped,
    tree_lacks,
)

if TYPE_CHECKING:
    from rocmport.verify.analyses.impact import ImpactFigures

# Part of the baseline cache key: a record read another way is not reused. 9: hang attribution by run
# order and time; 10: spawned children shimmed; 11: one device per rank; 12: upstream CI's deselection,
# in-order streams, TE submodules -> local; 13: the session's objects frozen after collection; 14:
# subgroups asked for on nccl get gloo; 15: what was collected, every selected file accounted for; 16:
# TE answers for verify --te: current_device 0 to TE frames, device selection a no-op.
PLUGIN_VERSION = "17"
FILES_PER_RUN = 16  # test files per torchrun: bounds what a long suite accumulates in one set of ranks
RESTARTS_PER_FILE = (
    6  # hangs a test file may restart its run for; past that its remaining tests are not run (and say so)
)
_RANK = {"error": 3, "failed": 2, "skipped": 1, "passed": 0}
LABELS = (
    "port-regression",
    "unverified",
    "missing-dependency",
    "not-run",
    "upstream-known",
    "proxy-artifact",
    "needs-nvidia-only",
    "flaky",
    "known-failure",
)
# `not-run`: a selected test file some or all of whose tests have no outcome (FileRun): never counted as run.
BLOCKING = ("port-regression", "unverified", "missing-dependency", "not-run")
Progress = Callable[[str], None]


def pytest_command(tests: list[str], nproc: int, launcher: Launcher = Launcher()) -> list[str]:
    """Upstream CI's invocation (`torchrun --nproc_per_node N -m pytest`, one node), plus rocmport's plugin."""
    return launcher.command(
        nproc,
        [
            "-m",
            "pytest",
            "-p",
            "rocmport.verify.runtime.pytest_plugin",
            "-p",
            "no:cacheprovider",
            "--continue-on-collection-errors",
            "-q",
            "-o",
            "addopts=",
            *tests,
        ],
        "unit-tests",
        single_node=True,
    )


def _file(nodeid: str) -> str:
    return nodeid.split("::")[0]


# The files pytest reads its configuration from, and the section that makes each one count (None: any).
_PYTEST_CONFIGS = (
    ("pytest.ini", None),
    (".pytest.ini", None),
    ("pyproject.toml", ("[tool.pytest.ini_options]", "[tool.pytest]")),
    ("tox.ini", ("[pytest]",)),
    ("setup.cfg", ("[tool:pytest]",)),
)


def tree_config(tree: Path, tests: list[str]) -> Path | None:
    """The pytest configuration file pytest would find for ``tests`` inside ``tree`` (from the test
    files' common directory up to the tree's root), or None when the tree has none."""
    dirs = [(tree / _file(t)).parent if not (tree / _file(t)).is_dir() else tree / _file(t) for t in tests]
    common = Path(os.path.commonpath([str(d) for d in dirs])) if dirs else tree
    here = common if common == tree or tree in common.parents else tree
    while True:
        for name, sections in _PYTEST_CONFIGS:
            path = here / name
            if path.is_file():
                if sections is None:
                    return path
                text = path.read_text(encoding="utf-8", errors="replace")
                if any(s in text for s in sections):
                    return path
        if here == tree:
            return None
        here = here.parent


def config_args(tree: Path, tests: list[str], empty_ini: Path) -> list[str]:
    """pytest's root and configuration pinned to the tree. Left to itself, pytest looks for a
    configuration file upwards from the tests and past the tree's root: a tree without one of its own
    (upstream's has pyproject.toml) inside a project that has one (build/refresh/megatron-lm under the
    rocmport project's pyproject.toml) got that project's directory as rootdir, and its options. Its
    test ids were then `build/refresh/megatron-lm/tests/...`, which match no selected file: a test
    that ran and passed was reported "pytest never collected it". ``empty_ini``: an empty file to
    give as the configuration where the tree has none (what pytest uses in a tree with no config);
    the caller writes it (`verify --dry-run` only names it)."""
    found = tree_config(tree, tests)
    if found is not None:
        return ["--rootdir", str(tree), "-c", str(found)]
    return ["--rootdir", str(tree), "-c", str(empty_ini), "--confcutdir", str(tree)]


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


@dataclass(frozen=True)
class Hang:
    """The test one attempt hung in, and when the first watchdog fired (``cut``): from then on a
    peer's exit can break any rank's collective, so an outcome recorded after it proves nothing."""

    nodeid: str
    detail: str  # set when the rank stuck in it did not record the hang itself
    cut: float

    def collateral(self, rank: dict, nodeid: str, complete: bool) -> bool:
        """Whether ``rank``'s outcome for ``nodeid`` is the hang's side effect (that test runs again):
        a later test this rank waited in, an outcome recorded after the cut (a broken connection,
        or the stuck test's own error once its peer left), or a test not every rank finished."""
        if nodeid in {h[0] for h in rank.get("hung", [])}:
            return nodeid != self.nodeid
        span = rank.get("spans", {}).get(nodeid)  # none: a collection outcome, before every test
        if span is not None and self.cut < float("inf") and (span[2] is None or span[2] >= self.cut):
            return True
        return nodeid != self.nodeid and not complete


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


@dataclass(frozen=True)
class FileRun:
    """What stage 3 did with one selected test file. ``status``:

    - ``ran``: every test pytest collected from it has an outcome (none collected: ``reason`` says so);
    - ``collection-error``: its module does not import (an ``error`` outcome, labelled like any other);
    - ``not-collected``: a file of a selected directory that pytest's configuration leaves out (not a failure);
    - ``not-run``: some or all of its tests have no outcome; ``reason`` says why (its restart budget,
      the run's time limit, pytest recording nothing) and ``not_run`` which. It fails the stage."""

    status: str
    counts: dict[str, int] = field(default_factory=dict)
    hangs: int = 0
    reason: str = ""
    not_run: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "counts": self.counts,
            "hangs": self.hangs,
            "reason": self.reason,
            "not_run": list(self.not_run),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FileRun:
        """The account as to_dict() wrote it (a cached baseline's ``files``)."""
        return cls(
            status=data["status"],
            counts=dict(data.get("counts", {})),
            hangs=data.get("hangs", 0),
            reason=data.get("reason", ""),
            not_run=tuple(data.get("not_run", ())),
        )


@dataclass
class SuiteRun:
    """What `run_tests` found on one tree: the port's run, or the unported tree's (`baseline`, cached
    as its to_dict() under the cache's unit-baselines/). Per test id its outcome merged over ranks,
    failure text (``details``), exception type (``kinds``) and missing module; what was deselected;
    every selected file's FileRun; the hangs, restarts, peak, seconds (per test file too), slow tests
    and the machine's share. Set after the run: ``alone``, the hung tests rerun alone; on the unported
    tree also ``alone_kinds`` (those reruns' failure kinds) and ``overlay`` (the port's files it ran with)."""

    outcomes: dict[str, str] = field(default_factory=dict)
    details: dict[str, str] = field(default_factory=dict)
    kinds: dict[str, str] = field(default_factory=dict)
    missing: dict[str, str] = field(default_factory=dict)
    ranks: int = 0  # the most ranks any attempt recorded (0: pytest under torchrun recorded nothing)
    timed_out: bool = False
    hung: list[str] = field(default_factory=list)
    restarts: int = 0
    swaps: list[str] = field(default_factory=list)
    unsupported: str = ""  # the proxy shim hook that stopped the run, if one did
    guards: list[str] = field(default_factory=list)
    local_spec: list[str] = field(default_factory=list)
    deselected: dict[str, str] = field(default_factory=dict)  # test -> the mark upstream's CI deselects
    peak: dict[str, Any] = field(default_factory=dict)  # threads, rss_mb, rss_mb_all_ranks, released_groups
    seconds: float = 0.0
    file_seconds: dict[str, float] = field(default_factory=dict)
    crash: str = ""  # why nothing was recorded (torchrun's or pytest's line), when nothing was
    files: dict[str, FileRun] = field(default_factory=dict)
    restarts_per_file: int = RESTARTS_PER_FILE
    # tests with no result after the timeout whose ranks were still computing: slow, not hung (pytest_plugin._watchdog)
    slow: dict[str, float] = field(default_factory=dict)
    watchdog_seconds: float = 0.0
    machine: dict[str, Any] | None = None  # MachineShare.to_dict(), None where it cannot be read
    alone: dict[str, str] = field(default_factory=dict)
    alone_kinds: dict[str, str] = field(default_factory=dict)
    overlay: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """The cache's record (the baseline's file, json.dumps(indent=1, sort_keys=True))."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["files"] = {f: a.to_dict() for f, a in self.files.items()}
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SuiteRun:
        """A record as to_dict() wrote it; a key it lacks keeps its default, one it does not know is left out."""
        known = {f.name for f in fields(cls)} - {"files"}
        files = {f: FileRun.from_dict(a) for f, a in data.get("files", {}).items()}
        return cls(**{k: v for k, v in data.items() if k in known}, files=files)


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
    merged: dict[str, str] = {}
    slow: dict[str, float] = {}
    details: dict[str, str] = {}
    kinds: dict[str, str] = {}
    missing: dict[str, str] = {}
    swaps: list[str] = []
    guards: list[str] = []
    hung: list[str] = []
    local_spec: set[str] = set()
    deselected: dict[str, str] = {}
    peak = {"threads": 0, "rss_mb": 0.0, "rss_mb_all_ranks": 0.0, "released_groups": 0}
    ran = 0
    crash = ""
    unsupported = ""
    attempts = 0
    stopped = False
    files: dict[str, FileRun] = {}
    file_seconds: dict[str, float] = {}  # per test file: its tests' seconds (the slowest rank's each)
    files_total = len(suite.test_files(tree, tests))
    reported: set[str] = set()

    def file_done(f: str, rank0: dict, whose: str = "rank 0") -> None:
        if progress and f not in reported:
            reported.add(f)
            tally = Counter(v for k, v in rank0.items() if _file(k) == f)
            progress(
                f"[{len(reported)}/{files_total}] {f}: "
                + (", ".join(f"{n} {k}" for k, n in sorted(tally.items())) or "no outcome")
                + f" ({whose}), {elapsed(time.monotonic() - start)} elapsed"
            )

    for chunk in _chunks(tests):
        chunk_start = time.monotonic()
        chunk_files = suite.test_files(tree, chunk)
        explicit = {_file(t) for t in chunk}
        file_hangs: Counter[str] = Counter()
        exhausted: set[str] = set()
        collected: set[str] = set()
        modules: dict[str, str] = {}
        why_stopped = ""
        # Each file's budget, and one more run after each file's ran out: a bound, whatever the ranks record.
        for _ in range((restarts + 2) * max(1, len(chunk_files))):
            attempts += 1
            left = max(1.0, timeout - (time.monotonic() - chunk_start))
            done = [k for k in merged if "::" in k and any(suite.matches(k, c) for c in chunk)]
            ranks, stopped, crash, seen = _attempt(
                tree,
                chunk,
                done + [f"{f}::" for f in sorted(exhausted)],
                env,
                nproc,
                launcher,
                left,
                file_done if progress else None,
            )
            collected.update(seen.get("items", []))
            modules.update(seen.get("modules", {}))
            ran = max(ran, len(ranks))
            unsupported = unsupported or next((u[0] for r in ranks for u in [r.get("unsupported")] if u), "")
            if unsupported:
                why_stopped = f"the proxy shim stopped the run: {unsupported}"
                break
            if not ranks:
                why_stopped = (
                    f"the run was stopped at its time limit ({timeout:g} s for up to {FILES_PER_RUN} test files) "
                    "before any test started"
                    if stopped
                    else f"pytest under torchrun recorded nothing: {crash}"
                )
                break
            swaps = swaps or (ranks[0].get("swaps", []) if ranks else [])
            guards = guards or (ranks[0].get("guards", []) if ranks else [])
            local_spec.update(nodeid for r in ranks for nodeid in r.get("local_spec", []))
            for r in ranks:
                deselected.update(r.get("deselected", {}))
                for nodeid, waited in (r.get("slow") or {}).items():
                    slow[nodeid] = max(slow.get(nodeid, 0.0), waited)
            for r in ranks:
                p = r.get("peak") or {}
                peak["threads"] = max(peak["threads"], p.get("threads", 0))
                peak["rss_mb"] = max(peak["rss_mb"], p.get("rss_mb", 0.0))
                peak["released_groups"] += p.get("released_groups", 0)
            peak["rss_mb_all_ranks"] = max(
                peak["rss_mb_all_ranks"], round(sum((r.get("peak") or {}).get("rss_mb", 0.0) for r in ranks), 1)
            )
            took: dict[str, float] = {}
            for r in ranks:
                for nodeid, (_, began, ended) in (r.get("spans") or {}).items():
                    if ended is not None:
                        took[nodeid] = max(took.get(nodeid, 0.0), ended - began)
            for nodeid, sec in took.items():
                file_seconds[_file(nodeid)] = file_seconds.get(_file(nodeid), 0.0) + sec
            hang = _first_hang(ranks, stopped, protocol.UNIT_TEST_TIMEOUT.raw(env))
            if hang:
                hung.append(hang.nodeid)
            seen_by = Counter(nodeid for r in ranks for nodeid in r["outcomes"])
            for r in ranks:
                for nodeid in r.get("running", []) if stopped else []:
                    r["outcomes"][nodeid] = "failed"
                    r["details"][nodeid] = f"still running when the stage stopped it after {timeout:g} s"
                for nodeid, outcome in r["outcomes"].items():
                    if hang and hang.collateral(r, nodeid, seen_by[nodeid] >= max(nproc, len(ranks))):
                        continue
                    if _RANK[outcome] >= _RANK.get(merged.get(nodeid, "passed"), 0):
                        merged[nodeid] = outcome
                        if nodeid in r["details"]:
                            details[nodeid] = r["details"][nodeid]
                        if nodeid in r.get("kinds", {}):
                            kinds[nodeid] = r["kinds"][nodeid]
                missing.update(r.get("missing", {}))
            if hang and hang.detail:  # the stuck rank did not record it: its outcome, as its own watchdog would have
                merged[hang.nodeid], kinds[hang.nodeid], details[hang.nodeid] = "failed", "hang", hang.detail
            if stopped:
                why_stopped = (
                    f"the run was stopped at its time limit ({timeout:g} s for up to {FILES_PER_RUN} test files)"
                )
                break
            if not hang:
                break
            file_hangs[_file(hang.nodeid)] += 1
            if file_hangs[_file(hang.nodeid)] > restarts:
                exhausted.add(_file(hang.nodeid))
            if progress:  # minutes may pass before the next file's line: say what the restart is for
                progress(
                    f"hung: {hang.nodeid}; "
                    + (
                        f"{_file(hang.nodeid)} used its {restarts} restarts: its other tests are not run; "
                        if _file(hang.nodeid) in exhausted
                        else ""
                    )
                    + f"restarting without the tests that have an outcome, {elapsed(time.monotonic() - start)} elapsed"
                )
            if collected and not any(
                i not in merged and i not in deselected and _file(i) not in exhausted for i in collected
            ):
                break  # nothing left to run: no restart
        for f in chunk_files:
            files[f] = _account(
                f,
                f in explicit,
                merged,
                details,
                collected,
                modules,
                deselected,
                file_hangs[f],
                f in exhausted,
                restarts,
                why_stopped,
            )
            if progress and files[f].status == "not-run":
                progress(f"not run: {f}: {files[f].reason}")
            elif files[f].status != "not-collected":
                file_done(f, merged, "all ranks")  # the files rank 0 was still in when its last run ended
    return SuiteRun(
        outcomes=merged,
        details=details,
        kinds=kinds,
        missing=missing,
        ranks=ran,
        timed_out=stopped,
        hung=hung,
        restarts=attempts - len(_chunks(tests)),
        swaps=swaps,
        unsupported=unsupported,
        guards=guards,
        local_spec=sorted(local_spec),
        deselected=dict(sorted(deselected.items())),
        peak=peak,
        seconds=round(time.monotonic() - start, 1),
        file_seconds={f: round(sec, 2) for f, sec in sorted(file_seconds.items())},
        crash="" if ran else crash,
        files=files,
        restarts_per_file=restarts,
        slow=dict(sorted(slow.items())),
        watchdog_seconds=protocol.UNIT_TEST_TIMEOUT.read(env) or 0.0,
        machine=(m.to_dict() if (m := share.read()) else None),
    )


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


def _swap_tree(env: dict, old: Path, new: Path) -> dict:
    return {
        **env,
        "PYTHONPATH": os.pathsep.join(str(new) if p == str(old) else p for p in env["PYTHONPATH"].split(os.pathsep)),
    }


def overlay_files(tree: Path, base: str) -> list[str]:
    """What the baseline takes from the port: its test files (the codemods' import guards) and the
    generated helpers they import. The library (megatron/) stays upstream's."""
    changed = run_git("diff", "--name-only", base, "--", "tests", cwd=tree, check=False).stdout.split()
    helpers = [h for h in (u.helper_path for u in UPSTREAMS.values()) if (tree / h).is_file()]
    return sorted({f for f in changed if (tree / f).is_file()} | set(helpers))


def baseline_cache(
    tree: Path, base: str, tests: list[str], env: dict, nproc: int, cache_dir: Path, overlay: list[str]
) -> Path:
    """Where `baseline` keeps the unported tree's run of ``tests`` at ``base`` (a SuiteRun's to_dict()):
    keyed by what makes a run differ (the plugin, torch, Python, the mode, the bytes of ``overlay``:
    overlay_files(tree, base), TE)."""
    import torch

    digest = hashlib.sha256(b"".join((tree / f).read_bytes() for f in overlay)).hexdigest()[:16]
    key = hashlib.sha256(
        json.dumps(
            [
                base,
                sorted(tests),
                nproc,
                PLUGIN_VERSION,
                torch.__version__,
                platform.python_version(),
                protocol.PROXY.raw(env),
                protocol.HIP_SIM.raw(env),
                digest,
            ]
            # TE's Python layer (verify --te): a baseline run with another TE, or none, is not reused
            + ([protocol.TE.raw(env)] if protocol.TE.raw(env) else [])
        ).encode()
    ).hexdigest()[:20]
    return cache_dir / "unit-baselines" / f"{base[:12]}-{key}.json"


def baseline(
    tree: Path,
    base: str,
    tests: list[str],
    env: dict,
    nproc: int,
    cache_dir: Path,
    launcher: Launcher = Launcher(),
    progress: Progress | None = None,
) -> tuple[SuiteRun, bool]:
    """The same tests on the unported tree at ``base`` under the port's conditions (see the module
    docstring), from the cache when it has them. Its hung tests are rerun alone too."""
    overlay = overlay_files(tree, base)
    cached = baseline_cache(tree, base, tests, env, nproc, cache_dir, overlay)
    if cached.is_file():
        return SuiteRun.from_dict(json.loads(cached.read_text())), True
    with tempfile.TemporaryDirectory(prefix="rocmport-base-") as tmp:
        checkout = Path(tmp) / "tree"
        git("worktree", "add", "-q", "--detach", str(checkout), base, cwd=tree)
        try:
            for rel in overlay:
                tree_write_bytes(checkout, rel, tree_read_bytes(tree, rel))  # never through a link
            benv = {**_swap_tree(env, tree, checkout), **protocol.BASELINE_GUARDS.entry(True)}
            protocol.PORT_SITES.unset(benv)
            result = run_tests(checkout, tests, benv, nproc, launcher, progress=progress)
            result.alone = rerun_alone(
                checkout, sorted(set(result.hung)), benv, nproc, launcher, progress, result.alone_kinds
            )
        finally:
            run_git("worktree", "remove", "--force", str(checkout), cwd=tree, check=False)
    result.overlay = overlay
    if not (result.hung and (result.machine or {}).get("overloaded")):
        # hangs on a machine other jobs kept busy are not upstream's to remember: the next run measures again
        atomic_write_text(cached, json.dumps(result.to_dict(), indent=1, sort_keys=True))
    return result, False


def _missing_ordinary(nodeid: str, res: SuiteRun, blocked: tuple[str, ...]) -> str | None:
    """The ordinary package whose absence made this test (or its module) fail, if that is why."""
    import re

    mod = res.missing.get(_file(nodeid)) or res.missing.get(nodeid)
    if not mod:
        m = re.search(r"No module named '([^']+)'", res.details.get(nodeid, ""))
        mod = m.group(1) if m else None
    return mod if mod and mod.split(".")[0] not in blocked else None


# How megatron's messages name a package besides its module name and distribution spelling.
_ALIASES = {"transformer_engine": r"\bTE\b|Transformer ?Engine", "flash_attn": r"flash[- ]attn|FlashAttention"}


def _names_blocked(nodeid: str, res: SuiteRun, blocked: tuple[str, ...]) -> str | None:
    """The firewalled package this failure names, if any: the module it found missing, or its
    message. Names that are also ordinary words (`cuda`, `nvidia`, `apex`: torch.cuda, "Apex is not
    installed") count only as a missing module; distinctive ones (`transformer_engine`) also as
    written, as their distribution spells them (`nvidia-resiliency-ext`) and by megatron's aliases."""
    import re

    for mod in (res.missing.get(_file(nodeid)), res.missing.get(nodeid)):
        if mod and mod.split(".")[0] in blocked:
            return mod.split(".")[0]
    text = res.details.get(nodeid, "")
    for mod in blocked:
        patterns = [rf"No module named '{re.escape(mod)}\b"]
        if "_" in mod:
            patterns += [rf"\b{re.escape(mod)}\b", rf"\b{re.escape(mod.replace('_', '-'))}\b"]
        if mod in _ALIASES:
            patterns.append(_ALIASES[mod])
        if any(re.search(p, text) for p in patterns):
            return mod
    return None


# The machine's limits, as the C library and Python word them: threads (EAGAIN from pthread_create,
# as gloo reports a group it could not start), file descriptors, memory.
def _te_kernel_missing(nodeid: str, res: SuiteRun) -> str | None:
    """The transformer_engine_torch function whose missing CPU implementation failed this test, if that is why."""
    m = re.search(r"unsupported-in-proxy: (transformer_engine_torch\.\w+)", res.details.get(nodeid, ""))
    return m.group(1) if m else None


def _exhausted(nodeid: str, res: SuiteRun) -> str | None:
    """The resource-exhaustion message this failure carries, if any: the machine's limit, not upstream's bug."""
    return exhausted(res.details.get(nodeid, ""))


def label(
    port: SuiteRun, base: SuiteRun, known: dict[str, str], blocked: tuple[str, ...] = ()
) -> tuple[dict[str, str], dict[str, str]]:
    """Each failing test of the port: its label (see the module docstring) and why."""
    labels, why = {}, {}
    alone = port.alone
    base_alone = base.alone
    local = set(port.local_spec)
    for nodeid, outcome in port.outcomes.items():
        if outcome not in ("failed", "error"):
            continue
        listed = next((k for k in known if suite.matches(nodeid, k)), None)
        missing = _missing_ordinary(nodeid, port, blocked)
        b = base.outcomes.get(nodeid)
        b_module = base.outcomes.get(_file(nodeid))
        if missing:
            lab, text = "missing-dependency", f"the ordinary package {missing.split('.')[0]} is not installed"
        elif listed:
            lab, text = "known-failure", known[listed]
        elif kernel := _te_kernel_missing(nodeid, port):
            # TE's Python layer reached a compiled kernel the proxy's CPU layer does not implement
            # (verify --te): the proxy's gap, named; never the port's failure nor a firewalled package's.
            lab, text = (
                "proxy-artifact",
                (
                    f"unsupported-in-proxy: the CPU proxy's TE layer has no reference implementation "
                    f"of {kernel}; not verified here"
                ),
            )
        elif nodeid in port.hung:
            again = alone.get(nodeid)
            if again == "passed":
                lab, text = "flaky", "hung in the suite, passed when rerun alone"
            elif again == "hung" and (nodeid in base.hung and base_alone.get(nodeid) in ("hung", None)):
                lab, text = "flaky", "hangs on the port and on the unported tree"
            elif again == "hung" and b in ("passed", "skipped"):
                lab, text = "port-regression", "hangs on the port (alone too); passes on the unported tree"
            else:
                alone_words = {
                    "failed": "failed when rerun alone",
                    "error": "errored when rerun alone",
                    "hung": "hung again when rerun alone",
                    "skipped": "was skipped when rerun alone",
                }.get(again or "", "was not rerun alone")
                base_words = (
                    "the unported tree has no outcome for it"
                    if not b
                    else "the unported tree hung in it too"
                    if nodeid in base.hung
                    else f"the unported tree {b} it without hanging"
                    if b in ("failed", "passed", "skipped")
                    else f"on the unported tree: {b}"
                )
                lab, text = "unverified", f"it hung in the suite and {alone_words}; {base_words}"
        elif b in ("passed", "skipped"):
            lab, text = "port-regression", f"{b} on the unported tree"
        elif b in ("failed", "error"):
            base_kind, hung_there = base.kinds.get(nodeid), False
            if nodeid in base.hung and nodeid in base.alone_kinds:
                # it hung in the unported tree's suite and failed when rerun alone: that failure is its outcome there
                base_kind = base.alone_kinds[nodeid]
                hung_there = True
            same = port.kinds.get(nodeid) == base_kind
            if not same:
                lab, text = (
                    "unverified",
                    (
                        f"fails differently on the unported tree ({base_kind or '?'} "
                        f"there, {port.kinds.get(nodeid) or '?'} here)"
                    ),
                )
            elif exhausted := _exhausted(nodeid, port):
                lab, text = (
                    "proxy-artifact",
                    (
                        f"fails the same way on the unported tree: this machine ran out of a resource "
                        f"({exhausted}), here under the CPU proxy's load (gloo groups' threads on 8 ranks)"
                    ),
                )
            elif nodeid in local:
                lab, text = (
                    "proxy-artifact",
                    "fails the same way on the unported tree, running with the local spec in place of TE's",
                )
            elif needs := _names_blocked(nodeid, port, blocked):
                lab, text = (
                    "needs-nvidia-only",
                    f"fails the same way on the unported tree: it needs {needs}, which the firewall removes here",
                )
            else:
                lab, text = (
                    "upstream-known",
                    "fails the same way on the unported tree"
                    + (" (there when rerun alone: it hung in the suite)" if hung_there else ""),
                )
        elif (
            _file(nodeid) == nodeid
            and b_module is None
            and (ran_there := [k for k in base.outcomes if _file(k) == nodeid and k != nodeid])
        ):
            # its module does not import on the port; on the unported tree it imported and its tests ran
            lab, text = (
                "port-regression",
                f"its module does not import here; on the unported tree it imported and {len(ran_there)} of its tests ran",
            )
        elif b_module == "error" and _file(nodeid) != nodeid:
            lab, text = (
                "unverified",
                f"its module does not import on the unported tree: {base.details.get(_file(nodeid), '')[:200]}",
            )
        else:
            base_file = base.files.get(_file(nodeid))
            lab, text = (
                "unverified",
                (
                    "the unported tree has no outcome for it"
                    + (
                        f" (it did not run there: {base_file.reason})"
                        if base_file is not None and base_file.status == "not-run"
                        else ""
                    )
                ),
            )
        if nodeid in port.hung and port.machine and port.machine.get("overloaded"):
            text += f" (on an overloaded machine: {_share_phrase(port.machine)})"  # the verdict may be the machine's
        labels[nodeid], why[nodeid] = lab, text
    return labels, why


def _counts(values: dict[str, str], keys=("passed", "skipped", "failed", "error")) -> dict[str, int]:
    """How many of ``values`` are each of ``keys`` (outcomes by default, or labels)."""
    tally = Counter(values.values())
    return {k: tally[k] for k in keys}


def _on_baseline(nodeid: str, base: SuiteRun) -> str:
    out = base.outcomes.get(nodeid)
    if out:
        return out
    if base.outcomes.get(_file(nodeid)) == "error":
        return f"module error: {base.details.get(_file(nodeid), '')}"
    account = base.files.get(_file(nodeid))
    if account is not None and account.status == "not-run":
        return f"not run: {account.reason}"
    if (
        "::" not in nodeid and account is not None and account.status == "ran"
    ):  # a file (not-run here): what its tests did there
        return "ran: " + (", ".join(f"{n} {k}" for k, n in account.counts.items()) or account.reason)
    return "not run"


@dataclass
class UnitBaseline:
    """The unported tree's run at the same commit (`baseline` of stage 3's entry): where and whether
    cached, its counts and test ids (a module error on the port hides tests the unported tree has),
    the guards and overlay it ran with, and its peak."""

    commit: str | None = None
    cached: bool = False
    counts: dict[str, int] = field(default_factory=dict)
    tests: int = 0
    guards: list[str] = field(default_factory=list)
    overlay: list[str] = field(default_factory=list)
    peak: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "commit": self.commit,
            "cached": self.cached,
            "counts": self.counts,
            "tests": self.tests,
            "guards": self.guards,
            "overlay": self.overlay,
            "peak": self.peak,
        }


@dataclass
class UnitTestsRun:
    """Stage 3's details when the tests ran on both trees (its entry's own keys in the report): per test
    id its outcome, label, why and failure, and what the unported tree did; every selected file's
    FileRun; the restarts, hangs and reruns; the peak, the machine's share and seconds.
    ``impact``: an impacted selection's figures (added after the run, see registry)."""

    tests: list[str] = field(default_factory=list)
    why: dict[str, str] = field(default_factory=dict)  # test -> why it is in the suite
    nproc: int = 0
    counts: dict[str, int] = field(default_factory=dict)
    outcomes: dict[str, str] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    label_reasons: dict[str, str] = field(default_factory=dict)
    failures: dict[str, str] = field(default_factory=dict)
    # every selected test file: ran (with counts), collection-error, not-collected, or not-run with why
    files: dict[str, FileRun] = field(default_factory=dict)
    restarts_per_file: int = RESTARTS_PER_FILE
    # what the unported tree did with each labelled test: its outcome, or why its module did not import
    on_baseline: dict[str, str] = field(default_factory=dict)
    swaps: list[str] = field(default_factory=list)
    hung: list[str] = field(default_factory=list)
    rerun_alone: dict[str, str] = field(default_factory=dict)
    # a failure here may be the local spec's, not the port's: upstream wrote the test for TE
    local_spec_instead_of_te: list[str] = field(default_factory=list)
    restarts: int = 0
    peak: dict[str, Any] = field(default_factory=dict)
    # not run, on either tree, because upstream's CI does not run them (see pytest_plugin)
    deselected: dict[str, str] = field(default_factory=dict)
    baseline: UnitBaseline = field(default_factory=UnitBaseline)
    known_failures: dict[str, str] = field(default_factory=dict)
    known_failures_not_applied: dict[str, str] = field(default_factory=dict)
    port_seconds: float = 0.0
    file_seconds: dict[str, float] = field(default_factory=dict)  # per test file, on the port (impact.py's estimates)
    baseline_seconds: float | None = 0.0
    slow: dict[str, float] = field(default_factory=dict)
    machine: dict[str, Any] | None = field(default_factory=dict)  # the port's run's MachineShare (None: unread)
    impact: ImpactFigures | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "tests": self.tests,
            "why": self.why,
            "nproc": self.nproc,
            "counts": self.counts,
            "outcomes": self.outcomes,
            "labels": self.labels,
            "label_reasons": self.label_reasons,
            "failures": self.failures,
            "files": {f: a.to_dict() for f, a in self.files.items()},
            "restarts_per_file": self.restarts_per_file,
            "on_baseline": self.on_baseline,
            "swaps": self.swaps,
            "hung": self.hung,
            "rerun_alone": self.rerun_alone,
            "local_spec_instead_of_te": self.local_spec_instead_of_te,
            "restarts": self.restarts,
            "peak": self.peak,
            "deselected": self.deselected,
            "baseline": self.baseline.to_dict(),
            "known_failures": self.known_failures,
            "known_failures_not_applied": self.known_failures_not_applied,
            "port_seconds": self.port_seconds,
            "file_seconds": self.file_seconds,
            "baseline_seconds": self.baseline_seconds,
            "slow": self.slow,
            "machine": self.machine,
        }
        if self.impact is not None:
            out["impact"] = self.impact.to_dict()
        return out


@dataclass
class UnitTestsStopped:
    """Stage 3's details when it stopped before labelling: the selected tests, and what stopped it,
    the dependencies they need that this Python lacks ({module: pip name}), or the files of a run that
    produced no results (their FileRuns). None: not this stop (absent from the JSON)."""

    tests: list[str]
    missing_dependencies: dict[str, str] | None = None
    files: dict[str, FileRun] | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"tests": self.tests}
        if self.missing_dependencies is not None:
            out["missing_dependencies"] = self.missing_dependencies
        if self.files is not None:
            out["files"] = {f: a.to_dict() for f, a in self.files.items()}
        return out


def stage_unit_tests(
    tree: Path,
    env: dict,
    tests: list[str],
    nproc: int,
    known: dict[str, str],
    cache_dir: Path,
    base: str | None,
    launcher: Launcher = Launcher(),
    blocked: tuple[str, ...] = (),
    progress: Progress | None = None,
    reasons: dict[str, str] | None = None,
    known_skipped: dict[str, str] | None = None,
    restarts: int = RESTARTS_PER_FILE,
) -> StageResult:
    start = time.monotonic()
    if not launcher.runs_stage(single_node=True):
        return StageResult(
            "unit-tests", SKIPPED, "upstream's unit tests run on one node, like upstream CI: node 0 runs them"
        )
    if not (tree / "tests" / "unit_tests").is_dir():
        return skipped("unit-tests", tree_lacks("tests/unit_tests"))
    absent = [t for t in tests if not (tree / _file(t)).exists()]
    if absent:
        return StageResult(
            "unit-tests",
            FAIL,
            f"not in the tree: {', '.join(absent)}; fix --unit-test or the series' verify.unit_tests",
        )
    files = suite.test_files(tree, tests)
    need = suite.missing_dependencies(tree, files, blocked)
    if need:
        return StageResult(
            "unit-tests",
            FAIL,
            f"the selected test files need {', '.join(sorted(need))}, which this Python lacks: "
            f"`{suite.pip_command(need)}`",
            time.monotonic() - start,
            UnitTestsStopped(tests, missing_dependencies=need),
        )
    say = (lambda line: progress(f"port {line}")) if progress else None
    port = run_tests(tree, tests, env, nproc, launcher, restarts=restarts, progress=say)
    if port.unsupported:
        return StageResult(
            "unit-tests", UNSUPPORTED, f"proxy shim hook missing: {port.unsupported}", time.monotonic() - start
        )
    if not port.ranks:
        return StageResult(
            "unit-tests",
            FAIL,
            f"pytest under torchrun produced no results (none of the {len(port.files)} selected "
            f"files ran): {port.crash}",
            time.monotonic() - start,
            UnitTestsStopped(tests, files=port.files),
        )
    port.alone = rerun_alone(tree, sorted(set(port.hung)), env, nproc, launcher, say)
    bsay = (lambda line: progress(f"unported tree {line}")) if progress else None
    base_result, cached = (
        baseline(tree, base, tests, env, nproc, cache_dir, launcher, bsay) if base else (SuiteRun(), False)
    )
    labels, why = label(port, base_result, known, blocked)
    machine = port.machine or {}
    # A file with tests that have no outcome is never counted as run: it is listed, with why, and fails the stage.
    not_run = {f: a for f, a in port.files.items() if a.status == "not-run"}
    for f, a in not_run.items():
        labels[f], why[f] = "not-run", a.reason
    counts = _counts(port.outcomes)
    by_label = _counts(labels, LABELS)
    details = UnitTestsRun(
        tests=tests,
        why={t: (reasons or {}).get(t, "") for t in tests},
        nproc=nproc,
        counts=counts,
        outcomes=dict(sorted(port.outcomes.items())),
        labels=labels,
        label_reasons=why,
        failures={k: port.details.get(k, "") for k in labels},
        files=port.files,
        restarts_per_file=port.restarts_per_file,
        on_baseline={k: _on_baseline(k, base_result) for k in labels},
        swaps=port.swaps,
        hung=port.hung,
        rerun_alone=port.alone,
        local_spec_instead_of_te=port.local_spec,
        restarts=port.restarts,
        peak=port.peak,
        deselected={
            k: f"marked {m}: upstream's CI deselects it (tests/unit_tests/run_ci_test.sh, dev environment)"
            for k, m in port.deselected.items()
        },
        baseline=UnitBaseline(
            commit=base,
            cached=cached,
            counts=_counts(base_result.outcomes),
            tests=sum("::" in k for k in base_result.outcomes),  # test ids (a module error hides them on the port)
            guards=base_result.guards,
            overlay=base_result.overlay,
            peak=base_result.peak,
        ),
        known_failures=known,
        known_failures_not_applied=known_skipped or {},
        port_seconds=port.seconds,
        file_seconds=port.file_seconds,
        # no baseline (no base commit): None; cached: it took no time now
        baseline_seconds=0.0 if cached else base_result.seconds if base else None,
        slow=port.slow,
        machine=port.machine,
    )
    summary = (
        f"{counts['passed']} passed, {counts['skipped']} skipped, {counts['failed'] + counts['error']} failed ("
        + ", ".join(f"{by_label[k]} {k}" for k in LABELS if by_label[k] or k in ("port-regression", "upstream-known"))
        + f") in {_files_phrase(port.files)} on {nproc} ranks; "
        + ("not run: " + "; ".join(f"{f} ({a.reason})" for f, a in not_run.items()) + "; " if not_run else "")
        + f"restart budget {port.restarts_per_file} per test file ({port.restarts} used); "
        + (
            f"{len(port.deselected)} deselected as upstream's CI does ({', '.join(sorted(set(port.deselected.values())))}); "
            if port.deselected
            else ""
        )
        + f"baseline {'cached' if cached else 'run'} at {str(base)[:12]}; "
        f"peak {port.peak['threads']} threads, {port.peak['rss_mb']:.0f} MB per rank"
        + (
            f"; {len(port.slow)} slow test(s) given more time, their ranks still computing after the "
            f"{port.watchdog_seconds:g} s timeout"
            if port.slow
            else ""
        )
        + (
            f"; this machine was overloaded: {_share_phrase(machine)}: hang and time-limit verdicts may be the machine's"
            if machine.get("overloaded")
            else ""
        )
    )
    ran_out = task_limit_phrase(port.peak["threads"], nproc, task_limit()) if not_run else None
    if ran_out:
        summary += f"; {ran_out}"
    lacking = {
        str(_missing_ordinary(k, port, blocked)).split(".")[0] for k, v in labels.items() if v == "missing-dependency"
    }
    if lacking:
        cmd = suite.pip_command({m: suite.PIP_NAMES.get(m, m.replace("_", "-")) for m in lacking})
        summary += f"; missing dependencies: `{cmd}`"
    status = FAIL if any(by_label[k] for k in BLOCKING) else PASS
    return StageResult("unit-tests", status, summary, time.monotonic() - start, details)


def _share_phrase(machine: dict) -> str:
    return (
        f"other processes kept {machine['others_cores']:.1f} of its {machine['cpus']} cores busy on average "
        f"for {machine['seconds']:.0f} s"
    )


def _files_phrase(files: dict[str, FileRun]) -> str:
    """ "7 files", or "2 of 7 files" when some did not run (a file is counted only if it ran)."""
    accounted = {f: a for f, a in files.items() if a.status != "not-collected"}
    done = sum(a.status != "not-run" for a in accounted.values())
    return f"{len(accounted)} files" if done == len(accounted) else f"{done} of {len(accounted)} files"
