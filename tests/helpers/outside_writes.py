"""What a test run must leave alone, and a pytest plugin that fails the run when it did not.

Every test writes under its own temporary directories (tests/conftest.py points rocmport's cache,
XDG_CACHE_HOME and the default project directory there). This plugin is the check behind that rule:
a snapshot of the checkout (`git status --ignored` and every file under build/, where verify writes
its reports and last.json) and of the user's ~/.cache/rocmport* before the session, compared after
it. A difference fails the run, naming each path, so a test that writes into the project or the
user's cache is found the run it is added, not by a user whose `rocmport status` shows a fake verify.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

# What running Python and pytest itself leaves in a checkout: bytecode and the tools' own caches.
EXPECTED_IN_CHECKOUT = frozenset({"__pycache__", ".pytest_cache", ".hypothesis", ".mypy_cache", ".ruff_cache"})
# In the user's cache, entries this deep are watched: deep enough to see a new directory and the files
# in it (unit-baselines/<key>.json), shallow enough that a sync run elsewhere updating a mirror's
# objects (mirrors/<name>.git/objects/...) is not taken for this run's doing.
CACHE_DEPTH = 2


def _walk(root: Path, depth: int | None) -> dict[str, str]:
    """Each path under ``root`` (relative), with its size and modification time for a file, up to
    ``depth`` levels (None: all)."""
    found: dict[str, str] = {}
    for here, dirs, files in os.walk(root):
        rel = Path(here).relative_to(root)
        level = len(rel.parts)
        for name in files:
            path = Path(here) / name
            try:
                st = path.lstat()
            except OSError:
                continue  # gone between the listing and the stat: the next snapshot says so
            found[str(rel / name)] = "" if depth is not None else f"{st.st_size} {st.st_mtime_ns}"
        for name in dirs:
            found[str(rel / name) + "/"] = ""
        if depth is not None and level + 1 >= depth:
            dirs[:] = []
    return found


def snapshot(checkout: Path, cache_home: Path, exempt: frozenset[Path] = frozenset()) -> dict[str, str]:
    """What a run must not change: ``checkout``'s git status (tracked, untracked and ignored, less
    bytecode and tool caches), the files under its build/, and ``cache_home``/rocmport* (less ``exempt``)."""
    state: dict[str, str] = {}
    proc = subprocess.run(
        ["git", "status", "--porcelain", "--ignored"], cwd=checkout, capture_output=True, text=True, check=False
    )
    if proc.returncode == 0:  # not a git checkout (an sdist's tests): build/ alone is watched
        for line in proc.stdout.splitlines():
            path = line[3:].strip('"')
            if not EXPECTED_IN_CHECKOUT.intersection(Path(path).parts) and not path.endswith(".egg-info/"):
                state[f"{checkout}/{path}"] = line[:2]
    if (checkout / "build").is_dir():
        for rel, stat in _walk(checkout / "build", None).items():
            state[str(checkout / "build" / rel)] = stat
    if cache_home.is_dir():
        for cache in sorted(cache_home.glob("rocmport*")):
            if cache.resolve() in exempt:
                continue
            state[str(cache) + "/"] = ""
            if cache.is_dir():
                for rel in _walk(cache, CACHE_DEPTH):
                    state[str(cache / rel)] = ""
    return state


def changes(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """One line per path that appeared, went or changed, in path order."""
    lines = []
    for path in sorted(set(before) | set(after)):
        if path not in before:
            lines.append(f"new: {path}")
        elif path not in after:
            lines.append(f"gone: {path}")
        elif before[path] != after[path]:
            lines.append(f"changed: {path}")
    return lines


def cache_home() -> Path:
    """The user's cache directory as rocmport finds it (XDG_CACHE_HOME, else ~/.cache), read before any
    fixture points it at a temporary directory."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")


class OutsideWrites:
    """The plugin: a snapshot at the session's start, compared at its end (in the controlling process
    only, under xdist: the workers share the one checkout and cache)."""

    def __init__(self, checkout: Path, exempt: frozenset[Path] = frozenset()):
        self.checkout = checkout
        self.home = cache_home()
        self.exempt = exempt
        self.before: dict[str, str] | None = None

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        if not hasattr(session.config, "workerinput"):
            self.before = snapshot(self.checkout, self.home, self.exempt)

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if self.before is None:
            return
        found = changes(self.before, snapshot(self.checkout, self.home, self.exempt))
        if not found:
            return
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        lines = [
            "tests wrote outside their temporary directories (into the checkout or the user's cache); "
            "point the writer at tmp_path:",
            *(f"  {line}" for line in found),
        ]
        if reporter is not None:
            reporter.write("\n")
            reporter.write_sep("=", "writes outside tmp", red=True)
            for line in lines:
                reporter.write_line(line)
        if session.exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
