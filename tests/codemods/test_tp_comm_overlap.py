"""tp-comm-overlap: before/after, and --tp-comm-overlap on ROCm (with and without TE userbuffers) vs CUDA."""

import pytest

from tests.helpers.codemods import (
    VALIDATE_ARGS,
    assert_codemod,
    rewrite,
    run_tree,
    validate_args_probe,
    validate_args_tree,
)

REL = "megatron/training/arguments.py"
OVERLAP = {"tp_comm_overlap": True, "sequence_parallel": True}

# A Transformer Engine with userbuffers (the names the probe asks for), and one without (older ROCm TE).
TE_WITH_UB = {
    "transformer_engine/__init__.py": "",
    "transformer_engine/pytorch/__init__.py": "",
    "transformer_engine/pytorch/module/__init__.py": "",
    "transformer_engine/pytorch/module/base.py": "def initialize_ub(*a, **k):\n    pass\n",
    "transformer_engine_torch.py": "class CommOverlap: pass\nclass CommOverlapP2P: pass\n",
}
TE_WITHOUT_UB = {**TE_WITH_UB, "transformer_engine_torch.py": "class CommOverlapHelper: pass\n"}


def test_exact_before_after():
    after = VALIDATE_ARGS.replace(
        '    """Validate arguments."""\n',
        (
            '    """Validate arguments."""\n'
            "    from megatron.core._rocm import disable_unsupported_tp_comm_overlap\n"
            "    disable_unsupported_tp_comm_overlap(args)  # rocmport: on ROCm, only with TE userbuffers\n"
        ),
    )
    assert_codemod("tp-comm-overlap", VALIDATE_ARGS, after, REL, sites=1)


@pytest.mark.torch
def test_rocm_without_userbuffers_switches_it_off_with_a_warning(tmp_path):
    after, _ = rewrite("tp-comm-overlap", VALIDATE_ARGS, REL)
    env = {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    for name, te in (("none", {}), ("old", TE_WITHOUT_UB)):
        proc = run_tree(
            tmp_path / name, {**validate_args_tree(after), **te}, validate_args_probe(env, OVERLAP), hip="6.4.43482"
        )
        lines = proc.stdout.splitlines()
        assert lines[1] == "tp_comm_overlap False", proc.stderr
        assert lines[2].startswith(
            "warning ROCm: --tp-comm-overlap disabled: the installed Transformer Engine has no userbuffers"
        )


@pytest.mark.torch
def test_rocm_with_userbuffers_keeps_it(tmp_path):
    after, _ = rewrite("tp-comm-overlap", VALIDATE_ARGS, REL)
    proc = run_tree(
        tmp_path,
        {**validate_args_tree(after), **TE_WITH_UB},
        validate_args_probe({"CUDA_DEVICE_MAX_CONNECTIONS": "1"}, OVERLAP),
        hip="6.4.43482",
    )
    assert proc.stdout.splitlines()[1:] == ["tp_comm_overlap True"], proc.stderr


@pytest.mark.torch
def test_cuda_is_upstream(tmp_path):
    """CUDA keeps the option whatever TE has (upstream fails later, in _initialize_tp_communicators)."""
    after, _ = rewrite("tp-comm-overlap", VALIDATE_ARGS, REL)
    probe = validate_args_probe({"CUDA_DEVICE_MAX_CONNECTIONS": "1"}, OVERLAP)
    ported = run_tree(tmp_path / "p", validate_args_tree(after), probe)
    upstream = run_tree(tmp_path / "u", validate_args_tree(VALIDATE_ARGS), probe)
    assert ported.stdout == upstream.stdout and ported.stdout.splitlines()[1] == "tp_comm_overlap True", ported.stderr
