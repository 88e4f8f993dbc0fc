"""`apply` as plain functions: pinned commit -> layered branch `rocm/<ref>`:
base (tagged rocmport/base/<ref>) -> one commit per patch -> one commit per codemod
(tagged rocmport/port/<ref>). Idempotent, recoverable, and it never loses a user's work."""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Literal

from rocmport import __version__, output
from rocmport.codemods import compute_layers, registry
from rocmport.codemods.catalog import check_recipe
from rocmport.config import Settings
from rocmport.errors import BadInput
from rocmport.fsutil import atomic_write_text
from rocmport.gitutil import git, run_git
from rocmport.patches.apply import PatchOutcome, apply_patch, touched_paths
from rocmport.patches.commits import explaining_patch
from rocmport.patches.series import Series, default_series, recipe_digest, select_series
from rocmport.port import manifests
from rocmport.port import worktree as wt
from rocmport.upstream import package_index
from rocmport.upstream.lock import Lock, Pin, load_lock
from rocmport.upstream.remotes import validate_url
from rocmport.upstream.store import Store


# done: the port is built; conflict: stopped at a patch for a human; aborted: --abort restored the branch.
ApplyOutcome = Literal["done", "conflict", "aborted"]


@dataclass
class ApplyReport:
    upstream: str
    tree: str
    branch: str
    series: str
    series_hash: str
    base: str
    result: str | None
    status: ApplyOutcome
    noop: bool = False
    patches: list[dict] = field(default_factory=list)
    codemods: list[dict] = field(default_factory=list)
    manifests: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        totals: dict[str, int] = {}
        for p in self.patches:
            totals[p["bucket"]] = totals.get(p["bucket"], 0) + 1
        return {**self.__dict__, "totals": totals}


def codemod_versions(series: Series) -> dict[str, str]:
    """Each codemod's version; unknown codemods and options they do not declare are refused here,
    before anything is touched."""
    check_recipe(series.codemods, series.path)
    return {entry["name"]: registry[entry["name"]].VERSION for entry in series.codemods}


def inputs_hash(pin: Pin, series: Series, versions: dict[str, str]) -> str:
    # The generated runtime helper is part of what the codemod layers write.
    helper = resources.files("rocmport").joinpath("data/_rocm.py.tmpl").read_bytes() if series.codemods else b""
    data = {"commit": pin.commit, "recipe": recipe_digest(series, versions), "codemods": versions, "rocmport": __version__,
            "helper": hashlib.sha256(helper).hexdigest(), "manifests": manifests.VERSION}
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def branch_name(pin: Pin) -> str:
    return f"rocm/{pin.resolved_ref}"


def _ensure_commit(settings: Settings, store: Store, name: str, pin: Pin) -> Path:
    mirror = store.mirror_dir(name)
    if store.has_commit(name, pin.commit):
        return mirror
    if pin.source == "git":
        store.update_mirror(validate_url(name, settings.remotes[name]))
        if store.has_commit(name, pin.commit):
            return mirror
    elif pin.source == "pypi":
        if package_index.pin_from_index(store, name, pin.resolved_ref).commit == pin.commit:
            return mirror
    raise BadInput(f"{name}: pinned commit {pin.commit[:12]} is not in the cache {mirror}; run `rocmport sync` (with --remote if needed)")


def unexplained_commits(tree: Path, series: Series, since: str, head: str) -> list[str]:
    """Commits after the recorded result that no patch of the series explains (same effect)."""
    if run_git("merge-base", "--is-ancestor", since, head, cwd=tree, check=False).returncode != 0:
        return [head]
    return [c for c in wt.commits_between(tree, since, head) if not explaining_patch(tree, series, c)]


def _commit_message(patch, outcome: PatchOutcome) -> str:
    subject, _, body = patch.description.partition("\n")
    trailers = [f"Patch: {patch.name}", f"Upstream-Status: {patch.upstream_status}", f"Bucket: {outcome.bucket}"]
    trailers += [f"{k}: {v}" for k, v in patch.header.items() if k in ("Bug", "Forwarded")]
    return subject + ("\n\n" + body.strip() if body.strip() else "") + "\n\n" + "\n".join(trailers) + "\n"


def report_path(tree: Path) -> Path:
    return tree.parent / f"{tree.name}.report.json"


def apply_project(settings: Settings, upstream: str | None, *, codemods_only=False, force=False, mode: str = "apply",
                  say=print) -> Iterator[ApplyReport]:
    """`rocmport apply`: each pinned upstream (Megatron-LM first) or only ``upstream``, one report
    each as it finishes; a conflict ends the run there."""
    lock = load_lock(settings.lock_path)
    for name in [upstream] if upstream else sorted(lock.upstreams, key=lambda n: n != "megatron-lm"):
        if name not in lock.upstreams:
            raise BadInput(f"{settings.lock_path}: no pin for {name}; run `rocmport sync`")
        with output.progress(f"applying the {name} port"):
            report = apply_upstream(settings, lock, name, codemods_only=codemods_only, force=force, mode=mode, say=say)
        yield report
        if report.status == "conflict":
            return


def apply_upstream(settings: Settings, lock: Lock, name: str, *, codemods_only=False, force=False,
                   mode: str = "apply", say=print, series: Series | None = None) -> ApplyReport:
    """``series`` overrides the selection from the project's patchsets (refresh applies a staged copy)."""
    with wt.locked(settings.worktree_path(name)):
        return _apply_upstream(settings, lock, name, codemods_only=codemods_only, force=force, mode=mode, say=say, series=series)


def _apply_upstream(settings: Settings, lock: Lock, name: str, *, codemods_only, force, mode, say, series) -> ApplyReport:
    pin = lock.upstreams[name]
    if series is None:
        series = default_series(name, pin.version or "0") if codemods_only else select_series(settings.patchsets_dir, name, pin.version)
    for patch in series.patches:  # reject unsafe or malformed patches before touching anything
        touched_paths(patch)
    versions = codemod_versions(series)
    inputs = inputs_hash(pin, series, versions)
    store = Store(settings.cache_dir)
    mirror = _ensure_commit(settings, store, name, pin)
    tree = settings.worktree_path(name)
    if wt.ensure_clone(mirror, tree):
        wt.write_state(tree, {"status": "new", "prev_head": None, "patches": []})
    state = wt.read_state(tree)
    head = wt.head(tree)
    dirty = wt.dirty_paths(tree) if head else []
    digest = recipe_digest(series, versions)

    if mode in ("continue", "abort"):
        if not state or state.get("status") != "conflict":
            raise BadInput(f"{tree}: no stopped apply to {mode}")
        if mode == "abort":
            return _abort(tree, state, pin, series, digest, say)
        if dirty:
            raise BadInput(f"{tree}: uncommitted changes ({', '.join(dirty[:5])}); commit your resolution of {state['patches'][-1]['name']}, then `rocmport apply --continue`")
        if head is None or head == state["last_good"]:
            raise BadInput(f"{tree}: HEAD is still the last good commit; resolve {state['patches'][-1]['name']} and commit it first")
        state["patches"][-1].update(detail=f"resolved by hand in {head[:12]}", resolved_by_hand=True, commit=head, parent=state["last_good"])
        state["last_good"] = head
        return _run(tree, pin, series, state, state["index"] + 1, say, settings.cache_dir)

    if state and state.get("status") == "conflict":
        raise BadInput(f"{tree}: an apply stopped at a conflict in {state['patches'][-1]['name']}; resolve and commit, then `rocmport apply --continue`, or `rocmport apply --abort`")
    if state and state.get("status") == "done" and state.get("inputs") == inputs and head == state.get("result") and not dirty:
        return ApplyReport(**{**state["report"], "noop": True})

    if state and state.get("status") == "in-progress":
        say(f"{name}: recovering from an interrupted apply: rebuilding from the base commit")
    elif head and (state or {}).get("status") != "new":
        problems = []
        if dirty:
            problems.append(f"uncommitted changes in {', '.join(dirty[:5])}{' ...' if len(dirty) > 5 else ''}")
        if state and state.get("result") and head != state["result"]:
            extra = unexplained_commits(tree, series, state["result"], head)
            if extra:
                problems.append(f"{len(extra)} commit(s) on {git('rev-parse', '--abbrev-ref', 'HEAD', cwd=tree)} that no patch explains ({', '.join(c[:12] for c in extra[:3])})")
        elif not state:
            problems.append("a work tree rocmport did not build (no state file)")
        if problems:
            if not force:
                raise BadInput(
                    f"{tree}: refusing to rebuild over {'; '.join(problems)}; keep them with `rocmport patches export` "
                    f"(or commit them elsewhere), or pass --force to save them on refs/rocmport/backup/<n> first"
                )
            ref = wt.save_backup(tree, "; ".join(problems))
            say(f"{name}: saved {'; '.join(problems)} on {ref}")

    recovering = (state or {}).get("status") == "in-progress"
    state = {"status": "in-progress", "inputs": inputs, "prev_head": (state or {}).get("prev_head") if recovering else head,
             "base": pin.commit, "branch": branch_name(pin), "series": str(series.path), "series_hash": digest, "patches": [],
             # Bridge's manifest points its Megatron-LM source at the ported tree beside it.
             "megatron_lm_path": os.path.relpath(settings.worktree_path("megatron-lm"), tree) if name == "megatron-bridge" else None}
    wt.write_state(tree, state)
    wt.set_sparse(tree, pin.commit, series.excluded_paths)
    git("checkout", "-q", "--force", "-B", branch_name(pin), pin.commit, cwd=tree)
    git("clean", "-fdq", cwd=tree)
    git("tag", "-f", f"rocmport/base/{pin.resolved_ref}", pin.commit, cwd=tree)
    state["last_good"] = pin.commit
    return _run(tree, pin, series, state, 0, say, settings.cache_dir)


def _run(tree: Path, pin: Pin, series: Series, state: dict, start: int, say, cache_dir: Path) -> ApplyReport:
    sleep = float(os.environ.get("ROCMPORT_TEST_SLEEP_AFTER_PATCH", "0") or 0)  # crash-recovery tests only
    for index in range(start, len(series.patches)):
        patch = series.patches[index]
        outcome = apply_patch(patch, tree)
        entry = outcome.to_dict()
        state["patches"].append(entry)
        if outcome.bucket == "conflict":
            state.update(status="conflict", index=index)
            wt.write_state(tree, state)
            return _report(tree, pin, series, state, None, "conflict")
        if outcome.bucket in ("clean", "offset", "merged-3way"):
            # The commit each patch became: refresh regenerates drifted patches from it.
            entry["parent"] = state["last_good"]
            state["last_good"] = entry["commit"] = wt.commit_all(tree, _commit_message(patch, outcome))
        wt.write_state(tree, state)
        if sleep:
            time.sleep(sleep)
    state["codemods"] = _codemod_layers(tree, series, cache_dir)
    state["manifests"] = _manifest_layer(tree, series, state.get("megatron_lm_path"))
    result = wt.head(tree)
    git("tag", "-f", f"rocmport/port/{pin.resolved_ref}", result, cwd=tree)
    report = _report(tree, pin, series, state, result, "done")
    state.update(status="done", result=result, report={k: v for k, v in report.to_dict().items() if k != "totals"})
    wt.write_state(tree, state)
    return report


def _codemod_layers(tree: Path, series: Series, cache_dir: Path) -> list[dict]:
    if not series.codemods:
        return []
    result = compute_layers(tree, series.codemods, cache_dir=cache_dir)
    if result.failures:
        first = result.failures[0]
        raise BadInput(f"{tree / first.path}:{first.line or '?'}: codemods could not parse this file ({first.message})")
    layers = []
    for layer in result.layers:
        for rel, text in layer.files.items():
            (tree / rel).parent.mkdir(parents=True, exist_ok=True)
            (tree / rel).write_text(text, encoding="utf-8")
        if layer.files:
            git("add", "--", *layer.files, cwd=tree)
            wt.commit_all(tree, f"codemod: {layer.name} {layer.version}\n\nGenerated by rocmport; regenerate, never edit.\n\nCodemod: {layer.name}\n")
        layers.append({"name": layer.name, "version": layer.version, "files": sorted(layer.files), "sites": sum(layer.sites.values())})
    return layers


def _manifest_layer(tree: Path, series: Series, megatron_lm_path: str | None) -> list[dict]:
    """Dependency manifests without CUDA-only distributions: one commit, every change listed."""
    policy = manifests.policy_from_series(series.manifests, megatron_lm_path)
    if policy is None:
        return []
    texts, changes = manifests.rewrite_tree(tree, policy)
    for rel, text in texts.items():
        atomic_write_text(tree / rel, text)
    if texts:
        git("add", "--", *texts, cwd=tree)
        lines = "\n".join(f"- {c.file} {c.where}: {c.action} {c.requirement} ({c.reason})" for c in changes)
        wt.commit_all(tree, f"manifests: ROCm dependency declarations {manifests.VERSION}\n\nGenerated by rocmport; regenerate, never edit.\n\n{lines}\n")
    return [c.to_dict() for c in changes]


def _report(tree, pin, series, state, result, status) -> ApplyReport:
    report = ApplyReport(
        upstream=series.upstream, tree=str(tree), branch=branch_name(pin), series=str(series.path),
        series_hash=state["series_hash"], base=pin.commit, result=result, status=status,
        patches=list(state["patches"]), codemods=state.get("codemods", []), manifests=state.get("manifests", []),
    )
    atomic_write_text(report_path(tree), json.dumps(report.to_dict(), indent=2, sort_keys=True) + "\n")
    return report


def _abort(tree: Path, state: dict, pin: Pin, series, digest, say) -> ApplyReport:
    target = state.get("prev_head") or pin.commit
    git("checkout", "-q", "--force", "-B", state["branch"], target, cwd=tree)
    git("clean", "-fdq", cwd=tree)
    wt.clear_state(tree)
    say(f"{series.upstream}: aborted; {state['branch']} is back at {target[:12]}")
    return ApplyReport(series.upstream, str(tree), state["branch"], str(series.path), digest, pin.commit, target, "aborted")
