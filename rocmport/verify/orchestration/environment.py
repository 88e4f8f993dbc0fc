"""What verify's launched processes need beyond the machine (rocmport.machine): the tree's ordinary and
functional dependencies, and the started processes' environment."""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path


from rocmport.upstreams import MEGATRON_LM
from rocmport.verify.runtime import protocol

# Ordinary (non-NVIDIA) dependencies megatron imports, by module -> what to pip install.
ORDINARY_DEPS = {"einops": "einops", "packaging": "packaging", "numpy": "numpy"}
TRAINING_DEPS = {"six": "six", "regex": "regex", "pydantic": "pydantic", "triton": "triton"}


def missing_deps(tree: Path) -> dict[str, str]:
    """Ordinary dependencies of the tree that this interpreter lacks: module -> pip name."""
    needed = dict(ORDINARY_DEPS)
    if (tree / "megatron" / "training").is_dir():
        needed.update(TRAINING_DEPS)
    return {m: dist for m, dist in needed.items() if importlib.util.find_spec(m) is None}


# What upstream's pretrain_gpt.py needs besides megatron.training's imports, and why: module -> (pip
# name, what uses it).
FUNCTIONAL_DEPS = {
    # megatron/core/datasets/Makefile builds the dataset index helpers (a C++ compiler, make, `python3 -m pybind11`)
    "pybind11": ("pybind11", "megatron/core/datasets/Makefile builds the dataset helpers with it"),
    # upstream's cases save with --async-save --use-persistent-ckpt-worker: the persistent writer asks
    # psutil for its memory (an optional import upstream: without it the save fails after the first iterations)
    "psutil": ("psutil", "the persistent checkpoint writer of upstream's --async-save cases uses it"),
}


def functional_blockers(tree: Path) -> str | None:
    """What stage 4 lacks on this machine, as a one-line reason with the fix, else None."""

    if not (tree / MEGATRON_LM.package_dir / "datasets" / "Makefile").is_file():
        return None
    writer = tree / MEGATRON_LM.package_dir / "dist_checkpointing" / "strategies" / "filesystem_async.py"
    uses = {"pybind11": True, "psutil": writer.is_file() and "import psutil" in writer.read_text(errors="replace")}
    missing = {mod: dep for mod, dep in FUNCTIONAL_DEPS.items() if uses[mod] and importlib.util.find_spec(mod) is None}
    tools = [t for t in ("make",) if shutil.which(t) is None] + (
        [] if shutil.which("c++") or shutil.which("g++") else ["c++ (g++)"]
    )
    problems = []
    if missing:
        problems.append(
            f"missing dependency {', '.join(d for d, _ in missing.values())} ("
            + "; ".join(f"{d}: {why}" for d, why in missing.values())
            + f"): `{sys.executable} -m pip install {' '.join(d for d, _ in missing.values())}`"
        )
    if tools:
        problems.append(
            f"no {' or '.join(tools)} on PATH to build megatron's dataset helpers (install build-essential)"
        )
    return "; ".join(problems) or None


def child_env(tree: Path, bootstrap: Path, extra: dict[str, str | None], pycache: Path | None = None) -> dict[str, str]:
    """The started processes' environment: the tree (and the firewall) put first on the path, the
    bootstrap's bin/ (this interpreter as `python3`) first on PATH; ``extra`` on top (None: unset).
    Bytecode goes to ``pycache`` (PYTHONPYCACHEPREFIX), never into the tree; without one none is written."""
    env = dict(os.environ)
    parts = [str(bootstrap), str(tree)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    env.update(
        {
            "PYTHONPATH": os.pathsep.join(parts),
            "OMP_NUM_THREADS": env.get("OMP_NUM_THREADS", "1"),
            "PATH": os.pathsep.join([str(bootstrap / "bin"), env.get("PATH", "")]),
            **protocol.PYTHON.entry(sys.executable),
        }
    )
    if pycache is not None:
        # Bytecode is written, but under ``pycache``, not in the tree's __pycache__: written there, it
        # made the tree dirty for the next `apply` wherever the tree's .gitignore does not name it. Not
        # written at all (PYTHONDONTWRITEBYTECODE), every rank, checkpoint writer and data-loader worker
        # compiled megatron's sources again at each start (a tenth of stage 4's processor time on 2 cores).
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(pycache)
    else:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        env.pop("PYTHONPYCACHEPREFIX", None)
    for key, value in extra.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env
