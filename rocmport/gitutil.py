"""Every git subprocess call goes through here.

The git CLI is used rather than GitPython's object layer where git's own behaviour matters
(sparse index, ``apply --3way``, ``format-patch``); GitPython is used for read-only inspection.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from rocmport.errors import EXIT_PROBLEM, BadInput, RocmportError, is_control

# Transports git may use at all (defence in depth behind URL validation): never ext:: or fd::.
ALLOWED_PROTOCOLS = "file:git:http:https:ssh"

# A fixed identity and date for commits rocmport makes, so the same inputs give the same ids.
FIXED_IDENTITY = {
    "GIT_AUTHOR_NAME": "rocmport",
    "GIT_AUTHOR_EMAIL": "rocmport@localhost",
    "GIT_COMMITTER_NAME": "rocmport",
    "GIT_COMMITTER_EMAIL": "rocmport@localhost",
    "GIT_AUTHOR_DATE": "2000-01-01T00:00:00+0000",
    "GIT_COMMITTER_DATE": "2000-01-01T00:00:00+0000",
}


class GitError(RocmportError):
    """A git command failed; carries its stderr. Exit 1: the input was checked before git ran, so
    a failing git is a problem found (bad input raises BadInput before it gets here)."""

    exit_code = EXIT_PROBLEM

    def __init__(self, args, returncode: int, stderr: str, exit_code: int | None = None, cwd=None):
        self.args_run = list(args)
        self.returncode = returncode
        self.stderr = stderr
        first = next((ln for ln in stderr.splitlines() if ln.strip()), "").strip()
        said = f"git {' '.join(map(str, args[:3]))} failed"
        full = out_of_space(stderr, cwd)
        if full is not None:  # git says "unable to write file X", not why: the disk is named, and "no space left"
            super().__init__(
                f"{said}: {full}: no space left on device (git: {first}); free space there and run it again", exit_code
            )
            return
        super().__init__(f"{said}: {first or 'exit ' + str(returncode)}", exit_code)


# What git prints when a write failed; with a nearly full file system under its directory, the reason.
_WRITE_FAILED = (
    "no space left on device",
    "unable to write",
    "write error",
    "short write",
    "failed to write",
    "disk quota",
)
_NEARLY_FULL = 1 << 20  # bytes free: git's failed write left less than this


def out_of_space(stderr: str, cwd) -> str | None:
    """The directory whose file system is full when git's ``stderr`` says a write failed (its own
    words, or "unable to write file" with less than a MiB free under ``cwd``); else None."""
    said = stderr.lower()
    if not any(w in said for w in _WRITE_FAILED):
        return None
    where = Path(cwd) if cwd is not None else Path.cwd()
    if "no space left on device" in said or "disk quota" in said:
        return str(where)
    try:
        st = os.statvfs(where)
    except OSError:
        return None
    return str(where) if st.f_bavail * st.f_frsize < _NEARLY_FULL else None


def git_env(extra: dict | None = None) -> dict:
    env = dict(os.environ)
    env.update(
        {
            "GIT_TERMINAL_PROMPT": "0",
            "GIT_ALLOW_PROTOCOL": ALLOWED_PROTOCOLS,
            "GIT_CONFIG_NOSYSTEM": "1",
            "LC_ALL": "C",
        }
    )
    # Never let a user's global hooks path, signing or advice settings change what we commit.
    env.pop("GIT_DIR", None)
    env.pop("GIT_WORK_TREE", None)
    env.pop("GIT_INDEX_FILE", None)
    if extra:
        env.update(extra)
    return env


def run_git(
    *args,
    cwd: str | os.PathLike | None = None,
    check: bool = True,
    input: str | bytes | None = None,
    env: dict | None = None,
    text: bool = True,
    timeout: float | None = None,
) -> subprocess.CompletedProcess:
    """Run ``git ARGS`` and return the CompletedProcess; raise GitError when ``check`` and it fails."""
    cmd = [
        "git",
        "-c",
        "core.hooksPath=/dev/null",
        "-c",
        "commit.gpgSign=false",
        "-c",
        "tag.gpgSign=false",
        *map(str, args),
    ]
    if isinstance(input, str) and not text:
        input = input.encode()
    proc = subprocess.run(
        cmd,
        cwd=str(cwd) if cwd is not None else None,
        input=input,
        capture_output=True,
        text=text,
        env=git_env(env),
        timeout=timeout,
    )
    if check and proc.returncode != 0:
        stderr = proc.stderr if text else proc.stderr.decode(errors="replace")
        raise GitError(list(args), proc.returncode, stderr, cwd=cwd)
    return proc


def check_operand(value: str, what: str, fix: str) -> str:
    """``value`` as a git operand (a remote, ref, branch or push target from the user or a file), or
    BadInput (exit 2) naming ``what``: one that starts with '-' would be read by git as an option
    (``--upload-pack=CMD`` runs CMD), and a control character has no place in a name. Every git call
    with such an operand also ends the options first (``--`` or ``--end-of-options``): this check
    tells the user at the option, the separator keeps git safe whatever reaches it."""
    if not value or not value.strip():
        raise BadInput(f"{what} {value!r}: empty; {fix}")
    if value.startswith("-"):
        raise BadInput(f"{what} {value!r}: starts with '-', which git would read as an option; {fix}")
    if any(map(is_control, value)):
        raise BadInput(f"{what} {value!r}: has a control character; {fix}")
    return value


def git(*args, cwd=None, **kw) -> str:
    """Run git and return stdout stripped of the trailing newline."""
    return run_git(*args, cwd=cwd, **kw).stdout.rstrip("\n")


def rev_parse(ref: str, cwd) -> str | None:
    """The commit ``ref`` names, or None (unborn HEAD, unknown ref)."""
    proc = run_git("rev-parse", "--verify", "--quiet", "--end-of-options", f"{ref}^{{commit}}", cwd=cwd, check=False)
    return (proc.stdout.strip() or None) if proc.returncode == 0 else None


def has_commit(git_dir: str | os.PathLike, commit: str) -> bool:
    """Does the repository hold ``commit`` (a commit, not just any object)?"""
    return run_git("cat-file", "-e", f"{commit}^{{commit}}", cwd=git_dir, check=False).returncode == 0


def is_git_dir(path: str | os.PathLike) -> bool:
    p = Path(path)
    if not p.exists():
        return False
    proc = run_git("rev-parse", "--git-dir", cwd=p, check=False)
    return proc.returncode == 0


def z_paths(out: str) -> list[str]:
    """The paths of a NUL-separated (`-z`) git listing: names with spaces, quotes, newlines or
    non-ASCII characters come through as they are, never quoted or split."""
    return [p for p in out.split("\0") if p]


def status_paths(tree: str | os.PathLike, untracked: str = "normal") -> list[str]:
    """Every path `git status` reports as changed or untracked (a rename: both its names), exactly."""
    fields = run_git("status", "--porcelain", "-z", f"--untracked-files={untracked}", cwd=tree).stdout.split("\0")
    out, i = [], 0
    while i < len(fields):
        entry = fields[i]
        i += 1
        if len(entry) < 4:
            continue
        out.append(entry[3:])
        if entry[0] in "RC":  # `R  new\0old`: the source follows
            out.append(fields[i])
            i += 1
    return out


# Lock files git creates while it writes: a killed git leaves them behind. Under objects/ only the
# auto maintenance's lock (a commit starts `git maintenance run --auto`, which takes it).
_TOP_LOCKS = (
    "objects/maintenance.lock",
    "index.lock",
    "HEAD.lock",
    "ORIG_HEAD.lock",
    "FETCH_HEAD.lock",
    "config.lock",
    "packed-refs.lock",
    "shallow.lock",
    "MERGE_HEAD.lock",
    "CHERRY_PICK_HEAD.lock",
    "AUTO_MERGE.lock",
)


def git_lock_files(git_dir: Path) -> list[Path]:
    """git's own *.lock files in ``git_dir`` (top level, objects/maintenance.lock, refs/, info/, logs/)."""
    found = [git_dir / n for n in _TOP_LOCKS if (git_dir / n).is_file()]
    for sub in ("refs", "info", "logs"):
        base = git_dir / sub
        if base.is_dir():
            found += sorted(p for p in base.rglob("*.lock") if p.is_file() and not p.is_symlink())
    return found


def live_git_processes(root: Path) -> list[int]:
    """Pids of running git processes working in ``root`` (their cwd, or a file they hold open, is
    inside it). Linux /proc; elsewhere nothing can be told, and every git counts as live."""
    proc = Path("/proc")
    if not proc.is_dir():
        return [-1]
    base = os.path.realpath(root) + os.sep
    me, found = os.getpid(), []
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            if not (entry / "comm").read_text().startswith("git"):
                continue
            if (os.readlink(entry / "cwd") + os.sep).startswith(base):
                found.append(int(entry.name))
                continue
            for fd in (entry / "fd").iterdir():
                try:
                    if os.readlink(fd).startswith(base):
                        found.append(int(entry.name))
                        break
                except OSError:
                    continue
        except OSError:  # gone, or not ours to look at
            continue
    return found


def clear_stale_locks(git_dir: Path, work_root: Path | None = None) -> list[Path]:
    """Remove git's lock files in ``git_dir`` that a killed process left behind, and return them.

    Only call this while holding rocmport's own file lock for that repository: then no other
    rocmport works there, and a lock file no live git process (working in ``work_root``, default
    the git dir) can hold is stale. When a git process is live there, nothing is removed."""
    locks = git_lock_files(git_dir)
    if not locks or live_git_processes(work_root or git_dir):
        return []
    for lock in locks:
        lock.unlink(missing_ok=True)
    return locks
