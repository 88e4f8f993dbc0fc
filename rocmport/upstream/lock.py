"""`upstream.lock`: the pinned upstream commits, the contract other tools read.

YAML, sorted keys, no timestamps that change when nothing changed, written atomically.
A malformed or hand-edited lock is rejected with a one-line error naming the key and file.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import NoReturn

import yaml
from packaging.version import InvalidVersion, Version

from rocmport.errors import BadInput
from rocmport.fsutil import atomic_write_text
from rocmport.inputs import decode, has_control, is_int, parse_yaml, read_text, ref_problem, type_name
from rocmport.redact import CREDENTIAL_HELP, has_credentials
from rocmport.upstream.remotes import validate_url
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


FIX = "re-run `rocmport sync --ref REF` to rewrite the lock"
MAX_BYTES = 1 << 20  # a lock is a few hundred bytes; anything near this is not one
COMPANION_RULES = ("gitlink-exact", "gitlink-minor", "declared-range", "override")
_SDIST_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*\.(tar\.gz|zip)")


def _check_pin(path, prefix: str, entry: dict) -> None:
    """Every value of one pin, by its meaning: refs git can use, a PEP 440 version, a URL without credentials."""
    if entry["source"] not in SOURCES:
        _fail(path, f"{prefix}.source", f"must be one of {', '.join(SOURCES)}")
    if not _SHA_RE.fullmatch(entry["commit"]):
        _fail(path, f"{prefix}.commit", "must be a full 40-hex commit id")
    why = ref_problem(entry["resolved_ref"])
    if why:
        _fail(path, f"{prefix}.resolved_ref", f"{why}: not a ref git can use")
    if has_control(entry["requested_ref"]) or len(entry["requested_ref"]) > 200:
        _fail(path, f"{prefix}.requested_ref", "must be one line of text (no control characters)")
    if entry["requested_ref"].startswith("-"):  # `sync` resolves it again with git
        _fail(path, f"{prefix}.requested_ref", "must not start with '-' (git would read it as an option)")
    try:
        datetime.fromisoformat(
            entry["commit_date"].removesuffix("Z") + ("+00:00" if entry["commit_date"].endswith("Z") else "")
        )
    except ValueError:
        _fail(path, f"{prefix}.commit_date", "must be an ISO 8601 date and time")
    try:
        validate_url(prefix.rpartition(".")[2], entry["url"])
    except BadInput as exc:
        _fail(path, f"{prefix}.url", f"is not a usable URL ({str(exc).partition(': ')[2]})")
    if has_credentials(entry["url"]):
        _fail(path, f"{prefix}.url", f"holds credentials; a lock never does ({CREDENTIAL_HELP})")
    sdist = entry.get("sdist")
    if entry["source"] == "pypi":
        if (
            not isinstance(sdist, dict)
            or set(sdist) != {"filename", "sha256"}
            or not isinstance(sdist["filename"], str)
            or not _SDIST_NAME_RE.fullmatch(sdist["filename"])
            or not isinstance(sdist["sha256"], str)
            or not _SHA256_RE.fullmatch(sdist["sha256"])
        ):
            _fail(
                path,
                f"{prefix}.sdist",
                "must hold 'filename' (an sdist file name) and a 64-hex 'sha256' for a pypi source",
            )
    elif sdist is not None:
        _fail(path, f"{prefix}.sdist", "is only valid for a pypi source")
    for key in ("chosen_by", "version"):
        if key in entry and not isinstance(entry[key], str):
            _fail(path, f"{prefix}.{key}", f"must be a string (found {type_name(entry[key])})")
    if "chosen_by" in entry and entry["chosen_by"] not in COMPANION_RULES:
        _fail(path, f"{prefix}.chosen_by", f"must be one of {', '.join(COMPANION_RULES)}")
    if "version" in entry:
        try:
            Version(entry["version"])
        except InvalidVersion:
            _fail(path, f"{prefix}.version", f"{entry['version']!r} is not a PEP 440 version")


def parse_lock(text: str, path: str | Path = "upstream.lock") -> Lock:
    data = parse_yaml(text, path, FIX)
    if not isinstance(data, dict):
        raise BadInput(f"{path}: expected a mapping with 'schema_version' and 'upstreams'; {FIX}")
    version = data.get("schema_version")
    if not is_int(version) or version != SCHEMA_VERSION:
        _fail(path, "schema_version", f"must be {SCHEMA_VERSION} (found {version!r})")
    ups = data.get("upstreams")
    if not isinstance(ups, dict) or not ups:
        _fail(path, "upstreams", "must be a non-empty mapping")
    extra = sorted(str(k) for k in set(data) - {"schema_version", "upstreams"})
    if extra:
        _fail(path, extra[0], "is not part of the lock schema")
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
                _fail(path, f"{prefix}.{key}", f"must be a non-empty string (found {type_name(entry[key])})")
        unknown = sorted(str(k) for k in set(entry) - set(_REQUIRED) - set(_OPTIONAL))
        if unknown:
            _fail(path, f"{prefix}.{unknown[0]}", "is not part of the lock schema")
        _check_pin(path, prefix, entry)
        lock.upstreams[name] = Pin(
            entry["url"],
            entry["source"],
            entry["requested_ref"],
            entry["resolved_ref"],
            entry["commit"],
            entry["commit_date"],
            sdist=entry.get("sdist"),
            chosen_by=entry.get("chosen_by"),
            version=entry.get("version"),
        )
    return lock


def parse_lock_bytes(data: bytes, path: str | Path = "upstream.lock") -> Lock:
    """The lock in ``data`` (a file's bytes): not UTF-8 is refused with the byte offset."""
    return parse_lock(decode(data, path, FIX), path)


def load_lock(path: str | Path) -> Lock:
    path = Path(path)
    if not path.is_file():
        raise BadInput(f"{path}: no lock file; run `rocmport sync --ref REF` first")
    return parse_lock(read_text(path, "lock file", max_bytes=MAX_BYTES, fix=FIX), path)


def load_lock_or_none(path: str | Path) -> Lock | None:
    return load_lock(path) if Path(path).is_file() else None
