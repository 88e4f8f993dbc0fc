"""`upstream.lock`: the pinned upstream commits, the contract other tools read.

YAML, sorted keys, no timestamps that change when nothing changed, written atomically.
A malformed or hand-edited lock is rejected with a one-line error naming the key and file.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

import yaml

from rocmport.errors import BadInput
from rocmport.fsutil import atomic_write_text
from rocmport.upstreams import NAMES

SCHEMA_VERSION = 1
SOURCES = ("git", "pypi")
_SHA_RE = re.compile(r"^[0-9a-f]{40}$")
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
_REQUIRED = ("url", "source", "requested_ref", "resolved_ref", "commit", "commit_date")
_OPTIONAL = ("sdist", "chosen_by", "version")

HEADER = (
    "# upstream.lock: written by `rocmport sync`. Pins the exact upstream commits the port is built on.\n"
    "# Edit with `rocmport sync`, not by hand.\n"
)


@dataclass
class Pin:
    """One pinned upstream."""

    url: str
    source: str
    requested_ref: str
    resolved_ref: str
    commit: str
    commit_date: str
    sdist: dict | None = None
    chosen_by: str | None = None
    version: str | None = None  # megatron-core version at that commit (package_info.py), when known

    @property
    def sdist_filename(self) -> str:
        """The sdist a package-index pin was imported from (the lock requires one for source pypi)."""
        if self.sdist is None:
            raise ValueError(f"{self.resolved_ref}: a {self.source} pin has no sdist")
        return str(self.sdist["filename"])

    def to_dict(self) -> dict:
        out = {k: getattr(self, k) for k in _REQUIRED}
        for k in _OPTIONAL:
            if getattr(self, k) is not None:
                out[k] = getattr(self, k)
        return out


@dataclass
class Lock:
    upstreams: dict[str, Pin] = field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION

    def to_dict(self) -> dict:
        return {
            "schema_version": self.schema_version,
            "upstreams": {name: pin.to_dict() for name, pin in sorted(self.upstreams.items())},
        }

    def dumps(self) -> str:
        return HEADER + yaml.safe_dump(self.to_dict(), sort_keys=True, default_flow_style=False, width=1000)

    def save(self, path: str | Path) -> None:
        atomic_write_text(path, self.dumps())


def _fail(path, key: str, what: str) -> NoReturn:
    raise BadInput(f"{path}: key '{key}' {what}; re-run `rocmport sync --ref REF` to rewrite the lock")


def parse_lock(text: str, path: str | Path = "upstream.lock") -> Lock:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise BadInput(f"{path}: not valid YAML{where}; re-run `rocmport sync --ref REF` to rewrite the lock") from None
    if not isinstance(data, dict):
        raise BadInput(f"{path}: expected a mapping with 'schema_version' and 'upstreams'")
    if data.get("schema_version") != SCHEMA_VERSION:
        _fail(path, "schema_version", f"must be {SCHEMA_VERSION} (found {data.get('schema_version')!r})")
    ups = data.get("upstreams")
    if not isinstance(ups, dict) or not ups:
        _fail(path, "upstreams", "must be a non-empty mapping")
    extra = set(data) - {"schema_version", "upstreams"}
    if extra:
        _fail(path, sorted(extra)[0], "is not part of the lock schema")
    lock = Lock()
    for name, entry in ups.items():
        prefix = f"upstreams.{name}"
        if name not in NAMES:
            _fail(path, prefix, f"names an unknown upstream (known: {', '.join(NAMES)})")
        if not isinstance(entry, dict):
            _fail(path, prefix, "must be a mapping")
        for key in _REQUIRED:
            if key not in entry:
                _fail(path, f"{prefix}.{key}", "is missing")
            if not isinstance(entry[key], str) or not entry[key]:
                _fail(path, f"{prefix}.{key}", "must be a non-empty string")
        unknown = set(entry) - set(_REQUIRED) - set(_OPTIONAL)
        if unknown:
            _fail(path, f"{prefix}.{sorted(unknown)[0]}", "is not part of the lock schema")
        if entry["source"] not in SOURCES:
            _fail(path, f"{prefix}.source", f"must be one of {', '.join(SOURCES)}")
        if not _SHA_RE.match(entry["commit"]):
            _fail(path, f"{prefix}.commit", "must be a full 40-hex commit id")
        sdist = entry.get("sdist")
        if entry["source"] == "pypi":
            if not isinstance(sdist, dict) or not isinstance(sdist.get("filename"), str) or not _SHA256_RE.match(str(sdist.get("sha256", ""))):
                _fail(path, f"{prefix}.sdist", "must hold 'filename' and a 64-hex 'sha256' for a pypi source")
        elif sdist is not None:
            _fail(path, f"{prefix}.sdist", "is only valid for a pypi source")
        for key in ("chosen_by", "version"):
            if key in entry and not isinstance(entry[key], str):
                _fail(path, f"{prefix}.{key}", "must be a string")
        lock.upstreams[name] = Pin(entry["url"], entry["source"], entry["requested_ref"], entry["resolved_ref"], entry["commit"],
                                   entry["commit_date"], sdist=entry.get("sdist"), chosen_by=entry.get("chosen_by"),
                                   version=entry.get("version"))
    return lock


def load_lock(path: str | Path) -> Lock:
    path = Path(path)
    if not path.is_file():
        raise BadInput(f"{path}: no lock file; run `rocmport sync --ref REF` first")
    return parse_lock(path.read_text(encoding="utf-8"), path)


def load_lock_or_none(path: str | Path) -> Lock | None:
    return load_lock(path) if Path(path).is_file() else None
