"""deterministic-env: before/after, and --deterministic-mode on ROCm vs CUDA."""

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
DET = {"deterministic_mode": True, "tensor_model_parallel_size": 1}


def test_exact_before_after():
    after = VALIDATE_ARGS.replace(
        '    """Validate arguments."""\n',
        (
            '    """Validate arguments."""\n'
            "    from megatron.core._rocm import apply_deterministic_env\n"
            "    apply_deterministic_env(args)  # rocmport: on ROCm, deterministic-mode extras\n"
        ),
    )
    assert_codemod("deterministic-env", VALIDATE_ARGS, after, REL, sites=1)


@pytest.mark.torch
def test_rocm_sets_the_extras_with_a_warning(tmp_path):
    after, _ = rewrite("deterministic-env", VALIDATE_ARGS, REL)
    proc = run_tree(tmp_path, validate_args_tree(after), validate_args_probe(args=DET), hip="6.4.43482")
    lines = proc.stdout.splitlines()
    assert lines[0] == "ok NCCL_ALGO=Ring ROCBLAS_DEFAULT_ATOMICS_MODE=0", proc.stderr
    assert lines[2] == (
        "warning ROCm --deterministic-mode: set NCCL_ALGO=Ring ROCBLAS_DEFAULT_ATOMICS_MODE=0 "
        "(bitwise-reproducible collectives and rocBLAS GEMMs)"
    )


@pytest.mark.torch
def test_rocm_keeps_the_users_nccl_algo_and_refuses_atomics(tmp_path):
    after, _ = rewrite("deterministic-env", VALIDATE_ARGS, REL)
    tree = validate_args_tree(after)
    kept = run_tree(tmp_path / "k", tree, validate_args_probe({"NCCL_ALGO": "Tree"}, DET), hip="6.4.43482")
    assert kept.stdout.splitlines()[0] == "ok NCCL_ALGO=Tree ROCBLAS_DEFAULT_ATOMICS_MODE=0", kept.stderr
    refused = run_tree(
        tmp_path / "r", tree, validate_args_probe({"ROCBLAS_DEFAULT_ATOMICS_MODE": "1"}, DET), hip="6.4.43482"
    )
    assert refused.stdout.splitlines()[0] == (
        "ValueError --deterministic-mode on ROCm needs ROCBLAS_DEFAULT_ATOMICS_MODE=0 (rocBLAS without atomics: bitwise "
        "reproducible GEMMs); it is set to '1'. Unset it or export ROCBLAS_DEFAULT_ATOMICS_MODE=0."
    ), refused.stderr


@pytest.mark.torch
def test_without_deterministic_mode_nothing_changes_on_rocm(tmp_path):
    after, _ = rewrite("deterministic-env", VALIDATE_ARGS, REL)
    proc = run_tree(
        tmp_path,
        validate_args_tree(after),
        validate_args_probe(args={"tensor_model_parallel_size": 1}),
        hip="6.4.43482",
    )
    assert proc.stdout.splitlines() == ["ok ", "tp_comm_overlap False"], proc.stderr


@pytest.mark.torch
def test_cuda_is_upstream(tmp_path):
    after, _ = rewrite("deterministic-env", VALIDATE_ARGS, REL)
    ported = run_tree(tmp_path / "p", validate_args_tree(after), validate_args_probe(args=DET))
    upstream = run_tree(tmp_path / "u", validate_args_tree(VALIDATE_ARGS), validate_args_probe(args=DET))
    assert ported.stdout == upstream.stdout and ported.stdout.startswith("AssertionError NCCL_ALGO must be one of"), (
        ported.stderr
    )
