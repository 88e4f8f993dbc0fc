"""Imports Transformer Engine's Python layer (under verify's bootstrap, in the flavour the environment
names) and prints, as JSON, what each ROCm TE delta changes as Megatron would see it."""

from __future__ import annotations

import inspect
import json
import os
import pickle


def _answer(check) -> list | str:
    try:
        return list(check())
    except Exception as exc:  # noqa: BLE001 - NVIDIA's checks on a ROCm torch (torch.version.cuda None)
        return f"{type(exc).__name__}: {exc}"


def _master_weight_e4m3_max() -> float | str:
    """The E4M3 maximum TE scales a current-scaling FP8 weight to when it casts the optimizer's master
    weight into it (tensor/utils.py, Megatron's --fp8-param-gather): amax / the weight's scale_inv."""
    import tempfile

    import torch
    import torch.distributed as dist
    import transformer_engine.pytorch as te
    from transformer_engine.common.recipe import Float8CurrentScaling
    from transformer_engine.pytorch.tensor.utils import cast_master_weights_to_fp8

    try:
        if not dist.is_initialized():
            store = tempfile.mktemp(prefix="te-probe-store-")
            dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
        with te.quantized_model_init(enabled=True, recipe=Float8CurrentScaling()):
            linear = te.Linear(32, 32, params_dtype=torch.float32)
        weight = linear.weight
        master = torch.linspace(-3.0, 3.0, weight.numel()).reshape(-1)  # amax 3
        cast_master_weights_to_fp8([weight], [master], [0], dist.group.WORLD)
        return round(3.0 / float(weight._scale_inv.reshape(-1)[0]), 3)
    except Exception as exc:  # noqa: BLE001 - said in the probe's answer
        return f"{type(exc).__name__}: {exc}"


def _dequantized_weight() -> dict | str:
    """A current-scaling FP8 weight read back through TE's own Float8Tensor.dequantize (how Megatron's
    --fp8-param-gather makes its fp32 master weights): NaNs, and the largest error relative to the
    weight's amax (E4M3 rounds to within 1/16 of a value)."""
    import torch
    import transformer_engine_torch as tex
    from transformer_engine.pytorch.tensor.float8_tensor import Float8CurrentScalingQuantizer

    try:
        weight = torch.linspace(-3.0, 3.0, 1024).reshape(32, 32)  # amax 3: its ends cast to E4M3's maximum
        quantized = Float8CurrentScalingQuantizer(tex.DType.kFloat8E4M3, torch.device("cuda"))(weight)
        back = quantized.dequantize(dtype=torch.float32)
        return {
            "nan": int(torch.isnan(back).sum()),
            "max_error": round(float((back - weight).abs().max()) / 3.0, 4),
            # a copy staged on the CPU (Megatron's checkpoint writer asserts `tensor.is_cpu` of it) is there
            "staged_is_cpu": quantized.detach().to("cpu").is_cpu,
            # ...while TE asking its own Float8Tensor.is_cpu (code compiled under a TE file name) sees the
            # simulated device, as its is_cuda does
            "te_asks_is_cpu": eval(compile("quantized.is_cpu", "/site/transformer_engine/pytorch/probe.py", "eval")),
            # Megatron's checkpoint writer asking is_cpu of the weight itself (TE 2.12 has no is_cpu of its own:
            # its __torch_function__ hands the question back from a TE frame)
            "megatron_asks_is_cpu": quantized.is_cpu,
            # and is_cuda of the same weight: TE asking sees the simulated device; Megatron asking (its optimizer
            # offload, moe_utils) sees where it really is, as it does of any other tensor on the proxy
            "te_asks_is_cuda": eval(compile("quantized.is_cuda", "/site/transformer_engine/pytorch/probe.py", "eval")),
            "megatron_asks_is_cuda": quantized.is_cuda,
            "megatron_asks_plain_is_cuda": weight.is_cuda,
            # Megatron's staging (filesystem_async.preload_tensors: `.to("cpu", non_blocking=True)`) takes TE's
            # own device-to-host copy: a plain tensor with the weight's values under TE 2.12, as on a GPU
            "staged_type": type(staged := quantized.to("cpu", non_blocking=True)).__name__,
            "staged_max_error": round(float((staged.float() - back).abs().max()), 6),
            "te_asks_data_is_cpu": eval(
                compile("quantized._data.is_cpu", "/site/transformer_engine/pytorch/probe.py", "eval")
            ),
        }
    except Exception as exc:  # noqa: BLE001 - said in the probe's answer
        return f"{type(exc).__name__}: {exc}"


def main() -> None:
    from rocmport.verify.runtime import proxy_shim

    proxy_shim.install(megatron=False)
    proxy_shim.install_for_te()
    import torch

    import transformer_engine
    import transformer_engine.pytorch as te
    from transformer_engine.common.recipe import DelayedScaling, Format
    from transformer_engine.pytorch import utils
    from transformer_engine.pytorch.cpp_extensions import fused_attn
    from transformer_engine.pytorch.module import base

    import transformer_engine_torch as tex
    from rocmport.verify.runtime import te_rocm

    try:
        from transformer_engine.pytorch import quantization as q
    except ImportError:  # older releases: fp8.py
        from transformer_engine.pytorch import fp8 as q  # type: ignore[no-redef]
    backends = fused_attn.FusedAttnBackend
    names = sorted(backends.keys() if isinstance(backends, dict) else backends.__members__)
    out = {
        "version": transformer_engine.__version__,
        "fused_attn_backends": names,
        "tex_backends": sorted(tex.NVTE_Fused_Attn_Backend.__members__),
        "cudnn": list(utils.get_cudnn_version()),
        "keep_fp8_cache": {
            cls: "keep_fp8_weight_transpose_cache" in inspect.signature(getattr(te, cls).__init__).parameters
            for cls in ("Linear", "LayerNormLinear", "LayerNormMLP")
        },
        "get_workspace": hasattr(base, "get_workspace"),
        "fp8": _answer(q.check_fp8_support),
        "mxfp8": _answer(q.check_mxfp8_support),
        "block_scaling": _answer(q.check_fp8_block_scaling_support),
        "e4m3_max": Format.E4M3.value.max_fwd,
        # a recipe pickled into a checkpoint (TE's extra state) comes back: Format(value) finds its member
        "formats_round_trip": all(pickle.loads(pickle.dumps(f)) is f for f in Format)
        and pickle.loads(pickle.dumps(DelayedScaling(fp8_format=Format.HYBRID))).fp8_format is Format.HYBRID,
        "fnuz": bool(getattr(utils, "is_fp8_fnuz", lambda: False)()),
        "env": {k: os.environ.get(k) for k in ("NVTE_FLASH_ATTN", "NVTE_FUSED_ATTN")},
        "applied": te_rocm.APPLIED,
        # the CUDA control simulates its GPU to TE's own frames only (ROCMPORT_CUDA_SIM_ARCH): asked from here, torch
        # says it has no CUDA
        "capability": _answer(torch.cuda.get_device_capability),
    }
    out["master_weight_e4m3_max"] = _master_weight_e4m3_max()
    out["dequantized_weight"] = _dequantized_weight()
    # a ROCm-only keyword reaches the module (and NVIDIA's refuses it)
    try:
        te.Linear(32, 32, keep_fp8_weight_transpose_cache=False, params_dtype=torch.float32)
        out["linear_accepts_keyword"] = True
    except TypeError as exc:
        out["linear_accepts_keyword"] = str(exc)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
