"""Stage 3's baseline: the unported tree at the same commit, checked out beside the port with the
port's test files and helper overlaid, run under the same conditions on the tests the labels need
(the port's non-passing ones, `to_label`), and cached by commit, those tests, overlay and plugin version."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from rocmport.fsutil import atomic_write_text, tree_read_bytes, tree_write_bytes, write_file
from rocmport.gitutil import git, run_git
from rocmport.upstreams import UPSTREAMS
from rocmport.verify.stages.unit_tests import suite
from rocmport.verify.stages.unit_tests.command import PLUGIN_VERSION, _file
from rocmport.verify.stages.unit_tests.results import SuiteRun
from rocmport.verify.stages.unit_tests.runner import Progress, rerun_alone, run_tests
from rocmport.verify.orchestration.launcher import Launcher
from rocmport.verify import runtime
from rocmport.verify.runtime import protocol

if TYPE_CHECKING:
    pass


def _swap_tree(env: dict, old: Path, new: Path) -> dict:
    return {
        **env,
        "PYTHONPATH": os.pathsep.join(str(new) if p == str(old) else p for p in env["PYTHONPATH"].split(os.pathsep)),
    }


@contextmanager
def unported_checkout(tree: Path, base: str, overlay: list[str]) -> Iterator[Path]:
    """The unported tree at ``base``, checked out beside the port (a git worktree of it, removed
    after) with the port's files ``overlay`` written over it (never through a link). Stage 3's and
    stage 4's baselines run in it."""
    with tempfile.TemporaryDirectory(prefix="rocmport-base-") as tmp:
        checkout = Path(tmp) / "tree"
        git("worktree", "add", "-q", "--detach", str(checkout), base, cwd=tree)
        try:
            for rel in overlay:
                tree_write_bytes(checkout, rel, tree_read_bytes(tree, rel))  # never through a link
            yield checkout
        finally:
            run_git("worktree", "remove", "--force", str(checkout), cwd=tree, check=False)


def unported_env(env: dict, tree: Path, checkout: Path) -> dict:
    """The port's run environment for the unported ``checkout``: its path in place of the tree's,
    and no port-site recording (the unported tree has no port sites)."""
    benv = _swap_tree(env, tree, checkout)
    protocol.PORT_SITES.unset(benv)
    return benv


def overlay_files(tree: Path, base: str) -> list[str]:
    """What the baseline takes from the port: its test files (the codemods' import guards) and the
    generated helpers they import. The library (megatron/) stays upstream's."""
    changed = run_git("diff", "--name-only", base, "--", "tests", cwd=tree, check=False).stdout.split()
    helpers = [h for h in (u.helper_path for u in UPSTREAMS.values()) if (tree / h).is_file()]
    return sorted({f for f in changed if (tree / f).is_file()} | set(helpers))


def to_label(tree: Path, tests: list[str], port: SuiteRun) -> list[str]:
    """What the unported tree runs for the labels, sorted: each test id the port failed or errored (a
    hang is a failure; its rerun alone there is baseline's), the whole file where the port's module
    does not import (labels._label_one counts the tests it ran there), the selected files below a
    conftest.py, package or directory whose collection failed, and the tests of a not-run file that have no
    outcome here (the file where it names none: it never ran). Empty: nothing to label, no baseline.
    A test that passed (or skipped) on the port is never run there: no label and no report reads it."""
    files = suite.test_files(tree, tests)
    out: set[str] = set()
    for nodeid, outcome in port.outcomes.items():
        if outcome not in ("failed", "error"):
            continue
        if "::" in nodeid or nodeid in files:
            out.add(nodeid)  # a test, or a test module of the selection that does not import: all of its tests there
            continue
        # a collector above the test files (a conftest.py, a package, a directory): the selected files below it
        where = str(Path(nodeid).parent) if nodeid.endswith(".py") else nodeid.rstrip("/")
        below = [f for f in files if where in ("", ".") or f.startswith(where + "/")]
        out.update(below or files)
    for f, account in port.files.items():
        if account.status == "not-run":
            out.update(account.not_run or (f,))
    return sorted(out)


def _run_files(tree: Path, tests: list[str], only: list[str]) -> list[str]:
    """The test files pytest is given for ``only``: the selection's files that hold one, in its order."""
    wanted = {_file(t) for t in only}
    files = suite.test_files(tree, tests)
    return [f for f in files if f in wanted] + sorted(wanted - set(files))


def baseline_cache(
    tree: Path,
    base: str,
    tests: list[str],
    env: dict,
    nproc: int,
    cache_dir: Path,
    overlay: list[str],
    only: list[str] | None = None,
) -> Path:
    """Where `baseline` keeps the unported tree's run of ``tests`` at ``base`` (a SuiteRun's to_dict()):
    keyed by what makes a run differ (the tests, and ``only``, the tests of them it ran; the plugin,
    torch, Python, the mode, the proxy's sources, the bytes of ``overlay``: overlay_files(tree, base), TE)."""
    import torch

    digest = hashlib.sha256(b"".join((tree / f).read_bytes() for f in overlay)).hexdigest()[:16]
    key = hashlib.sha256(
        json.dumps(
            [
                base,
                sorted(tests),
                nproc,
                PLUGIN_VERSION,
                torch.__version__,
                platform.python_version(),
                protocol.PROXY.raw(env),
                protocol.HIP_SIM.raw(env),
                digest,
                runtime.source_digest(),  # the proxy and plugin both trees' runs stood on
            ]
            # TE's Python layer (verify --te): a baseline run with another TE, or none, is not reused
            + ([protocol.TE.raw(env)] if protocol.TE.raw(env) else [])
            # the tests it ran (to_label): another set of failures on the port is another run there
            + ([sorted(only)] if only is not None else [])
        ).encode()
    ).hexdigest()[:20]
    return cache_dir / "unit-baselines" / f"{base[:12]}-{key}.json"


def baseline(
    tree: Path,
    base: str,
    tests: list[str],
    env: dict,
    nproc: int,
    cache_dir: Path,
    launcher: Launcher = Launcher(),
    progress: Progress | None = None,
    only: list[str] | None = None,
) -> tuple[SuiteRun, bool]:
    """The same tests on the unported tree at ``base`` under the port's conditions (see the module
    docstring), from the cache when it has them. ``only``: the test ids and files of them to run
    (to_label; None: all); the others are not run. Its hung tests are rerun alone too."""
    overlay = overlay_files(tree, base)
    cached = baseline_cache(tree, base, tests, env, nproc, cache_dir, overlay, only)
    if cached.is_file():
        return SuiteRun.from_dict(json.loads(cached.read_text())), True
    with unported_checkout(tree, base, overlay) as checkout:
        benv = {**unported_env(env, tree, checkout), **protocol.BASELINE_GUARDS.entry(True)}
        run = tests
        if only is not None:
            # pytest gets the files and the plugin the ids, in a file (protocol.UNIT_ONLY): an id given to
            # pytest that it cannot collect (its module does not import here) ends the whole session,
            # and a long list of ids is no command line
            listed = checkout.parent / "only.txt"
            write_file(listed, "".join(f"{t}\n" for t in only), durable=False)
            benv.update(protocol.UNIT_ONLY.entry(str(listed)))
            run = _run_files(tree, tests, only)
        result = run_tests(checkout, run, benv, nproc, launcher, progress=progress)
        result.alone = rerun_alone(
            checkout, sorted(set(result.hung)), benv, nproc, launcher, progress, result.alone_kinds
        )
    result.overlay = overlay
    if not (result.hung and (result.machine or {}).get("overloaded")):
        # hangs on a machine other jobs kept busy are not upstream's to remember: the next run measures again
        atomic_write_text(cached, json.dumps(result.to_dict(), indent=1, sort_keys=True))
    return result, False
