"""device-probes: before/after, and ROCm vs CUDA behaviour."""

import pytest

from tests.helpers.codemods import assert_codemod, assert_idempotent, rewrite, run_tree

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

FAKE_PYNVML = {"pynvml.py": "def nvmlInit():\n    raise RuntimeError('NVML Shared Library Not Found')\n"}


def test_energy_and_affinity_before_after():
    after, sites = rewrite("device-probes", ENERGY, "megatron/core/energy_monitor.py")
    assert (
        sites == 1
        and (
            "    has_nvml = False\nfrom megatron.core._rocm import is_hip as _rocmport_is_hip\n"
            "if _rocmport_is_hip():\n    has_nvml = False  # rocmport:"
        )
        in after
    )
    assert_idempotent("device-probes", ENERGY, "megatron/core/energy_monitor.py")
    after, sites = rewrite("device-probes", AFFINITY, "megatron/core/pipeline_parallel/utils.py")
    assert (
        sites == 1
        and '"""Set CPU affinity for the current GPU to optimize host-device transfers."""\n'
        "    from megatron.core._rocm import is_hip\n    if is_hip():\n        return"
        in after
    )
    assert_idempotent("device-probes", AFFINITY, "megatron/core/pipeline_parallel/utils.py")


@pytest.mark.torch
def test_energy_monitor_off_on_rocm_upstream_on_cuda(tmp_path):
    after, _ = rewrite("device-probes", ENERGY, "megatron/core/energy_monitor.py")
    files = {**FAKE_PYNVML, "megatron/core/energy_monitor.py": after}
    code = (
        "from megatron.core import energy_monitor as e\ntry:\n"
        "    e.EnergyMonitor().setup(); print(e.has_nvml, 'ok')\nexcept RuntimeError as x:\n"
        "    print(e.has_nvml, x)\n"
    )
    assert run_tree(tmp_path / "r", files, code, hip="6.4.1").stdout.strip() == "False ok"
    assert run_tree(tmp_path / "c", files, code).stdout.strip() == "True NVML Shared Library Not Found"


@pytest.mark.torch
def test_affinity_noop_on_rocm(tmp_path):
    after, _ = rewrite("device-probes", AFFINITY, "megatron/core/pipeline_parallel/utils.py")
    files = {
        **FAKE_PYNVML,
        "megatron/core/pipeline_parallel/__init__.py": "",
        "megatron/core/pipeline_parallel/utils.py": after,
    }
    code = (
        "from megatron.core.pipeline_parallel.utils import set_ideal_affinity_for_current_gpu as f\n"
        "try:\n    print(f())\nexcept RuntimeError as x:\n    print(x)\n"
    )
    assert run_tree(tmp_path / "r", files, code, hip="6.4.1").stdout.strip() == "None"
    assert run_tree(tmp_path / "c", files, code).stdout.strip() == "NVML Shared Library Not Found"


def test_energy_exact_before_after():
    assert_codemod(
        "device-probes",
        ENERGY,
        ENERGY.replace(
            "    has_nvml = False\n",
            (
                "    has_nvml = False\n"
                "from megatron.core._rocm import is_hip as _rocmport_is_hip\n"
                "if _rocmport_is_hip():\n"
                "    has_nvml = False  # rocmport: NVML counters are NVIDIA-only (pynvml imports on ROCm, nvmlInit fails)\n"
            ),
            1,
        ),
        "megatron/core/energy_monitor.py",
        sites=1,
    )


def test_affinity_exact_before_after():
    assert_codemod(
        "device-probes",
        AFFINITY,
        '''\
        def set_ideal_affinity_for_current_gpu():
            """Set CPU affinity for the current GPU to optimize host-device transfers."""
            from megatron.core._rocm import is_hip
            if is_hip():
                return  # rocmport: NVML/cuda-python affinity is NVIDIA-only
            import pynvml

            pynvml.nvmlInit()
        ''',
        "megatron/core/pipeline_parallel/utils.py",
        sites=1,
    )


def test_binding_found_by_assignment_not_by_text():
    """An annotated binding counts; a mention in a string, a comparison or a function body does not."""
    assert_codemod(
        "device-probes",
        """\
        note = "has_nvml = True is set below"
        has_nvml: bool = False
        if has_nvml == True:
            pass


        def f():
            has_nvml = 1
        """,
        """\
        note = "has_nvml = True is set below"
        has_nvml: bool = False
        from megatron.core._rocm import is_hip as _rocmport_is_hip
        if _rocmport_is_hip():
            has_nvml = False  # rocmport: NVML counters are NVIDIA-only (pynvml imports on ROCm, nvmlInit fails)
        if has_nvml == True:
            pass


        def f():
            has_nvml = 1
        """,
        "megatron/core/energy_monitor.py",
        sites=1,
    )
