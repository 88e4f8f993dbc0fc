"""The `tp-comm-overlap` codemod's runtime helpers: --tp-comm-overlap switched off on HIP without TE
userbuffers.

Only the text between the `# >>> helper part N` / `# <<< helper part N` markers goes into the
generated helper module (rocmport/codemods/helper.py assembles it, parts in N order); what is
above the first marker is for the type checker and readers (the generated module defines
these names itself)."""

import warnings

from rocmport.codemods.runtime.core import is_hip

# >>> helper part 140
# ---- --tp-comm-overlap -----------------------------------------------------------------------------

def te_userbuffers_available() -> bool:
    """Does the installed Transformer Engine have userbuffers (the feature, not a version number)?"""
    try:
        import transformer_engine_torch as tex
        from transformer_engine.pytorch.module import base
    except ImportError:
        return False
    return hasattr(tex, "CommOverlap") and hasattr(tex, "CommOverlapP2P") and hasattr(base, "initialize_ub")


def disable_unsupported_tp_comm_overlap(args):
    """On HIP, --tp-comm-overlap needs TE's userbuffers, which ROCm TE has only in recent releases:
    without them the option is switched off with a warning saying why. CUDA: unchanged."""
    if is_hip() and getattr(args, "tp_comm_overlap", False) and not te_userbuffers_available():
        args.tp_comm_overlap = False
        warnings.warn("ROCm: --tp-comm-overlap disabled: the installed Transformer Engine has no userbuffers "
                      "(transformer_engine_torch.CommOverlap / initialize_ub); tensor-parallel communication runs "
                      "without GEMM overlap. Install a ROCm Transformer Engine with userbuffers to use it.", stacklevel=2)
    return args


# <<< helper part 140
