"""`apply` as plain functions: pinned commit -> layered branch `rocm/<ref>`:
base (tagged rocmport/base/<ref>) -> one commit per patch -> one commit per codemod
(tagged rocmport/port/<ref>). Idempotent, recoverable, and it never loses a user's work."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from rocmport import __version__, output

# libcst and the codemods load where a codemod runs (codemod_versions, _codemod_layers): the checks and
# the helper text need neither, so deciding an apply is a no-op loads no codemod.
from rocmport.codemods.declared import check_series, recipe_helper_text
from rocmport.config import Settings
from rocmport.errors import BadInput
from rocmport.fsutil import atomic_write_text, tree_write_text
from rocmport.gitutil import git, run_git
from rocmport.patches.apply import PatchOutcome, apply_patch
from rocmport.patches.commits import explaining_patch
from rocmport.patches.series import Series, default_series, recipe_digest, select_series
from rocmport.port import manifests
from rocmport.port import worktree as wt
from rocmport.upstream.lock import Lock, Pin, load_lock
from rocmport.upstream.remotes import validate_url
from rocmport.upstream.store import Store
from rocmport.upstreams import MEGATRON_BRIDGE, MEGATRON_LM


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
    patches: list[wt.PatchEntry] = field(default_factory=list)
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
    from rocmport.codemods import registry

    check_series(series)
    return {entry["name"]: registry[entry["name"]].VERSION for entry in series.codemods}


def inputs_hash(pin: Pin, series: Series, versions: dict[str, str]) -> str:
    # The generated runtime helper is part of what the codemod layers write (the one this recipe's
    # tree gets, as rendered: the launcher environment of rocmport/launch_env.py is in it).
    helper = recipe_helper_text(series.codemods).encode() if series.codemods else b""
    data = {
        "commit": pin.commit,
        "recipe": recipe_digest(series, versions),
        "codemods": versions,
        "rocmport": __version__,
        "helper": hashlib.sha256(helper).hexdigest(),
        "manifests": manifests.VERSION,
    }
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
        from rocmport.upstream import package_index  # urllib and ssl: only when the cache lacks the commit

        if package_index.pin_from_index(store, name, pin.resolved_ref).commit == pin.commit:
            return mirror
    raise BadInput(
        f"{name}: pinned commit {pin.commit[:12]} is not in the cache {mirror}; run `rocmport sync` (with --remote if needed)"
    )


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


def apply_project(
    settings: Settings, upstream: str | None, *, codemods_only=False, force=False, mode: str = "apply", say=print
) -> Iterator[ApplyReport]:
    """`rocmport apply`: each pinned upstream (Megatron-LM first) or only ``upstream``, one report
    each as it finishes; a conflict ends the run there. --continue/--abort without --upstream act on
    the work trees that have a stopped apply (BadInput when none has)."""
    lock = load_lock(settings.lock_path)
    names = [upstream] if upstream else sorted(lock.upstreams, key=lambda n: n != MEGATRON_LM.name)
    for name in names:
        if name not in lock.upstreams:
            raise BadInput(f"{settings.lock_path}: no pin for {name}; run `rocmport sync`")
    if mode in ("continue", "abort") and not upstream:
        stopped = [n for n in names if _stopped(settings.worktree_path(n))]
        if not stopped:
            raise BadInput(f"no stopped apply to {mode} in {', '.join(str(settings.worktree_path(n)) for n in names)}")
        names = stopped
    for name in names:
        with output.progress(f"applying the {name} port"):
            report = apply_upstream(settings, lock, name, codemods_only=codemods_only, force=force, mode=mode, say=say)
        yield report
        if report.status == "conflict":
            return


def _stopped(tree: Path) -> bool:
    state = wt.read_state(tree) if (tree / ".git").is_dir() else None
    return state is not None and state.status == "conflict"


def apply_upstream(
    settings: Settings,
    lock: Lock,
    name: str,
    *,
    codemods_only=False,
    force=False,
    mode: str = "apply",
    say=print,
    series: Series | None = None,
) -> ApplyReport:
    """``series`` overrides the selection from the project's patchsets (refresh applies a staged copy)."""
    with wt.locked(settings.worktree_path(name)):
        return _apply_upstream(
            settings, lock, name, codemods_only=codemods_only, force=force, mode=mode, say=say, series=series
        )


def _apply_upstream(
    settings: Settings, lock: Lock, name: str, *, codemods_only, force, mode, say, series
) -> ApplyReport:
    pin = lock.upstreams[name]
    if series is None:
        # Loading checks every patch (paths, modes, links, size, that git can parse it) before anything is touched.
        series = (
            default_series(name, pin.version or "0")
            if codemods_only
            else select_series(settings.patchsets_dir, name, pin.version)
        )
    versions = codemod_versions(series)
    inputs = inputs_hash(pin, series, versions)
    digest = recipe_digest(series, versions)
    tree = settings.worktree_path(name)
    if mode in ("continue", "abort") and not _stopped(tree):
        raise BadInput(f"{tree}: no stopped apply to {mode}")
    store = Store(settings.cache_dir)
    mirror = _ensure_commit(settings, store, name, pin)
    if wt.ensure_clone(mirror, tree):
        wt.write_state(tree, wt.ApplyState(status="new"))
    for lock_file in wt.clear_stale_git_locks(tree):  # we hold the tree's lock: no rocmport of ours runs here
        say(f"{name}: removed {lock_file}, left behind by an interrupted git (no git process works in {tree})")
    state = wt.read_state(tree)
    head = wt.head(tree)
    dirty = wt.dirty_paths(tree) if head and (state is None or state.status != "new") else []

    if mode in ("continue", "abort"):
        assert state is not None and state.status == "conflict"
        if mode == "abort":
            return _abort(tree, state, pin, series, digest, dirty, say)
        conflicting = state.patches[-1]["name"]
        if dirty:
            raise BadInput(
                f"{tree}: uncommitted changes ({', '.join(dirty[:5])}); commit your resolution of {conflicting}, then `rocmport apply --continue`"
            )
        if head is None or head == state.last_good or state.last_good is None:
            raise BadInput(f"{tree}: HEAD is still the last good commit; resolve {conflicting} and commit it first")
        resolved = state.patches[-1]
        resolved["detail"], resolved["resolved_by_hand"] = f"resolved by hand in {head[:12]}", True
        resolved["commit"], resolved["parent"] = head, state.last_good
        state.last_good = head
        state.status = "in-progress"
        return _run(tree, pin, series, state, (state.index or 0) + 1, say, settings.cache_dir)

    if state and state.status == "conflict":
        raise BadInput(
            f"{tree}: an apply stopped at a conflict in {state.patches[-1]['name']}; "
            "resolve and commit, then `rocmport apply --continue`, or `rocmport apply --abort`"
        )
    if (
        state
        and state.status == "done"
        and state.inputs == inputs
        and head == state.result
        and not dirty
        and state.report
    ):
        return ApplyReport(**{**state.report, "noop": True})

    recovering = state is not None and state.status == "in-progress"
    if recovering:
        say(f"{name}: recovering from an interrupted apply: rebuilding from the base commit")
    if head and state is not None and state.status != "new":
        problems, leftovers = _user_work(tree, series, state, head, dirty)
        if problems and not force:
            raise BadInput(
                f"{tree}: refusing to rebuild over {'; '.join(problems)}; keep them with `rocmport patches export` "
                f"(or commit them elsewhere), or pass --force to save them on refs/rocmport/backup/<n> first"
            )
        if problems or leftovers:
            what = "; ".join(
                problems
                + [
                    f"what the interrupted apply left in {', '.join(leftovers[:3])}{' ...' if len(leftovers) > 3 else ''}"
                ]
                * bool(leftovers)
            )
            ref = wt.save_backup(tree, what)
            say(f"{name}: saved {what} on {ref}")
    elif head and state is None:
        if not force:
            raise BadInput(
                f"{tree}: refusing to rebuild over a work tree rocmport did not build (no state file); "
                f"pass --force to save what it holds on refs/rocmport/backup/<n> first"
            )
        ref = wt.save_backup(tree, "a work tree without a state file")
        say(f"{name}: saved the work tree as it was on {ref}")

    prev_head = state.prev_head if recovering and state else head
    prev_state = (state.prev_state if recovering else _returnable(state, head)) if state else None
    new = wt.ApplyState(
        status="in-progress",
        inputs=inputs,
        prev_head=prev_head,
        prev_state=prev_state,
        base=pin.commit,
        branch=branch_name(pin),
        series=str(series.path),
        series_hash=digest,
        step=wt.Step("checkout", parent=head),
        # Bridge's manifest points its Megatron-LM source at the ported tree beside it.
        megatron_lm_path=os.path.relpath(settings.worktree_path(MEGATRON_LM.name), tree)
        if name == MEGATRON_BRIDGE.name
        else None,
    )
    wt.write_state(tree, new)
    wt.set_sparse(tree, pin.commit, series.excluded_paths)
    git("checkout", "-q", "--force", "-B", branch_name(pin), pin.commit, cwd=tree)
    git("clean", "-fdq", cwd=tree)
    git("tag", "-f", f"rocmport/base/{pin.resolved_ref}", pin.commit, cwd=tree)
    new.last_good, new.step = pin.commit, None
    wt.write_state(tree, new)
    return _run(tree, pin, series, new, 0, say, settings.cache_dir)


def _returnable(state: wt.ApplyState | None, head: str | None) -> dict | None:
    """The state --abort goes back to: a finished port that HEAD still is."""
    if state is not None and state.status in ("done", "aborted") and head is not None and head == state.result:
        data = state.to_json()
        data.pop("prev_state", None)  # one level back is all --abort needs; no chain grows
        return data
    return None


def _user_work(
    tree: Path, series: Series, state: wt.ApplyState, head: str, dirty: list[str]
) -> tuple[list[str], list[str]]:
    """What a user did in the tree since rocmport last wrote it (problems: refused without --force),
    and what an interrupted apply itself left half-written (leftovers: saved, never refused). The same
    checks for a fresh apply and for the recovery of a killed one."""
    step = state.step if state.status == "in-progress" else None
    leftovers = [p for p in dirty if step is not None and step.covers(p)]
    edits = [p for p in dirty if p not in leftovers]
    problems = []
    if edits:
        problems.append(f"uncommitted changes in {', '.join(edits[:5])}{' ...' if len(edits) > 5 else ''}")
    branch = git("rev-parse", "--abbrev-ref", "HEAD", cwd=tree)
    if state.status == "in-progress":
        # rocmport's own commits end at last_good (or, before the checkout finished, at the HEAD it began from
        # or the base); a kill between a commit and the state update leaves one more, on that parent, its own.
        anchors = [
            a
            for a in ([state.last_good] if state.last_good else [state.step.parent if state.step else None, state.base])
            if a
        ]
        anchor = next((a for a in anchors if _descends(tree, a, head)), None)
        if anchor is None:
            problems.append(f"HEAD moved to {head[:12]}, off the commits the interrupted apply made")
        else:
            extra = wt.commits_between(tree, anchor, head)
            if extra and wt.is_own_commit(tree, extra[0], anchor):
                extra = extra[1:]
            if extra:
                problems.append(
                    f"{len(extra)} commit(s) on {branch} made after the interrupted apply ({', '.join(c[:12] for c in extra[:3])})"
                )
    elif state.result and head != state.result:
        extra = unexplained_commits(tree, series, state.result, head)
        if extra:
            problems.append(
                f"{len(extra)} commit(s) on {branch} that no patch explains ({', '.join(c[:12] for c in extra[:3])})"
            )
    return problems, leftovers


def _descends(tree: Path, ancestor: str, head: str) -> bool:
    return run_git("merge-base", "--is-ancestor", ancestor, head, cwd=tree, check=False).returncode == 0


def _run(tree: Path, pin: Pin, series: Series, state: wt.ApplyState, start: int, say, cache_dir: Path) -> ApplyReport:
    for index in range(start, len(series.patches)):
        patch = series.patches[index]
        output.advance(f"patch {index + 1}/{len(series.patches)}: {patch.name}")
        paths = sorted({p for f in patch.files for p in (f.path, f.source) if p})
        state.step = wt.Step("patch", patch.name, paths, parent=state.last_good)
        wt.write_state(tree, state)
        outcome = apply_patch(patch, tree)
        entry = wt.PatchEntry(**outcome.to_dict())
        if outcome.bucket == "conflict":
            state.patches.append(entry)
            state.status, state.index, state.step = "conflict", index, None
            wt.write_state(tree, state)
            return _report(tree, pin, series, state, None, "conflict")
        if outcome.bucket in ("clean", "offset", "merged-3way"):
            # The commit each patch became: refresh regenerates drifted patches from it.
            entry["parent"] = state.last_good or pin.commit
            state.last_good = entry["commit"] = wt.commit_all(tree, _commit_message(patch, outcome))
        state.patches.append(entry)
        state.step = None
        wt.write_state(tree, state)
    state.codemods = _codemod_layers(tree, series, cache_dir, state)
    state.manifests = _manifest_layer(tree, series, state)
    result = wt.head(tree)
    assert result is not None
    state.step = wt.Step("finish", paths=[], parent=result)  # tags and the report: nothing in the tree
    wt.write_state(tree, state)
    git("tag", "-f", f"rocmport/port/{pin.resolved_ref}", result, cwd=tree)
    report = _report(tree, pin, series, state, result, "done")
    state.status, state.result, state.step = "done", result, None
    state.report = {k: v for k, v in report.to_dict().items() if k != "totals"}
    wt.write_state(tree, state)
    return report


def _codemod_layers(tree: Path, series: Series, cache_dir: Path, state: wt.ApplyState) -> list[dict]:
    from rocmport.codemods import compute_layers

    if not series.codemods:
        return []
    result = compute_layers(tree, series.codemods, cache_dir=cache_dir)
    if result.failures:
        first = result.failures[0]
        raise BadInput(f"{tree / first.path}:{first.line or '?'}: codemods could not parse this file ({first.message})")
    touched = sorted({rel for layer in result.layers for rel in layer.files})
    layers = []
    for layer in result.layers:
        if layer.files:
            output.advance(f"committing codemod layer {layer.name} (version {layer.version}, {len(layer.files)} files)")
            state.step = wt.Step("codemods", layer.name, touched, parent=state.last_good)
            wt.write_state(tree, state)
            for rel, text in layer.files.items():
                tree_write_text(tree, rel, text)  # never through a link, never outside the tree
            git("add", "--pathspec-from-file=-", "--pathspec-file-nul", cwd=tree, input="\0".join(layer.files) + "\0")
            state.last_good = wt.commit_all(
                tree,
                f"codemod: {layer.name} {layer.version}\n\nGenerated by rocmport; regenerate, never edit.\n\nCodemod: {layer.name}\n",
            )
            state.step = None
            wt.write_state(tree, state)
        layers.append(
            {
                "name": layer.name,
                "version": layer.version,
                "files": sorted(layer.files),
                "sites": sum(layer.sites.values()),
            }
        )
    return layers


def _manifest_layer(tree: Path, series: Series, state: wt.ApplyState) -> list[dict]:
    """Dependency manifests without CUDA-only distributions: one commit, every change listed."""
    policy = manifests.policy_from_series(series.manifests, state.megatron_lm_path, series.rocm)
    if policy is None:
        return []
    texts, changes = manifests.rewrite_tree(tree, policy)
    if texts:
        state.step = wt.Step("manifests", "", sorted(texts), parent=state.last_good)
        wt.write_state(tree, state)
        for rel, text in texts.items():
            tree_write_text(tree, rel, text)
        git("add", "--pathspec-from-file=-", "--pathspec-file-nul", cwd=tree, input="\0".join(texts) + "\0")
        lines = "\n".join(f"- {c.file} {c.where}: {c.action} {c.requirement} ({c.reason})" for c in changes)
        state.last_good = wt.commit_all(
            tree,
            f"manifests: ROCm dependency declarations {manifests.VERSION}\n\nGenerated by rocmport; regenerate, never edit.\n\n{lines}\n",
        )
        state.step = None
        wt.write_state(tree, state)
    return [c.to_dict() for c in changes]


def _report(
    tree: Path, pin: Pin, series: Series, state: wt.ApplyState, result: str | None, status: ApplyOutcome
) -> ApplyReport:
    report = ApplyReport(
        upstream=series.upstream,
        tree=str(tree),
        branch=branch_name(pin),
        series=str(series.path),
        series_hash=state.series_hash or "",
        base=pin.commit,
        result=result,
        status=status,
        patches=list(state.patches),
        codemods=state.codemods,
        manifests=state.manifests,
    )
    atomic_write_text(report_path(tree), json.dumps(report.to_dict(), indent=2, sort_keys=True) + "\n")
    return report


def _abort(
    tree: Path, state: wt.ApplyState, pin: Pin, series: Series, digest: str, dirty: list[str], say
) -> ApplyReport:
    """Give up a stopped apply: anything in the tree is saved first (a backup ref), then the branch goes
    back to where it was, and so does the state, so a plain `apply` works again afterwards."""
    branch = state.branch or branch_name(pin)
    if dirty:
        ref = wt.save_backup(
            tree, f"uncommitted work when the apply stopped at {state.patches[-1]['name']} was aborted"
        )
        say(
            f"{series.upstream}: saved the uncommitted changes and untracked files ({', '.join(dirty[:3])}{' ...' if len(dirty) > 3 else ''}) on {ref}"
        )
    target = state.prev_head or pin.commit
    git("checkout", "-q", "--force", "-B", branch, target, cwd=tree)
    git("clean", "-fdq", cwd=tree)
    previous = wt.ApplyState.from_json(state.prev_state) if state.prev_state else None
    if previous is not None and previous.result == target:
        wt.write_state(tree, previous)
    else:
        wt.write_state(
            tree,
            wt.ApplyState(
                status="aborted",
                base=pin.commit,
                branch=branch,
                result=target,
                series=str(series.path),
                series_hash=digest,
            ),
        )
    say(f"{series.upstream}: aborted; {branch} is back at {target[:12]}")
    return ApplyReport(series.upstream, str(tree), branch, str(series.path), digest, pin.commit, target, "aborted")
