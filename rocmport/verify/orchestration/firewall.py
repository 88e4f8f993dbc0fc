"""Import firewall: the processes verify starts see NVIDIA-only packages as simply not installed.

A sitecustomize.py first on PYTHONPATH wraps every meta-path finder so that blocked top-level
modules are never found: `importlib.util.find_spec(name)` returns None and `import name` raises
ModuleNotFoundError, exactly as when the package is absent, so ported `HAVE_X` guards work.

The same bootstrap then runs rocmport.verify.runtime.bootstrap, which installs, in CPU-proxy mode,
the HIP simulation (`hip_sim`, every process) and the proxy shim in the workers of upstream scripts
(`proxy_shim.install_for_script`) and in the children a unit-test rank spawns."""

from __future__ import annotations

import string
import sys
from pathlib import Path

from rocmport.fsutil import write_file
from rocmport.nvidia_only import blocked
from rocmport.verify.runtime import protocol

# The bootstrap's sitecustomize.py. Its firewall runs in any Python a started process may be (a
# build step's, with no rocmport to import), so the protocol's names are written into its text; the
# rest is rocmport.verify.runtime.bootstrap, on the interpreter verify runs on only.
SITECUSTOMIZE = string.Template("""\
# Written by rocmport verify: emulate the absence of NVIDIA-only packages.
import os
import sys

_BLOCKED = frozenset(filter(None, os.environ.get("$firewall", "").split(",")))


class _Firewall:
    def __init__(self, inner):
        self._inner = inner

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in _BLOCKED:
            return None
        find = getattr(self._inner, "find_spec", None)
        return find(name, path, target) if find else None

    def __getattr__(self, attr):
        return getattr(self._inner, attr)


if _BLOCKED:
    sys.meta_path[:] = [f if isinstance(f, _Firewall) else _Firewall(f) for f in sys.meta_path]
    for _name in [m for m in sys.modules if m.partition(".")[0] in _BLOCKED]:
        del sys.modules[_name]

# The rest only in the interpreter verify runs on, started by verify or its launchers: another
# Python, or `python3` from PATH as a build step runs it (megatron's dataset Makefile: `python3 -m
# pybind11`; bin/python3 marks it a build step), gets the firewall alone.
if os.environ.get("$python") == sys.executable and os.environ.get("$build_step") != "1":
    from rocmport.verify.runtime import bootstrap as _bootstrap

    _bootstrap.install()
""").substitute(firewall=protocol.FIREWALL.name, python=protocol.PYTHON.name, build_step=protocol.BUILD_STEP.name)


PYTHON_CONFIG = """\
#!{python} -S
# Written by rocmport verify: python3-config for the interpreter verify runs on (a build step in the
# tree, e.g. megatron's dataset-helper Makefile, asks it for the extension suffix and includes).
import sys, sysconfig
paths = sysconfig.get_paths()
answers = {{"--extension-suffix": sysconfig.get_config_var("EXT_SUFFIX"), "--prefix": sys.prefix,
           "--includes": f"-I{{paths['include']}} -I{{paths['platinclude']}}"}}
print(" ".join(answers[a] for a in sys.argv[1:] if a in answers))
"""


def write_bootstrap(directory: Path) -> Path:
    """The bootstrap directory: first on the started processes' PYTHONPATH (sitecustomize.py), and
    its bin/ first on their PATH, where `python`, `python3` and `python3-config` are the
    interpreter verify runs on (a build step in the tree must not pick another Python from PATH)."""
    directory.mkdir(parents=True, exist_ok=True)
    write_file(directory / "sitecustomize.py", SITECUSTOMIZE)
    bindir = directory / "bin"
    bindir.mkdir(exist_ok=True)
    # `python3` from PATH is what a build step runs (megatron's Makefile: `python3 -m pybind11`): it
    # gets the firewall only (no HIP simulation or shim importing torch and megatron, ~10 s each).
    scripts = {
        name: f'#!/bin/sh\n{protocol.BUILD_STEP.name}=1 exec "{sys.executable}" "$@"\n'
        for name in ("python", "python3")
    }  # not links: a
    scripts["python3-config"] = PYTHON_CONFIG.format(
        python=sys.executable
    )  # venv's Python finds its venv by its own path
    for name, text in scripts.items():
        write_file(bindir / name, text, mode=0o755)
    return directory


def firewall_env(profile: str) -> dict[str, str]:
    return protocol.FIREWALL.entry(tuple(blocked(profile)))
