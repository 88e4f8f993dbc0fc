"""What a refresh produced, typed: the whole result, each upstream's outcome and each patch's row.
`to_dict()` is the JSON of `refresh --json` and summary.json (with the file texts, which `public`
in refresh/summary.py leaves out)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

RefreshStatus = Literal["ready", "needs-human", "up-to-date"]
READY: RefreshStatus = "ready"
NEEDS_HUMAN: RefreshStatus = "needs-human"
UP_TO_DATE: RefreshStatus = "up-to-date"

# The apply ladder's buckets (patches/apply.py), plus a conflict a human resolved during the refresh.
RowBucket = Literal["clean", "offset", "merged-3way", "already-upstream", "not-applicable", "conflict", "resolved-by-hand"]
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

    series: str                          # the series file in the project
    created: bool                        # a new release line
    from_series: str                     # the series directory it was copied from
    patches: list[PatchRow] = field(default_factory=list)
    regenerated: dict[str, str] = field(default_factory=dict)     # patch file -> its new text
    dropped: dict[str, str] = field(default_factory=dict)         # patch file -> evidence upstream has it
    dropped_texts: dict[str, str] = field(default_factory=dict)   # patch file -> its text before the drop
    series_text: str = ""                # the refreshed series file, dropped patches still listed
    series_text_final: str = ""          # ... and without them
    codemods: list[dict[str, Any]] = field(default_factory=list)  # refresh/report.codemod_changes
    from_: Pinned | None = None          # the old pin (None: the upstream was not pinned before)
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

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["upstreams"] = {name: outcome.to_dict() for name, outcome in self.upstreams.items()}
        return data
