"""Ported work trees: self-contained clones of the cache mirror (objects borrowed through
alternates, no refs written into the cache), sparse for excluded paths, with a state file
under .git so an interrupted or stopped apply can be recovered, continued or aborted."""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, TypedDict

from rocmport.errors import BadInput
from rocmport.fsutil import file_lock
from rocmport.gitutil import FIXED_IDENTITY, clear_stale_locks, git, rev_parse, run_git, status_paths, z_paths
from rocmport.state import Invalid, expect, one_of, read_json, value_of, write_json

STATE = "rocmport-state.json"


def state_path(tree: Path) -> Path:
    return tree / ".git" / STATE


# new: cloned, nothing applied; in-progress: an apply is (or was, when killed) running; conflict: stopped
# at a patch for a human (--continue / --abort); done: the port is built; aborted: --abort put the branch
# back where it was before an apply that had no finished port to return to.
ApplyStatus = Literal["new", "in-progress", "conflict", "done", "aborted"]
StepKind = Literal["checkout", "patch", "codemods", "manifests", "finish"]
_FIX = "delete it; `rocmport apply --force` then rebuilds the tree (keeping your commits on refs/rocmport/backup/<n>)"


class PatchEntry(TypedDict, total=False):
    """One patch of an apply, as the state file and the report hold it."""

    name: str
    bucket: str
    files: list[str]
    offsets: list[dict[str, int]]
    failed_hunks: list[dict[str, Any]]
    detail: str
    commit: str  # the commit the patch became
    parent: str  # the commit it was applied on
    resolved_by_hand: bool


@dataclass
class Step:
    """What an apply is in the middle of: if it is killed there, the paths it was writing are its own
    leftovers (kept on a backup ref, never mistaken for a user's work), and a commit on ``parent``
    with rocmport's fixed identity and date is its own commit."""

    kind: StepKind
    name: str = ""
    paths: list[str] | None = None  # None: any path (checkout and clean rewrite the whole tree)
    parent: str | None = None  # the commit the step builds on

    def covers(self, path: str) -> bool:
        """Could the step have left ``path`` dirty (one of its files, or the temp file of one being written)?"""
        if self.paths is None or path in self.paths:
            return True
        head, _, base = path.rpartition("/")
        m = re.fullmatch(r"\.(.+)\.\d+\.tmp", base)
        if m is None:
            return False
        return (f"{head}/{m.group(1)}" if head else m.group(1)) in self.paths


@dataclass
class ApplyState:
    """The state file under .git of a work tree (`rocmport-state.json`)."""

    status: ApplyStatus
    inputs: str | None = None
    base: str | None = None
    branch: str | None = None
    series: str | None = None
    series_hash: str | None = None
    patches: list[PatchEntry] = field(default_factory=list)
    last_good: str | None = None
    index: int | None = None  # the conflicting patch (status conflict)
    step: Step | None = None
    codemods: list[dict[str, Any]] = field(default_factory=list)
    manifests: list[dict[str, Any]] = field(default_factory=list)
    result: str | None = None  # the finished port (done), or where --abort put the branch (aborted)
    report: dict[str, Any] | None = None
    prev_head: str | None = None  # HEAD before this apply began
    prev_state: dict[str, Any] | None = None  # the state before it (a finished port --abort goes back to)
    megatron_lm_path: str | None = None  # Bridge: where the ported Megatron-LM tree is, from this tree

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        return {k: v for k, v in data.items() if v is not None}

    @classmethod
    def from_json(cls, data: Any) -> ApplyState:
        expect(data, dict, "the apply state")
        status = one_of(value_of(data, "status", str), ApplyStatus, "key 'status'")
        for key in (
            "inputs",
            "base",
            "branch",
            "series",
            "series_hash",
            "last_good",
            "result",
            "prev_head",
            "megatron_lm_path",
        ):
            value_of(data, key, str, required=False)
        for key in ("patches", "codemods", "manifests"):
            for i, item in enumerate(expect(data.get(key) or [], list, f"key '{key}'")):
                expect(item, dict, f"key '{key}[{i}]'")
        for key in ("report", "prev_state"):
            value_of(data, key, dict, required=False)
        index = value_of(data, "index", int, required=False)
        step = None
        if data.get("step") is not None:
            raw = expect(data["step"], dict, "key 'step'")
            paths = value_of(raw, "paths", list, "step", required=False)
            if paths is not None and not all(isinstance(p, str) for p in paths):
                raise Invalid("key 'step.paths' must be a list of strings")
            step = Step(
                one_of(value_of(raw, "kind", str, "step"), StepKind, "key 'step.kind'"),
                value_of(raw, "name", str, "step", required=False) or "",
                paths,
                value_of(raw, "parent", str, "step", required=False),
            )
        return cls(
            status=status,
            inputs=data.get("inputs"),
            base=data.get("base"),
            branch=data.get("branch"),
            series=data.get("series"),
            series_hash=data.get("series_hash"),
            patches=list(data.get("patches") or []),
            last_good=data.get("last_good"),
            index=index,
            step=step,
            codemods=list(data.get("codemods") or []),
            manifests=list(data.get("manifests") or []),
            result=data.get("result"),
            report=data.get("report"),
            prev_head=data.get("prev_head"),
            prev_state=data.get("prev_state"),
            megatron_lm_path=data.get("megatron_lm_path"),
        )


def read_state(tree: Path) -> ApplyState | None:
    """The state of the last apply in ``tree``, None when there is none (BadInput when unreadable)."""
    return read_json(state_path(tree), ApplyState.from_json, _FIX)


def project_series(tree: Path, recorded: Path) -> Path:
    """The series file of the project that holds ``tree``: apply records its absolute path, which names
    the project apply ran in. A project copied (``cp -a``) or moved keeps that path, and verify would
    read and write (--record-reach, --record-golden) the other project's records: the same place under
    patchsets/ is looked for from the tree upwards, and the nearest one there is the tree's own. A
    recorded path outside a patchsets/ directory, or with none found, stands as recorded."""
    parts = recorded.parts
    if "patchsets" not in parts:
        return recorded
    inside = Path(*parts[len(parts) - parts[::-1].index("patchsets") - 1 :])  # patchsets/<upstream>/<line>/series
    for above in tree.absolute().parents:
        if (above / inside).is_file():
            return above / inside
    return recorded


def write_state(tree: Path, state: ApplyState) -> None:
    write_json(state_path(tree), state.to_json())


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
        listing = git(
            "ls-tree", "-z", "-d", "--name-only", f"{commit}:{parent}" if parent else commit, cwd=mirror_or_tree
        )
        for name in z_paths(listing):
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
        raise BadInput(
            f"{tree}: exists and is not a rocmport work tree; move it away or set [tool.rocmport] worktree-dir"
        )
    tree.parent.mkdir(parents=True, exist_ok=True)
    # Clone beside the target and rename: a kill mid-clone never leaves a half work tree.
    staging = tree.parent / f".{tree.name}.cloning"
    shutil.rmtree(staging, ignore_errors=True)
    # --shared: borrow the cache's objects (alternates); refs live only in the work tree.
    git("clone", "-q", "--shared", "--no-checkout", "--no-tags", "--", str(mirror), str(staging))
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
    with file_lock(
        tree.parent / f".{tree.name}.lock",
        f"another rocmport apply is running on this work tree ({tree}); wait for it to finish",
        timeout=timeout,
    ):
        yield


def dirty_paths(tree: Path) -> list[str]:
    """Tracked files changed and untracked files (not ignored ones), by their exact names."""
    return status_paths(tree)


def head(tree: Path) -> str | None:
    return rev_parse("HEAD", tree)


def commits_between(tree: Path, old: str, new: str) -> list[str]:
    return git("rev-list", "--reverse", f"{old}..{new}", cwd=tree).split()


BACKUP_PREFIX = "refs/rocmport/backup/"
_ZERO = "0" * 40


def save_backup(tree: Path, what: str) -> str:
    """Keep HEAD, every uncommitted edit and every untracked file on a new refs/rocmport/backup/<n>
    (the next free number: an existing backup is never overwritten) before anything resets them."""
    untracked = z_paths(run_git("ls-files", "-z", "--others", "--exclude-standard", cwd=tree).stdout)
    if untracked:  # so the stash commit holds them too
        git("add", "--pathspec-from-file=-", "--pathspec-file-nul", "--", cwd=tree, input="\0".join(untracked) + "\0")
    stash = git("stash", "create", f"rocmport backup ({what})", cwd=tree) if dirty_paths(tree) else ""
    target = stash or git("rev-parse", "HEAD", cwd=tree)
    return _new_backup_ref(tree, target, what)


def copy_backup(source: Path, ref: str, dest: Path, what: str) -> str:
    """Keep ``source``'s backup ``ref`` (its commits, stash and untracked files) on a new
    refs/rocmport/backup/<n> of the repository ``dest`` too: for a tree about to be deleted."""
    git("fetch", "-q", "--no-tags", "--", str(source.resolve()), ref, cwd=dest)
    return _new_backup_ref(dest, git("rev-parse", "FETCH_HEAD", cwd=dest), what)


def _new_backup_ref(tree: Path, target: str, what: str) -> str:
    taken = [
        r.removeprefix(BACKUP_PREFIX)
        for r in git("for-each-ref", "--format=%(refname)", BACKUP_PREFIX, cwd=tree).split()
    ]
    n = max((int(t) for t in taken if t.isdigit()), default=0)
    while True:
        n += 1
        ref = f"{BACKUP_PREFIX}{n}"
        # Create-only (old value: none): a ref that appeared meanwhile is never replaced.
        if (
            run_git(
                "update-ref", "-m", f"rocmport backup: {what}", ref, target, _ZERO, cwd=tree, check=False
            ).returncode
            == 0
        ):
            return ref


def clear_stale_git_locks(tree: Path) -> list[str]:
    """git lock files a killed apply left in the work tree's repository (the caller holds the work
    tree's file lock): removed, and named for a note."""
    return [str(p.relative_to(tree)) for p in clear_stale_locks(tree / ".git", tree)]


def commit_all(tree: Path, message: str) -> str:
    git("commit", "-q", "--no-verify", "--allow-empty-message", "-m", message, cwd=tree, env=FIXED_IDENTITY)
    return git("rev-parse", "HEAD", cwd=tree)


def is_own_commit(tree: Path, commit: str, parent: str | None) -> bool:
    """Is ``commit`` one rocmport made (its fixed identity and date) directly on ``parent``?"""
    if parent is None:
        return False
    fields = git("show", "-s", "--format=%P%x00%an%x00%cn%x00%aI%x00%cI", commit, cwd=tree).split("\0")
    fixed = "2000-01-01T00:00:00+00:00"
    return (
        fields[0] == parent
        and fields[1] == fields[2] == FIXED_IDENTITY["GIT_AUTHOR_NAME"]
        and fields[3] == fields[4] == fixed
    )
