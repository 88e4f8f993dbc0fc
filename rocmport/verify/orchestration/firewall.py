"""Import firewall: the processes verify starts see NVIDIA-only packages as simply not installed.

A sitecustomize.py first on PYTHONPATH wraps every meta-path finder so that blocked top-level
modules are never found: `importlib.util.find_spec(name)` returns None and `import name` raises
ModuleNotFoundError, exactly as when the package is absent, so ported `HAVE_X` guards work.

The same bootstrap installs, in CPU-proxy mode, the HIP simulation (`hip_sim`, every process) and
the proxy shim in the workers of upstream scripts (`proxy_shim.install_for_script`) and in the
children a unit-test rank spawns."""

from __future__ import annotations

import sys
from pathlib import Path

from rocmport.nvidia_only import blocked

SITECUSTOMIZE = """\
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

# The rest only in the interpreter verify runs on, started by verify or its launchers: another
# Python, or `python3` from PATH as a build step runs it (megatron's dataset Makefile: `python3 -m
# pybind11`; bin/python3 marks it ROCMPORT_BUILD_STEP), gets the firewall alone.
_OURS = os.environ.get("ROCMPORT_PYTHON") == sys.executable and not os.environ.get("ROCMPORT_BUILD_STEP")

# HIP simulation (CPU proxy): this process's torch is a ROCm build of $ROCMPORT_HIP_SIM.
if _OURS and os.environ.get("ROCMPORT_HIP_SIM"):
    from rocmport.verify import hip_sim as _hip_sim

    _hip_sim.install()

# Transformer Engine's own Python layer on the CPU proxy (verify --te): its compiled extension is
# rocmport.verify.te_cpu (see rocmport.verify.te_layer).
if _OURS and os.environ.get("ROCMPORT_TE"):
    from rocmport.verify.orchestration import te_layer as _te_layer

    _te_layer.install()

# Port coverage: which of the tree's modules this process imported (the generated helpers record
# the rewritten call sites that ran; see rocmport.verify.port_sites).
if _OURS and os.environ.get("ROCMPORT_PORT_SITES"):
    import atexit

    def _rocmport_modules(directory=os.environ["ROCMPORT_PORT_SITES"]):
        files = sorted({f for f in (getattr(m, "__file__", None) for m in list(sys.modules.values())) if f and "/megatron/" in f})
        with open(os.path.join(directory, f"modules-{os.getpid()}.txt"), "a", encoding="utf-8") as fh:
            fh.write("".join(f + "\\n" for f in files))

    atexit.register(_rocmport_modules)

# Upstream scripts (pretrain_gpt.py) in CPU-proxy mode: the shim goes into each torchrun worker.
# (Under Slurm, rocmport.verify.slurm_task installs it once it has set the rank variables.)
if _OURS and os.environ.get("ROCMPORT_SHIM_WORKERS") == "1" and "LOCAL_RANK" in os.environ:
    from rocmport.verify import proxy_shim as _shim

    _shim.install_for_script()
# A child that a unit-test rank (shimmed by the pytest plugin, which sets ROCMPORT_SHIM_CHILDREN)
# starts with multiprocessing's spawn gets the same shim: upstream's persistent async-checkpoint
# worker begins with torch.cuda.set_device(rank % torch.cuda.device_count()); unshimmed, it dies
# there and its rank waits on a queue for ever (a hang on the port and the unported tree alike).
elif _OURS and os.environ.get("ROCMPORT_SHIM_CHILDREN") == "1" and "--multiprocessing-fork" in sys.argv:
    from rocmport.verify import proxy_shim as _shim

    try:
        _shim.install_for_upstream_code()
    except _shim.Unsupported:  # the rank that started it has reported the missing hook
        pass

"""


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
    (directory / "sitecustomize.py").write_text(SITECUSTOMIZE)
    bindir = directory / "bin"
    bindir.mkdir(exist_ok=True)
    # `python3` from PATH is what a build step runs (megatron's Makefile: `python3 -m pybind11`): it
    # gets the firewall only (no HIP simulation or shim importing torch and megatron, ~10 s each).
    scripts = {
        name: f'#!/bin/sh\nROCMPORT_BUILD_STEP=1 exec "{sys.executable}" "$@"\n' for name in ("python", "python3")
    }  # not links: a
    scripts["python3-config"] = PYTHON_CONFIG.format(
        python=sys.executable
    )  # venv's Python finds its venv by its own path
    for name, text in scripts.items():
        (bindir / name).write_text(text)
        (bindir / name).chmod(0o755)
    return directory


def firewall_env(profile: str) -> dict[str, str]:
    return {"ROCMPORT_FIREWALL": ",".join(blocked(profile))}
