"""Stage 3's results, typed: the labels, a file's run (FileRun), a tree's run (SuiteRun), the
unported baseline's (UnitBaseline), and the stage's details (UnitTestsRun, or UnitTestsStopped when
pytest produced no results)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any


if TYPE_CHECKING:
    from rocmport.verify.analyses.impact import ImpactFigures

RESTARTS_PER_FILE = (
    6  # hangs a test file may restart its run for; past that its remaining tests are not run (and say so)
)


def _counts(values: dict[str, str], keys=("passed", "skipped", "failed", "error")) -> dict[str, int]:
    """How many of ``values`` are each of ``keys`` (outcomes by default, or labels)."""
    tally = Counter(values.values())
    return {k: tally[k] for k in keys}


def _share_phrase(machine: dict) -> str:
    return (
        f"other processes kept {machine['others_cores']:.1f} of its {machine['cpus']} cores busy on average "
        f"for {machine['seconds']:.0f} s"
    )


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


@dataclass
class UnitBaseline:
    """The unported tree's run at the same commit (`baseline` of stage 3's entry): where and whether
    cached, what it ran (``ran``: the port's non-passing test ids and files, baseline.to_label; empty:
    nothing to label, it did not run), its counts and test ids, of them those the port has no outcome
    for (``tests_not_on_port``: a module error on the port hides them, a not-run file never ran them),
    the guards and overlay it ran with, and its peak."""

    commit: str | None = None
    cached: bool = False
    counts: dict[str, int] = field(default_factory=dict)
    tests: int = 0
    ran: list[str] = field(default_factory=list)
    tests_not_on_port: int = 0
    guards: list[str] = field(default_factory=list)
    overlay: list[str] = field(default_factory=list)
    peak: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "commit": self.commit,
            "cached": self.cached,
            "counts": self.counts,
            "tests": self.tests,
            "ran": self.ran,
            "tests_not_on_port": self.tests_not_on_port,
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

    def labels_by_file(self) -> dict[str, dict[str, int]]:
        """Each test file that ran here (not left out by pytest's configuration) -> how many of its
        tests (or the file itself: a collection error, not-run) got each label; a clean file: {}."""
        out: dict[str, dict[str, int]] = {f: {} for f, a in self.files.items() if a.status != "not-collected"}
        for nodeid, lab in self.labels.items():
            counts = out.setdefault(nodeid.split("::")[0], {})
            counts[lab] = counts.get(lab, 0) + 1
        return out

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
