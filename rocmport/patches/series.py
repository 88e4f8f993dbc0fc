"""Patch sets on disk: `patchsets/<upstream>/<line>/series` (YAML: the full recipe of one release
line) plus DEP-3-headed `.patch` files. Parsing, linting, version-range selection, hashing."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from rocmport.errors import BadInput
from rocmport.inputs import has_control, is_int, is_str_list, is_str_map, parse_yaml, read_text, type_name
from rocmport import components
from rocmport.patches import diff as diffs
from rocmport.components import Matrix
from rocmport.upstreams import NAMES, UPSTREAMS
from rocmport.patches.verify_settings import parse_settings as parse_verify_settings

_STATUS_RE = re.compile(r"^(Pending|ROCm-only|Submitted \S+|Backport [0-9a-fA-F]{7,40}|Inappropriate \S.*)$")
_FIELD_RE = re.compile(r"^([A-Za-z][A-Za-z0-9-]*):(?: (.*))?$")
_SERIES_KEYS = {
    "upstream",
    "line",
    "versions",
    "patches",
    "codemods",
    "excluded_paths",
    "manifests",
    "verify",
    "allow",
    "max_patch_bytes",
    "rocm",
}
DEFAULT_MAX_PATCH_BYTES = 2 << 20  # a hand-kept patch is kilobytes; `max_patch_bytes:` in the series raises it
MAX_SERIES_BYTES = 1 << 20
KNOWN_FIELDS = ("Description", "Upstream-Status", "Bug", "Forwarded", "Author", "Origin", "Last-Update")


@dataclass
class PatchFile:
    name: str
    path: Path
    header: dict[str, str]
    diff: str  # the diff text after the header
    files: list[diffs.FileChange] = field(default_factory=list)  # what the diff changes, checked

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
    # verify's settings for this line (rocmport.patches.verify_settings): unit_tests, known_failures,
    # rocm_known_failures, hip_known_failures, proxy_known_failures, rocm_arch_known_failures.
    verify: dict = field(default_factory=dict)
    # What the patches may do beyond text edits (`allow:`): binary, gitlinks, mode-changes, symlinks.
    allow: frozenset[str] = frozenset()
    max_patch_bytes: int = DEFAULT_MAX_PATCH_BYTES
    # The ROCm component matrix (`rocm:`, rocmport/components/__init__.py): None when the series has none.
    rocm: Matrix | None = None

    @property
    def dir(self) -> Path:
        return self.path.parent

    def admits(self, version: str) -> bool:
        return self.versions.contains(Version(version), prereleases=True)


def split_header(text: str) -> tuple[list[str], str]:
    """Header lines before the first `---`/`diff --git` line, and the rest."""
    header, body, _ = _split(text)
    return header, body


def _split(text: str) -> tuple[list[str], str, int]:
    """Header lines, the diff text, and the file line the diff starts on."""
    lines = text.splitlines(keepends=True)
    for i, line in enumerate(lines):
        if line.startswith("diff --git ") or line.rstrip("\n") == "---" or line.startswith("--- "):
            sep = line.rstrip("\n") == "---"
            body = lines[i + 1 :] if sep else lines[i:]
            return [ln.rstrip("\n") for ln in lines[:i]], "".join(body), i + 1 + sep
    return [ln.rstrip("\n") for ln in lines], "", len(lines) + 1


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


def load_patch(
    path: Path, *, allow: frozenset[str] = frozenset(), max_bytes: int = DEFAULT_MAX_PATCH_BYTES
) -> PatchFile:
    """A patch file, fully checked: UTF-8, its DEP-3 header, its diff (paths, modes, links; git can parse it)."""
    # patchsets/<upstream>/<line>/NAME: a link may share a patch between lines, inside patchsets/.
    root = path.parents[2] if len(path.parents) > 2 and path.parents[2].name == "patchsets" else path.parent
    if path.is_symlink() and not path.resolve().is_relative_to(root.resolve()):
        # Never read (or quote in an error) a file outside through a link: /etc/passwd's first line
        # would be "a malformed DEP-3 header" in the message.
        raise BadInput(
            f"{path}: is a link to a file outside {root}; rocmport reads patches only from there: copy the patch in"
        )
    if not path.is_file():
        raise BadInput(f"{path}: listed in the series but missing; add the file or drop it from `patches:`")
    text = read_text(
        path,
        "patch",
        max_bytes=max_bytes,
        fix="save it as UTF-8 (a binary change needs `allow: [binary]` and git's base85 form)",
    )
    return parse_patch(text, path, allow=allow)


def parse_patch(text: str, path: Path, *, allow: frozenset[str] = frozenset()) -> PatchFile:
    header_lines, diff, first_line = _split(text)
    header = parse_header(header_lines, path)
    problems = lint_header(header, path)
    if problems:
        raise BadInput(problems[0])
    if not diff.strip():
        raise BadInput(f"{path}: no diff after the header")
    files = diffs.parse(diff, path, first_line=first_line, allow=allow)
    return PatchFile(path.name, path, header, diff, files)


def _series_fail(path: Path, key: str, what: str) -> BadInput:
    return BadInput(f"{path}: key '{key}' {what}")


def _plain_name(name) -> bool:
    return (
        isinstance(name, str)
        and bool(name)
        and name not in (".", "..")
        and not any(c in name for c in "/\\")
        and not has_control(name)
    )


def _rel_dir(p) -> bool:
    return (
        isinstance(p, str)
        and bool(p.strip("/"))
        and not p.startswith("/")
        and ".." not in p.split("/")
        and not has_control(p)
    )


def _check_upstream(path: Path, upstream: str) -> None:
    if upstream not in NAMES:
        raise _series_fail(path, "upstream", f"is {upstream!r}; known upstreams: {', '.join(NAMES)}")
    # patchsets/<upstream>/<line>/series (or a refresh's staged <upstream>/series)
    for d in (path.parent.parent.name, path.parent.name):
        if d in NAMES:
            if d != upstream:
                raise _series_fail(
                    path,
                    "upstream",
                    f"is {upstream!r} but the series lives under {d}/; move it to patchsets/{upstream}/ or fix the key",
                )
            return


def _codemods(path: Path, raw) -> list[dict]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise _series_fail(
            path, "codemods", f"must be a list of codemod names or {{name, options}} (found {type_name(raw)})"
        )
    out, seen = [], set()
    for i, entry in enumerate(raw):
        if isinstance(entry, str):
            entry = {"name": entry}
        if (
            not isinstance(entry, dict)
            or set(map(str, entry)) - {"name", "options"}
            or not _plain_name(entry.get("name"))
            or not isinstance(entry.get("options") if entry.get("options") is not None else {}, dict)
            or not all(isinstance(k, str) for k in (entry.get("options") or {}))
        ):
            raise _series_fail(
                path, f"codemods[{i}]", "must be a codemod name or {name: NAME, options: {OPTION: VALUE}}"
            )
        if entry["name"] in seen:
            raise _series_fail(path, f"codemods[{i}]", f"lists {entry['name']!r} a second time")
        seen.add(entry["name"])
        out.append({"name": entry["name"], "options": entry.get("options") or {}})
    return out


def _manifests(path: Path, raw):
    ok = (
        raw is None
        or raw is False
        or (
            isinstance(raw, dict)
            and set(map(str, raw)) <= {"drop", "keep"}
            and (raw.get("drop") is None or is_str_map(raw["drop"]))
            and (raw.get("keep") is None or is_str_list(raw["keep"]))
        )
    )
    if not ok:
        raise _series_fail(
            path, "manifests", "must be false or a mapping with 'drop' ({name: reason}) and 'keep' ([names])"
        )
    return raw


def _verify(path: Path, raw) -> dict:
    parse_verify_settings(raw, str(path))  # the block's schema lives with verify (rocmport.patches.verify_settings)
    return {k: v for k, v in (raw or {}).items() if v is not None}


@dataclass(frozen=True)
class SeriesHead:
    """What selecting a series needs of a series file: its keys upstream, line and versions, checked."""

    path: Path
    upstream: str
    line: str
    versions: SpecifierSet
    data: dict

    def admits(self, version: str) -> bool:
        return self.versions.contains(Version(version), prereleases=True)

    def codemod_entries(self) -> list[dict]:
        """The codemods the series lists (`{name, options}` entries, checked as load_series checks them)."""
        return _codemods(self.path, self.data.get("codemods"))


def load_head(path: Path) -> SeriesHead:
    """A series file's YAML with its upstream, line and versions checked (its patches not read)."""
    data = parse_yaml(read_text(path, "series file", max_bytes=MAX_SERIES_BYTES), path)
    if not isinstance(data, dict):
        raise BadInput(f"{path}: expected a mapping with upstream, line, versions, patches, codemods, excluded_paths")
    unknown = sorted(str(k) for k in set(data) - _SERIES_KEYS)
    if unknown:
        raise BadInput(f"{path}: unknown key '{unknown[0]}'; known: {', '.join(sorted(_SERIES_KEYS))}")
    for key in ("upstream", "line", "versions"):
        if not isinstance(data.get(key), str) or not data[key] or has_control(data[key]):
            raise _series_fail(path, key, f"must be a non-empty one-line string (found {type_name(data.get(key))})")
    _check_upstream(path, data["upstream"])
    try:
        spec = SpecifierSet(data["versions"])
    except InvalidSpecifier:
        raise _series_fail(path, "versions", f"is not a PEP 440 specifier set: {data['versions']!r}") from None
    return SeriesHead(path, data["upstream"], data["line"], spec, data)


def load_series(path: Path | SeriesHead) -> Series:
    """A series file and every patch it lists, fully checked before anything uses them (exit 2 naming
    the file and key otherwise)."""
    head = path if isinstance(path, SeriesHead) else load_head(path)
    path, data, spec = head.path, head.data, head.versions
    patches = data.get("patches") or []
    if not isinstance(patches, list) or not all(_plain_name(p) for p in patches):
        raise _series_fail(path, "patches", "must be a list of file names in the series directory")
    dup = next((p for i, p in enumerate(patches) if p in patches[:i]), None)
    if dup:
        raise _series_fail(path, "patches", f"lists {dup} twice; a patch applies once")
    excluded = data.get("excluded_paths") or []
    if not isinstance(excluded, list) or not all(_rel_dir(p) for p in excluded):
        raise _series_fail(path, "excluded_paths", "must be a list of relative directories")
    allow = data.get("allow") or []
    if not isinstance(allow, list) or not all(isinstance(a, str) and a in diffs.ALLOWABLE for a in allow):
        raise _series_fail(path, "allow", f"must be a list of: {', '.join(diffs.ALLOWABLE)}")
    limit = data.get("max_patch_bytes", DEFAULT_MAX_PATCH_BYTES)
    if not is_int(limit) or limit < 1:
        raise _series_fail(path, "max_patch_bytes", f"must be a positive number of bytes (found {limit!r})")
    return Series(
        path=path,
        upstream=data["upstream"],
        line=data["line"],
        versions=spec,
        patches=[load_patch(path.parent / p, allow=frozenset(allow), max_bytes=limit) for p in patches],
        codemods=_codemods(path, data.get("codemods")),
        excluded_paths=[p.strip("/") for p in excluded],
        manifests=_manifests(path, data.get("manifests")),
        verify=_verify(path, data.get("verify")),
        allow=frozenset(allow),
        max_patch_bytes=limit,
        rocm=components.parse(data["rocm"], path) if data.get("rocm") is not None else None,
    )


def all_series(patchsets_dir: Path, upstream: str) -> list[Series]:
    root = patchsets_dir / upstream
    return [load_series(p) for p in sorted(root.glob("*/series"))] if root.is_dir() else []


def series_heads(patchsets_dir: Path, upstream: str) -> list[SeriesHead]:
    root = patchsets_dir / upstream
    return [load_head(p) for p in sorted(root.glob("*/series"))] if root.is_dir() else []


def select_series(patchsets_dir: Path, upstream: str, version: str | None) -> Series:
    """The series whose range admits ``version``; an exact `==` range beats a wider one. Only that
    series' patches are read (every series file's range is, to choose)."""
    found = series_heads(patchsets_dir, upstream)
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
    return load_series((exact or matching)[0])


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
        "upstream": series.upstream,
        "line": series.line,
        "versions": str(series.versions),
        "hash": series_hash(series),
        "codemods": [c["name"] for c in series.codemods],
        "excluded_paths": series.excluded_paths,
        "patches": [
            {"name": p.name, "description": p.description.splitlines()[0], "upstream_status": p.upstream_status}
            for p in series.patches
        ],
        "rocm": series.rocm.to_dict() if series.rocm is not None else None,
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
    return hashlib.sha256(
        json.dumps(
            {"codemods": series.codemods, "excluded": series.excluded_paths, "v": codemod_versions}, sort_keys=True
        ).encode()
    ).hexdigest()
