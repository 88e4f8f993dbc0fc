"""What a patch's diff does, checked before any of it is applied: the files it touches (never outside
the tree or in .git/), and the changes that are refused unless the series allows them explicitly
(`allow:` in the series): binary hunks (`binary`), gitlinks (`gitlinks`), mode changes
(`mode-changes`) and symlinks (`symlinks`). Even an allowed symlink must resolve inside the tree,
and may not stand where a later step of apply writes (the codemods' helper, the manifests).

git itself parses the diff once here too (`git apply --numstat`), so a truncated or corrupt patch is
reported as such, never as a conflict."""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path, PurePosixPath

from unidiff import PatchSet
from unidiff.errors import UnidiffParseError

from rocmport.errors import BadInput
from rocmport.gitutil import run_git
from rocmport.upstreams import later_step_paths

ALLOWABLE = ("binary", "gitlinks", "mode-changes", "symlinks")
LINK, GITLINK = "120000", "160000"
_MODE_RE = re.compile(r"^(new file mode|deleted file mode|old mode|new mode) ([0-7]{6})$")
_INDEX_MODE_RE = re.compile(r"^index [0-9a-f]+\.\.[0-9a-f]+ ([0-7]{6})$")
_CORRUPT_RE = re.compile(
    r"(corrupt patch|corrupt binary patch|patch fragment without header|unrecognized input|"
    r"No valid patches in input|recount: unexpected line)(?:[^\n]*? at line (\d+))?",
    re.I,
)


@dataclass(frozen=True)
class FileChange:
    """One file of a diff."""

    path: str  # the path after the change
    source: str | None  # the path before (None: a new file)
    is_new: bool
    is_deleted: bool
    old_mode: str | None
    new_mode: str | None
    binary: bool
    link_target: str | None  # what a symlink the change leaves at ``path`` points to


def _bad_path(path: str) -> str | None:
    if path == "/dev/null":
        return None
    p = PurePosixPath(path)
    if p.is_absolute():
        return "is absolute"
    if ".." in p.parts:
        return "escapes the tree"
    if ".git" in p.parts:
        return "is inside .git/"
    if any(ord(c) < 0x20 for c in path):
        return "holds a control character"
    return None


def _strip(raw: str) -> str:
    return raw[2:] if raw.startswith(("a/", "b/")) else raw


def _modes(info: list[str]) -> tuple[str | None, str | None]:
    old = new = None
    for line in info:
        line = line.rstrip("\n")
        m = _MODE_RE.match(line)
        if m:
            kind, mode = m.groups()
            if kind in ("new file mode", "new mode"):
                new = mode
            else:
                old = mode
            continue
        m = _INDEX_MODE_RE.match(line)
        if m:  # `index a..b 100644`: unchanged mode
            old = old or m.group(1)
            new = new or m.group(1)
    return old, new


def _link_target(pf) -> str | None:
    added = [line.value for hunk in pf for line in hunk if line.is_added]
    return added[0].rstrip("\n") if added else None


def resolves_inside(link: str, target: str) -> bool:
    """Does a link at ``link`` (tree-relative) pointing to ``target`` stay inside the tree (and out of .git/), read lexically?"""
    if not target or target.startswith("/") or "\0" in target:
        return False
    joined = posixpath.normpath(posixpath.join(posixpath.dirname(link), target))
    parts = PurePosixPath(joined).parts
    return bool(parts) and parts[0] != ".." and ".git" not in parts


def later_step_writes(path: str) -> str | None:
    """The path a later step of apply writes at or below ``path`` (so a link there would be written through), or None."""
    for pattern in later_step_paths():
        pparts, parts = pattern.split("/"), path.split("/")
        if len(parts) <= len(pparts) and all(fnmatchcase(a, b) for a, b in zip(parts, pparts)):
            return pattern
    return None


def parse(diff: str, where: Path, *, first_line: int = 1, allow: frozenset[str] = frozenset()) -> list[FileChange]:
    """Every file ``diff`` changes, or BadInput naming ``where`` (and the line, when it is the diff's
    text that is wrong). ``first_line``: the file line the diff text starts on."""
    if "\0" in diff:
        raise BadInput(
            f"{where}: holds a NUL byte; a text patch never does (regenerate it with `rocmport patches export`)"
        )
    try:
        ps = PatchSet(diff)
    except UnidiffParseError as exc:
        m = re.search(r"line (\d+)", str(exc))
        at = f":{int(m.group(1)) + first_line - 1}" if m else ""
        what = " ".join(str(exc).split())  # unidiff quotes the offending line, newline and all: one line here
        raise BadInput(
            f"{where}{at}: corrupt patch: malformed diff ({what}); regenerate it with `rocmport patches export`"
        ) from None
    if not len(ps):
        raise BadInput(f"{where}: contains no file diff")
    _git_parses(diff, where, first_line)
    changes = []
    for pf in ps:
        for raw in (pf.source_file, pf.target_file):
            why = _bad_path(_strip(raw))
            if why:
                raise BadInput(f"{where}: path {_strip(raw)!r} {why}; refusing the patch")
        old, new = _modes([str(x) for x in pf.patch_info or ()])
        source = None if pf.is_added_file else _strip(pf.source_file)
        path = pf.path if not pf.is_removed_file else (source or pf.path)
        if (
            not len(pf)
            and not pf.is_binary_file
            and not pf.is_added_file
            and not pf.is_removed_file
            and not getattr(pf, "is_rename", False)
            and old == new
        ):
            raise BadInput(
                f"{where}: the diff of {path!r} has no hunks (a truncated patch?); regenerate it with `rocmport patches export`"
            )
        change = FileChange(
            path,
            source,
            pf.is_added_file,
            pf.is_removed_file,
            old,
            new,
            pf.is_binary_file,
            _link_target(pf) if new == LINK and not pf.is_removed_file else None,
        )
        _check_allowed(change, where, allow)
        changes.append(change)
    return changes


def _refuse(where: Path, path: str, what: str, key: str) -> BadInput:
    return BadInput(f"{where}: {path!r} {what}; refused unless the series says `allow: [{key}]`")


def _check_allowed(c: FileChange, where: Path, allow: frozenset[str]) -> None:
    if c.binary and "binary" not in allow:
        raise _refuse(where, c.path, "is a binary change", "binary")
    if GITLINK in (c.old_mode, c.new_mode) and not c.is_deleted and "gitlinks" not in allow:
        raise _refuse(where, c.path, "is a gitlink (submodule commit, mode 160000)", "gitlinks")
    becomes_link = c.new_mode == LINK and not c.is_deleted
    if becomes_link:
        if "symlinks" not in allow:
            raise _refuse(where, c.path, "becomes a symlink", "symlinks")
        if c.link_target is None or not resolves_inside(c.path, c.link_target):
            raise BadInput(
                f"{where}: {c.path!r} becomes a symlink to {c.link_target!r}, which resolves outside the tree; refusing the patch"
            )
        step = later_step_writes(c.path)
        if step:
            raise BadInput(
                f"{where}: {c.path!r} becomes a symlink where a later step of apply writes ({step}); refusing the patch"
            )
    elif (
        c.old_mode
        and c.new_mode
        and c.old_mode != c.new_mode
        and not c.is_new
        and not c.is_deleted
        and "mode-changes" not in allow
    ):
        raise _refuse(where, c.path, f"changes mode {c.old_mode} -> {c.new_mode}", "mode-changes")


def _git_parses(diff: str, where: Path, first_line: int) -> None:
    """git's own parser over the diff (it touches nothing): a truncated or corrupt patch is named here."""
    proc = run_git(
        "apply",
        "--numstat",
        "-",
        cwd=where.parent if where.parent.is_dir() else None,
        input=diff,
        check=False,
        text=False,
    )
    if proc.returncode == 0:
        return
    err = proc.stderr.decode("utf-8", "replace")
    m = _CORRUPT_RE.search(err)
    line = f":{int(m.group(2)) + first_line - 1}" if m and m.group(2) else ""
    first = next((ln for ln in err.splitlines() if ln.strip()), f"git apply exit {proc.returncode}").removeprefix(
        "error: "
    )
    what = (
        "truncated or edited by hand: git cannot parse it"
        if m and m.group(1).lower().startswith("corrupt patch")
        else first
    )
    raise BadInput(f"{where}{line}: corrupt patch ({what}); regenerate it with `rocmport patches export`")
