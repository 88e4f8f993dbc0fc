"""Stage 4's label of a case that fails inside the port's own code (the generated helper,
megatron/core/_rocm.py): port-regression, whatever the unported tree did with the case. Upstream has no
such file in its library (the baseline's overlay copies it for the port's test files only), so no
upstream code path raises there; when the unported tree stops earlier, on a package the port makes
optional, comparing the two failures said `unverified` and the port's bug passed the stage.

The tracebacks are real: v0.19's current-scaling FP8 case with a port bug injected
(scripts/inject_port_bug.py attention-fp8-gate-missing-kwarg and fp8-recipes-gfx942-tensorwise), its
unported run stopping on nvidia_resiliency_ext."""

from __future__ import annotations

from pathlib import Path

from rocmport.verify.orchestration.stage_result import FAIL, PASS, StageResult
from rocmport.verify.stages.functional import case_log
from rocmport.verify.stages.functional.case_labels import BaselineRun, label_case
from rocmport.verify.stages.functional.case_run import CaseOutcome
from rocmport.verify.stages.functional.details import CaseFailure

TREE = Path("/work/proj/build/megatron-lm")
GATE = """\
[rank0]:   File "/work/proj/build/megatron-lm/megatron/core/transformer/attention.py", line 438, in __init__
[rank0]:     and te_gate(is_te_min_version("2.6.0dev0"), "pytorch.Linear")
[rank0]:         ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
[rank0]:   File "/work/proj/build/megatron-lm/megatron/core/_rocm.py", line 816, in counted
[rank0]:     return fn(*args, **kwargs)
[rank0]:            ^^^^^^^^^^^^^^^^^^^
[rank0]: TypeError: te_gate() missing 1 required positional argument: 'kwarg' when instantiating SelfAttention when instantiating TransformerLayer
"""
RECIPE = """\
Traceback (most recent call last):
  File "/work/proj/build/megatron-lm/megatron/training/arguments.py", line 412, in validate_args
    check_fp8_for_arch(args)
  File "/work/proj/build/megatron-lm/megatron/core/_rocm.py", line 708, in check_fp8_for_arch
    raise ValueError(f"{what}: {arch} cannot run the {recipe} recipe ({why}); "
ValueError: --fp8-format hybrid --fp8-recipe tensorwise: gfx942 cannot run the tensorwise recipe (not among gfx942's FP8 recipes); use --fp8-recipe delayed
"""
NO_NVRX = """\
Traceback (most recent call last):
  File "/tmp/baseline/megatron/core/dist_checkpointing/strategies/torch.py", line 120, in get_async_strategy
    from nvidia_resiliency_ext.checkpointing.async_ckpt.core import AsyncRequest
ModuleNotFoundError: No module named 'nvidia_resiliency_ext'
"""


def _port(stderr: str) -> CaseOutcome:
    failure = case_log.failure_of(stderr, TREE, "run")
    return CaseOutcome("fp8", StageResult("functional", FAIL, failure.message), None, failure)


def _unported(status: str = FAIL) -> BaselineRun:
    failure = case_log.failure_of(NO_NVRX, Path("/tmp/baseline"), "run") if status == FAIL else None
    return BaselineRun(
        "5be9626709af" + "0" * 28, status, "ModuleNotFoundError: nvidia_resiliency_ext", 18.0, failure=failure
    )


def test_a_failure_inside_the_ports_helper_is_a_port_regression_though_the_unported_tree_stopped_earlier():
    for stderr, said in (
        (GATE, "te_gate() missing 1 required positional argument"),
        (RECIPE, "cannot run the tensorwise"),
    ):
        port = _port(stderr)
        assert port.failure is not None and port.failure.site is not None
        assert port.failure.site.startswith("megatron/core/_rocm.py"), port.failure.site
        label, why = label_case(port, _unported(), blocked=("nvidia_resiliency_ext",))
        assert label == "port-regression", why
        assert "the port's own code" in why and said in why and "nvidia_resiliency_ext" in why


def test_a_failure_elsewhere_still_compares_with_the_unported_tree():
    other = GATE.replace("megatron/core/_rocm.py", "megatron/core/transformer/utils.py")
    label, _ = label_case(_port(other), _unported(), blocked=("nvidia_resiliency_ext",))
    assert label == "unverified"  # fails differently on the unported tree: nothing shows whose it is


def test_a_failure_in_the_helper_through_the_proxys_shim_is_left_to_the_comparison():
    port = _port(GATE)
    assert port.failure is not None
    port.failure = CaseFailure(port.failure.phase, port.failure.message, port.failure.site, "__torch_function__")
    label, _ = label_case(port, _unported(), blocked=("nvidia_resiliency_ext",))
    assert label == "unverified"


def test_the_unported_tree_passing_says_so_first():
    label, why = label_case(_port(RECIPE), _unported(PASS))
    assert label == "port-regression" and why.startswith("passes on the unported tree")
