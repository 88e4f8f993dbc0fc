"""What one stage of a verify run ends with: its status (pass | fail | skipped | unsupported-in-proxy),
a one-line reason, its seconds and its own typed details: the run, the summary, the JUnit XML and
refresh read it; every stage writes it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

PASS, FAIL, SKIPPED, UNSUPPORTED = "pass", "fail", "skipped", "unsupported-in-proxy"

# Why a stage cannot apply to a tree: the package index's Megatron-LM sdist (`sync --source pypi`) is
# megatron/core alone, with no upstream tests and no pretrain_gpt.py to run. Such a stage is
# "skipped" in the JSON as before, with applicable false; the verdict counts it apart from stages not run.
PACKAGE_INDEX_ONLY = "a package-index source ships megatron/core only"


def tree_lacks(what: str) -> str:
    """The reason a stage does not apply: "the tree has no tests/unit_tests (a package-index source ...)"."""
    return f"the tree has no {what} ({PACKAGE_INDEX_ONLY})"


def skipped(name: str, why: str) -> StageResult:
    """A skipped stage, not applicable when ``why`` is a tree_lacks reason."""
    return StageResult(name, SKIPPED, why, applicable=not why.endswith(f"({PACKAGE_INDEX_ONLY})"))


class StageDetails(Protocol):
    """A stage's own facts, typed (stage 1's and 5's ImportProbe, stage 3's unit_tests.UnitTestsRun or
    UnitTestsStopped, stage 4's functional.FunctionalRun): the renderers read their attributes;
    ``to_dict()`` gives the keys the stage adds to its entry in the report's JSON."""

    def to_dict(self) -> dict[str, Any]: ...


@dataclass
class StageResult:
    name: str
    status: str
    reason: str = ""
    seconds: float = 0.0
    details: StageDetails | None = None  # None: the stage adds no keys of its own
    # False: skipped because the tree cannot have it (see tree_lacks), not because the run left it out
    applicable: bool = True

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status,
            "reason": self.reason,
            "seconds": round(self.seconds, 2),
            "applicable": self.applicable,
            **(self.details.to_dict() if self.details is not None else {}),
        }
