"""`patches export` and `patches check` on a ported work tree: the commits a user made on the work
branch after the applied port become patch files of its series, and the drift gate says where the
stored patches and the branch differ. A commit some patch already explains is never rewritten."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from rocmport.config import Settings
from rocmport.errors import BadInput
from rocmport.fsutil import tree_read_text, tree_write_text
from rocmport.gitutil import git, run_git
from rocmport.patches.commits import commit_diff, explaining_patch, patch_matches_commit, render_patch, slug
from rocmport.codemods.declared import check_series
from rocmport.patches.series import Series, lint_header, parse_header, select_series, split_header
from rocmport.patches.series_edit import add_to_series
from rocmport.port import worktree as wt
from rocmport.upstream.lock import load_lock
from rocmport.upstreams import NAMES


@dataclass
class ExportResult:
    written: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    texts: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def ported_trees(settings: Settings, upstream: str | None) -> list[tuple[str, Series, Path]]:
    """(upstream, its series, its work tree) for each pinned upstream, or only ``upstream``: what
    `patches export` and `patches check` work on."""
    lock = load_lock(settings.lock_path)
    names = [upstream] if upstream else [n for n in NAMES if n in lock.upstreams]
    out = []
    for name in names:
        if name not in lock.upstreams:
            raise BadInput(f"{settings.lock_path}: no pin for {name}")
        series = check_series(select_series(settings.patchsets_dir, name, lock.upstreams[name].version))
        tree = settings.worktree_path(name)
        if not (tree / ".git").exists():
            raise BadInput(f"{tree}: no work tree; run `rocmport apply` first")
        out.append((name, series, tree))
    return out


def user_commits(tree: Path) -> list[str]:
    state = wt.read_state(tree)
    if state is None or state.status != "done" or not state.result:
        raise BadInput(f"{tree}: no finished apply to export from; run `rocmport apply` first")
    head = wt.head(tree)
    if (
        head is None
        or run_git("merge-base", "--is-ancestor", state.result, head, cwd=tree, check=False).returncode != 0
    ):
        raise BadInput(
            f"{tree}: HEAD does not descend from the applied port {state.result[:12]}; rebase your commits onto it"
        )
    return wt.commits_between(tree, state.result, head)


def export(tree: Path, series: Series, description: str | None, status: str, dry_run: bool = False) -> ExportResult:
    problems = lint_header({"Description": description or "x", "Upstream-Status": status}, Path("--upstream-status"))
    if problems:
        raise BadInput(problems[0])
    result = ExportResult()
    number = len(series.patches)
    new_names: list[str] = []
    listed = {p.name for p in series.patches}
    for c in user_commits(tree):
        known = explaining_patch(tree, series, c)
        if known:
            result.unchanged.append(known)
            continue
        diff = commit_diff(tree, c)
        message = git("log", "-1", "--format=%B", c, cwd=tree)
        subject = slug(message.splitlines()[0] if message else "patch")
        number += 1
        name = f"{number:04d}-{subject}.patch"
        # The next free name: a file export did not write (listed or not) is never replaced.
        while name in listed or name in result.texts or os.path.lexists(series.dir / name):
            if name not in listed and name not in result.texts:
                result.notes.append(f"{series.dir / name} exists and is not in the series: left alone")
            number += 1
            name = f"{number:04d}-{subject}.patch"
        result.texts[name] = render_patch(description or message, status, diff)
        new_names.append(name)
    if dry_run:
        return result
    for name, text in result.texts.items():
        try:
            tree_write_text(series.dir, name, text, replace=False)  # create-only, never through a link
        except FileExistsError:
            raise BadInput(
                f"{series.dir / name}: appeared while exporting; left alone, run `rocmport patches export` again"
            ) from None
        result.written.append(name)
    if new_names:
        tree_write_text(
            series.dir, series.path.name, add_to_series(tree_read_text(series.dir, series.path.name), new_names)
        )
    return result


def check(tree: Path, series: Series) -> list[str]:
    """Drift and lint problems: an empty list means the stored patches are what the branch holds."""
    problems = []
    for p in series.patches:
        lines, _ = split_header(p.path.read_text(encoding="utf-8"))
        problems += lint_header(parse_header(lines, p.path), p.path)
    for c in user_commits(tree):
        if not explaining_patch(tree, series, c):
            subject = git("log", "-1", "--format=%s", c, cwd=tree)
            problems.append(f"{tree}: commit {c[:12]} '{subject}' is not in the series; run `rocmport patches export`")
    state = wt.read_state(tree)
    if state is not None and state.base and state.result:
        for c in wt.commits_between(tree, state.base, state.result):
            trailer = re.search(r"^Patch: (\S+)$", git("log", "-1", "--format=%B", c, cwd=tree), re.M)
            if not trailer:
                continue
            stored = next((p for p in series.patches if p.name == trailer.group(1)), None)
            if stored is None:
                problems.append(
                    f"{trailer.group(1)}: applied on the branch but no longer in {series.path}; re-run `rocmport apply`"
                )
            elif not patch_matches_commit(tree, stored.diff, c):
                problems.append(
                    f"{stored.path}: differs from its commit {c[:12]} on the branch; re-run `rocmport apply` or export the branch"
                )
    return problems
