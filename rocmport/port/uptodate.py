"""Is a plain `rocmport apply` a no-op? Decided from the inputs hash the last apply recorded, with no
codemod and no libcst loaded: the codemod versions and the helper text come from their declarations
(rocmport/codemods/declared.py), and only the selected line's series is read.

The answer is the one `apply_upstream` gives (the same inputs hash, the same state checks) without
its side effects; anything short of a plain "done, same inputs, same HEAD, clean tree" is left to
it, so every recovery, refusal and message stays in one place (rocmport/port/apply.py)."""

from __future__ import annotations

from rocmport.codemods import declared
from rocmport.config import Settings
from rocmport.gitutil import git_lock_files
from rocmport.patches.series import default_series, select_series
from rocmport.port import worktree as wt
from rocmport.port.apply import ApplyReport, inputs_hash
from rocmport.upstream.lock import Lock, load_lock
from rocmport.upstream.store import Store
from rocmport.upstreams import MEGATRON_LM


def noop_reports(settings: Settings, upstream: str | None, *, codemods_only: bool = False) -> list[ApplyReport] | None:
    """The no-op report of every upstream a plain apply would build (Megatron-LM first), when each
    is up to date; None when any is not (or anything is unusual), and the full apply must run."""
    lock = load_lock(settings.lock_path)
    names = [upstream] if upstream else sorted(lock.upstreams, key=lambda n: n != MEGATRON_LM.name)
    reports = []
    for name in names:
        report = noop_report(settings, lock, name, codemods_only=codemods_only) if name in lock.upstreams else None
        if report is None:
            return None
        reports.append(report)
    return reports


def noop_report(settings: Settings, lock: Lock, name: str, *, codemods_only: bool = False) -> ApplyReport | None:
    """``name``'s no-op report when its work tree is the finished port of the current inputs, else None."""
    tree = settings.worktree_path(name)
    if not (tree / ".git").is_dir():
        return None
    pin = lock.upstreams[name]
    # The series is read and checked as apply reads it: bad input is refused here with apply's message.
    series = (
        default_series(name, pin.version or "0")
        if codemods_only
        else select_series(settings.patchsets_dir, name, pin.version)
    )
    inputs = inputs_hash(pin, series, declared.versions(series))
    with wt.locked(tree):
        state = wt.read_state(tree)
        if state is None or state.status != "done" or state.inputs != inputs or not state.report:
            return None
        # What apply checks or repairs before it decides: the cache's commit (the tree borrows its
        # objects), a lock file a killed git left, HEAD, uncommitted work.
        if git_lock_files(tree / ".git") or not Store(settings.cache_dir).has_commit(name, pin.commit):
            return None
        if wt.head(tree) != state.result or wt.dirty_paths(tree):
            return None
        return ApplyReport(**{**state.report, "noop": True})
