"""What a project's port holds: the lock, whether the cache has the pinned commits, and each
ported work tree (branch, base, head, clean, series, apply status)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion

from rocmport.codemods.declared import check_series
from rocmport.config import Settings
from rocmport.gitutil import git, is_git_dir, run_git
from rocmport.patches.series import SeriesHead, load_series, series_heads
from rocmport.port.worktree import read_state
from rocmport.upstream.lock import Lock, load_lock_or_none
from rocmport.upstream.store import Store
from rocmport.upstreams import NAMES


@dataclass
class WorktreeInfo:
    """A ported work tree: where, its branch, base and head, whether clean, and its apply state."""

    path: str
    branch: str | None
    base: str | None
    head: str
    clean: bool
    series: str | None = None
    series_hash: str | None = None
    apply_status: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class ProjectStatus:
    """`rocmport status`: the lock, whether the cache has each pinned commit, the work trees."""

    lock: Lock | None
    lock_path: str
    cache_dir: str
    cached: dict[str, bool] = field(default_factory=dict)
    worktrees: dict[str, WorktreeInfo] = field(default_factory=dict)
    # upstream -> why its work tree is not what the lock pins (a bot run or a checkout of another
    # branch moved one of them): verify would test a tree the lock does not describe
    mismatches: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "lock": self.lock.to_dict() if self.lock else None,
            "lock_path": self.lock_path,
            "cache_dir": self.cache_dir,
            "cached": self.cached,
            "worktrees": {name: w.to_dict() for name, w in self.worktrees.items()},
            "mismatches": self.mismatches,
        }


def worktree_info(path: Path) -> WorktreeInfo | None:
    """Where a ported tree is and what it holds, or None when there is none."""
    if not (path / ".git").exists() or not is_git_dir(path):
        return None
    branch = run_git("symbolic-ref", "--short", "-q", "HEAD", cwd=path, check=False).stdout.strip() or None
    base_tags = (
        git("tag", "--list", "rocmport/base/*", "--points-at", "HEAD", cwd=path).split()
        or git("tag", "--list", "rocmport/base/*", "--merged", "HEAD", cwd=path).split()
    )
    state = read_state(path)
    # the commit apply built this tree on (its state says; else the base tag it carries)
    base = (state.base if state and state.base else None) or (
        git("rev-parse", f"{base_tags[0]}^{{commit}}", cwd=path) if base_tags else None
    )
    clean = run_git("status", "--porcelain", "-z", "--untracked-files=no", cwd=path).stdout.strip("\0") == ""
    return WorktreeInfo(
        path=str(path),
        branch=branch,
        base=base,
        head=git("rev-parse", "HEAD", cwd=path),
        clean=clean,
        series=state.series if state else None,
        series_hash=state.series_hash if state else None,
        apply_status=state.status if state else None,
    )


def _admits(series: SeriesHead, version: str | None) -> bool:
    try:
        return version is not None and series.admits(version)
    except InvalidVersion:  # apply says what is wrong with such a lock
        return False


def status(settings: Settings) -> ProjectStatus:
    lock = load_lock_or_none(settings.lock_path)
    store = Store(settings.cache_dir)
    cache = {}
    if lock:
        for name, pin in lock.upstreams.items():
            cache[name] = store.has_commit(name, pin.commit)
            # The series apply would build this pin from: refused here as apply refuses it.
            for head in series_heads(settings.patchsets_dir, name):
                if _admits(head, pin.version):
                    check_series(load_series(head))
    worktrees = {}
    for name in NAMES:
        info = worktree_info(settings.worktree_path(name))
        if info:
            worktrees[name] = info
    mismatches = {}
    for name, pin in lock.upstreams.items() if lock else ():
        wt = worktrees.get(name)
        if wt is not None and wt.base is not None and wt.base != pin.commit:
            mismatches[name] = (
                f"{wt.path} is built on {wt.base[:12]}"
                + (f" (branch {wt.branch})" if wt.branch else "")
                + f" but {settings.lock_path.name} pins {pin.resolved_ref} ({pin.commit[:12]}): "
                "`rocmport apply` rebuilds it from the lock (verify would test a tree the lock does not describe)"
            )
    return ProjectStatus(lock, str(settings.lock_path), str(settings.cache_dir), cache, worktrees, mismatches)
