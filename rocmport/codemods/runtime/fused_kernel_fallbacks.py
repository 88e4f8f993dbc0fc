"""The `fused-kernel-fallbacks` codemod's runtime helpers: cuda_toolkit_missing, the amp_C kernels on
torch._foreach_* (AmpCFallback), disable_missing_fusions and the fused wgrad GEMM on torch.

Only the text between the `# >>> helper part N` / `# <<< helper part N` markers goes into the
generated helper module (rocmport/codemods/helper.py assembles it, parts in N order); what is
above the first marker is for the type checker and readers (the generated module defines
these names itself)."""

import warnings

import torch

from rocmport.codemods.runtime.core import is_hip, module_available
from rocmport.codemods.runtime.grouped_gemm import GROUPED_GEMM_ROCM_HINT

# >>> helper part 20
def cuda_toolkit_missing() -> bool:
    """True when there is no nvcc to build CUDA extensions with (always the case on ROCm)."""
    from torch.utils import cpp_extension

    return is_hip() or getattr(cpp_extension, "CUDA_HOME", None) is None


# <<< helper part 20

# >>> helper part 50
def multi_tensor_l2norm(chunk_size, noop_flag, tensor_lists, per_tensor, *args):
    norms = torch._foreach_norm(tensor_lists[0]) if tensor_lists[0] else [torch.zeros(())]
    total = torch.linalg.vector_norm(torch.stack([n.float() for n in norms]))
    return total, (torch.stack(norms) if per_tensor else None)


def multi_tensor_scale(chunk_size, noop_flag, tensor_lists, scale):
    for src, dst in zip(tensor_lists[0], tensor_lists[1]):
        dst.copy_(src * scale)


class AmpCFallback:
    """The subset of apex's amp_C kernels megatron calls, on torch._foreach_*."""

    multi_tensor_l2norm = staticmethod(multi_tensor_l2norm)
    multi_tensor_scale = staticmethod(multi_tensor_scale)


# ---- fused-kernel flags ---------------------------------------------------------------------------

FUSION_KERNELS = {
    "gradient_accumulation_fusion": ("fused_weight_gradient_mlp_cuda",),
    "masked_softmax_fusion": ("scaled_masked_softmax_cuda", "scaled_upper_triang_masked_softmax_cuda"),
}


def disable_missing_fusions(args):
    """On ROCm, turn off fusion flags whose CUDA kernel is not importable, with a warning naming it."""
    if not is_hip():
        return args
    for flag, kernels in FUSION_KERNELS.items():
        missing = [k for k in kernels if not module_available(k)]
        if getattr(args, flag, False) and missing:
            setattr(args, flag, False)
            warnings.warn(f"ROCm: --{flag.replace('_', '-')} disabled: kernel {', '.join(missing)} is not available")
    # Megatron asks for apex's persistent layer norm unless told --no-persist-layer-norm; without apex
    # the local layer spec builds torch's LayerNorm (WrappedTorchNorm), which asserts the flag is off.
    if not getattr(args, "no_persist_layer_norm", True) and not module_available("apex"):
        args.no_persist_layer_norm = True
        warnings.warn("ROCm: --no-persist-layer-norm set: apex (its persistent layer norm kernel) is not available")
    # --moe-grouped-gemm runs on TE's GroupedLinear (TEGroupedMLP) where the TE installed has it, else
    # on the grouped_gemm package (the legacy GroupedMLP; AMD's ROCm build, in the line's component
    # matrix); with neither, megatron's SequentialMLP runs the experts one GEMM at a time.
    te_grouped = (getattr(args, "transformer_impl", "local") == "transformer_engine"
                  and not getattr(args, "moe_use_legacy_grouped_gemm", False) and _te_has_grouped_linear())
    if getattr(args, "moe_grouped_gemm", False) and not te_grouped and not module_available("grouped_gemm"):
        args.moe_grouped_gemm = False
        warnings.warn("ROCm: --moe-grouped-gemm disabled (sequential expert GEMMs): " + GROUPED_GEMM_ROCM_HINT)
    return args




def _te_has_grouped_linear() -> bool:
    """Whether the installed Transformer Engine has GroupedLinear (an older ROCm TE may not)."""
    if not module_available("transformer_engine"):
        return False
    try:
        import transformer_engine.pytorch as te_pytorch
    except Exception:  # noqa: BLE001 - a TE that does not import offers nothing
        return False
    return hasattr(te_pytorch, "GroupedLinear")


# <<< helper part 50

# >>> helper part 210
# ---- gradient-accumulation fusion without apex's kernel ----------------------------------------------

class WgradGemmFallback:
    """apex's fused_weight_gradient_mlp_cuda on torch: main_grad += grad_output^T @ input."""

    @staticmethod
    def wgrad_gemm_accum_fp32(total_input, grad_output, main_grad):
        main_grad.add_(grad_output.t().matmul(total_input).to(main_grad.dtype))

    wgrad_gemm_accum_fp16 = wgrad_gemm_accum_fp32


# <<< helper part 210
