"""tp-comm-overlap: `--tp-comm-overlap` needs Transformer Engine's userbuffers
(`transformer_engine_torch.CommOverlap`, `initialize_ub`), which ROCm TE has only in recent releases.
On HIP, `validate_args()` first asks the installed TE for them (the feature, not a version number)
and, without them, switches the option off with a warning saying why, before upstream's checks and
`initialize_megatron`'s `_initialize_tp_communicators`. On CUDA nothing changes."""

from __future__ import annotations

import libcst as cst

from rocmport.codemods.base import Codemod, Context
from rocmport.codemods.launch_env import prepend_to_validate_args


class TpCommOverlap(Codemod):
    NAME = "tp-comm-overlap"
    DESCRIPTION = "On ROCm, --tp-comm-overlap is switched off with a warning unless the installed TE has userbuffers"
    TRIGGERS = ("\ndef validate_args(args",)

    def transform(self, module: cst.Module, ctx: Context):
        return prepend_to_validate_args(
            module,
            ctx,
            "disable_unsupported_tp_comm_overlap",
            "on ROCm, only with TE userbuffers",
            "validate_args() starts with disable_unsupported_tp_comm_overlap(args) (HIP only)",
        )
