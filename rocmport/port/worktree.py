"""Ported work trees: self-contained clones of the cache mirror (objects borrowed through
alternates, no refs written into the cache), sparse for excluded paths, with a state file
under .git so an interrupted or stopped apply can be recovered, continued or aborted."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from rocmport.errors import BadInput
from rocmport.fsutil import file_lock
from rocmport.gitutil import FIXED_IDENTITY, git, rev_parse, run_git
from rocmport.state import expect, one_of, read_json, value_of, write_json

STATE = "rocmport-state.json"


def state_path(tree: Path) -> Path:
    return tree / ".git" / STATE


# new: cloned, nothing applied; in-progress: an apply is (or was, when killed) running; conflict: stopped
# at a patch for a human (--continue / --abort); done: the port is built.
ApplyStatus = Literal["new", "in-progress", "conflict", "done"]
_FIX = "delete it; `rocmport apply --force` then rebuilds the tree (keeping your commits on refs/rocmport/backup/<n>)"


def _parse_state(data: Any) -> dict[str, Any]:
    expect(data, dict, "the apply state")
    one_of(value_of(data, "status", str), ApplyStatus, "key 'status'")
    expect(data.get("patches", []), list, "key 'patches'")
    return data


def read_state(tree: Path) -> dict[str, Any] | None:
    """The state of the last apply in ``tree``, None when there is none (BadInput when unreadable)."""
    return read_json(state_path(tree), _parse_state, _FIX)


def write_state(tree: Path, state: dict[str, Any]) -> None:
    write_json(state_path(tree), state)


def clear_state(tree: Path) -> None:
    state_path(tree).unlink(missing_ok=True)


def cone_dirs(mirror_or_tree: Path, commit: str, excluded: list[str]) -> list[str] | None:
    """Directories for a cone-mode sparse checkout holding everything but ``excluded``.

    Cone mode can only include directories, so each excluded path is replaced by its siblings
    at every level above it. None when nothing is excluded (full checkout)."""
    if not excluded:
        return None
    skip = {PurePosixPath(e) for e in excluded}
    result: set[str] = set()
    frontier = [""]
    while frontier:
        parent = frontier.pop()
        prefix = f"{parent}/" if parent else ""
        listing = git("ls-tree", "-d", "--name-only", f"{commit}:{parent}" if parent else commit, cwd=mirror_or_tree)
        for name in listing.splitlines():
            child = PurePosixPath(prefix + name)
            if child in skip:
                continue
            if any(child in e.parents for e in skip):
                frontier.append(str(child))
            else:
                result.add(str(child))
    return sorted(result)


def ensure_clone(mirror: Path, tree: Path) -> bool:
    """Clone the work tree from the cache mirror unless it exists; True when it was created."""
    if (tree / ".git").exists():
        return False
    if tree.exists() and any(tree.iterdir()):
        raise BadInput(f"{tree}: exists and is not a rocmport work tree; move it away or set [tool.rocmport] worktree-dir")
    tree.parent.mkdir(parents=True, exist_ok=True)
    # Clone beside the target and rename: a kill mid-clone never leaves a half work tree.
    staging = tree.parent / f".{tree.name}.cloning"
    shutil.rmtree(staging, ignore_errors=True)
    # --shared: borrow the cache's objects (alternates); refs live only in the work tree.
    git("clone", "-q", "--shared", "--no-checkout", "--no-tags", str(mirror), str(staging))
    git("config", "user.name", FIXED_IDENTITY["GIT_AUTHOR_NAME"], cwd=staging)
    git("config", "user.email", FIXED_IDENTITY["GIT_AUTHOR_EMAIL"], cwd=staging)
    if tree.exists():
        tree.rmdir()
    staging.rename(tree)
    return True


def set_sparse(tree: Path, commit: str, excluded: list[str]) -> None:
    dirs = cone_dirs(tree, commit, excluded)
    if dirs is None:
        if run_git("config", "core.sparseCheckout", cwd=tree, check=False).stdout.strip() == "true":
            git("sparse-checkout", "disable", cwd=tree)
        return
    # Cone mode with a sparse index: the only mode in which git can commit over blobs the mirror lacks.
    git("sparse-checkout", "set", "--cone", "--sparse-index", *dirs, cwd=tree)


@contextmanager
def locked(tree: Path, timeout: float = 5) -> Iterator[None]:
    """One apply per work tree at a time."""
    with file_lock(tree.parent / f".{tree.name}.lock", f"another rocmport apply is running on this work tree ({tree}); "
                                                       f"wait for it to finish", timeout=timeout):
        yield


def dirty_paths(tree: Path) -> list[str]:
    out = run_git("status", "--porcelain", "--untracked-files=normal", cwd=tree).stdout
    return [line[3:] for line in out.splitlines() if line.strip()]


def head(tree: Path) -> str | None:
    return rev_parse("HEAD", tree)


def commits_between(tree: Path, old: str, new: str) -> list[str]:
    return git("rev-list", "--reverse", f"{old}..{new}", cwd=tree).split()


def save_backup(tree: Path, what: str) -> str:
    """Keep HEAD and any uncommitted edits on refs/rocmport/backup/<n> before --force resets."""
    untracked = run_git("ls-files", "--others", "--exclude-standard", cwd=tree).stdout.split()
    if untracked:
        git("add", "--", *untracked, cwd=tree)  # so the stash commit holds them too
    stash = git("stash", "create", f"rocmport backup ({what})", cwd=tree) if dirty_paths(tree) else ""
    target = stash or head(tree)
    existing = git("for-each-ref", "--format=%(refname)", "refs/rocmport/backup/", cwd=tree).split()
    ref = f"refs/rocmport/backup/{len(existing) + 1}"
    git("update-ref", ref, target, cwd=tree)
    return ref


def commit_all(tree: Path, message: str) -> str:
    git("commit", "-q", "--no-verify", "--allow-empty-message", "-m", message, cwd=tree, env=FIXED_IDENTITY)
    return git("rev-parse", "HEAD", cwd=tree)
