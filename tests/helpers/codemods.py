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
    return rewrite_with_reports(name, source, relpath, options)[:2]


def rewrite_with_reports(name: str, source: str, relpath: str = "megatron/core/x.py", options=None):
    """(text after the codemod, sites, its reports)."""
    source = textwrap.dedent(source)
    ctx = Context(relpath, options or {}, codemod=name)
    module, sites = registry[name].transform(cst.parse_module(source), ctx)
    return module.code, sites, ctx.reports


def assert_codemod(name: str, before: str, after: str, relpath: str = "megatron/core/x.py", sites: int | None = None, options=None):
    """LibCST's assertCodemod: ``before`` becomes exactly ``after``; a second run changes nothing."""
    got, n = rewrite(name, before, relpath, options)
    assert got == textwrap.dedent(after)
    if sites is not None:
        assert n == sites
    again, n2 = rewrite(name, got, relpath, options)
    assert (again, n2) == (got, 0), "not idempotent"


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
