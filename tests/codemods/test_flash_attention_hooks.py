"""flash-attention-hooks: before/after, and ROCm vs CUDA behaviour."""

import pytest

from tests.helpers.codemods import assert_codemod, assert_idempotent, rewrite, run_tree

ATTENTION = """\
try:
    from flash_attn_3.flash_attn_interface import _flash_attn_forward

    HAVE_FA3 = True
except ImportError:
    HAVE_FA3 = False

try:
    from flash_attn import flash_attn_varlen_func
except ImportError:
    flash_attn_varlen_func = None
"""

UTILS = '''\
from packaging.version import Version as PkgVersion

_fa_version = None


def get_fa_version():
    """Get Flash attention version from __version__"""

    def get_fa_version_str():
        import flash_attn as fa

        return str(fa.__version__)

    global _fa_version
    if _fa_version is None:
        _fa_version = PkgVersion(get_fa_version_str())
    return _fa_version
'''


@pytest.mark.torch
def test_fa3_off_on_rocm(tmp_path):
    after, sites = rewrite("flash-attention-hooks", ATTENTION, "megatron/core/transformer/attention.py")
    assert sites == 1 and "if _rocmport_is_hip():\n    HAVE_FA3 = False  # rocmport:" in after
    assert after.index("HAVE_FA3 = False  # rocmport") < after.index("from flash_attn import")
    assert_idempotent("flash-attention-hooks", ATTENTION, "megatron/core/transformer/attention.py")
    fa3 = {
        "flash_attn_3/__init__.py": "",
        "flash_attn_3/flash_attn_interface.py": "def _flash_attn_forward(): pass\n",
        "megatron/core/transformer/__init__.py": "",
        "megatron/core/transformer/attention.py": after,
    }
    code = "from megatron.core.transformer import attention as a\nprint(a.HAVE_FA3)\n"
    assert run_tree(tmp_path / "r", fa3, code, hip="6.4.1").stdout.strip() == "False"
    assert run_tree(tmp_path / "c", fa3, code).stdout.strip() == "True"


@pytest.mark.torch
def test_fa_version_without_flash_attn(tmp_path):
    after, sites = rewrite("flash-attention-hooks", UTILS, "megatron/core/utils.py")
    assert sites == 1
    assert_idempotent("flash-attention-hooks", UTILS, "megatron/core/utils.py")
    code = "from megatron.core.utils import get_fa_version\nprint(get_fa_version())\n"
    assert run_tree(tmp_path / "a", {"megatron/core/utils.py": after}, code).stdout.strip() == "0.0.0"
    assert "ModuleNotFoundError" in run_tree(tmp_path / "u", {"megatron/core/utils.py": UTILS}, code).stderr
    fa = {"flash_attn/__init__.py": "__version__ = '2.7.4'\n", "megatron/core/utils.py": after}
    assert run_tree(tmp_path / "p", fa, code).stdout.strip() == "2.7.4"


def test_attention_exact_before_after():
    assert_codemod(
        "flash-attention-hooks",
        ATTENTION,
        ATTENTION.replace(
            "    HAVE_FA3 = False\n",
            (
                "    HAVE_FA3 = False\n"
                "from megatron.core._rocm import is_hip as _rocmport_is_hip\n"
                "if _rocmport_is_hip():\n"
                "    HAVE_FA3 = False  # rocmport: FlashAttention-3 is Hopper-only; ROCm uses flash_attn (CK)\n"
            ),
            1,
        ),
        "megatron/core/transformer/attention.py",
        sites=1,
    )


def test_fa_version_exact_before_after():
    assert_codemod(
        "flash-attention-hooks",
        UTILS,
        UTILS.replace(
            '    """Get Flash attention version from __version__"""\n',
            (
                '    """Get Flash attention version from __version__"""\n'
                "    from megatron.core._rocm import module_available\n"
                '    if not module_available("flash_attn"):\n'
                '        return PkgVersion("0.0.0")  # rocmport: no flash_attn, no FA feature of any version\n'
            ),
        ),
        "megatron/core/utils.py",
        sites=1,
    )
