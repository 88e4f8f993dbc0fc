"""Import firewall: the processes verify starts see NVIDIA-only packages as simply not installed.

A sitecustomize.py first on PYTHONPATH wraps every meta-path finder so that blocked top-level
modules are never found: `importlib.util.find_spec(name)` returns None and `import name` raises
ModuleNotFoundError, exactly as when the package is absent, so ported `HAVE_X` guards work."""

from __future__ import annotations

from pathlib import Path

from rocmport.nvidia_only import blocked

SITECUSTOMIZE = '''\
# Written by rocmport verify: emulate the absence of NVIDIA-only packages.
import os
import sys

_BLOCKED = frozenset(filter(None, os.environ.get("ROCMPORT_FIREWALL", "").split(",")))


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

# Upstream scripts (pretrain_gpt.py) in CPU-proxy mode: the shim goes into each torchrun worker.
# (Under Slurm, rocmport.verify.slurm_task installs it once it has set the rank variables.)
if os.environ.get("ROCMPORT_SHIM_WORKERS") == "1" and "LOCAL_RANK" in os.environ:
    from rocmport.verify import proxy_shim as _shim

    _shim.install_for_upstream_code()
'''


def write_bootstrap(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "sitecustomize.py").write_text(SITECUSTOMIZE)
    return directory


def firewall_env(profile: str) -> dict[str, str]:
    return {"ROCMPORT_FIREWALL": ",".join(blocked(profile))}
