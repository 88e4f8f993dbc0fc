"""The apply ladder for one patch in a work tree, never fuzz:
exact (offsets allowed and recorded) -> 3-way merge -> stop; before stopping, a patch that
reverse-applies is `already-upstream`. Every patch ends in exactly one bucket."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from rocmport.errors import BadInput
from rocmport.gitutil import run_git
from rocmport.patches.series import PatchFile

BUCKETS = ("clean", "offset", "merged-3way", "already-upstream", "not-applicable", "conflict")
_OFFSET_RE = re.compile(r"Hunk #(\d+) succeeded at (\d+) \(offset (-?\d+) lines?\)")
_FAILED_RE = re.compile(r"error: patch failed: (.+):(\d+)")


@dataclass
class PatchOutcome:
    name: str
    bucket: str
    files: list[str]
    offsets: list[dict] = field(default_factory=list)
    failed_hunks: list[dict] = field(default_factory=list)
    detail: str = ""

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "bucket": self.bucket,
            "files": self.files,
            "offsets": self.offsets,
            "failed_hunks": self.failed_hunks,
            "detail": self.detail,
        }


def touched_paths(patch: PatchFile) -> list[tuple[str, str | None, bool]]:
    """(path, source_path, is_new) for each file of the patch (checked when it was loaded)."""
    return [(f.path, f.source, f.is_new) for f in patch.files]


def check_symlinks(patch: PatchFile, tree: Path) -> None:
    """Refuse a patch that writes through a symlink in the tree (it could land outside it)."""
    for f in patch.files:
        for path in {f.path, *([f.source] if f.source else [])}:
            cur = tree
            for part in PurePosixPath(path).parts:
                cur = cur / part
                if cur.is_symlink() and cur != tree / path:
                    raise BadInput(
                        f"{patch.path}: path {path!r} goes through the symlink {cur.relative_to(tree)}; refusing the patch"
                    )


def check_links_after(patch: PatchFile, tree: Path) -> None:
    """After ``patch`` applied: every symlink it left must resolve inside the tree and out of .git/,
    followed through any links already there. Otherwise the tree is reset to HEAD and the patch refused."""
    root = os.path.realpath(tree)
    for f in patch.files:
        if f.link_target is None:
            continue
        real = os.path.realpath(tree / f.path)
        inside = real.startswith(root + os.sep) and not (real + os.sep).startswith(os.path.join(root, ".git") + os.sep)
        if not inside:
            run_git("reset", "-q", "--hard", "HEAD", cwd=tree)
            raise BadInput(
                f"{patch.path}: {f.path!r} becomes a symlink that resolves outside the tree ({real}); "
                f"refusing the patch (the work tree is back at the last good commit)"
            )


def _in_tree(tree: Path, path: str) -> bool:
    return run_git("cat-file", "-e", f"HEAD:{path}", cwd=tree, check=False).returncode == 0


def apply_patch(patch: PatchFile, tree: Path) -> PatchOutcome:
    """Apply ``patch`` to the index and work tree of ``tree`` (HEAD clean) and classify it."""
    files = touched_paths(patch)
    names = [f[0] for f in files]
    check_symlinks(patch, tree)
    if not files:
        raise BadInput(f"{patch.path}: contains no file diff")
    existing = [src for _, src, new in files if src is not None and not new and _in_tree(tree, src)]
    if not any(new for _, _, new in files) and not existing:
        return PatchOutcome(
            patch.name, "not-applicable", names, detail="none of the files it changes exist in this source"
        )
    data = patch.diff
    proc = run_git("apply", "--index", "--verbose", "--whitespace=nowarn", "-", cwd=tree, input=data, check=False)
    if proc.returncode == 0:
        check_links_after(patch, tree)
        offsets = [
            {"hunk": int(h), "line": int(at), "offset": int(off)} for h, at, off in _OFFSET_RE.findall(proc.stderr)
        ]
        return PatchOutcome(patch.name, "offset" if offsets else "clean", names, offsets)
    if "corrupt patch" in proc.stderr:  # the loader's own parse lets nothing like this through; git's word is final
        raise BadInput(
            f"{patch.path}: corrupt patch ({proc.stderr.strip().splitlines()[-1]}); regenerate it with `rocmport patches export`"
        )
    failed = [{"file": f, "line": int(n)} for f, n in _FAILED_RE.findall(proc.stderr)]
    if run_git("apply", "--check", "--reverse", "-", cwd=tree, input=data, check=False).returncode == 0:
        return PatchOutcome(
            patch.name, "already-upstream", names, detail="the patch reverse-applies: upstream already has it"
        )
    three = run_git("apply", "--3way", "--index", "--whitespace=nowarn", "-", cwd=tree, input=data, check=False)
    if three.returncode == 0 and not _has_conflicts(tree):
        check_links_after(patch, tree)
        return PatchOutcome(
            patch.name, "merged-3way", names, detail="applied by 3-way merge against its recorded base blobs"
        )
    run_git("reset", "-q", "--hard", "HEAD", cwd=tree)  # leave nothing half-applied
    where = ", ".join(f"{h['file']}:{h['line']}" for h in failed)
    detail = f"exact apply failed at {where}; 3-way merge left conflicts" if where else "does not apply"
    return PatchOutcome(patch.name, "conflict", names, failed_hunks=failed, detail=detail)


def _has_conflicts(tree: Path) -> bool:
    return bool(run_git("diff", "--name-only", "-z", "--diff-filter=U", cwd=tree).stdout.strip("\0"))
