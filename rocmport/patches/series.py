"""Patch sets on disk: `patchsets/<upstream>/<line>/series` (YAML: the full recipe of one release
line) plus DEP-3-headed `.patch` files. Parsing, linting, version-range selection, hashing."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from rocmport.errors import BadInput
from rocmport.upstreams import UPSTREAMS

_STATUS_RE = re.compile(r"^(Pending|ROCm-only|Submitted \S+|Backport [0-9a-fA-F]{7,40}|Inappropriate \S.*)$")
_FIELD_RE = re.compile(r"^([A-Za-z][A-Za-z0-9-]*):(?: (.*))?$")
_SERIES_KEYS = {"upstream", "line", "versions", "patches", "codemods", "excluded_paths", "manifests", "verify"}
KNOWN_FIELDS = ("Description", "Upstream-Status", "Bug", "Forwarded", "Author", "Origin", "Last-Update")


@dataclass
class PatchFile:
    name: str
    path: Path
    header: dict[str, str]
    diff: str  # the diff text after the header

    @property
    def description(self) -> str:
        return self.header.get("Description", "")

    @property
    def upstream_status(self) -> str:
        return self.header.get("Upstream-Status", "")


@dataclass
class Series:
    path: Path
    upstream: str
    line: str
    versions: SpecifierSet
    patches: list[PatchFile] = field(default_factory=list)
    codemods: list[dict] = field(default_factory=list)
    excluded_paths: list[str] = field(default_factory=list)
    # Dependency-manifest rewrite: None = the defaults, False = off, or {drop: {name: reason}, keep: [names]}.
    manifests: dict | bool | None = None
    # verify's settings for this line: {unit_tests: [paths], known_failures: {test id or file: reason}}.
    verify: dict = field(default_factory=dict)

    @property
    def dir(self) -> Path:
        return self.path.parent

    def admits(self, version: str) -> bool:
        return self.versions.contains(Version(version), prereleases=True)


def split_header(text: str) -> tuple[list[str], str]:
    """Header lines before the first `---`/`diff --git` line, and the rest."""
    lines = text.splitlines(keepends=True)
    for i, line in enumerate(lines):
        if line.startswith("diff --git ") or line.rstrip("\n") == "---" or line.startswith("--- "):
            body = lines[i + 1:] if line.rstrip("\n") == "---" else lines[i:]
            return [ln.rstrip("\n") for ln in lines[:i]], "".join(body)
    return [ln.rstrip("\n") for ln in lines], ""


def parse_header(lines: list[str], where: Path) -> dict[str, str]:
    """DEP-3 fields; continuation lines start with a space (` .` is an empty line)."""
    header: dict[str, str] = {}
    current = None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            current = None
            continue
        if line.startswith((" ", "\t")) and current:
            header[current] += "\n" + ("" if line.strip() == "." else line.strip())
            continue
        m = _FIELD_RE.match(line)
        if not m:
            raise BadInput(f"{where}:{n}: malformed DEP-3 header line {line!r}; expected 'Field: value'")
        current = m.group(1)
        header[current] = (m.group(2) or "").strip()
    return header


def lint_header(header: dict[str, str], where: Path) -> list[str]:
    problems = []
    if not header.get("Description"):
        problems.append(f"{where}: missing 'Description'")
    status = header.get("Upstream-Status")
    if not status:
        problems.append(f"{where}: missing 'Upstream-Status'")
    elif not _STATUS_RE.match(status):
        problems.append(
            f"{where}: Upstream-Status {status!r} must be Pending | Submitted <url> | Backport <commit> | Inappropriate <reason> | ROCm-only"
        )
    return problems


def load_patch(path: Path) -> PatchFile:
    if not path.is_file():
        raise BadInput(f"{path}: listed in the series but missing; add the file or drop it from `patches:`")
    text = path.read_text(encoding="utf-8")
    header_lines, diff = split_header(text)
    header = parse_header(header_lines, path)
    problems = lint_header(header, path)
    if problems:
        raise BadInput(problems[0])
    if not diff.strip():
        raise BadInput(f"{path}: no diff after the header")
    return PatchFile(path.name, path, header, diff)


def load_series(path: Path) -> Series:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise BadInput(f"{path}: not valid YAML{f' at line {mark.line + 1}' if mark else ''}") from None
    if not isinstance(data, dict):
        raise BadInput(f"{path}: expected a mapping with upstream, line, versions, patches, codemods, excluded_paths")
    unknown = set(data) - _SERIES_KEYS
    if unknown:
        raise BadInput(f"{path}: unknown key '{sorted(unknown)[0]}'; known: {', '.join(sorted(_SERIES_KEYS))}")
    for key in ("upstream", "line", "versions"):
        if not isinstance(data.get(key), str) or not data[key]:
            raise BadInput(f"{path}: key '{key}' must be a non-empty string")
    try:
        spec = SpecifierSet(data["versions"])
    except InvalidSpecifier:
        raise BadInput(f"{path}: key 'versions' is not a PEP 440 specifier set: {data['versions']!r}") from None
    patches = data.get("patches") or []
    if not isinstance(patches, list) or not all(isinstance(p, str) and "/" not in p for p in patches):
        raise BadInput(f"{path}: key 'patches' must be a list of file names in the series directory")
    codemods = []
    for i, entry in enumerate(data.get("codemods") or []):
        if isinstance(entry, str):
            entry = {"name": entry, "options": {}}
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str) or not isinstance(entry.get("options", {}), dict):
            raise BadInput(f"{path}: key 'codemods[{i}]' must be a name or {{name, options}}")
        codemods.append({"name": entry["name"], "options": entry.get("options") or {}})
    excluded = data.get("excluded_paths") or []
    if not isinstance(excluded, list) or not all(isinstance(p, str) and p.strip("/") and ".." not in p.split("/") and not p.startswith("/") for p in excluded):
        raise BadInput(f"{path}: key 'excluded_paths' must be a list of relative directories")
    manifests = data.get("manifests")
    if not (manifests is None or manifests is False or (
            isinstance(manifests, dict) and set(manifests) <= {"drop", "keep"}
            and isinstance(manifests.get("drop", {}), dict) and all(isinstance(v, str) for v in (manifests.get("drop") or {}).values())
            and isinstance(manifests.get("keep", []), list) and all(isinstance(v, str) for v in manifests.get("keep") or []))):
        raise BadInput(f"{path}: key 'manifests' must be false or a mapping with 'drop' ({{name: reason}}) and 'keep' ([names])")
    verify = data.get("verify") or {}
    if not (isinstance(verify, dict) and set(verify) <= {"unit_tests", "known_failures"}
            and isinstance(verify.get("unit_tests", []), list) and isinstance(verify.get("known_failures", {}), dict)):
        raise BadInput(f"{path}: key 'verify' must be a mapping with 'unit_tests' ([paths]) and 'known_failures' ({{test id: reason}})")
    return Series(
        path=path,
        upstream=data["upstream"],
        line=data["line"],
        versions=spec,
        patches=[load_patch(path.parent / p) for p in patches],
        codemods=codemods,
        excluded_paths=[p.strip("/") for p in excluded],
        manifests=manifests,
        verify=verify,
    )


def all_series(patchsets_dir: Path, upstream: str) -> list[Series]:
    root = patchsets_dir / upstream
    return [load_series(p) for p in sorted(root.glob("*/series"))] if root.is_dir() else []


def select_series(patchsets_dir: Path, upstream: str, version: str | None) -> Series:
    """The series whose range admits ``version``; an exact `==` range beats a wider one."""
    found = all_series(patchsets_dir, upstream)
    if version is None:
        raise BadInput(f"{upstream}: the lock records no version, so no series can be chosen; re-run `rocmport sync`")
    try:
        Version(version)
    except InvalidVersion:
        raise BadInput(f"{upstream}: version {version!r} in the lock is not a PEP 440 version") from None
    matching = [s for s in found if s.admits(version)]
    if not matching:
        have = ", ".join(f"{s.line} ({s.versions})" for s in found) or "none"
        raise BadInput(
            f"{upstream} {version}: no series in {patchsets_dir / upstream} admits this version (series: {have}); "
            f"start one with `rocmport refresh --to <ref>`, or run `rocmport apply --codemods-only` for the default recipe"
        )
    exact = [s for s in matching if any(sp.operator in ("==", "===") for sp in s.versions)]
    if len(exact or matching) > 1:
        names = ", ".join(str(s.path) for s in exact or matching)
        raise BadInput(f"{upstream} {version}: several series admit this version ({names}); make their ranges disjoint")
    return (exact or matching)[0]


def series_hash(series: Series) -> str:
    """Hash of the recipe and every patch's bytes: what the work tree was built from."""
    h = hashlib.sha256()
    h.update(series.path.read_bytes())
    for p in series.patches:
        h.update(p.name.encode() + b"\0" + p.path.read_bytes() + b"\0")
    return h.hexdigest()


def describe(series: Series) -> dict:
    """What `patches list --json` says of a series."""
    return {
        "upstream": series.upstream, "line": series.line, "versions": str(series.versions), "hash": series_hash(series),
        "codemods": [c["name"] for c in series.codemods], "excluded_paths": series.excluded_paths,
        "patches": [{"name": p.name, "description": p.description.splitlines()[0], "upstream_status": p.upstream_status}
                    for p in series.patches],
    }


def default_series(upstream: str, version: str) -> Series:
    """`--codemods-only`: no patches, the default codemod recipe for the upstream."""
    up = UPSTREAMS[upstream]
    return Series(
        path=Path(f"<default recipe for {upstream}>"),
        upstream=upstream,
        line="default",
        versions=SpecifierSet(f"=={version}"),
        codemods=[c if isinstance(c, dict) else {"name": c, "options": {}} for c in up.default_codemods],
        excluded_paths=list(up.excluded_paths),
    )


def recipe_digest(series: Series, codemod_versions: dict[str, str]) -> str:
    if series.path.is_file():
        return series_hash(series)
    return hashlib.sha256(json.dumps({"codemods": series.codemods, "excluded": series.excluded_paths, "v": codemod_versions}, sort_keys=True).encode()).hexdigest()
