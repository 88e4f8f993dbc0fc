"""Ref resolution in a mirror: loose release lines, exact tags, branches and SHAs.

`v0.16` means the newest final `core_v0.16.*` release (rc only with --pre). Every resolution
carries a sentence saying what was chosen and why, which `sync` prints.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from pathlib import Path

from packaging.version import InvalidVersion, Version

from rocmport.errors import BadInput
from rocmport.gitutil import git, run_git
from rocmport.release_line import ReleaseLine
from rocmport.upstreams import MEGATRON_LM, UPSTREAMS

_TAG_RE = re.compile(r"^(?P<prefix>core_)?v(?P<version>\d+\.\d+\.\d+(?:(?:rc|a|b)\d+|\.dev\d+|\.post\d+)?)$")
_SHA_RE = re.compile(r"^[0-9a-fA-F]{4,40}$")


@dataclass(frozen=True)
class ReleaseTag:
    name: str
    commit: str
    version: Version

    @property
    def is_final(self) -> bool:
        return not (self.version.is_prerelease or self.version.is_devrelease)

    @property
    def core_prefixed(self) -> bool:
        return self.name.startswith("core_")


@dataclass(frozen=True)
class Resolution:
    requested: str
    resolved_ref: str
    commit: str
    kind: str  # release-line | tag | branch | sha
    explanation: str


def tags(mirror: Path) -> dict[str, str]:
    """Tag name -> commit id (annotated tags peeled)."""
    out = git("for-each-ref", "--format=%(refname:strip=2) %(objectname) %(*objectname)", "refs/tags", cwd=mirror)
    result = {}
    for line in out.splitlines():
        name, obj, peeled = (line.split(" ") + [""])[:3]
        result[name] = peeled or obj
    return result


def release_tags(mirror: Path, tag_map: dict[str, str] | None = None) -> list[ReleaseTag]:
    """Tags that name a release (`v0.3.1`, `core_v0.16.1`, `core_v0.17.0rc0`), oldest version first."""
    found = []
    for name, commit in (tag_map if tag_map is not None else tags(mirror)).items():
        m = _TAG_RE.match(name)
        if not m:
            continue
        try:
            found.append(ReleaseTag(name, commit, Version(m.group("version"))))
        except InvalidVersion:
            continue
    # Same version: the core_ tag sorts after the bare one, so "newest" picks upstream's release tag.
    return sorted(found, key=lambda t: (t.version, t.core_prefixed, t.name))


def branches(mirror: Path) -> dict[str, str]:
    out = git("for-each-ref", "--format=%(refname:strip=2) %(objectname)", "refs/heads", cwd=mirror)
    return dict(line.split(" ", 1) for line in out.splitlines() if line)


def resolve(mirror: Path, requested: str, pre: bool = False, upstream: str = MEGATRON_LM.name) -> Resolution:
    tag_map = tags(mirror)
    rels = release_tags(mirror, tag_map)
    line = ReleaseLine.match(requested)
    if line and requested not in tag_map:
        major, minor = line.major, line.minor
        cands = [t for t in rels if line.admits(t.version) and (pre or t.is_final)]
        if not cands:
            others = [t.name for t in rels if line.admits(t.version)]
            hint = f" (only pre-releases: {', '.join(others)}; add --pre)" if others else ""
            raise BadInput(f"{upstream}: no final release tag for {requested}{hint}; {_closest(requested, rels)}")
        best = cands[-1]
        twins = [t.name for t in cands if t.version == best.version and t.name != best.name]
        why = (
            f"{requested} -> {best.name} ({best.commit[:12]}): newest {'' if pre else 'final '}release of {major}.{minor} "
            f"among {', '.join(t.name for t in cands)}"
        )
        if twins:
            why += f"; {', '.join(twins)} names the same version, {best.name} chosen as upstream's core_v release tag"
        return Resolution(requested, best.name, best.commit, "release-line", why)
    if requested in tag_map:
        commit = tag_map[requested]
        why = f"{requested} -> exact tag ({commit[:12]})"
        m = _TAG_RE.match(requested)
        if m:
            same_version = [
                t for t in rels if str(t.version) == str(Version(m.group("version"))) and t.name != requested
            ]
            for other in same_version:
                same = "same commit" if other.commit == commit else f"a different commit {other.commit[:12]}"
                why += f"; {other.name} also exists ({same}), the tag was taken as given"
        return Resolution(requested, requested, commit, "tag", why)
    m = _TAG_RE.match(requested) or re.match(r"^v?(?P<version>\d+\.\d+\.\d+\S*)$", requested)
    if m:
        wanted = m.group("version")
        for tag in reversed(rels):
            if str(tag.version) == wanted or tag.name.endswith("v" + wanted):
                return Resolution(
                    requested,
                    tag.name,
                    tag.commit,
                    "tag",
                    f"{requested} -> {tag.name} ({tag.commit[:12]}): no tag named {requested}, {tag.name} is that release",
                )
    heads = branches(mirror)
    if requested in heads:
        commit = heads[requested]
        return Resolution(requested, requested, commit, "branch", f"{requested} -> branch head {commit[:12]}")
    if _SHA_RE.match(requested):
        proc = run_git("rev-parse", "--verify", "--quiet", f"{requested}^{{commit}}", cwd=mirror, check=False)
        if proc.returncode == 0:
            commit = proc.stdout.strip()
            return Resolution(requested, commit, commit, "sha", f"{requested} -> commit {commit}")
    raise BadInput(f"{upstream}: unknown ref '{requested}'; {_closest(requested, rels)}")


def _closest(requested: str, rels: list[ReleaseTag]) -> str:
    """What to suggest for a ref that names nothing: for a release line, the nearest existing lines
    by number; for a version, the release tags nearest it; for anything else, the tags spelled most alike."""
    line = ReleaseLine.match(requested)
    m = None if line else (_TAG_RE.match(requested) or re.match(r"^v?(?P<version>\d+\.\d+\.\d+\S*)$", requested))
    if line is not None and rels:
        newest: dict[ReleaseLine, ReleaseTag] = {}
        for t in rels:  # oldest first: the last final one seen per line is its newest
            if t.is_final or ReleaseLine.of(t.version) not in newest:
                newest[ReleaseLine.of(t.version)] = t
        near = sorted(newest, key=lambda ln: (abs((ln.major - line.major) * 1000 + ln.minor - line.minor), ln))[:3]
        return "nearest release lines: " + ", ".join(f"{ln} (newest {newest[ln].name})" for ln in sorted(near))
    if m is not None and rels:
        try:
            wanted = Version(m.group("version"))
        except InvalidVersion:
            wanted = None
        if wanted is not None:
            below = [t.name for t in rels if t.version < wanted][-3:][::-1]
            above = [t.name for t in rels if t.version > wanted][:2]
            return f"nearest release tags: {', '.join(below + above)}"
    names = [t.name for t in rels]
    close = difflib.get_close_matches(requested, names, n=5, cutoff=0.5)
    if not close:
        close = [t.name for t in rels if t.is_final][-5:][::-1]
    return f"closest tags: {', '.join(close)}" if close else "the mirror has no release tags"


def commit_date(mirror: Path, commit: str) -> str:
    return git("show", "-s", "--format=%cI", commit, cwd=mirror)


def read_file(mirror: Path, commit: str, path: str) -> str | None:
    proc = run_git("show", f"{commit}:{path}", cwd=mirror, check=False)
    return proc.stdout if proc.returncode == 0 else None


def version_at(mirror: Path, commit: str, upstream: str) -> str | None:
    """The package version the tree declares at ``commit`` (package_info.py), e.g. '0.16.1'."""
    text = read_file(mirror, commit, UPSTREAMS[upstream].package_info)
    return parse_package_info(text) if text else None


def parse_package_info(text: str) -> str | None:
    fields = {}
    for key in ("MAJOR", "MINOR", "PATCH", "PRE_RELEASE"):
        m = re.search(rf"^{key}\s*=\s*(?:['\"](?P<s>[^'\"]*)['\"]|(?P<n>\d+))", text, re.M)
        if m:
            fields[key] = m.group("s") if m.group("s") is not None else m.group("n")
    if not all(k in fields for k in ("MAJOR", "MINOR", "PATCH")):
        return None
    return f"{fields['MAJOR']}.{fields['MINOR']}.{fields['PATCH']}{fields.get('PRE_RELEASE', '')}"
