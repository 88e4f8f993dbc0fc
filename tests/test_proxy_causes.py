"""Which failures are the CPU proxy's (rocmport.verify.runtime.proxy_causes), on real tracebacks: torch ops
that raise under the shim's real TorchFunctionMode (CudaToCpu) in a subprocess, read as stage 4 reads a rank's
stderr (case_log.failure_of) and as stage 3's pytest plugin records a test's failure, then labelled.

The shim's mode sits in every torch op's call stack: where it changed nothing (its pass-through), the frame is
not the shim, and a failure both trees share there is upstream's unless its message says the CPU backend
lacks something; a frame where the shim acted (device='cuda' made cpu) still is the shim."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rocmport.verify.runtime import protocol

pytestmark = pytest.mark.torch

# Three real failures under the shim's mode. ``leaf``: the distributed optimizer's (measured on v0.16's fp32
# dist-opt resume cases, on both trees; it fails on a GPU too), a torch op the shim passes through unchanged.
# ``pinned``: a pass-through too, whose message says the CPU backend has no pinned memory. ``redirected``:
# an op the shim rewrote (device='cuda' made cpu) before torch refused it.
OPS = textwrap.dedent("""\
    import torch


    def leaf():
        torch.ones(3, requires_grad=True)[:2].copy_(torch.zeros(2))


    def pinned():
        torch.empty(3, pin_memory=True)


    def redirected():
        torch.zeros(-1, device="cuda")
    """)

RUN_ONE = textwrap.dedent("""\
    import sys, traceback
    sys.path.insert(0, sys.argv[1])
    from rocmport.verify.runtime.proxy_shim import CudaToCpu
    from megatron.core import ops
    with CudaToCpu():
        try:
            getattr(ops, sys.argv[2])()
        except Exception:
            for line in traceback.format_exc().splitlines():  # as torchrun prefixes a rank's lines
                print(f"[rank0]: {line}", file=sys.stderr)
            sys.exit(1)
    """)


def tree_with_ops(root: Path) -> Path:
    (root / "megatron" / "core").mkdir(parents=True)
    (root / "megatron" / "__init__.py").write_text("")
    (root / "megatron" / "core" / "__init__.py").write_text("")
    (root / "megatron" / "core" / "ops.py").write_text(OPS)
    return root


def rank_stderr(tree: Path, op: str) -> str:
    """A rank's stderr after ``op`` raised under the shim's mode (run in a subprocess, as a rank runs)."""
    proc = subprocess.run(
        [sys.executable, "-c", RUN_ONE, str(tree), op], capture_output=True, text=True, timeout=120, cwd=tree
    )
    assert proc.returncode == 1 and "Traceback" in proc.stderr, proc.stderr
    return proc.stderr


def stage4_label(tmp_path: Path, op: str) -> tuple[str, str, str | None]:
    """``op``'s failure on two trees (each a real run), labelled by stage 4: (label, why, the port's shim frame)."""
    from rocmport.verify.orchestration.stage_result import FAIL, StageResult
    from rocmport.verify.stages.functional import CaseOutcome, failure_of
    from rocmport.verify.stages.functional.case_labels import BaselineRun, label_case

    port_tree, base_tree = tree_with_ops(tmp_path / "port"), tree_with_ops(tmp_path / "base")
    pf = failure_of(rank_stderr(port_tree, op), port_tree, "resume")
    bf = failure_of(rank_stderr(base_tree, op), base_tree, "resume")
    assert pf.site == f"megatron/core/ops.py ({op})" and (pf.message, pf.site) == (bf.message, bf.site)
    out = CaseOutcome("case", StageResult("functional", FAIL, "x"), None, pf)
    lab, why = label_case(out, BaselineRun("a" * 40, FAIL, "y", 1.0, failure=bf))
    return lab, why, pf.shim


@pytest.mark.slow
def test_stage4_a_torch_error_through_the_shims_pass_through_is_upstream_known_not_the_shims(tmp_path):
    lab, why, shim = stage4_label(tmp_path, "leaf")
    assert shim is None, shim
    assert lab == "upstream-known", why
    assert "a view of a leaf Variable that requires grad" in why and "shim" not in why


@pytest.mark.slow
def test_stage4_a_failure_where_the_shim_redirected_the_call_is_still_the_shims(tmp_path):
    lab, why, shim = stage4_label(tmp_path, "redirected")
    assert shim is not None and shim.startswith("__torch_function__ (proxy_shim.py:"), shim
    assert lab == "proxy-artifact" and "its TorchFunctionMode" in why, why


@pytest.mark.slow
def test_stage4_a_cpu_backend_message_on_both_trees_is_a_proxy_artifact_naming_the_cpu_backend(tmp_path):
    lab, why, shim = stage4_label(tmp_path, "pinned")
    assert shim is None, shim
    assert lab == "proxy-artifact", why
    assert "through the CPU backend (RuntimeError: pin_memory=True requires a CUDA or other accelerator backend" in why


PYTEST_FILE = textwrap.dedent("""\
    import pytest

    from megatron.core import ops
    from rocmport.verify.runtime.proxy_shim import CudaToCpu


    @pytest.mark.parametrize("op", ["leaf", "pinned", "redirected"])
    def test_op(op):
        with CudaToCpu():
            getattr(ops, op)()
    """)


@pytest.mark.slow
def test_stage3_the_plugin_sites_a_failure_past_the_shims_pass_through_and_labels_follow(tmp_path):
    """The plugin's record of each failure (a real pytest run with it), labelled by stage 3 against the same
    record as the unported tree's (the same failure on both trees)."""
    from rocmport.verify.stages.unit_tests.labels import label
    from rocmport.verify.stages.unit_tests.results import SuiteRun

    tree = tree_with_ops(tmp_path / "tree")
    (tree / "tests").mkdir()
    (tree / "tests" / "test_ops.py").write_text(PYTEST_FILE)
    out = tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "PYTHONPATH": str(tree)}
    protocol.UNIT_OUT.set(env, str(out))
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "rocmport.verify.runtime.pytest_plugin", "tests/test_ops.py"],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "3 failed" in proc.stdout, proc.stdout + proc.stderr
    rank = json.loads((out / "rank0.json").read_text())
    details = rank["details"]
    node = "tests/test_ops.py::test_op[{}]".format
    # raised in a torch op the shim handed on unchanged: where upstream's code called it, as on a GPU
    assert details[node("leaf")].endswith(" at megatron/core/ops.py:5"), details
    assert details[node("pinned")].endswith(" at megatron/core/ops.py:9"), details
    # raised where the shim acted: the shim's frame
    assert "rocmport/verify/runtime/proxy_shim.py:" in details[node("redirected")], details
    run = SuiteRun(outcomes=rank["outcomes"], details=details, kinds=rank["kinds"])
    labels, why = label(run, run, {})
    assert labels[node("leaf")] == "upstream-known", why
    assert (
        labels[node("pinned")] == "proxy-artifact"
        and "through the CPU backend (RuntimeError: pin_memory" in (why[node("pinned")])
    )
    assert (
        labels[node("redirected")] == "proxy-artifact" and "raised in the CPU proxy's shim" in why[node("redirected")]
    )


@pytest.mark.parametrize(
    "message",
    [
        "RuntimeError: pin_memory=True requires a CUDA or other accelerator backend; no pinned memory allocator",
        "AssertionError: Torch not compiled with CUDA enabled",
        "RuntimeError: Found no NVIDIA driver on your system. Please check that you have an NVIDIA GPU",
        "AttributeError: module 'torch.distributed' has no attribute 'ProcessGroupNCCL'. Did you mean: 'ProcessGroup'?",
        "RuntimeError: 0 active drivers ([]). There should only be one.",
        "RuntimeError: Batch-invariant GEMM requires CUDA tensors.",
        "AssertionError: Input must be a CUDA tensor",
        "NotImplementedError: Could not run 'aten::_fused_adam_' with arguments from the 'CPU' backend.",
        "RuntimeError: \"addmm_impl_cpu_\" not implemented for 'Half'",
        "RuntimeError: softmax with half to float conversion is not supported on CPU",
        "RuntimeError: Cannot use ReduceOp.PREMUL_SUM with Gloo",
        "RuntimeError: CUDA error: no CUDA-capable device is detected",
        "RuntimeError: Distributed package doesn't have NCCL built in",
    ],
)
def test_messages_that_say_the_cpu_backend_lacks_something(message):
    """Each as torch, gloo, triton or megatron words it (the first six seen on the proxy's v0.16/v0.19 runs)."""
    from rocmport.verify.runtime.proxy_causes import cpu_backend_mechanism

    assert cpu_backend_mechanism(message) == f"the CPU backend ({message})"


@pytest.mark.parametrize(
    "message",
    [
        "RuntimeError: a view of a leaf Variable that requires grad is being used in an in-place operation.",
        "RuntimeError: CUDA error: an illegal memory access was encountered",  # a kernel's, on a GPU
        "NotImplementedError: Async checkpoint save not implemented for legacy checkpoints",
        "AttributeError: module 'torch.distributed' has no attribute 'ProcessGroupGloo2'",
    ],
)
def test_messages_that_do_not(message):
    from rocmport.verify.runtime.proxy_causes import cpu_backend_mechanism

    assert cpu_backend_mechanism(message) is None
