"""What a refresh produced, typed: the whole result, each upstream's outcome and each patch's row.
`to_dict()` is the JSON of `refresh --json` and summary.json (with the file texts, which `public`
in refresh/summary.py leaves out)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

from rocmport.errors import EXIT_OK, EXIT_PROBLEM

# One status vocabulary for a refresh, the same in `refresh --json`, summary.json, summary.md (the PR
# body), the exit code and the bot's record: ready (verify ran and passed), not-verified (carried
# over, but verify did not run: --no-verify, or not the Python the tree needs), needs-a-human (a
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


def derive_status(
    *, conflict: dict | None, verify: dict | None, problems: list[str], up_to_date: bool = False
) -> tuple[RefreshStatus, str]:
    """The status of a refresh and why, from what it found (``verify`` None: --no-verify)."""
    if up_to_date:
        return UP_TO_DATE, "the lock already pins it"
    if conflict:
        return NEEDS_HUMAN, f"conflict in {conflict['patch']}"
    if verify is not None and verify.get("failed"):
        return NEEDS_HUMAN, f"verify failed: {', '.join(verify['failed'])}"
    if problems:
        return NEEDS_HUMAN, "; ".join(problems)
    if verify is None:
        return NOT_VERIFIED, "verify was skipped (--no-verify)"
    if verify.get("skipped"):
        return NOT_VERIFIED, f"verify did not run: {verify['skipped']}"
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
    codemods: list[dict[str, Any]] = field(default_factory=list)  # refresh/report.codemod_changes
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
    old_lock: dict
    new_lock: dict
    upstreams: dict[str, UpstreamOutcome] = field(default_factory=dict)
    verify: dict | None = None
    conflict: dict | None = None
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
        data = dataclasses.asdict(self)
        data["upstreams"] = {name: outcome.to_dict() for name, outcome in self.upstreams.items()}
        return data
