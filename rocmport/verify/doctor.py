"""What this machine has for running a ported Megatron: torch and its HIP/CUDA build, ROCm and RCCL,
the devices and their arch, ROCm builds of the accelerated packages, the launcher variables (`rocmport doctor`)."""

from __future__ import annotations

import glob
import importlib.metadata
import importlib.util
import os

from rocmport.launch_env import DETERMINISTIC_ENV, LAUNCH_ENV

# import name -> distribution names to ask for a version (ROCm and CUDA builds differ in name)
ACCELERATED = {
    "apex": ("apex",),
    "transformer_engine": ("transformer_engine", "transformer-engine", "transformer_engine_torch"),
    "flash_attn": ("flash_attn", "flash-attn"),
    "grouped_gemm": ("grouped_gemm", "grouped-gemm"),
}


def _version(dists) -> str | None:
    for d in dists:
        try:
            return importlib.metadata.version(d)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def doctor() -> dict:
    import torch

    hip = getattr(torch.version, "hip", None)
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    archs = []
    for i in range(count):
        props = torch.cuda.get_device_properties(i)
        archs.append(getattr(props, "gcnArchName", None) or f"sm_{props.major}{props.minor}")
    rocm_path = os.environ.get("ROCM_PATH") or ("/opt/rocm" if os.path.isdir("/opt/rocm") else None)
    rccl = sorted(glob.glob(os.path.join(rocm_path, "lib", "librccl.so*")))[:1] if rocm_path else []
    packages = {}
    for mod, dists in ACCELERATED.items():
        found = importlib.util.find_spec(mod) is not None
        packages[mod] = {"importable": found, "version": _version(dists) if found else None,
                         "rocm_build": bool(found and hip)}
    names = [n for n, _, _ in LAUNCH_ENV + DETERMINISTIC_ENV] + ["NVTE_FLASH_ATTN", "NVTE_FUSED_ATTN", "PYTORCH_ROCM_ARCH", "HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"]
    return {
        "torch": torch.__version__, "hip": hip, "cuda": getattr(torch.version, "cuda", None),
        "rocm_path": rocm_path, "rccl": rccl[0] if rccl else None,
        "devices": [{"index": i, "name": torch.cuda.get_device_name(i), "arch": archs[i]} for i in range(count)],
        "packages": packages,
        "env": {n: os.environ.get(n) for n in names},
    }
