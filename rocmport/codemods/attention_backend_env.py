"""attention-backend-env: `_set_attention_backend` (language_module.py) asserts the NVTE_* variables
against what it expects, but ROCm images bake `NVTE_FLASH_ATTN=0 NVTE_FUSED_ATTN=1` (TE's own flash
attention is off on ROCm). On HIP, `auto` keeps what the environment says (setdefault) and an
explicit backend sets its combination instead of asserting. On CUDA nothing changes."""

from __future__ import annotations

import libcst as cst

from rocmport.codemods.base import Codemod, Context
from rocmport.codemods.edits import prepend_to_function
from rocmport.codemods.guard import helper_import


class AttentionBackendEnv(Codemod):
    NAME = "attention-backend-env"
    DESCRIPTION = (
        "On ROCm, keep the image's NVTE_* attention settings for auto; set, not assert, for an explicit backend"
    )
    TRIGGERS = ("def check_and_set_env_variable(",)

    def transform(self, module: cst.Module, ctx: Context):
        code = (
            f"{helper_import(ctx, 'is_hip')}\n"
            "if is_hip():\n"
            "    # rocmport: ROCm images bake NVTE_FLASH_ATTN=0 NVTE_FUSED_ATTN=1; auto keeps them.\n"
            "    if attn_type == AttnBackend.auto:\n"
            "        os.environ.setdefault(env_variable_name, str(expected_value))\n"
            "    else:\n"
            "        os.environ[env_variable_name] = str(expected_value)\n"
            "    return\n"
        )
        return prepend_to_function(
            module,
            ("_set_attention_backend", "check_and_set_env_variable"),
            code,
            "is_hip()",
            ctx,
            "check_and_set_env_variable(): on HIP setdefault for auto, set for an explicit backend",
        )
