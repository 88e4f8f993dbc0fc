"""What a refresh produced, typed: the whole result, each upstream's outcome and each patch's row, the
conflict that stopped it, the verify it ran, and the locks before and after. The renderers (summary.md,
the command's lines, the bot) read these; `to_dict()` is the JSON of `refresh --json` and summary.json
(with the file texts, which `public` in refresh/summary.py leaves out), its shape held by
tests/test_result_shapes.py."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

from rocmport.errors import EXIT_OK, EXIT_PROBLEM
from rocmport.upstream.lock import Lock
from rocmport.verify.stages.gpt_training import PASS, StageResult

# One status vocabulary for a refresh, the same in `refresh --json`, summary.json, summary.md (the PR
# body), the exit code and the bot's record: ready (verify ran and passed), not-verified (carried
# over, but verify did not run: --no-verify, not the Python the tree needs, or a stage asked for was
# skipped, as stage 3 is on a tree without upstream's tests/unit_tests), needs-a-human (a
# conflict, a failed verify, a series that did not re-apply), up-to-date (nothing to do).
# `derive_status` is the one place it is decided; every renderer reads `status` and `why`.
RefreshStatus = Literal["ready", "not-verified", "needs-a-human", "up-to-date"]
READY: RefreshStatus = "ready"
NOT_VERIFIED: RefreshStatus = "not-verified"
NEEDS_HUMAN: RefreshStatus = "needs-a-human"
UP_TO_DATE: RefreshStatus = "up-to-date"
PROMOTED: tuple[RefreshStatus, ...] = (READY, NOT_VERIFIED)  # what carries the port over (lock, series, tree)
EXIT_CODES: dict[RefreshStatus, int] = {
    READY: EXIT_OK,
    NOT_VERIFIED: EXIT_OK,
    UP_TO_DATE: EXIT_OK,
    NEEDS_HUMAN: EXIT_PROBLEM,
}


@dataclass
class Hunk:
    file: str
    line: int


@dataclass
class Conflict:
    """The patch a refresh stopped at, for a human: where it does not apply and the tree to resolve it in."""

    upstream: str
    patch: str
    files: list[str]
    hunks: list[Hunk]
    detail: str
    tree: str

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class RefreshVerify:
    """The verify a refresh ran on the new port (stages 1-2, or --verify-stages), and when a stage failed, each failure
    labelled against the old pin; or why it did not run (``skipped``)."""

    mode: str = ""
    stages: list[StageResult] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    labels: dict[str, str] | None = None  # failed stage -> what the old pin did
    skipped: str | None = None  # why verify did not run (then no mode)
    unit_tests_selection: str | None = None  # stage 3's impacted selection, as its summary line says it
    cases_selection: str | None = None  # stage 4's cases by reach (report.hop_functional), when asked for
    requested: list[str] = field(default_factory=list)  # the stages the refresh asked for (--verify-stages)

    def to_dict(self) -> dict[str, Any]:
        if self.skipped is not None:
            return {"skipped": self.skipped, "stages": [], "failed": self.failed}
        out: dict[str, Any] = {"mode": self.mode, "stages": [s.to_dict() for s in self.stages], "failed": self.failed}
        if self.unit_tests_selection is not None:
            out["unit_tests_selection"] = self.unit_tests_selection
        if self.cases_selection is not None:
            out["cases_selection"] = self.cases_selection
        if self.labels is not None:
            out["labels"] = self.labels
        return out


def derive_status(
    *, conflict: Conflict | None, verify: RefreshVerify | None, problems: list[str], up_to_date: bool = False
) -> tuple[RefreshStatus, str]:
    """The status of a refresh and why, from what it found (``verify`` None: --no-verify)."""
    if up_to_date:
        return UP_TO_DATE, "the lock already pins it"
    if conflict:
        return NEEDS_HUMAN, f"conflict in {conflict.patch}"
    if verify is not None and verify.failed:
        return NEEDS_HUMAN, f"verify failed: {', '.join(verify.failed)}"
    if problems:
        return NEEDS_HUMAN, "; ".join(problems)
    if verify is None:
        return NOT_VERIFIED, "verify was skipped (--no-verify)"
    if verify.skipped:
        return NOT_VERIFIED, f"verify did not run: {verify.skipped}"
    # A stage that was asked for and did not pass nor fail (skipped: a tree without upstream's
    # tests/unit_tests; unsupported in the proxy) verified nothing: never "ready" for it.
    unrun = [s for s in verify.stages if s.name in verify.requested and s.status != PASS]
    if unrun:
        return NOT_VERIFIED, "; ".join(f"stage {s.name} did not run ({s.status}: {s.reason})" for s in unrun)
    return READY, "verify ran and passed"


# The apply ladder's buckets (patches/apply.py), plus a conflict a human resolved during the refresh.
RowBucket = Literal[
    "clean", "offset", "merged-3way", "already-upstream", "not-applicable", "conflict", "resolved-by-hand"
]
# kept: applied exactly; unchanged / shifted / regenerated: drifted, and its file is now that;
# dropped: upstream has it (the evidence says how we know).
RowAction = Literal["kept", "unchanged", "shifted", "regenerated", "dropped"]


@dataclass
class PatchRow:
    name: str
    bucket: RowBucket
    action: RowAction = "kept"
    detail: str = ""
    evidence: str = ""


@dataclass
class LostFile:
    """A file a codemod rewrote on the old port and no longer does, and why (what upstream did to it)."""

    file: str
    why: str


@dataclass
class CodemodChange:
    """One codemod's sites and files on the old port vs the new (refresh/report.codemod_changes)."""

    name: str
    old_sites: int
    new_sites: int
    old_files: int
    new_files: int
    newly_rewritten: list[str] = field(default_factory=list)
    no_longer_rewritten: list[LostFile] = field(default_factory=list)


@dataclass
class Pinned:
    ref: str
    commit: str


@dataclass
class UpstreamOutcome:
    """One upstream's refresh: its series (created for a new release line, or the one it had), each
    patch's row, the regenerated and dropped patch files, and codemod sites old vs new."""

    series: str  # the series file in the project
    created: bool  # a new release line
    from_series: str  # the series directory it was copied from
    patches: list[PatchRow] = field(default_factory=list)
    regenerated: dict[str, str] = field(default_factory=dict)  # patch file -> its new text
    dropped: dict[str, str] = field(default_factory=dict)  # patch file -> evidence upstream has it
    dropped_texts: dict[str, str] = field(default_factory=dict)  # patch file -> its text before the drop
    series_text: str = ""  # the refreshed series file, dropped patches still listed
    series_text_final: str = ""  # ... and without them
    codemods: list[CodemodChange] = field(default_factory=list)
    from_: Pinned | None = None  # the old pin (None: the upstream was not pinned before)
    to: Pinned | None = None

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["from"] = data.pop("from_")
        return data


@dataclass
class RefreshResult:
    status: RefreshStatus
    to: str
    old_lock: Lock
    new_lock: Lock
    upstreams: dict[str, UpstreamOutcome] = field(default_factory=dict)
    verify: RefreshVerify | None = None
    conflict: Conflict | None = None
    range_diff: str = ""
    seconds: float = 0.0
    promoted: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # what needs a human besides a conflict or a failed verify
    why: str = ""  # the reason for ``status`` (derive_status)

    def settle(self, up_to_date: bool = False) -> RefreshResult:
        """Set ``status`` and ``why`` from what the refresh found: the only way they are set."""
        self.status, self.why = derive_status(
            conflict=self.conflict, verify=self.verify, problems=self.problems, up_to_date=up_to_date
        )
        return self

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.status]

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "to": self.to,
            "old_lock": self.old_lock.to_dict(),
            "new_lock": self.new_lock.to_dict(),
            "upstreams": {name: outcome.to_dict() for name, outcome in self.upstreams.items()},
            "verify": self.verify.to_dict() if self.verify else None,
            "conflict": self.conflict.to_dict() if self.conflict else None,
            "range_diff": self.range_diff,
            "seconds": self.seconds,
            "promoted": list(self.promoted),
            "notes": list(self.notes),
            "problems": list(self.problems),
            "why": self.why,
        }
