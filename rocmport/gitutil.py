"""Every git subprocess call goes through here.

The git CLI is used rather than GitPython's object layer where git's own behaviour matters
(sparse index, ``apply --3way``, ``format-patch``); GitPython is used for read-only inspection.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from rocmport.errors import EXIT_PROBLEM, RocmportError

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

    def __init__(self, args, returncode: int, stderr: str, exit_code: int | None = None):
        self.args_run = list(args)
        self.returncode = returncode
        self.stderr = stderr
        first = next((ln for ln in stderr.splitlines() if ln.strip()), "").strip()
        super().__init__(f"git {' '.join(map(str, args[:3]))} failed: {first or 'exit ' + str(returncode)}", exit_code)


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
    cmd = ["git", "-c", "core.hooksPath=/dev/null", "-c", "commit.gpgSign=false", "-c", "tag.gpgSign=false", *map(str, args)]
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
        raise GitError(list(args), proc.returncode, stderr)
    return proc


def git(*args, cwd=None, **kw) -> str:
    """Run git and return stdout stripped of the trailing newline."""
    return run_git(*args, cwd=cwd, **kw).stdout.rstrip("\n")


def rev_parse(ref: str, cwd) -> str | None:
    """The commit ``ref`` names, or None (unborn HEAD, unknown ref)."""
    proc = run_git("rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}", cwd=cwd, check=False)
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
