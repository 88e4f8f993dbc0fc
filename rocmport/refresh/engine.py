"""`refresh` as plain functions: carry the port from the locked upstream to a new ref.

Everything happens in a refresh area (work trees, a staged copy of each series, a state file)
beside the normal work trees; the project's series, lock and work trees change only when the
refresh finished. A conflict stops with the tree ready for a human (--continue / --abort)."""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
from pathlib import Path
from typing import Any, Literal

import yaml

from rocmport import procs
from rocmport.config import Settings
from rocmport.errors import BadInput
from rocmport.fsutil import atomic_write_text
from rocmport.patches.regenerate import patch_id, regenerate, reverse_applies, upstream_patch_ids
from rocmport.patches.series_edit import drop_from_series_text
from rocmport.port import worktree as wt
from rocmport.port.apply import apply_upstream, report_path
from rocmport.refresh.report import RefreshVerifyOptions, codemod_changes, range_diff, run_verify_both, verify_page
from rocmport.refresh.result import (
    NEEDS_HUMAN,
    PROMOTED,
    READY,
    UP_TO_DATE,
    Conflict,
    Hunk,
    PatchRow,
    Pinned,
    RefreshResult,
    RefreshStatus,
    UpstreamOutcome,
)
from rocmport.refresh.staging import StagedSeries, promote, stage_series
from rocmport.state import expect, one_of, read_json, value_of, write_json
from rocmport.upstream.lock import Lock, load_lock, parse_lock
from rocmport.upstream.resolve import resolve_lock
from rocmport.upstream.store import Store
from rocmport.upstreams import MEGATRON_BRIDGE, MEGATRON_LM, NAMES

# The state file of a refresh under way: in-progress (or killed), or stopped at a conflict for a human.
StateStatus = Literal["in-progress", "conflict"]
_FIX = "run `rocmport refresh --abort` to start over"


class Progress:
    """What a refresh has done so far and the step it is in: the line an interrupted refresh prints."""

    def __init__(self) -> None:
        self.done: list[str] = []
        self.now = ""

    def step(self, now: str) -> None:
        self.now = now

    def finish(self, done: str) -> None:
        self.done.append(done)
        self.now = ""

    def line(self) -> str:
        text = "finished: " + ", ".join(self.done) if self.done else "nothing had finished"
        return text + (f"; stopped during {self.now}" if self.now else "")


def _state_path(settings: Settings) -> Path:
    return settings.refresh_dir / "state.json"


def _refresh_settings(settings: Settings) -> Settings:
    return dataclasses.replace(settings, worktree_dir=settings.refresh_dir)


def _parse_state(data: Any) -> dict[str, Any]:
    expect(data, dict, "the refresh state")
    one_of(value_of(data, "status", str), StateStatus, "key 'status'")
    for key, kind in (("to", str), ("old_lock", dict), ("new_lock", dict), ("staged", dict), ("applied", dict)):
        value_of(data, key, kind)
    return data


def read_state(settings: Settings) -> dict[str, Any] | None:
    """The state of a refresh under way, None when there is none (BadInput when unreadable)."""
    return read_json(_state_path(settings), _parse_state, _FIX)


def _write_state(settings: Settings, state: dict[str, Any]) -> None:
    write_json(_state_path(settings), state)


def refresh(
    settings: Settings,
    to: str,
    *,
    verify_opts: RefreshVerifyOptions | None,
    say=print,
    warn=print,
    progress: Progress | None = None,
) -> RefreshResult:
    """Start a refresh to ``to``. ``verify_opts`` None means --no-verify."""
    progress = progress or Progress()
    state = read_state(settings)
    if state and state.get("status") == "conflict":
        raise BadInput(
            f"{_state_path(settings)}: a refresh to {state['to']} stopped at a conflict; resolve it and run "
            f"`rocmport refresh --continue`, or `rocmport refresh --abort`"
        )
    old = load_lock(settings.lock_path)
    mlm = old.upstreams.get(MEGATRON_LM.name)
    if mlm is None:
        raise BadInput(f"{settings.lock_path}: pins no megatron-lm; run `rocmport sync --ref REF` first")
    started = time.time()
    progress.step(f"resolving {to}")
    new = resolve_lock(
        settings, to, source=mlm.source, no_bridge=MEGATRON_BRIDGE.name not in old.upstreams, say=say, warn=warn
    )
    if {n: p.commit for n, p in new.upstreams.items()} == {n: p.commit for n, p in old.upstreams.items()}:
        return RefreshResult(UP_TO_DATE, to, old, new, notes=[f"the lock already pins {to}"]).settle(up_to_date=True)
    progress.finish(", ".join(f"{n} {to} resolved to {p.resolved_ref}" for n, p in new.upstreams.items()))
    progress.step("staging the series")
    settings.refresh_dir.mkdir(parents=True, exist_ok=True)
    staged = {}
    for name, pin in new.upstreams.items():
        before = old.upstreams.get(name)
        staged[name] = stage_series(
            settings.patchsets_dir,
            settings.refresh_dir / "patchsets",
            name,
            pin.version or "0",
            before.resolved_ref if before else "-",
            pin.resolved_ref,
        ).to_dict()
    merged = {
        name: _merged_upstream(settings, StagedSeries.from_dict(staged[name]), old.upstreams.get(name), pin)
        for name, pin in new.upstreams.items()
    }
    state = {
        "status": "in-progress",
        "to": to,
        "old_lock": old.to_dict(),
        "new_lock": new.to_dict(),
        "staged": staged,
        "merged_upstream": merged,
        "applied": {},
        "verify_opts": verify_opts.to_dict() if verify_opts is not None else None,
        "started": started,
    }
    _write_state(settings, state)
    progress.finish("series staged")
    return _advance(settings, state, say, warn, "apply", progress)


def continue_refresh(settings: Settings, *, say=print, warn=print, progress: Progress | None = None) -> RefreshResult:
    state = read_state(settings)
    if not state or state.get("status") != "conflict":
        raise BadInput(f"{settings.refresh_dir}: no stopped refresh to continue")
    return _advance(settings, state, say, warn, "continue", progress or Progress())


def abort_refresh(settings: Settings, *, say=print) -> list[str]:
    """Give up a refresh: what a human did in its trees (a committed resolution, edits, new files) is
    saved on a backup ref of the project's work tree first, as `apply --abort` saves it; then the
    refresh area goes. Returns where the work went ("<tree> <ref>" each)."""
    try:
        to = (read_state(settings) or {}).get("to")
    except BadInput:  # a state that cannot be read is aborted all the same
        to = "an unknown ref"
    if not to:
        raise BadInput(f"{settings.refresh_dir}: no refresh to abort")
    saved = [_keep_work(settings, name, to, say) for name in NAMES]
    shutil.rmtree(settings.refresh_dir, ignore_errors=True)
    say(f"refresh to {to} aborted; {settings.lock_path} and patchsets/ are as they were")
    return [s for s in saved if s]


def _keep_work(settings: Settings, name: str, to: str, say) -> str | None:
    """Save the refresh tree of ``name`` when it holds anything rocmport did not leave there itself:
    onto refs/rocmport/backup/<n> of the project's work tree (kept when the refresh area goes), or,
    without one, the refresh tree is moved aside whole with the backup ref in it."""
    tree = _refresh_settings(settings).worktree_path(name)
    if not (tree / ".git").is_dir() or wt.head(tree) is None:
        return None
    dirty = wt.dirty_paths(tree)
    try:
        state = wt.read_state(tree)
    except BadInput:
        state = None
    head = wt.head(tree)
    if state is not None and head in (state.result, state.last_good) and not dirty:
        return None  # exactly what the refresh left: nothing of a human's to keep
    what = f"the refresh tree of {name} when the refresh to {to} was aborted"
    ref = wt.save_backup(tree, what)
    files = f" and {', '.join(dirty[:3])}{' ...' if len(dirty) > 3 else ''}" if dirty else ""
    project_tree = settings.worktree_path(name)
    if (project_tree / ".git").is_dir():
        with wt.locked(project_tree):
            kept = wt.copy_backup(tree, ref, project_tree, what)
        say(
            f"{name}: saved the refresh tree's work (HEAD {head[:12] if head else '-'}{files}) on {kept} of {project_tree}; "
            f"see it with `git -C {project_tree} log --stat {kept}`"
        )
        return f"{project_tree} {kept}"
    aside = settings.worktrees_dir / f"refresh-aborted-{name}-{int(time.time())}"
    tree.rename(aside)
    say(
        f"{name}: {project_tree} does not exist; kept the refresh tree with its work (HEAD {head[:12] if head else '-'}{files}) "
        f"in {aside}, on {ref}"
    )
    return f"{aside} {ref}"


def _lock_from(data: dict, where: str) -> Lock:
    return parse_lock(yaml.safe_dump(data), where)


def _advance(settings: Settings, state: dict, say, warn, mode: str, progress: Progress) -> RefreshResult:
    new = _lock_from(state["new_lock"], "refresh state")
    rsettings = _refresh_settings(settings)
    for name in new.upstreams:
        if name in state["applied"]:
            continue
        st = StagedSeries.from_dict(state["staged"][name])
        step = mode if state.get("conflict_in") == name else "apply"
        series = st.series
        # Patches upstream merged (by patch-id) are not applied: they could only conflict.
        series.patches = [p for p in series.patches if p.name not in state.get("merged_upstream", {}).get(name, {})]
        progress.step(f"applying {name}'s series and codemods on {new.upstreams[name].resolved_ref}")
        report = apply_upstream(rsettings, new, name, series=series, force=True, mode=step, say=say)
        if report.status == "conflict":
            bad = report.patches[-1]
            state.update(status="conflict", conflict_in=name)
            _write_state(settings, state)
            result = _result(state, NEEDS_HUMAN)
            hunks = [Hunk(h["file"], h["line"]) for h in bad["failed_hunks"]]
            result.conflict = Conflict(name, bad["name"], bad["files"], hunks, bad["detail"], report.tree)
            return result.settle()
        state["applied"][name] = report.to_dict()
        state.pop("conflict_in", None)
        state["status"] = "in-progress"
        _write_state(settings, state)
        progress.finish(f"{name} applied")
    return _finish(settings, state, say, warn, progress)


def _merged_upstream(settings: Settings, st: StagedSeries, before, pin) -> dict[str, str]:
    """Patches whose `git patch-id --stable` matches an upstream commit in old..new -> evidence."""
    series = st.series
    if not series.patches or before is None or before.source != "git" or pin.source != "git":
        return {}  # package-index sources have no upstream history to search
    mirror = Store(settings.cache_dir).mirror_dir(st.upstream)
    ids = upstream_patch_ids(mirror, before.commit, pin.commit)
    found = {}
    for patch in series.patches:
        pid = patch_id(patch.diff, mirror)
        if pid and pid in ids:
            how = "reverse-applies on the new base; " if reverse_applies(mirror, patch.diff, pin.commit) else ""
            found[patch.name] = f"{how}patch-id {pid[:12]} matches upstream commit {ids[pid][:12]}"
    return found


def _result(state: dict, status: RefreshStatus) -> RefreshResult:
    old, new = (_lock_from(state[key], "refresh state") for key in ("old_lock", "new_lock"))
    return RefreshResult(status, state["to"], old, new)


def _finish(settings: Settings, state: dict, say, warn, progress: Progress) -> RefreshResult:
    old = _lock_from(state["old_lock"], "refresh state")
    new = _lock_from(state["new_lock"], "refresh state")
    result = _result(state, READY)
    rsettings = _refresh_settings(settings)
    outcomes: dict[str, UpstreamOutcome] = {}
    for name, report in state["applied"].items():
        st = StagedSeries.from_dict(state["staged"][name])
        tree = rsettings.worktree_path(name)
        before = old.upstreams.get(name)
        progress.step(f"refreshing {name}'s patches and comparing its codemod sites")
        outcome = _refresh_patches(st, tree, report, state.get("merged_upstream", {}).get(name, {}))
        outcome.codemods = codemod_changes(settings, old, name, report)
        outcome.from_ = Pinned(before.resolved_ref, before.commit) if before else None
        outcome.to = Pinned(new.upstreams[name].resolved_ref, new.upstreams[name].commit)
        outcomes[name] = outcome
        if _settle(st, outcome):
            # Rebuilt from the series as it will be promoted: the tree (and its commit ids) is then
            # exactly what `apply` makes from the project's series, and the next apply is a no-op.
            rebuilt = apply_upstream(rsettings, new, name, series=st.series, force=True, say=say)
            if rebuilt.status != "done":
                result.problems.append(
                    f"{name}: the refreshed series did not re-apply on {new.upstreams[name].resolved_ref} "
                    f"({rebuilt.status}); the refresh tree is {tree}"
                )
        progress.finish(f"{name}'s patches refreshed")
    result.upstreams = outcomes
    progress.step("the range-diff")
    result.range_diff = range_diff(
        rsettings, old, new, {n: StagedSeries.from_dict(s) for n, s in state["staged"].items()}, outcomes
    )
    progress.finish("range-diff")
    if state.get("verify_opts") is not None:
        progress.step("verify")
        opts = RefreshVerifyOptions.from_dict(state["verify_opts"])
        result.verify = run_verify_both(settings, rsettings, old, opts, say, page=verify_page(settings, result.to))
        progress.finish("verify")
    result.settle()
    if result.status in PROMOTED:  # verified, or carried over unverified as asked (the status says which)
        progress.step("promoting the result")
        with procs.held():  # the series, then the lock (the commit point), then the trees: never half of it
            result.promoted = _promote(settings, new, state, outcomes, warn)
        progress.finish("promoted")
    result.seconds = round(time.time() - state["started"], 1)
    return result


def _refresh_patches(st: StagedSeries, tree: Path, report: dict, merged: dict[str, str]) -> UpstreamOutcome:
    """Regenerate drifted patches in the staged series, drop the ones upstream merged."""
    series = st.series
    text = (st.staged_dir / "series").read_text(encoding="utf-8")
    out = UpstreamOutcome(str(st.target_dir / "series"), st.created, str(st.source_dir), series_text=text)
    by_name = {p["name"]: p for p in report["patches"]}
    for patch in series.patches:
        if patch.name in merged:
            by_name[patch.name] = {"bucket": "already-upstream", "detail": "", "evidence": merged[patch.name]}
        o = by_name.get(patch.name, {"bucket": "not-applicable", "detail": "not reached"})
        row = PatchRow(
            patch.name, "resolved-by-hand" if o.get("resolved_by_hand") else o["bucket"], detail=o.get("detail", "")
        )
        if row.bucket in ("offset", "merged-3way", "resolved-by-hand"):
            regen = regenerate(
                patch, tree, o["parent"], o["commit"], "merged-3way" if row.bucket == "resolved-by-hand" else row.bucket
            )
            row.action = regen.how if regen.changed else "unchanged"
            if regen.changed:
                out.regenerated[patch.name] = regen.text
        elif row.bucket == "already-upstream":
            row.action, row.evidence = "dropped", o.get("evidence") or "reverse-applies on the new base"
            out.dropped[patch.name] = row.evidence
            out.dropped_texts[patch.name] = patch.path.read_text(encoding="utf-8")
        out.patches.append(row)
    out.series_text_final = drop_from_series_text(text, out.dropped) if out.dropped else text
    return out


def _settle(st: StagedSeries, outcome: UpstreamOutcome) -> bool:
    """Write the refreshed texts into the staged series (regenerated patches, upstreamed ones gone,
    the series file as it will be promoted); True when that changed anything."""
    if not (outcome.regenerated or outcome.dropped):
        return False
    for name, text in outcome.regenerated.items():
        atomic_write_text(st.staged_dir / name, text)
    for name in outcome.dropped:
        (st.staged_dir / name).unlink(missing_ok=True)
    atomic_write_text(st.staged_dir / "series", outcome.series_text_final)
    return True


def _promote(settings: Settings, new: Lock, state: dict, outcomes: dict[str, UpstreamOutcome], warn) -> list[str]:
    changed = []
    for name, outcome in outcomes.items():
        st = StagedSeries.from_dict(state["staged"][name])
        changed += promote(st, outcome.series_text_final, outcome.regenerated, list(outcome.dropped))
    new.save(settings.lock_path)  # the commit point: after the series it needs are in place
    changed.append(str(settings.lock_path))
    for name in outcomes:
        if _swap_tree(settings, name, warn):
            _record_series(
                settings.worktree_path(name), StagedSeries.from_dict(state["staged"][name]).target_dir / "series"
            )
    shutil.rmtree(settings.refresh_dir / "patchsets", ignore_errors=True)
    _state_path(settings).unlink(missing_ok=True)
    return changed


def _swap_tree(settings: Settings, name: str, warn) -> bool:
    """Make the refreshed tree the project's work tree when the old one holds nothing of a user's."""
    fresh = _refresh_settings(settings).worktree_path(name)
    current = settings.worktree_path(name)
    if current.exists():
        state = wt.read_state(current)
        owned = (
            state is not None
            and state.status == "done"
            and wt.head(current) == state.result
            and not wt.dirty_paths(current)
        )
        if not owned:
            warn(f"{current}: has work rocmport did not make; left as it is (the refreshed port is in {fresh})")
            return False
    with wt.locked(current):
        trash = current.parent / f".{current.name}.old"
        shutil.rmtree(trash, ignore_errors=True)
        if current.exists():
            current.rename(trash)
        fresh.rename(current)
        rp = report_path(fresh)
        if rp.is_file():
            rp.replace(report_path(current))
        shutil.rmtree(trash, ignore_errors=True)
    return True


def _record_series(tree: Path, series: Path) -> None:
    """The swapped-in tree was built from the staged copy of the series, byte for byte the project's
    series now: its state and report name the project's series file and the tree where it now lives
    (same series hash, same inputs), so `build` records the release line and the next apply is a no-op."""
    state = wt.read_state(tree)
    if state is None:
        return
    state.series = str(series)
    if state.report is not None:
        state.report.update(series=str(series), tree=str(tree))
    wt.write_state(tree, state)
    rp = report_path(tree)
    if rp.is_file():
        data = json.loads(rp.read_text(encoding="utf-8"))
        data.update(series=str(series), tree=str(tree))
        atomic_write_text(rp, json.dumps(data, indent=2, sort_keys=True) + "\n")
