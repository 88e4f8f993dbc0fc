"""grouped-gemm: the install hint on ROCm vs CUDA, and the sequential fallback in validate_args."""

import pytest

from tests.helpers.codemods import assert_codemod, assert_idempotent, rewrite, run_tree

UTIL = '''\
try:
    import grouped_gemm
except ImportError:
    grouped_gemm = None


def assert_grouped_gemm_is_available():
    """Assert that grouped_gemm is available."""
    assert grouped_gemm is not None, (
        "Grouped GEMM is not available. Please run "
        "`pip install git+https://github.com/fanshiqing/grouped_gemm@v1.1.4`."
    )
'''

REL = "megatron/core/transformer/moe/grouped_gemm_util.py"
PROBE = (
    "from megatron.core.transformer.moe.grouped_gemm_util import assert_grouped_gemm_is_available as a\n"
    "try:\n    a()\nexcept AssertionError as e:\n    print(e)\n"
)


def test_before_after():
    after, sites = rewrite("grouped-gemm", UTIL, REL)
    assert sites == 1
    assert after.startswith("from megatron.core._rocm import grouped_gemm_hint\n")
    assert "    assert grouped_gemm is not None, grouped_gemm_hint((\n" in after
    assert_idempotent("grouped-gemm", UTIL, REL)


@pytest.mark.torch
def test_hint_names_amds_build_on_rocm_only(tmp_path):
    after, _ = rewrite("grouped-gemm", UTIL, REL)
    files = {"megatron/core/transformer/__init__.py": "", "megatron/core/transformer/moe/__init__.py": "", REL: after}
    assert "ROCm/grouped_gemm" in run_tree(tmp_path / "r", files, PROBE, hip="6.4.1").stdout
    assert "fanshiqing/grouped_gemm@v1.1.4" in run_tree(tmp_path / "c", files, PROBE).stdout


@pytest.mark.torch
def test_moe_grouped_gemm_falls_back_to_sequential_on_rocm(tmp_path):
    code = """
        import types, warnings
        from megatron.core._rocm import disable_missing_fusions
        for impl, legacy in (("local", False), ("transformer_engine", False), ("transformer_engine", True)):
            args = types.SimpleNamespace(moe_grouped_gemm=True, transformer_impl=impl, moe_use_legacy_grouped_gemm=legacy)
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                disable_missing_fusions(args)
            print(impl, args.moe_grouped_gemm, any("sequential expert GEMMs" in str(x.message) for x in w))
    """
    lines = lambda proc: proc.stdout.split("\n")[:3]  # noqa: E731
    # ROCm, neither TE nor grouped_gemm: every way falls back to SequentialMLP, with the warning
    assert lines(run_tree(tmp_path / "r", {}, code, hip="6.4.1")) == [
        "local False True",
        "transformer_engine False True",
        "transformer_engine False True",
    ]
    # a TE with GroupedLinear: TE's grouped GEMM (TEGroupedMLP), unless the legacy GroupedMLP is asked for
    te = {
        "transformer_engine/__init__.py": "",
        "transformer_engine/pytorch/__init__.py": "class GroupedLinear:\n    pass\n",
    }
    assert lines(run_tree(tmp_path / "t", te, code, hip="6.4.1")) == [
        "local False True",
        "transformer_engine True False",
        "transformer_engine False True",
    ]
    # an older ROCm TE without GroupedLinear: megatron would take the legacy GroupedMLP, which needs grouped_gemm
    old_te = {"transformer_engine/__init__.py": "", "transformer_engine/pytorch/__init__.py": ""}
    assert lines(run_tree(tmp_path / "o", old_te, code, hip="6.4.1"))[1] == "transformer_engine False True"
    # AMD's grouped_gemm build installed (the component matrix): the grouped GEMM stays on, every way
    gg = {"grouped_gemm/__init__.py": "", "grouped_gemm/ops.py": ""}
    assert lines(run_tree(tmp_path / "g", gg, code, hip="6.4.1")) == [
        "local True False",
        "transformer_engine True False",
        "transformer_engine True False",
    ]
    # the CUDA control: unchanged
    assert lines(run_tree(tmp_path / "c", {}, code)) == [
        "local True False",
        "transformer_engine True False",
        "transformer_engine True False",
    ]


def test_docstrings_citing_the_repo_are_left_alone():
    src = 'class Config:\n    moe_grouped_gemm: bool = False\n    """GEMM feature since CUTLASS 2.8 (https://github.com/fanshiqing/grouped_gemm)."""\n'
    assert rewrite("grouped-gemm", src, "megatron/core/transformer/transformer_config.py") == (src, 0)


def test_exact_before_after():
    assert_codemod(
        "grouped-gemm",
        UTIL,
        "from megatron.core._rocm import grouped_gemm_hint\n\n"
        + UTIL.replace(
            "    assert grouped_gemm is not None, (\n", "    assert grouped_gemm is not None, grouped_gemm_hint((\n"
        ).replace('@v1.1.4`."\n    )\n', '@v1.1.4`."\n    ))\n'),
        REL,
        sites=1,
    )


def test_hint_import_goes_after_docstring_and_future():
    assert_codemod(
        "grouped-gemm",
        '''\
        """Grouped GEMM."""
        from __future__ import annotations

        HINT = "pip install git+https://github.com/fanshiqing/grouped_gemm@v1.1.4"
        ''',
        '''\
        """Grouped GEMM."""
        from __future__ import annotations
        from megatron.core._rocm import grouped_gemm_hint

        HINT = grouped_gemm_hint("pip install git+https://github.com/fanshiqing/grouped_gemm@v1.1.4")
        ''',
        REL,
        sites=1,
    )
