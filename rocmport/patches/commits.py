"""Patches and the commits they make, compared by effect: the diff of a commit, whether a patch
reproduces a commit exactly, which patch of a series explains a commit, and a patch file's text.

Byte-stable: the same commit always gives the same text (no dates, no commit ids, no version footers)."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

from rocmport.gitutil import git, run_git
from rocmport.patches.series import Series


def commit_diff(tree: Path, commit: str) -> str:
    return (
        git(
            "diff", "--full-index", "--no-color", "--no-ext-diff", "--no-renames", "-U3", f"{commit}^", commit, cwd=tree
        )
        + "\n"
    )


def patch_matches_commit(tree: Path, diff: str, commit: str, parent: str | None = None) -> bool:
    """Does applying ``diff`` to the commit's parent (or ``parent``) give exactly the commit's tree?

    Compares effects, not text: a hand-written patch with less context still matches."""
    with tempfile.TemporaryDirectory(prefix="rocmport-idx-") as tmp:
        env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
        git("read-tree", parent or f"{commit}^", cwd=tree, env=env)
        if run_git("apply", "--cached", "-", cwd=tree, env=env, input=diff, check=False).returncode != 0:
            return False
        return git("write-tree", cwd=tree, env=env) == git("rev-parse", f"{commit}^{{tree}}", cwd=tree)


def explaining_patch(tree: Path, series: Series, commit: str) -> str | None:
    """The name of the series patch whose effect is exactly ``commit``, if any."""
    return next((p.name for p in series.patches if patch_matches_commit(tree, p.diff, commit)), None)


def render_patch(description: str, status: str, diff: str, extra: dict[str, str] | None = None) -> str:
    subject, _, body = description.strip().partition("\n")
    lines = [f"Description: {subject.strip()}"]
    for line in body.strip("\n").splitlines():
        lines.append(" " + line.rstrip() if line.strip() else " .")
    lines.append(f"Upstream-Status: {status}")
    lines += [f"{k}: {v}" for k, v in (extra or {}).items()]
    return "\n".join(lines) + "\n---\n" + diff


def slug(text: str) -> str:
    s = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return s[:50].rstrip("-") or "patch"
