"""fp8-arch-check: before/after, and validate_args with an FP8 recipe per AMD arch (the HIP simulation's
device, its arch swapped per case) against the CUDA control."""

from __future__ import annotations

import pytest

from tests.helpers.codemods import VALIDATE_ARGS, assert_codemod, rewrite, run_tree, validate_args_tree

REL = "megatron/training/arguments.py"


def test_exact_before_after():
    after = VALIDATE_ARGS.replace(
        '    """Validate arguments."""\n',
        (
            '    """Validate arguments."""\n'
            "    from megatron.core._rocm import check_fp8_for_arch\n"
            "    check_fp8_for_arch(args)  # rocmport: on ROCm, the FP8 recipe against the GPU's arch\n"
        ),
    )
    assert_codemod("fp8-arch-check", VALIDATE_ARGS, after, REL, sites=1)


def test_only_arguments_py():
    _, sites = rewrite("fp8-arch-check", VALIDATE_ARGS, "megatron/training/other.py")
    assert sites == 0


# The device answers as the HIP simulation's MI300X would, with the arch of the case; TE is absent
# unless the case installs a stand-in for transformer_engine.pytorch.fp8 with its check's answer.
PROBE = """
import os, sys, types, warnings, torch
props = types.SimpleNamespace(gcnArchName=__ARCH__, name="AMD GPU", major=9, minor=4)
torch.cuda.get_device_properties = lambda device=None: props
for k in ("NVTE_ROCM_ENABLE_MXFP8", "CUDA_DEVICE_MAX_CONNECTIONS"):
    os.environ.pop(k, None)
os.environ.update(__ENV__)
os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] = "1"
if __TE__ is not None:
    for name in ("transformer_engine", "transformer_engine.pytorch"):
        sys.modules[name] = types.ModuleType(name)
    fp8 = sys.modules["transformer_engine.pytorch.fp8"] = types.ModuleType("transformer_engine.pytorch.fp8")
    fp8.check_fp8_support = fp8.check_mxfp8_support = lambda: __TE__
from megatron.training.arguments import validate_args
args = types.SimpleNamespace(rank=0, tensor_model_parallel_size=1, context_parallel_size=1, use_torch_fsdp2=False,
                             use_megatron_fsdp=False, tp_comm_overlap=False, sequence_parallel=False, deterministic_mode=False,
                             fp8=__FORMAT__, fp8_recipe=__RECIPE__)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    try:
        validate_args(args)
        print("ok", os.environ.get("NVTE_ROCM_ENABLE_MXFP8"))
    except ValueError as exc:
        print("ValueError", exc)
for w in caught:
    print("warning", w.message)
"""


def probe(arch="gfx942:sramecc+:xnack-", fmt="hybrid", recipe="delayed", env=None, te=None) -> str:
    return (
        PROBE.replace("__ARCH__", repr(arch))
        .replace("__FORMAT__", repr(fmt))
        .replace("__RECIPE__", repr(recipe))
        .replace("__ENV__", repr(env or {}))
        .replace("__TE__", repr(te))
    )


def run(tmp_path, text: str, code: str, hip: bool = True) -> list[str]:
    proc = run_tree(tmp_path, validate_args_tree(text), code, hip="7.1.25424" if hip else None)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()


CASES = [
    # (arch, format, recipe, env, TE's answer, the first line printed)
    ("gfx942:sramecc+:xnack-", "hybrid", "delayed", {}, None, "ok None"),
    ("gfx942:sramecc+:xnack-", "e4m3", "tensorwise", {}, None, "ok None"),
    (
        "gfx942:sramecc+:xnack-",
        "hybrid",
        "mxfp8",
        {},
        None,
        "ValueError --fp8-format hybrid --fp8-recipe mxfp8: gfx942 cannot run the mxfp8 recipe (MXFP8 needs gfx950; gfx942 has "
        "the FNUZ FP8 formats); use --fp8-recipe delayed or tensorwise",
    ),
    ("gfx950", "e4m3", "mxfp8", {}, None, "ok 1"),
    # ROCm TE refuses FP8 block scaling on every AMD GPU (quantization.py @030b7921: "FP8 block scaled
    # gemm not yet supported for ROCm"): refused here, with or without TE installed
    (
        "gfx942:sramecc+:xnack-",
        "e4m3",
        "blockwise",
        {},
        None,
        "ValueError --fp8-format e4m3 --fp8-recipe blockwise: gfx942 cannot run the blockwise recipe (ROCm Transformer "
        "Engine has no FP8 block scaling on any AMD GPU); use --fp8-recipe delayed or tensorwise",
    ),
    (
        "gfx950",
        "e4m3",
        "blockwise",
        {},
        None,
        "ValueError --fp8-format e4m3 --fp8-recipe blockwise: gfx950 cannot run the blockwise recipe (ROCm Transformer "
        "Engine has no FP8 block scaling on any AMD GPU); use --fp8-recipe delayed or tensorwise",
    ),
    (
        "gfx950",
        "e4m3",
        "mxfp8",
        {"NVTE_ROCM_ENABLE_MXFP8": "0"},
        None,
        "ValueError --fp8-format e4m3 --fp8-recipe mxfp8: gfx950 runs MXFP8 only with NVTE_ROCM_ENABLE_MXFP8=1 (it is set to '0'); "
        "export NVTE_ROCM_ENABLE_MXFP8=1",
    ),
    (
        "gfx90a:sramecc+:xnack-",
        "hybrid",
        "delayed",
        {},
        None,
        "ValueError --fp8-format hybrid --fp8-recipe delayed: gfx90a cannot run FP8 (ROCm Transformer Engine runs FP8 on "
        "gfx942/gfx950 only); train in bf16 (--bf16, without --fp8-format)",
    ),
    (
        "gfx1100",
        "e4m3",
        "tensorwise",
        {},
        None,
        "ValueError --fp8-format e4m3 --fp8-recipe tensorwise: gfx1100 cannot run FP8 (ROCm Transformer Engine runs FP8 on "
        "gfx942/gfx950 only); train in bf16 (--bf16, without --fp8-format)",
    ),
    # The installed TE's own check has the last word.
    (
        "gfx950",
        "hybrid",
        "delayed",
        {},
        (False, "Device arch gfx94x or gfx95x required for FP8 execution."),
        "ValueError --fp8-format hybrid --fp8-recipe delayed: the installed Transformer Engine cannot run it on gfx950: "
        "Device arch gfx94x or gfx95x required for FP8 execution.",
    ),
    ("gfx950", "hybrid", "delayed", {}, (True, ""), "ok None"),
]


@pytest.mark.torch
@pytest.mark.parametrize("arch, fmt, recipe, env, te, first", CASES)
def test_rocm_by_arch(tmp_path, arch, fmt, recipe, env, te, first):
    after, _ = rewrite("fp8-arch-check", VALIDATE_ARGS, REL)
    lines = run(tmp_path, after, probe(arch, fmt, recipe, env, te))
    assert lines[0] == first
    if first == "ok 1":
        assert lines[1].startswith(
            "warning ROCm gfx950 --fp8-format e4m3 --fp8-recipe mxfp8: set NVTE_ROCM_ENABLE_MXFP8=1"
        )


@pytest.mark.torch
def test_without_fp8_or_without_a_device_nothing_is_judged(tmp_path):
    after, _ = rewrite("fp8-arch-check", VALIDATE_ARGS, REL)
    assert run(tmp_path / "a", after, probe("gfx90a", None, "delayed"))[0] == "ok None"
    nodevice = probe("gfx90a").replace(
        "torch.cuda.get_device_properties = lambda device=None: props",
        "def nodev(device=None):\n    raise RuntimeError('No HIP GPUs are available')\n"
        "torch.cuda.get_device_properties = nodev",
    )
    assert run(tmp_path / "b", after, nodevice)[0] == "ok None"


@pytest.mark.torch
@pytest.mark.parametrize("arch, recipe", [("gfx90a", "delayed"), ("gfx942", "mxfp8")])
def test_cuda_is_upstream(tmp_path, arch, recipe):
    after, _ = rewrite("fp8-arch-check", VALIDATE_ARGS, REL)
    ported = run(tmp_path / "p", after, probe(arch, "hybrid", recipe), hip=False)
    upstream = run(tmp_path / "u", VALIDATE_ARGS, probe(arch, "hybrid", recipe), hip=False)
    assert ported == upstream == ["ok None"]
