"""Choose the Megatron-Bridge release that goes with a pinned Megatron-LM commit.

Rules, in order, over Bridge's final release tags (newest first):
  1 gitlink-exact   its `3rdparty/Megatron-LM` gitlink is exactly the pinned commit
  2 gitlink-minor   its gitlinked Megatron-LM commit has the same major.minor (package_info.py)
  3 declared-range  among the releases whose declared `megatron-core` requirement has an upper bound
                    and admits the version, the one made for it: the tightest range (lowest upper
                    bound, then highest lower bound; the newest release among equals). Bridge 0.2.x
                    declares <0.16 and is core 0.15.x's companion, although 0.3.x (<0.17) admits
                    0.15.x too. From v0.4.0 on Bridge declares an unbounded range, which must not
                    match everything.
  4 none            no companion: a warning, not an error
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from rocmport._compat import tomllib
from rocmport.gitutil import run_git
from rocmport.release_line import ReleaseLine
from rocmport.upstream.refs import read_file, release_tags, version_at
from rocmport.upstreams import MEGATRON_LM

GITLINK_PATH = "3rdparty/Megatron-LM"


@dataclass(frozen=True)
class Companion:
    tag: str
    commit: str
    rule: str
    explanation: str


def gitlink(bridge_mirror: Path, commit: str) -> str | None:
    proc = run_git("ls-tree", commit, GITLINK_PATH, cwd=bridge_mirror, check=False)
    parts = proc.stdout.split()
    return parts[2] if proc.returncode == 0 and len(parts) >= 3 and parts[0] == "160000" else None


def declared_core_spec(bridge_mirror: Path, commit: str):
    """The SpecifierSet of the `megatron-core` dependency in Bridge's pyproject.toml, or None."""
    text = read_file(bridge_mirror, commit, "pyproject.toml")
    if not text:
        return None
    try:
        deps = tomllib.loads(text).get("project", {}).get("dependencies", [])
    except tomllib.TOMLDecodeError:
        return None
    for dep in deps:
        try:
            req = Requirement(dep)
        except InvalidRequirement:
            continue
        if req.name == MEGATRON_LM.distribution:
            return req.specifier
    return None


def has_upper_bound(spec) -> bool:
    return any(s.operator in ("<", "<=", "==", "~=", "===") for s in spec)


def _release(text: str) -> Version | None:
    try:
        return Version(text)
    except InvalidVersion:
        return None


def range_bounds(spec: SpecifierSet) -> tuple[tuple[Version, int] | None, Version | None]:
    """(upper bound, lower bound) of a specifier set. The upper bound is (version, 0) when
    exclusive, (version, 1) when inclusive, so `<0.16` sorts before `<=0.16`; None: unbounded."""
    uppers: list[tuple[Version, int]] = []
    lowers: list[Version] = []
    for s in spec:
        op, text = s.operator, s.version
        if op == "==" and text.endswith(".*"):  # ==0.15.*: [0.15, 0.16)
            parts = [int(x) for x in text[:-2].split(".") if x.isdigit()]
            if parts:
                lowers.append(Version(".".join(map(str, parts))))
                uppers.append((Version(".".join(map(str, parts[:-1] + [parts[-1] + 1]))), 0))
            continue
        v = _release(text)
        if v is None:
            continue
        if op == "<":
            uppers.append((v, 0))
        elif op in ("<=", "==", "==="):
            uppers.append((v, 1))
        if op in (">", ">=", "==", "==="):
            lowers.append(v)
        if op == "~=":  # ~=0.15.2: [0.15.2, 0.16); ~=1.4: [1.4, 2)
            lowers.append(v)
            head = list(v.release[:-1]) or [v.release[0]]
            uppers.append((Version(".".join(map(str, head[:-1] + [head[-1] + 1]))), 0))
    return (min(uppers) if uppers else None), (max(lowers) if lowers else None)


def tightest_range(candidates: list[tuple[str, SpecifierSet | None]], version: str) -> tuple[str, str] | None:
    """Rule 3 over ``candidates`` (release name, declared spec), newest first: the release whose
    bounded range admits ``version`` most tightly, and an explanation that lists every admitting
    release with its range. None when no bounded range admits it."""
    admitting = [
        (name, spec)
        for name, spec in candidates
        if spec is not None and has_upper_bound(spec) and spec.contains(version, prereleases=True)
    ]
    if not admitting:
        return None
    bounds = {name: range_bounds(spec) for name, spec in admitting}
    # Lowest upper bound; among those the highest lower bound; ties go to the newest (max() and
    # min() keep the first of equals, and the candidates come newest first).
    unbounded = (Version("999999"), 1)  # an upper bound range_bounds cannot read (`===x`) ranks last
    low = min(bounds[name][0] or unbounded for name, _ in admitting)
    tight = [(name, spec) for name, spec in admitting if (bounds[name][0] or unbounded) == low]
    best = max(tight, key=lambda item: bounds[item[0]][1] or Version("0"))
    groups: dict[str, list[str]] = {}
    for name, spec in admitting:
        groups.setdefault(str(spec), []).append(name)
    listed = "; ".join(
        f"{', '.join(names)} declare{'s' if len(names) == 1 else ''} {spec}" for spec, names in groups.items()
    )
    why = (
        f"{best[0]}: the tightest declared {MEGATRON_LM.distribution} range admitting {version} ({best[1]}), the line made for it; "
        f"candidates (newest first): {listed}"
    )
    return best[0], why


def choose_bridge(bridge_mirror: Path, mlm_mirror: Path, mlm_commit: str, mlm_version: str | None) -> Companion | None:
    finals = [t for t in release_tags(bridge_mirror) if t.is_final][::-1]
    links = {t.name: gitlink(bridge_mirror, t.commit) for t in finals}
    for t in finals:
        if links[t.name] == mlm_commit:
            return Companion(
                t.name, t.commit, "gitlink-exact", f"{t.name}: its {GITLINK_PATH} gitlink is exactly {mlm_commit[:12]}"
            )
    if mlm_version is None:
        return None
    want = ReleaseLine.of(mlm_version)
    for t in finals:
        link = links[t.name]
        if not link:
            continue
        linked = version_at(mlm_mirror, link, MEGATRON_LM.name)
        if linked and want.admits(Version(linked)):
            return Companion(
                t.name,
                t.commit,
                "gitlink-minor",
                f"{t.name}: newest release whose gitlinked Megatron-LM ({link[:12]}, {linked}) is also {want.major}.{want.minor}",
            )
    chosen = tightest_range([(t.name, declared_core_spec(bridge_mirror, t.commit)) for t in finals], mlm_version)
    if chosen is None:
        return None
    tag = next(t for t in finals if t.name == chosen[0])
    return Companion(tag.name, tag.commit, "declared-range", chosen[1])
