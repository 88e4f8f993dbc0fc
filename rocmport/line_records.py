"""The records committed beside a line's series (`patchsets/<upstream>/<line>/`): reach.json
(rocmport/verify/analyses/reach.py: which port sites each case and test file ran) and
case-results.json (rocmport/report/case_results.py: stage 4's results per case, for docs/cases.md).
One reader and writer for both, so that they load, version and refuse alike.

A record is one JSON object: ``schema`` (the version this rocmport reads; another is refused, not
guessed at), ``line``, ``recorded_on`` (what it was made on: the ``upstream`` commit and TE's Python
layer ``te``, a version or null, with the record's own keys beside them) and the record's own body.
A file that is not UTF-8 or not JSON, a wrong schema, a missing or mistyped field: each is BadInput,
one line naming the file, what is wrong and what to do (each record says how it is made again). The
file is written atomically, in UTF-8 as itself (a case's reason keeps its '…')."""

from __future__ import annotations

import json
import re
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rocmport.errors import BadInput
from rocmport.fsutil import atomic_write_text
from rocmport.inputs import read_json

FULL_COMMIT = re.compile(r"[0-9a-f]{40}")


def opt_str(raw: dict[str, Any], key: str) -> bool:
    """Whether ``raw[key]`` is absent, null or a string that is not empty."""
    return raw.get(key) is None or (isinstance(raw.get(key), str) and bool(raw[key]))


@dataclass(frozen=True)
class Header:
    """What every record says of itself: its line, the upstream commit and TE layer it was made on,
    and the whole ``recorded_on`` mapping (the record's own keys in it are checked by the record)."""

    line: str
    upstream: str
    te: str | None
    recorded_on: dict[str, Any]


@dataclass(frozen=True)
class LineRecordFile:
    """One kind of record: its file ``name`` in the series directory, ``what`` the errors call it
    ("reach record"), ``fix``: what to do with a broken one, and the ``schema`` this rocmport reads.
    ``full_commit``: recorded_on.upstream must be a full commit (40 hex digits), else any string."""

    name: str
    what: str
    fix: str
    schema: int = 1
    full_commit: bool = False

    def path(self, series_dir: Path) -> Path:
        return series_dir / self.name

    def problem(self, path: Path, what: str) -> BadInput:
        """The one-line error of a record at ``path`` whose first wrong thing is ``what``."""
        return BadInput(f"{path}: not a {self.what} ({what}); {self.fix}")

    def load(self, series_dir: Path) -> tuple[Path, Any] | None:
        """The record's path and JSON value (None: the series has none); a file that is not UTF-8 or
        not JSON, too large or too deep is BadInput naming it."""
        path = self.path(series_dir)
        if not path.exists():
            return None
        return path, read_json(path, self.what, fix=self.fix)

    def header(self, data: Any, path: Path) -> Header:
        """The versioned header of ``data``, checked: a JSON object of this schema, with a line and
        recorded_on's upstream and te; BadInput naming ``path`` and the first thing wrong."""
        if not isinstance(data, dict):
            raise self.problem(path, "not a JSON object")
        if data.get("schema") != self.schema:
            raise self.problem(path, f"schema {data.get('schema')!r}, this rocmport reads schema {self.schema}")
        on = data.get("recorded_on")
        if not isinstance(on, dict):
            raise self.problem(path, "recorded_on is not a mapping")
        upstream = on.get("upstream")
        if self.full_commit and not (isinstance(upstream, str) and FULL_COMMIT.fullmatch(upstream)):
            raise self.problem(path, "recorded_on.upstream is not a full commit (40 hex digits)")
        if not isinstance(upstream, str) or not upstream:
            raise self.problem(path, "recorded_on.upstream is not a commit (a string)")
        if not opt_str(on, "te"):
            raise self.problem(path, "recorded_on.te is not a version string or null")
        if not isinstance(data.get("line"), str) or not data["line"]:
            raise self.problem(path, "line is not a line name (a string such as v0.16)")
        return Header(data["line"], upstream, on.get("te"), on)

    def write(self, series_dir: Path, data: dict[str, Any]) -> Path:
        """``data`` (a record's to_dict) written as the series' record, atomically; its path."""
        path = self.path(series_dir)
        atomic_write_text(path, json.dumps(data, indent=1, ensure_ascii=False) + "\n")
        return path

    # --- the checks of the fields both records have ----------------------------------------------

    def mapping(self, raw: Any, path: Path, where: str) -> dict[str, Any]:
        if not isinstance(raw, dict):
            raise self.problem(path, f"{where} is not a mapping")
        return raw

    def seconds(self, value: Any, path: Path, where: str) -> float:
        """``where``'s seconds: a number, 0 or more (not a boolean, not NaN)."""
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
            raise self.problem(path, f"{where}.seconds is not a number of seconds")
        return float(value)

    def known_keys(self, raw: dict[str, Any], known: Collection[str], path: Path, where: str) -> None:
        unknown = set(raw) - set(known)
        if unknown:
            raise self.problem(path, f"{where} has unknown keys {sorted(unknown)}")
