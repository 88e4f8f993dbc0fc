"""device-probes: NVIDIA-only device probes become no-ops on HIP.

- `set_ideal_affinity_for_current_gpu` (pipeline_parallel/utils.py) pins CPU affinity through
  cuda-python and NVML: on HIP it returns at once (amdsmi is AMD's equivalent; not wired yet).
- The energy monitor (energy_monitor.py) reads NVML counters when pynvml imports, and a pynvml
  wheel imports on ROCm too, then fails in nvmlInit: on HIP `has_nvml` is forced False.
On CUDA both behave as upstream."""

from __future__ import annotations

import libcst as cst

from rocmport.codemods.base import Codemod, Context
from rocmport.codemods.edits import insert_after_binding, prepend_to_function
from rocmport.codemods.guard import helper_import


class DeviceProbes(Codemod):
    NAME = "device-probes"
    DESCRIPTION = "NVML/cuda-python affinity and the NVML energy monitor become no-ops on HIP"
    TRIGGERS = ("def set_ideal_affinity_for_current_gpu(", "has_nvml")

    def transform(self, module: cst.Module, ctx: Context):
        module, a = prepend_to_function(
            module,
            ("set_ideal_affinity_for_current_gpu",),
            (
                f"{helper_import(ctx, 'is_hip')}\n"
                "if is_hip():\n"
                "    return  # rocmport: NVML/cuda-python affinity is NVIDIA-only\n"
            ),
            "is_hip()",
            ctx,
            "set_ideal_affinity_for_current_gpu() returns at once on HIP",
        )
        module, b = insert_after_binding(
            module,
            "has_nvml",
            (
                f"{helper_import(ctx, 'is_hip as _rocmport_is_hip')}\n"
                "if _rocmport_is_hip():\n"
                "    has_nvml = False  # rocmport: NVML counters are NVIDIA-only (pynvml imports on ROCm, nvmlInit fails)\n"
            ),
            "rocmport: NVML counters",
            ctx,
            "has_nvml forced False on HIP",
        )
        return module, a + b
