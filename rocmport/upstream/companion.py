"""Choose the Megatron-Bridge release that goes with a pinned Megatron-LM commit.

Rules, in order, over Bridge's final release tags (newest first):
  1 gitlink-exact   its `3rdparty/Megatron-LM` gitlink is exactly the pinned commit
  2 gitlink-minor   its gitlinked Megatron-LM commit has the same major.minor (package_info.py)
  3 declared-range  its declared `megatron-core` requirement has an upper bound and admits the version
                    (from v0.4.0 on Bridge declares an unbounded range, which must not match everything)
  4 none            no companion: a warning, not an error
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import Version

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


def choose_bridge(bridge_mirror: Path, mlm_mirror: Path, mlm_commit: str, mlm_version: str | None) -> Companion | None:
    finals = [t for t in release_tags(bridge_mirror) if t.is_final][::-1]
    links = {t.name: gitlink(bridge_mirror, t.commit) for t in finals}
    for t in finals:
        if links[t.name] == mlm_commit:
            return Companion(t.name, t.commit, "gitlink-exact", f"{t.name}: its {GITLINK_PATH} gitlink is exactly {mlm_commit[:12]}")
    if mlm_version is None:
        return None
    want = ReleaseLine.of(mlm_version)
    for t in finals:
        link = links[t.name]
        if not link:
            continue
        linked = version_at(mlm_mirror, link, "megatron-lm")
        if linked and want.admits(Version(linked)):
            return Companion(
                t.name, t.commit, "gitlink-minor",
                f"{t.name}: newest release whose gitlinked Megatron-LM ({link[:12]}, {linked}) is also {want.major}.{want.minor}",
            )
    for t in finals:
        spec = declared_core_spec(bridge_mirror, t.commit)
        if spec is not None and has_upper_bound(spec) and spec.contains(mlm_version, prereleases=True):
            return Companion(
                t.name, t.commit, "declared-range",
                f"{t.name}: newest release whose declared {MEGATRON_LM.distribution}{spec} admits {mlm_version}",
            )
    return None
