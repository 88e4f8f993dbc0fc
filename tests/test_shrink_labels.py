"""Stage 4's labels where verify's own shrink may have made the failure (case_plan.shrink_changes,
case_labels.label_case): a case that fails the same way on both trees before its first iteration, with a
message that names a quantity the proxy's plan changed (layers, heads, hidden size, sequence length,
micro-batches, vocabulary, ranks, precision...), is a proxy-artifact naming the change; one whose message
names nothing the plan changed stays upstream-known.

The cases are upstream's own YAMLs (a Megatron-LM mirror, ROCMPORT_TEST_MLM_MIRROR) and the failures the
texts Megatron printed in the v0.16 `--cases all` sweep (patchsets/megatron-lm/v0.16/case-results.json)."""

from __future__ import annotations

import os
import subprocess
import tarfile
from pathlib import Path

import pytest

from rocmport.verify.orchestration.stage_result import FAIL, StageResult
from rocmport.verify.stages import case_plan as cp
from rocmport.verify.stages.functional.case_args import PROXY_TRAINING
from rocmport.verify.stages.functional.case_labels import BaselineRun, label_case
from rocmport.verify.stages.functional.case_run import CaseOutcome
from rocmport.verify.stages.functional.details import CaseFailure, FunctionalRun

MIRROR = os.environ.get("ROCMPORT_TEST_MLM_MIRROR")
needs_mirror = pytest.mark.skipif(not MIRROR, reason="set ROCMPORT_TEST_MLM_MIRROR to a Megatron-LM mirror")
BASE = "55ac7082517c3878ae653c07c09c534b8aed49f6"  # v0.16's upstream commit (core_v0.16.1)

# Megatron's interleaved schedule, as it stopped both trees of the two tunable_overlap cases in the sweep's
# chunk b3 (the shrink's 8 micro-batches against the case's group of 5: a remainder of 3 under pp 4).
REMAINDER = (
    "RuntimeError: The remainder of M (the total micro-batches) divided by N (number of contiguous micro-batches in "
    "a virtual pipeline stage) should be 0, or larger than or equal to the pipeline-parallel size, but it is 3. "
    "Otherwise, it introduces dependency bubbles in the pipeline and reduces throughput"
)
SCHEDULE = "megatron/core/pipeline_parallel/schedules.py (forward_backward_pipelining_with_interleaving)"
VALIDATE = "megatron/training/arguments.py (validate_args)"


@pytest.fixture(scope="module")
def v016(tmp_path_factory) -> Path:
    """core_v0.16.1's GPT cases, archived from the mirror."""
    root = tmp_path_factory.mktemp("v016")
    with (root / "cases.tar").open("wb") as out:
        subprocess.run(["git", f"--git-dir={MIRROR}", "archive", "core_v0.16.1", str(cp.CASES)], stdout=out, check=True)
    with tarfile.open(root / "cases.tar") as tar:
        tar.extractall(root, filter="data")
    return root


def planned(tree: Path, case: str, **kwargs) -> cp.CasePlan:
    plan = cp.plan_case(case, cp.load_config(tree, case), **kwargs)
    assert isinstance(plan, cp.CasePlan), plan
    return plan


def changes_of(plan: cp.CasePlan) -> list[cp.ShrinkChange]:
    """What stage 4 changes about the case: the plan's shrink, mock data, and the proxy's training (10 iterations)."""
    return cp.shrink_changes(plan, mock_data=True, training={**PROXY_TRAINING, "--train-iters": 10})


def both_fail(case: str, message: str, site: str | None, losses: list[float] | None = None):
    """The port's outcome and the unported tree's run, failing alike before any iteration (``losses``: logged)."""
    failure = CaseFailure("run", message, site)
    run = FunctionalRun(case, "pretrain_gpt.py ...", losses or [], 10)
    port = CaseOutcome(case, StageResult("functional", FAIL, message), run, failure)
    return port, BaselineRun(BASE, FAIL, message, 1.0, failure=CaseFailure("run", message, site))


@needs_mirror
def test_the_plan_says_what_the_shrink_changed_of_a_real_case(v016):
    plan = planned(v016, "gpt3_mcore_te_tp1_pp4_vp1_tunable_overlap")
    said = {c.quantity: c.describe() for c in changes_of(plan)}
    assert said["--hidden-size"] == "--hidden-size 512 → 64"
    assert said["--num-attention-heads"] == "--num-attention-heads 8 → 4"
    assert said["--seq-length"] == "--seq-length 1024 → 128"
    assert said["--micro-batch-size"] == "--micro-batch-size 4 → 2"
    # upstream's one node of 8 GPUs gives tp1·pp4 dp2; the proxy runs dp1
    assert said["ranks"] == "ranks 8 (dp2) → 4 (dp1)"
    assert said["micro-batches"].startswith("micro-batches 5 per step → 9 per step"), said["micro-batches"]
    assert said["--vocab-size"] == "--vocab-size the tokenizer's → 1024 (mock data)"
    assert said["precision"] == "precision --bf16 → fp32"
    assert "--num-layers" not in said  # 12 layers: the case's pipeline structure (pp4 × 3 chunks) is its smallest


@needs_mirror
def test_a_failure_the_shrink_made_is_a_proxy_artifact_naming_what_it_changed(v016):
    """The sweep's chunk b3 labelled this upstream-known; the shrink's micro-batches made it (fixed since)."""
    case = "gpt3_mcore_te_tp1_pp4_vp1_tunable_overlap"
    port, base = both_fail(case, REMAINDER, SCHEDULE)
    label, why = label_case(port, base, changes=changes_of(planned(v016, case)))
    assert label == "proxy-artifact", why
    assert why.startswith("verify's shrink: micro-batches 5 per step → 9 per step"), why
    assert "The remainder of M (the total micro-batches)" in why and "--hidden-size" not in why
    # without what the plan changed (a GPU run has no plan), the same failure is upstream's
    assert label_case(port, base)[0] == "upstream-known"
    # a failure after the first iteration is training's, not the shrink's argument check
    port, base = both_fail(case, REMAINDER, SCHEDULE, losses=[7.0])
    assert label_case(port, base, changes=changes_of(planned(v016, case)))[0] == "upstream-known"


# The v0.16 sweep's upstream-known failures before the first iteration (case, message as Megatron printed it, site):
# each names something the case itself sets or a code path, not a quantity the shrink changed.
UPSTREAM_KNOWN = [
    (
        "gpt3_mcore_tp1_pp1_fsdp2_resume_torch_dist_te",
        "AssertionError: --use-torch-fsdp2 requires --untie-embeddings-and-output-weights",
        VALIDATE,
    ),
    (
        "gpt3_weekly_dgx_b200_mcore_tp2_pp2_current_scaling_native_fp8_tp_pp_sp_tp_overlap",
        "AssertionError: Using tensor model parallelism or context parallelism require setting the environment "
        "variable CUDA_DEVICE_MAX_CONNECTIONS to 1",
        VALIDATE,
    ),
    (
        "gpt3_weekly_dgx_h100_mcore_tp4_cp2_current_scaling_native_fp8_tp_fsdp",
        "AssertionError: Megatron FSDP only supports fsdp_dtensor checkpoint format",
        VALIDATE,
    ),
    (
        "gpt3_mcore_te_tp2_pp1_fsdp2_resume_torch_dist",
        "TypeError: _BaseDataParallel.finish_grad_sync() got an unexpected keyword argument 'force_all_reduce'",
        "megatron/core/distributed/finalize_model_grads.py (finalize_model_grads)",
    ),
]


@needs_mirror
@pytest.mark.parametrize("case, message, site", UPSTREAM_KNOWN, ids=[c for c, _, _ in UPSTREAM_KNOWN])
def test_a_failure_naming_nothing_the_shrink_changed_stays_upstream_known(v016, case, message, site):
    te = cp.ProxyTE("rocm", "fnuz", "gfx942")  # the sweep's: ROCm TE's layer on a simulated MI300X
    port, base = both_fail(case, message, site)
    label, why = label_case(port, base, changes=changes_of(planned(v016, case, te=te)))
    assert label == "upstream-known" and "shrink" not in why, why


@pytest.mark.parametrize(
    "message, quantity",
    [
        # Megatron's own messages (core_v0.16.1: transformer_config.py, arguments.py, num_microbatches_calculator.py)
        (
            "ValueError: num_attention_heads (4) must be a multiple of tensor_model_parallel_size (8).",
            "--num-attention-heads",
        ),
        (
            "ValueError: num_query_groups (2) must be a multiple or divisor of tensor_model_parallel_size (4).",
            "--num-query-groups",
        ),
        (
            "AssertionError: number of layers of the model must be divisible pipeline model parallel size",
            "--num-layers",
        ),
        (
            "AssertionError: global batch size (18) is not divisible by micro batch size (2) times data parallel size (2)",
            "--global-batch-size",
        ),
        ("AssertionError: world size (4) is not divisible by total_model_size (total_model_size=8)", "ranks"),
    ],
)
def test_each_quantity_the_shrink_changes_is_recognised_in_megatrons_words(message, quantity):
    changes = [
        cp.ShrinkChange("--num-attention-heads", "32", "4"),
        cp.ShrinkChange("--num-query-groups", "8", "2"),
        cp.ShrinkChange("--num-layers", "32", "4"),
        cp.ShrinkChange("--hidden-size", "4096", "64"),
        cp.ShrinkChange("--global-batch-size", "128", "16"),
        cp.ShrinkChange("ranks", "8 (dp4)", "4 (dp2)"),
    ]
    named = {c.quantity for c in cp.shrink_named(changes, message)}
    assert quantity in named and "--hidden-size" not in named, named


def test_a_word_inside_another_option_is_not_the_quantity():
    lr = cp.ShrinkChange("--lr", "0.00015", "0.003")
    assert not lr.named_in("AssertionError: --decoupled-lr requires --decoupled-min-lr")
    assert not lr.named_in("decoupled_lr must be set")
    assert lr.named_in("AssertionError: lr must be positive")
    hidden = cp.ShrinkChange("--hidden-size", "512", "64")
    assert not hidden.named_in("ffn_hidden_size must be set with --swiglu")
