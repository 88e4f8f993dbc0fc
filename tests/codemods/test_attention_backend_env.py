"""attention-backend-env: before/after, and ROCm vs CUDA behaviour."""

import pytest

from tests.helpers.codemods import assert_codemod, assert_idempotent, rewrite, run_tree

LANGUAGE_MODULE = '''\
import os

from megatron.core.transformer.enums import AttnBackend


class LanguageModule:
    def __init__(self, config):
        self.config = config

    def _set_attention_backend(self):
        """Set attention backend"""

        def check_and_set_env_variable(
            env_variable_name: str, expected_value: int, attn_type: AttnBackend
        ) -> None:
            current_value = os.getenv(env_variable_name)
            assert current_value is None or current_value == str(
                expected_value
            ), f"{env_variable_name} set to {current_value}, but expected {expected_value}"
            os.environ[env_variable_name] = str(expected_value)

        if self.config.attention_backend == AttnBackend.flash:
            check_and_set_env_variable("NVTE_FLASH_ATTN", 1, AttnBackend.flash)
            check_and_set_env_variable("NVTE_FUSED_ATTN", 0, AttnBackend.flash)
            check_and_set_env_variable("NVTE_UNFUSED_ATTN", 0, AttnBackend.flash)
        elif self.config.attention_backend == AttnBackend.auto:
            check_and_set_env_variable("NVTE_FLASH_ATTN", 1, AttnBackend.auto)
            check_and_set_env_variable("NVTE_FUSED_ATTN", 1, AttnBackend.auto)
            check_and_set_env_variable("NVTE_UNFUSED_ATTN", 1, AttnBackend.auto)
'''

ENUMS = "import enum\n\nclass AttnBackend(enum.Enum):\n    flash = 1\n    fused = 2\n    unfused = 3\n    local = 4\n    auto = 5\n"

REL = "megatron/core/models/common/language_module/language_module.py"

PROBE = """
import os, types
from megatron.core.models.common.language_module.language_module import LanguageModule
from megatron.core.transformer.enums import AttnBackend
os.environ.update(NVTE_FLASH_ATTN="0", NVTE_FUSED_ATTN="1")  # what ROCm images bake in
for backend in ("auto", "flash"):
    try:
        LanguageModule(types.SimpleNamespace(attention_backend=AttnBackend[backend]))._set_attention_backend()
        print(backend, os.environ["NVTE_FLASH_ATTN"], os.environ["NVTE_FUSED_ATTN"], os.environ["NVTE_UNFUSED_ATTN"])
    except AssertionError:
        print(backend, "AssertionError")
"""


def _tree(after):
    pkgs = [
        "megatron/core/models/__init__.py",
        "megatron/core/models/common/__init__.py",
        "megatron/core/models/common/language_module/__init__.py",
        "megatron/core/transformer/__init__.py",
    ]
    return {**{p: "" for p in pkgs}, "megatron/core/transformer/enums.py": ENUMS, REL: after}


def test_attention_before_after():
    after, sites = rewrite("attention-backend-env", LANGUAGE_MODULE, REL)
    assert sites == 1
    assert (
        "        ) -> None:\n            from megatron.core._rocm import is_hip\n            if is_hip():\n"
        "                # rocmport: ROCm images bake NVTE_FLASH_ATTN=0 NVTE_FUSED_ATTN=1; auto keeps them.\n"
        "                if attn_type == AttnBackend.auto:\n"
        "                    os.environ.setdefault(env_variable_name, str(expected_value))\n"
    ) in after
    assert_idempotent("attention-backend-env", LANGUAGE_MODULE, REL)


@pytest.mark.torch
def test_attention_on_rocm_keeps_image_values(tmp_path):
    after, _ = rewrite("attention-backend-env", LANGUAGE_MODULE, REL)
    proc = run_tree(tmp_path, _tree(after), PROBE, hip="6.4.1")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[:2] == ["auto 0 1 1", "flash 1 0 0"]


@pytest.mark.torch
def test_attention_on_cuda_is_upstream(tmp_path):
    after, _ = rewrite("attention-backend-env", LANGUAGE_MODULE, REL)
    ported = run_tree(tmp_path / "a", _tree(after), PROBE, hip=None)
    upstream = run_tree(tmp_path / "b", _tree(LANGUAGE_MODULE), PROBE, hip=None)
    assert ported.stdout == upstream.stdout
    assert ported.stdout.startswith("auto AssertionError")


def test_attention_exact_before_after():
    assert_codemod(
        "attention-backend-env",
        LANGUAGE_MODULE,
        LANGUAGE_MODULE.replace(
            "        ) -> None:\n",
            "        ) -> None:\n"
            "            from megatron.core._rocm import is_hip\n"
            "            if is_hip():\n"
            "                # rocmport: ROCm images bake NVTE_FLASH_ATTN=0 NVTE_FUSED_ATTN=1; auto keeps them.\n"
            "                if attn_type == AttnBackend.auto:\n"
            "                    os.environ.setdefault(env_variable_name, str(expected_value))\n"
            "                else:\n"
            "                    os.environ[env_variable_name] = str(expected_value)\n"
            "                return\n",
        ),
        REL,
        sites=1,
    )
