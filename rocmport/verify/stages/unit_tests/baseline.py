"""Stage 3's baseline: the unported tree at the same commit, checked out beside the port with the
port's test files and helper overlaid, run under the same conditions, and cached by commit, overlay
and plugin version."""

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

from rocmport.fsutil import atomic_write_text, tree_read_bytes, tree_write_bytes
from rocmport.gitutil import git, run_git
from rocmport.upstreams import UPSTREAMS
from rocmport.verify.stages.unit_tests.command import PLUGIN_VERSION
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


def baseline_cache(
    tree: Path, base: str, tests: list[str], env: dict, nproc: int, cache_dir: Path, overlay: list[str]
) -> Path:
    """Where `baseline` keeps the unported tree's run of ``tests`` at ``base`` (a SuiteRun's to_dict()):
    keyed by what makes a run differ (the plugin, torch, Python, the mode, the proxy's sources, the bytes of ``overlay``:
    overlay_files(tree, base), TE)."""
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
) -> tuple[SuiteRun, bool]:
    """The same tests on the unported tree at ``base`` under the port's conditions (see the module
    docstring), from the cache when it has them. Its hung tests are rerun alone too."""
    overlay = overlay_files(tree, base)
    cached = baseline_cache(tree, base, tests, env, nproc, cache_dir, overlay)
    if cached.is_file():
        return SuiteRun.from_dict(json.loads(cached.read_text())), True
    with unported_checkout(tree, base, overlay) as checkout:
        benv = {**unported_env(env, tree, checkout), **protocol.BASELINE_GUARDS.entry(True)}
        result = run_tests(checkout, tests, benv, nproc, launcher, progress=progress)
        result.alone = rerun_alone(
            checkout, sorted(set(result.hung)), benv, nproc, launcher, progress, result.alone_kinds
        )
    result.overlay = overlay
    if not (result.hung and (result.machine or {}).get("overloaded")):
        # hangs on a machine other jobs kept busy are not upstream's to remember: the next run measures again
        atomic_write_text(cached, json.dumps(result.to_dict(), indent=1, sort_keys=True))
    return result, False
