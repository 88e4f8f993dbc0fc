"""Every codemod rocmport knows, by name, in the order a full run applies them."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rocmport.errors import BadInput

from rocmport.codemods.apex_to_torch import ApexToTorch
from rocmport.codemods.async_checkpoint_spawn import AsyncCheckpointSpawn
from rocmport.codemods.async_save_strategy import AsyncSaveStrategy
from rocmport.codemods.attention_backend_env import AttentionBackendEnv
from rocmport.codemods.base import Codemod
from rocmport.codemods.options import problems
from rocmport.codemods.capability_gates import CapabilityGates
from rocmport.codemods.dataloader_mp_context import DataloaderMpContext
from rocmport.codemods.deterministic_env import DeterministicEnv
from rocmport.codemods.device_probes import DeviceProbes
from rocmport.codemods.empty_cache_interval import EmptyCacheInterval
from rocmport.codemods.flash_attention_hooks import FlashAttentionHooks
from rocmport.codemods.fp8_arch_check import Fp8ArchCheck
from rocmport.codemods.fused_kernel_fallbacks import FusedKernelFallbacks
from rocmport.codemods.grouped_gemm import GroupedGemm
from rocmport.codemods.guard_nvidia_only_imports import GuardNvidiaOnlyImports
from rocmport.codemods.hip_runtime_link import HipRuntimeLink
from rocmport.codemods.launch_env import LaunchEnv
from rocmport.codemods.nccl_allocator_rccl import NcclAllocatorRccl
from rocmport.codemods.te_version_gates import TeVersionGates
from rocmport.codemods.tp_comm_overlap import TpCommOverlap

if TYPE_CHECKING:
    from rocmport.patches.series import Series

registry: dict[str, Codemod] = {
    c.NAME: c
    for c in (ApexToTorch(), FusedKernelFallbacks(), GuardNvidiaOnlyImports(), AttentionBackendEnv(), TeVersionGates(),
              DeviceProbes(), FlashAttentionHooks(), CapabilityGates(), GroupedGemm(),
              # issue 17: the ROCm run-time gaps
              LaunchEnv(), DeterministicEnv(), TpCommOverlap(), AsyncCheckpointSpawn(), DataloaderMpContext(),
              NcclAllocatorRccl(), AsyncSaveStrategy(),
              # issue 29: what AMD's own ports do
              HipRuntimeLink(), Fp8ArchCheck(), EmptyCacheInterval())
}


def check_recipe(codemods: list[dict], where) -> None:
    """Every codemod of a recipe (`{name, options}` entries) exists and gets options it declares, of
    the declared kind: BadInput naming ``where`` and the entry otherwise (before anything runs)."""
    for i, entry in enumerate(codemods):
        mod = registry.get(entry["name"])
        if mod is None:
            raise BadInput(f"{where}: key 'codemods[{i}]': unknown codemod '{entry['name']}'; known: {', '.join(sorted(registry))}")
        found = problems(mod.OPTIONS, entry.get("options") or {})
        if found:
            raise BadInput(f"{where}: key 'codemods[{i}]' ({entry['name']}): {found[0]}")


def check_series(series: Series) -> Series:
    """The one check of a series' codemods that every reader runs (apply, `patches check` and `list`,
    `status`, `emit docker`): what apply refuses, each of them refuses with the same message."""
    check_recipe(series.codemods, series.path)
    return series
