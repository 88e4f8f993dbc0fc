"""flash-attention-hooks: AMD's flash-attention (ROCm/flash-attention, CK backend) keeps the import
name `flash_attn`, so the FA2 path stays as it is; FlashAttention-3 is Hopper-only, so on HIP
`HAVE_FA3` is forced False after upstream's (already guarded) FA3 imports. `get_fa_version()`
stops importing flash_attn unguarded: without it the version is 0.0.0 and every
`is_fa_min_version` gate answers False. On CUDA nothing changes."""

from __future__ import annotations

import libcst as cst

from rocmport.codemods.base import Codemod, Context
from rocmport.codemods.edits import insert_after_binding, prepend_to_function
from rocmport.codemods.guard import helper_import


class FlashAttentionHooks(Codemod):
    NAME = "flash-attention-hooks"
    DESCRIPTION = "FA3 (Hopper-only) off on HIP; flash_attn version probe without an unguarded import"
    TRIGGERS = ("HAVE_FA3", "def get_fa_version(")

    def transform(self, module: cst.Module, ctx: Context):
        module, a = insert_after_binding(
            module,
            "HAVE_FA3",
            (
                f"{helper_import(ctx, 'is_hip as _rocmport_is_hip')}\n"
                "if _rocmport_is_hip():\n"
                "    HAVE_FA3 = False  # rocmport: FlashAttention-3 is Hopper-only; ROCm uses flash_attn (CK)\n"
            ),
            "rocmport: FlashAttention-3 is Hopper-only",
            ctx,
            "HAVE_FA3 forced False on HIP",
        )
        module, b = prepend_to_function(
            module,
            ("get_fa_version",),
            (
                f"{helper_import(ctx, 'module_available')}\n"
                'if not module_available("flash_attn"):\n'
                '    return PkgVersion("0.0.0")  # rocmport: no flash_attn, no FA feature of any version\n'
            ),
            'module_available("flash_attn")',
            ctx,
            "get_fa_version() answers 0.0.0 without flash_attn",
        )
        return module, a + b
