"""The `async-save-strategy` codemod's runtime helpers: --async-strategy mcore where nvidia-resiliency-ext
does not import.

Only the text between the `# >>> helper part N` / `# <<< helper part N` markers goes into the
generated helper module (rocmport/codemods/helper.py assembles it, parts in N order); what is
above the first marker is for the type checker and readers (the generated module defines
these names itself)."""

import warnings

from rocmport.codemods.runtime.core import is_hip

# >>> helper part 160
def nvrx_async_available() -> bool:
    """Whether nvidia-resiliency-ext's async checkpointing imports: upstream's default
    --async-strategy (nvrx) since v0.17, which get_async_strategy imports at the first save."""
    try:
        import nvidia_resiliency_ext.checkpointing.async_ckpt.core  # noqa: F401
    except ImportError:
        return False
    return True


def use_available_async_strategy(args):
    """On HIP, --async-save with the nvrx strategy and no nvidia-resiliency-ext (NVIDIA-only, not in
    the ROCm port's dependencies) writes through Megatron-Core's own async writer (mcore) instead,
    with a warning; upstream would stop at the first save. CUDA: unchanged."""
    if (is_hip() and getattr(args, "async_save", False) and getattr(args, "async_strategy", None) == "nvrx"
            and not nvrx_async_available()):
        args.async_strategy = "mcore"
        warnings.warn("ROCm: --async-strategy nvrx needs nvidia-resiliency-ext, which is NVIDIA-only and not installed: "
                      "async checkpoints are written by Megatron-Core's own writer (--async-strategy mcore).", stacklevel=2)
    return args


# <<< helper part 160
