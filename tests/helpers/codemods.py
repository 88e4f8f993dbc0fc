"""Run one codemod on a source string, and run rewritten code for real in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import libcst as cst

from rocmport.codemods import Context, registry
from rocmport.codemods.runner import helper_text


def rewrite(name: str, source: str, relpath: str = "megatron/core/x.py", options=None) -> tuple[str, int]:
    source = textwrap.dedent(source)
    module, sites = registry[name].transform(cst.parse_module(source), Context(relpath, options or {}))
    return module.code, sites


def assert_idempotent(name: str, source: str, relpath: str = "megatron/core/x.py"):
    once, _ = rewrite(name, source, relpath)
    twice, sites = rewrite(name, once, relpath)
    assert twice == once and sites == 0


def run_tree(tmp: Path, files: dict[str, str], code: str, hip: str | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    """Write ``files`` (plus the generated megatron/core/_rocm.py) under tmp and run ``code`` there.

    ``hip`` simulates a ROCm build of torch (torch.version.hip set before anything imports)."""
    for rel, text in {"megatron/__init__.py": "", "megatron/core/__init__.py": "",
                      "megatron/core/_rocm.py": helper_text(["test"]), **files}.items():
        (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp / rel).write_text(textwrap.dedent(text))
    prelude = f"import torch\ntorch.version.hip = {hip!r}\n"
    return subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code)], cwd=tmp, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(tmp), **(env or {})},
    )


# megatron/core/utils.py's TE version helpers at v0.16 (get_te_version() returns None without TE).
UTILS_V016 = '''\
from packaging.version import Version as PkgVersion

HAVE_PACKAGING = True
_te_version = None


def get_te_version():
    """Get TE version; None without TE."""
    try:
        import transformer_engine as te
    except ImportError:
        return None
    return PkgVersion(te.__version__)


def is_te_min_version(version, check_equality=True):
    """Check if minimum version of `transformer-engine` is installed."""
    if not HAVE_PACKAGING:
        raise ImportError("packaging is not installed.")

    if check_equality:
        return get_te_version() >= PkgVersion(version)
    return get_te_version() > PkgVersion(version)
'''
