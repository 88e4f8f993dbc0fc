"""device-probes and flash-attention-hooks: before/after, and ROCm vs CUDA behaviour."""

import pytest

from tests.helpers.codemods import assert_idempotent, rewrite, run_tree

ENERGY = '''\
"""Megatron Energy Monitoring (NVML)"""

import torch

try:
    from pynvml import nvmlInit

    has_nvml = True
except ImportError:
    has_nvml = False


class EnergyMonitor:
    def setup(self) -> None:
        if has_nvml:
            nvmlInit()
'''

AFFINITY = '''\
def set_ideal_affinity_for_current_gpu():
    """Set CPU affinity for the current GPU to optimize host-device transfers."""
    import pynvml

    pynvml.nvmlInit()
'''

ATTENTION = '''\
try:
    from flash_attn_3.flash_attn_interface import _flash_attn_forward

    HAVE_FA3 = True
except ImportError:
    HAVE_FA3 = False

try:
    from flash_attn import flash_attn_varlen_func
except ImportError:
    flash_attn_varlen_func = None
'''

UTILS = '''\
from packaging.version import Version as PkgVersion

_fa_version = None


def get_fa_version():
    """Get Flash attention version from __version__"""

    def get_fa_version_str():
        import flash_attn as fa

        return str(fa.__version__)

    global _fa_version
    if _fa_version is None:
        _fa_version = PkgVersion(get_fa_version_str())
    return _fa_version
'''

FAKE_PYNVML = {"pynvml.py": "def nvmlInit():\n    raise RuntimeError('NVML Shared Library Not Found')\n"}


def test_energy_and_affinity_before_after():
    after, sites = rewrite("device-probes", ENERGY, "megatron/core/energy_monitor.py")
    assert sites == 1 and ("    has_nvml = False\nfrom megatron.core._rocm import is_hip as _rocmport_is_hip\n"
                           "if _rocmport_is_hip():\n    has_nvml = False  # rocmport:") in after
    assert_idempotent("device-probes", ENERGY, "megatron/core/energy_monitor.py")
    after, sites = rewrite("device-probes", AFFINITY, "megatron/core/pipeline_parallel/utils.py")
    assert sites == 1 and '"""Set CPU affinity for the current GPU to optimize host-device transfers."""\n    from megatron.core._rocm import is_hip\n    if is_hip():\n        return' in after
    assert_idempotent("device-probes", AFFINITY, "megatron/core/pipeline_parallel/utils.py")


@pytest.mark.torch
def test_energy_monitor_off_on_rocm_upstream_on_cuda(tmp_path):
    after, _ = rewrite("device-probes", ENERGY, "megatron/core/energy_monitor.py")
    files = {**FAKE_PYNVML, "megatron/core/energy_monitor.py": after}
    code = "from megatron.core import energy_monitor as e\ntry:\n    e.EnergyMonitor().setup(); print(e.has_nvml, 'ok')\nexcept RuntimeError as x:\n    print(e.has_nvml, x)\n"
    assert run_tree(tmp_path / "r", files, code, hip="6.4.1").stdout.strip() == "False ok"
    assert run_tree(tmp_path / "c", files, code).stdout.strip() == "True NVML Shared Library Not Found"


@pytest.mark.torch
def test_affinity_noop_on_rocm(tmp_path):
    after, _ = rewrite("device-probes", AFFINITY, "megatron/core/pipeline_parallel/utils.py")
    files = {**FAKE_PYNVML, "megatron/core/pipeline_parallel/__init__.py": "", "megatron/core/pipeline_parallel/utils.py": after}
    code = "from megatron.core.pipeline_parallel.utils import set_ideal_affinity_for_current_gpu as f\ntry:\n    print(f())\nexcept RuntimeError as x:\n    print(x)\n"
    assert run_tree(tmp_path / "r", files, code, hip="6.4.1").stdout.strip() == "None"
    assert run_tree(tmp_path / "c", files, code).stdout.strip() == "NVML Shared Library Not Found"


@pytest.mark.torch
def test_fa3_off_on_rocm(tmp_path):
    after, sites = rewrite("flash-attention-hooks", ATTENTION, "megatron/core/transformer/attention.py")
    assert sites == 1 and "if _rocmport_is_hip():\n    HAVE_FA3 = False  # rocmport:" in after
    assert after.index("HAVE_FA3 = False  # rocmport") < after.index("from flash_attn import")
    assert_idempotent("flash-attention-hooks", ATTENTION, "megatron/core/transformer/attention.py")
    fa3 = {"flash_attn_3/__init__.py": "", "flash_attn_3/flash_attn_interface.py": "def _flash_attn_forward(): pass\n",
           "megatron/core/transformer/__init__.py": "", "megatron/core/transformer/attention.py": after}
    code = "from megatron.core.transformer import attention as a\nprint(a.HAVE_FA3)\n"
    assert run_tree(tmp_path / "r", fa3, code, hip="6.4.1").stdout.strip() == "False"
    assert run_tree(tmp_path / "c", fa3, code).stdout.strip() == "True"


@pytest.mark.torch
def test_fa_version_without_flash_attn(tmp_path):
    after, sites = rewrite("flash-attention-hooks", UTILS, "megatron/core/utils.py")
    assert sites == 1
    assert_idempotent("flash-attention-hooks", UTILS, "megatron/core/utils.py")
    code = "from megatron.core.utils import get_fa_version\nprint(get_fa_version())\n"
    assert run_tree(tmp_path / "a", {"megatron/core/utils.py": after}, code).stdout.strip() == "0.0.0"
    assert "ModuleNotFoundError" in run_tree(tmp_path / "u", {"megatron/core/utils.py": UTILS}, code).stderr
    fa = {"flash_attn/__init__.py": "__version__ = '2.7.4'\n", "megatron/core/utils.py": after}
    assert run_tree(tmp_path / "p", fa, code).stdout.strip() == "2.7.4"
