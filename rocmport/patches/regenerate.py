"""Patches after an upstream move: regenerate the ones that drifted, find the ones upstream merged.

A patch that applied with offsets keeps every byte of its hand-written hunks; only the hunk
positions and the `index` blob ids move. A patch that needed a 3-way merge (or a human) is
regenerated from its commit with the context width it had. Both are checked by effect: the new
text must reproduce the commit exactly, or it is not written."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from rocmport.gitutil import git, run_git
from rocmport.patches.commits import patch_matches_commit
from rocmport.patches.series import PatchFile

_HUNK_RE = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@(.*)$")
_DIFF_RE = re.compile(r"^diff --git a/(\S+) b/(\S+)$")
_INDEX_RE = re.compile(r"^index ([0-9a-f]+)\.\.([0-9a-f]+)(.*)$")


def _blob(tree: Path, commit: str, path: str, width: int) -> str:
    sha = run_git("rev-parse", "-q", "--verify", f"{commit}:{path}", cwd=tree, check=False).stdout.strip()
    return sha[:width] if sha else "0" * width


def _hunk_source(lines: list[str], start: int) -> list[str]:
    """Context and removed lines of the hunk whose header is at ``start``: what must match the base."""
    out = []
    for line in lines[start + 1 :]:
        if line.startswith("@@") or line.startswith("diff --git "):
            break
        if line.startswith((" ", "-")) and not line.startswith("--- "):
            out.append(line[1:])
        elif line == "":
            out.append("")
    return out


def _find_block(base_lines: list[str], block: list[str], near: int) -> int | None:
    """1-based start of ``block`` in ``base_lines``, the occurrence nearest ``near``."""
    if not block:
        return near
    n = len(block)
    hits = [i + 1 for i in range(len(base_lines) - n + 1) if base_lines[i : i + n] == block]
    return min(hits, key=lambda h: abs(h - near)) if hits else None


def shift_patch(diff: str, tree: Path, parent: str, commit: str) -> str | None:
    """``diff`` with hunk positions and blob ids moved to ``parent``; None if that is not possible."""
    lines = diff.split("\n")
    body = diff.rstrip("\n").split("\n")  # the final newline is not an empty context line
    out = []
    path = None
    base_lines: list[str] = []
    delta = 0
    for i, line in enumerate(lines):
        m = _DIFF_RE.match(line)
        if m:
            path, delta = m.group(1), 0
            text = run_git("show", f"{parent}:{path}", cwd=tree, check=False)
            base_lines = text.stdout.split("\n") if text.returncode == 0 else []
            out.append(line)
            continue
        m = _INDEX_RE.match(line)
        if m and path:
            width = len(m.group(1))
            out.append(f"index {_blob(tree, parent, path, width)}..{_blob(tree, commit, path, width)}{m.group(3)}")
            continue
        m = _HUNK_RE.match(line)
        if m and path:
            old_start, old_len, new_len = int(m.group(1)), m.group(2), m.group(4)
            block = _hunk_source(body, i)
            if old_start == 0:  # a new file: nothing to move
                out.append(line)
                continue
            found = _find_block(base_lines, block, old_start)
            if found is None:
                return None
            new_start = found + delta
            delta += (int(new_len) if new_len is not None else 1) - (int(old_len) if old_len is not None else 1)
            old_part = f"-{found}" + (f",{old_len}" if old_len is not None else "")
            new_part = f"+{new_start}" + (f",{new_len}" if new_len is not None else "")
            out.append(f"@@ {old_part} {new_part} @@{m.group(5)}")
            continue
        out.append(line)
    return "\n".join(out)


def context_width(diff: str) -> int:
    """The widest leading context of any hunk: what the author chose to keep."""
    widest, lines = 0, diff.split("\n")
    for i, line in enumerate(lines):
        if _HUNK_RE.match(line):
            lead = 0
            for body in lines[i + 1 :]:
                if not body.startswith(" "):
                    break
                lead += 1
            widest = max(widest, lead)
    return max(widest, 1)


def diff_between(tree: Path, parent: str, commit: str, context: int) -> str:
    return (
        git(
            "diff",
            "--full-index",
            "--no-color",
            "--no-ext-diff",
            "--no-renames",
            f"-U{context}",
            parent,
            commit,
            cwd=tree,
        )
        + "\n"
    )


@dataclass
class Regenerated:
    text: str  # the whole new patch file
    changed: bool  # differs from the file on disk
    how: Literal["kept", "shifted", "regenerated"]


def regenerate(patch: PatchFile, tree: Path, parent: str, commit: str, bucket: str) -> Regenerated:
    """The patch file that reproduces ``parent..commit`` with ``patch``'s header and style."""
    original = patch.path.read_text(encoding="utf-8")
    head = original[: len(original) - len(patch.diff)]
    if bucket == "clean":
        return Regenerated(original, False, "kept")
    if bucket == "offset":
        shifted = shift_patch(patch.diff, tree, parent, commit)
        if shifted is not None and _reproduces(tree, shifted, parent, commit):
            return Regenerated(head + shifted, head + shifted != original, "shifted")
    diff = diff_between(tree, parent, commit, context_width(patch.diff))
    return Regenerated(head + diff, head + diff != original, "regenerated")


def _reproduces(tree: Path, diff: str, parent: str, commit: str) -> bool:
    return patch_matches_commit(tree, diff, commit, parent)


def patch_id(diff: str, cwd: Path) -> str | None:
    out = run_git("patch-id", "--stable", cwd=cwd, input=diff, check=False).stdout.split()
    return out[0] if out else None


def upstream_patch_ids(repo: Path, old: str, new: str) -> dict[str, str]:
    """patch-id -> upstream commit for every non-merge commit reachable from ``new`` but not ``old``
    (release tags sit on release branches, so ``old`` is often not an ancestor of ``new``)."""
    log = run_git(
        "log", "-p", "--no-merges", "--full-index", "--no-renames", "--format=commit %H", f"{old}..{new}", cwd=repo
    ).stdout
    found: dict[str, str] = {}
    for line in run_git("patch-id", "--stable", cwd=repo, input=log).stdout.splitlines():
        pid, sha = line.split()
        found.setdefault(pid, sha)
    return found


def reverse_applies(repo: Path, diff: str, commit: str) -> bool:
    """Does ``diff`` reverse-apply on ``commit`` (checked in a private index, no checkout)?"""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="rocmport-rev-") as tmp:
        env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
        git("read-tree", commit, cwd=repo, env=env)
        return (
            run_git(
                "apply", "--cached", "--check", "--reverse", "-", cwd=repo, env=env, input=diff, check=False
            ).returncode
            == 0
        )
