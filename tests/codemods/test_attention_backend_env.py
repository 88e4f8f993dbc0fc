"""attention-backend-env and te-version-gates: before/after, and ROCm vs CUDA behaviour."""

import pytest

from tests.helpers.codemods import UTILS_V016, assert_idempotent, rewrite, run_tree

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
    pkgs = ["megatron/core/models/__init__.py", "megatron/core/models/common/__init__.py",
            "megatron/core/models/common/language_module/__init__.py", "megatron/core/transformer/__init__.py"]
    return {**{p: "" for p in pkgs}, "megatron/core/transformer/enums.py": ENUMS, REL: after}


def test_attention_before_after():
    after, sites = rewrite("attention-backend-env", LANGUAGE_MODULE, REL)
    assert sites == 1
    assert ('        ) -> None:\n            from megatron.core._rocm import is_hip\n            if is_hip():\n'
            '                # rocmport: ROCm images bake NVTE_FLASH_ATTN=0 NVTE_FUSED_ATTN=1; auto keeps them.\n'
            '                if attn_type == AttnBackend.auto:\n'
            '                    os.environ.setdefault(env_variable_name, str(expected_value))\n') in after
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




def test_te_gate_before_after():
    after, sites = rewrite("te-version-gates", UTILS_V016, "megatron/core/utils.py")
    assert sites == 1
    assert ('    """Check if minimum version of `transformer-engine` is installed."""\n'
            "    if get_te_version() is None:\n"
            "        return False  # rocmport: no Transformer Engine, so no TE feature of any version\n") in after
    assert_idempotent("te-version-gates", UTILS_V016, "megatron/core/utils.py")
    v017 = UTILS_V016.replace("return None", 'return PkgVersion("0.0.0")')
    assert rewrite("te-version-gates", v017, "megatron/core/utils.py") == (v017, 0)


@pytest.mark.torch
def test_te_gate_without_and_with_te(tmp_path):
    after, _ = rewrite("te-version-gates", UTILS_V016, "megatron/core/utils.py")
    code = "from megatron.core.utils import is_te_min_version\nprint(is_te_min_version('2.7'), is_te_min_version('1.0'))\n"
    absent = run_tree(tmp_path / "a", {"megatron/core/utils.py": after}, code)
    assert absent.stdout.strip() == "False False", absent.stderr
    upstream = run_tree(tmp_path / "u", {"megatron/core/utils.py": UTILS_V016}, code)
    assert "TypeError" in upstream.stderr  # what upstream does without TE
    fake_te = {"transformer_engine/__init__.py": "__version__ = '2.8.0'\n", "megatron/core/utils.py": after}
    present = run_tree(tmp_path / "p", fake_te, code)
    assert present.stdout.strip() == "True True", present.stderr
