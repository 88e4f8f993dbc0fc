"""Stage 3's pytest command: `torchrun --nproc_per_node N -m pytest` with rocmport's plugin, pinned to
the tree's own pytest configuration (else an empty one)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING


from rocmport.verify.orchestration.launcher import Launcher
from rocmport.verify.stages.unit_tests import NAME

if TYPE_CHECKING:
    pass

# Part of the baseline cache key: a record read another way is not reused. 9: hang attribution by run
# order and time; 10: spawned children shimmed; 11: one device per rank; 12: upstream CI's deselection,
# in-order streams, TE submodules -> local; 13: the session's objects frozen after collection; 14:
# subgroups asked for on nccl get gloo; 15: what was collected, every selected file accounted for; 16:
# TE answers for verify --te: current_device 0 to TE frames, device selection a no-op; 18: a failure
# raised through the proxy shim's pass-through is sited past it (proxy_causes.without_hand_ons); 19:
# each test's random state seeded from its id; 20: the groups a test's class instance or TE's
# group-keyed caches held are released (a file's ranks no longer run out of threads).
PLUGIN_VERSION = "20"


FILES_PER_RUN = 16  # test files per torchrun: bounds what a long suite accumulates in one set of ranks


def pytest_command(tests: list[str], nproc: int, launcher: Launcher = Launcher()) -> list[str]:
    """Upstream CI's invocation (`torchrun --nproc_per_node N -m pytest`, one node), plus rocmport's plugin."""
    return launcher.command(
        nproc,
        [
            "-m",
            "pytest",
            "-p",
            "rocmport.verify.runtime.pytest_plugin",
            "-p",
            "no:cacheprovider",
            "--continue-on-collection-errors",
            "-q",
            "-o",
            "addopts=",
            *tests,
        ],
        NAME,
        single_node=True,
    )


def _file(nodeid: str) -> str:
    return nodeid.split("::")[0]


# The files pytest reads its configuration from, and the section that makes each one count (None: any).
_PYTEST_CONFIGS = (
    ("pytest.ini", None),
    (".pytest.ini", None),
    ("pyproject.toml", ("[tool.pytest.ini_options]", "[tool.pytest]")),
    ("tox.ini", ("[pytest]",)),
    ("setup.cfg", ("[tool:pytest]",)),
)


def tree_config(tree: Path, tests: list[str]) -> Path | None:
    """The pytest configuration file pytest would find for ``tests`` inside ``tree`` (from the test
    files' common directory up to the tree's root), or None when the tree has none."""
    dirs = [(tree / _file(t)).parent if not (tree / _file(t)).is_dir() else tree / _file(t) for t in tests]
    common = Path(os.path.commonpath([str(d) for d in dirs])) if dirs else tree
    here = common if common == tree or tree in common.parents else tree
    while True:
        for name, sections in _PYTEST_CONFIGS:
            path = here / name
            if path.is_file():
                if sections is None:
                    return path
                text = path.read_text(encoding="utf-8", errors="replace")
                if any(s in text for s in sections):
                    return path
        if here == tree:
            return None
        here = here.parent


def config_args(tree: Path, tests: list[str], empty_ini: Path) -> list[str]:
    """pytest's root and configuration pinned to the tree. Left to itself, pytest looks for a
    configuration file upwards from the tests and past the tree's root: a tree without one of its own
    (upstream's has pyproject.toml) inside a project that has one (build/refresh/megatron-lm under the
    rocmport project's pyproject.toml) got that project's directory as rootdir, and its options. Its
    test ids were then `build/refresh/megatron-lm/tests/...`, which match no selected file: a test
    that ran and passed was reported "pytest never collected it". ``empty_ini``: an empty file to
    give as the configuration where the tree has none (what pytest uses in a tree with no config);
    the caller writes it (`verify --dry-run` only names it)."""
    found = tree_config(tree, tests)
    if found is not None:
        return ["--rootdir", str(tree), "-c", str(found)]
    return ["--rootdir", str(tree), "-c", str(empty_ini), "--confcutdir", str(tree)]
