"""The launcher environment recommended for Megatron on AMD GPUs: one list, used by
`rocmport env`, by verify (applied to the processes it starts on ROCm) and by the container recipe;
and Megatron's FSDP switches, under which its one hardware queue is left out (the port's launch-env
helper and verify's FSDP cases)."""

from __future__ import annotations

LAUNCH_ENV: list[tuple[str, str, str]] = [
    (
        "CUDA_DEVICE_MAX_CONNECTIONS",
        "1",
        "Megatron's TP/SP overlap assumes one hardware queue orders comms before compute",
    ),
    ("GPU_MAX_HW_QUEUES", "2", "HIP's equivalent knob: few hardware queues keep RCCL and compute streams ordered"),
    (
        "HSA_NO_SCRATCH_RECLAIM",
        "1",
        "stops the ROCm runtime reclaiming scratch memory mid-run (stalls and hangs in RCCL)",
    ),
    (
        "HSA_ENABLE_SCRATCH_ASYNC_RECLAIM",
        "0",
        "no asynchronous scratch reclaim either (AMD's Primus images: HSA_STATUS_ERROR_OUT_OF_RESOURCES otherwise)",
    ),
    (
        "TORCH_NCCL_HIGH_PRIORITY",
        "1",
        "puts RCCL collectives on high-priority streams so they are not starved by compute",
    ),
    ("NCCL_CHECKS_DISABLE", "1", "skips RCCL's per-call argument checks (latency on every collective)"),
    ("RCCL_MSCCL_ENABLE", "0", "MSCCL algorithms are not validated for Megatron's collectives; use RCCL's defaults"),
]

DETERMINISTIC_ENV: list[tuple[str, str, str]] = [
    ("NCCL_ALGO", "Ring", "a fixed collective algorithm gives run-to-run identical reductions"),
    ("ROCBLAS_DEFAULT_ATOMICS_MODE", "0", "rocBLAS without atomics: bitwise reproducible GEMMs"),
]


# Megatron's FSDP switches, as validate_args reads them (args.use_torch_fsdp2 ...): under each, upstream
# asserts CUDA_DEVICE_MAX_CONNECTIONS is not 1, so LAUNCH_ENV's 1 is left out. One list for the port's
# launch-env helper (written into megatron/core/_rocm.py from it, in this order: the ports' bytes) and
# verify's FSDP cases (which spell them as options: FSDP_OPTIONS).
FSDP_ARGS: tuple[str, ...] = ("use_torch_fsdp2", "use_megatron_fsdp", "use_custom_fsdp")


def option(dest: str) -> str:
    """The command-line option argparse stores under ``dest`` (use_torch_fsdp2 -> --use-torch-fsdp2)."""
    return "--" + dest.replace("_", "-")


FSDP_OPTIONS: tuple[str, ...] = tuple(option(dest) for dest in FSDP_ARGS)


def launch_env(deterministic: bool = False) -> dict[str, str]:
    return {k: v for k, v, _ in LAUNCH_ENV + (DETERMINISTIC_ENV if deterministic else [])}
