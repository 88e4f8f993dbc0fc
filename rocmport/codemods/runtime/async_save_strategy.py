"""The `async-save-strategy` codemod's runtime helpers: --async-strategy mcore where nvidia-resiliency-ext
does not import, and save_checkpoint's torch_dcp / fsdp_dtensor async save through whichever saver
that strategy gives.

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


_MCORE_SAVER = "megatron.core.dist_checkpointing.strategies.state_dict_saver"


def call_async_save_plan(save_plan, *args, **kwargs):
    """save_checkpoint's torch_dcp / fsdp_dtensor async save (v0.17+) calls its strategy's
    save_state_dict_async_plan with enable_cache= and hands the result to the strategy's finalize
    as its arguments: nvidia-resiliency-ext's saver (nvrx) takes that keyword and returns those
    arguments. Megatron-Core's own (mcore: what use_available_async_strategy picks on ROCm without
    nvidia-resiliency-ext) takes no enable_cache and returns (finalize arguments, central plan, local
    plan, cache validated, metadata reuse validated); upstream stops there with a TypeError on any
    platform. Here the saver gets only the keywords its signature takes (a dropped one that asks for
    something, as enable_cache=True, says so) and mcore's result is cut to the finalize arguments;
    a saver that takes them all, not mcore's, is called as upstream calls it."""
    import inspect

    params = inspect.signature(save_plan).parameters
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        dropped = sorted(k for k in kwargs if k not in params)
        for name in dropped:
            if kwargs[name]:
                warnings.warn(
                    f"rocmport: {getattr(save_plan, '__name__', save_plan)} takes no {name}: saving without it "
                    "(the --async-strategy's saver keeps no plan cache on this path).",
                    stacklevel=2,
                )
        kwargs = {k: v for k, v in kwargs.items() if k in params}
    result = save_plan(*args, **kwargs)
    if getattr(save_plan, "__module__", None) == _MCORE_SAVER:
        return result[0]
    return result


# <<< helper part 160
