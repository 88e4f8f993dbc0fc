"""Every codemod rocmport knows, by name, in the order a full run applies them."""

from __future__ import annotations

from rocmport.codemods.apex_to_torch import ApexToTorch
from rocmport.codemods.async_checkpoint_spawn import AsyncCheckpointSpawn
from rocmport.codemods.async_save_strategy import AsyncSaveStrategy
from rocmport.codemods.attention_backend_env import AttentionBackendEnv
from rocmport.codemods.base import Codemod

# The recipe checks need no codemod loaded: they live with the declarations (re-exported here).
from rocmport.codemods.declared import check_recipe, check_series  # noqa: F401
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

registry: dict[str, Codemod] = {
    c.NAME: c
    for c in (
        ApexToTorch(),
        FusedKernelFallbacks(),
        GuardNvidiaOnlyImports(),
        AttentionBackendEnv(),
        TeVersionGates(),
        DeviceProbes(),
        FlashAttentionHooks(),
        CapabilityGates(),
        GroupedGemm(),
        # issue 17: the ROCm run-time gaps
        LaunchEnv(),
        DeterministicEnv(),
        TpCommOverlap(),
        AsyncCheckpointSpawn(),
        DataloaderMpContext(),
        NcclAllocatorRccl(),
        AsyncSaveStrategy(),
        # issue 29: what AMD's own ports do
        HipRuntimeLink(),
        Fp8ArchCheck(),
        EmptyCacheInterval(),
    )
}
