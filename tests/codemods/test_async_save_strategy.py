"""async-save-strategy: before/after, and --async-save's strategy on ROCm (with and without
nvidia-resiliency-ext) vs CUDA, on a validate_args shaped like v0.17's."""

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
# v0.17+ (arguments.py at core_v0.17.1 l.1443): without --async-save the strategy is mcore; with it,
# the option's default (nvrx) stands.
VALIDATE_ARGS_V017 = VALIDATE_ARGS.replace(
    "    return args\n", ('    if not args.async_save:\n        args.async_strategy = "mcore"\n\n    return args\n')
)
# The module upstream's get_async_strategy("nvrx") imports first.
NVRX = {
    "nvidia_resiliency_ext/__init__.py": "",
    "nvidia_resiliency_ext/checkpointing/__init__.py": "",
    "nvidia_resiliency_ext/checkpointing/async_ckpt/__init__.py": "",
    "nvidia_resiliency_ext/checkpointing/async_ckpt/core.py": "class AsyncCallsQueue: pass\n",
}
ENV = {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}


def probe(args: dict) -> str:
    return validate_args_probe(ENV, args) + 'print("async_strategy", args.async_strategy)\n'


def outcome(proc) -> tuple[str, list[str]]:
    """(the strategy validate_args left, the warnings it gave)."""
    lines = proc.stdout.splitlines()
    assert lines and lines[0].startswith("ok"), proc.stderr
    return lines[-1].split()[-1], [ln for ln in lines if ln.startswith("warning")]


def test_exact_before_after():
    after = VALIDATE_ARGS_V017.replace(
        '    """Validate arguments."""\n',
        (
            '    """Validate arguments."""\n'
            "    from megatron.core._rocm import use_available_async_strategy\n"
            "    use_available_async_strategy(args)  # rocmport: on ROCm, mcore where nvidia-resiliency-ext is absent\n"
        ),
    )
    assert_codemod("async-save-strategy", VALIDATE_ARGS_V017, after, REL, sites=1)


def test_lines_without_the_option_are_left_alone():
    """v0.15/v0.16: validate_args never sees args.async_strategy; nothing to switch."""
    assert rewrite("async-save-strategy", VALIDATE_ARGS, REL) == (VALIDATE_ARGS, 0)


@pytest.mark.torch
def test_rocm_without_nvrx_writes_with_mcore_and_says_why(tmp_path):
    after, _ = rewrite("async-save-strategy", VALIDATE_ARGS_V017, REL)
    proc = run_tree(
        tmp_path, validate_args_tree(after), probe({"async_save": True, "async_strategy": "nvrx"}), hip="6.4.43482"
    )
    strategy, warned = outcome(proc)
    assert strategy == "mcore"
    assert warned == [
        "warning ROCm: --async-strategy nvrx needs nvidia-resiliency-ext, which is NVIDIA-only and not installed: "
        "async checkpoints are written by Megatron-Core's own writer (--async-strategy mcore)."
    ]


@pytest.mark.torch
@pytest.mark.parametrize(
    "given, expected",
    [
        ({"async_save": True, "async_strategy": "nvrx"}, "nvrx"),  # NVRx installed: kept
        ({"async_save": True, "async_strategy": "mcore"}, "mcore"),
        ({"async_save": False, "async_strategy": "nvrx"}, "mcore"),
    ],
)  # upstream's own rule
def test_rocm_leaves_a_usable_strategy_alone(tmp_path, given, expected):
    after, _ = rewrite("async-save-strategy", VALIDATE_ARGS_V017, REL)
    proc = run_tree(tmp_path, {**validate_args_tree(after), **NVRX}, probe(given), hip="6.4.43482")
    assert outcome(proc) == (expected, [])


@pytest.mark.torch
def test_cuda_is_upstream(tmp_path):
    """CUDA keeps nvrx without the package (upstream stops at the first save, naming it)."""
    after, _ = rewrite("async-save-strategy", VALIDATE_ARGS_V017, REL)
    given = probe({"async_save": True, "async_strategy": "nvrx"})
    ported = run_tree(tmp_path / "p", validate_args_tree(after), given)
    upstream = run_tree(tmp_path / "u", validate_args_tree(VALIDATE_ARGS_V017), given)
    assert ported.stdout == upstream.stdout and outcome(ported) == ("nvrx", []), ported.stderr
