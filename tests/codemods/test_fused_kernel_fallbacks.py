"""fused-kernel-fallbacks: before/after on upstream-shaped code, and both ways at run time."""

import subprocess

import pytest

from tests.helpers.codemods import assert_codemod, assert_idempotent, rewrite, rewrite_with_reports, run_tree
from tests.helpers.real import MLM, needs_mlm_mirror

LOAD_BEFORE = """\
import os
import subprocess

from torch.utils import cpp_extension


def load(args):

    # Check if cuda 11 is installed for compute capability 8.0
    cc_flag = []
    _, bare_metal_major, bare_metal_minor = _get_cuda_bare_metal_version(
        cpp_extension.CUDA_HOME
    )
    return bare_metal_major


def _get_cuda_bare_metal_version(cuda_dir):
    raw_output = subprocess.check_output([cuda_dir + "/bin/nvcc", "-V"], universal_newlines=True)
    output = raw_output.split()
    release = output[output.index("release") + 1].split(".")
    return raw_output, release[0], release[1][0]
"""

LOAD_AFTER_HEAD = """\
def load(args):
    from megatron.core._rocm import cuda_toolkit_missing
    if cuda_toolkit_missing():
        return  # rocmport: no nvcc (ROCm, or CUDA_HOME unset): nothing to build

    # Check if cuda 11 is installed for compute capability 8.0
"""

ARGS_BEFORE = """\
def validate_args(args, defaults={}):
    if args.rank == 0:
        print("validating")

    return args


def other(args):
    return args
"""

ARGS_AFTER = """\
def validate_args(args, defaults={}):
    if args.rank == 0:
        print("validating")

    from megatron.core._rocm import disable_missing_fusions
    return disable_missing_fusions(args)


def other(args):
    return args
"""

KERNEL_IMPORTS = """\
import torch
import amp_C
import fused_weight_gradient_mlp_cuda
"""

LOAD_REL = "megatron/legacy/fused_kernels/__init__.py"
ARGS_REL = "megatron/training/arguments.py"


def test_load_before_after():
    after, sites = rewrite("fused-kernel-fallbacks", LOAD_BEFORE, LOAD_REL)
    assert LOAD_AFTER_HEAD in after and sites == 1
    assert_idempotent("fused-kernel-fallbacks", LOAD_BEFORE, LOAD_REL)
    # Only the fused_kernels package's load() is touched.
    assert rewrite("fused-kernel-fallbacks", LOAD_BEFORE, "megatron/core/other.py")[1] == 0


def test_validate_args_before_after():
    after, sites = rewrite("fused-kernel-fallbacks", ARGS_BEFORE, ARGS_REL)
    assert after == ARGS_AFTER and sites == 1
    assert_idempotent("fused-kernel-fallbacks", ARGS_BEFORE, ARGS_REL)


def test_kernel_imports_guarded():
    after, sites = rewrite("fused-kernel-fallbacks", KERNEL_IMPORTS, "megatron/core/optimizer/x.py")
    assert sites == 2
    assert "    amp_C = AmpCFallback\n    fused_weight_gradient_mlp_cuda = None\n" in after
    assert "    HAVE_AMP_C = False\n    HAVE_FUSED_WEIGHT_GRADIENT_MLP_CUDA = False\n" in after


def _load_tree(tmp_path):
    after, _ = rewrite("fused-kernel-fallbacks", LOAD_BEFORE, LOAD_REL)
    return {"megatron/legacy/__init__.py": "", LOAD_REL: after}


@pytest.mark.torch
def test_load_returns_early_on_rocm(tmp_path):
    proc = run_tree(
        tmp_path,
        _load_tree(tmp_path),
        """
        from megatron.legacy import fused_kernels
        print(fused_kernels.load(None))
    """,
        hip="6.3.42131",
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "None"


@pytest.mark.torch
def test_load_on_cuda_still_runs_nvcc(tmp_path):
    cuda = tmp_path / "cuda"
    (cuda / "bin").mkdir(parents=True)
    (cuda / "bin" / "nvcc").write_text("#!/bin/sh\necho 'Cuda compilation tools, release 12.4, V12.4.131'\n")
    (cuda / "bin" / "nvcc").chmod(0o755)
    # A CUDA build of torch resolves CUDA_HOME at import; this CPU build leaves it None, so set it.
    proc = run_tree(
        tmp_path,
        _load_tree(tmp_path),
        f"""
        from torch.utils import cpp_extension
        cpp_extension.CUDA_HOME = {str(cuda)!r}
        from megatron.legacy import fused_kernels
        print(fused_kernels.load(None))
    """,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "12"


@pytest.mark.torch
def test_fusion_flags_off_on_rocm_only(tmp_path):
    files = {"megatron/training/__init__.py": "", ARGS_REL: ARGS_AFTER}
    code = """
        import types, warnings
        from megatron.training.arguments import validate_args
        args = types.SimpleNamespace(rank=1, gradient_accumulation_fusion=True, masked_softmax_fusion=True,
                                     no_persist_layer_norm=False)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            validate_args(args)
        print(args.gradient_accumulation_fusion, args.masked_softmax_fusion, args.no_persist_layer_norm,
              "|".join(str(x.message) for x in w))
    """
    rocm = run_tree(tmp_path, files, code, hip="6.3.0")
    assert rocm.returncode == 0, rocm.stderr
    # Upstream's gpt3_mcore_tp1_pp4 (--transformer-impl local, persistent layer norm by default) stopped in
    # WrappedTorchNorm's "persist_layer_norm not supported by torch LayerNorm" on the port without apex.
    assert rocm.stdout.startswith("False False True ")
    assert "kernel fused_weight_gradient_mlp_cuda is not available" in rocm.stdout
    assert "--no-persist-layer-norm set: apex" in rocm.stdout
    cuda = run_tree(tmp_path, files, code, hip=None)
    assert cuda.stdout.strip() == "True True False"


def test_load_exact_before_after():
    assert_codemod(
        "fused-kernel-fallbacks",
        LOAD_BEFORE,
        LOAD_BEFORE.replace(
            "def load(args):\n\n    # Check if cuda 11 is installed for compute capability 8.0\n", LOAD_AFTER_HEAD
        ),
        LOAD_REL,
        sites=1,
    )


def test_kernel_imports_exact_with_aliases():
    assert_codemod(
        "fused-kernel-fallbacks",
        """\
        import torch
        import amp_C as kernels
        import fused_weight_gradient_mlp_cuda
        """,
        """\
        import torch
        try:
            import amp_C as kernels
            import fused_weight_gradient_mlp_cuda
            HAVE_AMP_C = True
            HAVE_FUSED_WEIGHT_GRADIENT_MLP_CUDA = True
        except ImportError:
            from megatron.core._rocm import AmpCFallback
            kernels = AmpCFallback
            fused_weight_gradient_mlp_cuda = None
            HAVE_AMP_C = False
            HAVE_FUSED_WEIGHT_GRADIENT_MLP_CUDA = False
        """,
        "megatron/core/optimizer/x.py",
        sites=2,
    )


# ---- issue 17 item 9: the in-function import in drain_embedding_wgrad_compute -----------------------

DRAIN = '''\
import torch


def drain_embedding_wgrad_compute(config, embedding_activation_buffer, grad_output_buffer, weight, tp_group):
    """Helper for performing embedding wgrad GEMM's during the pipeline drain phase."""

    assert len(embedding_activation_buffer) == len(grad_output_buffer)

    import fused_weight_gradient_mlp_cuda

    for total_input, grad_output in zip(embedding_activation_buffer, grad_output_buffer):
        if config.gradient_accumulation_fusion:
            if weight.main_grad.dtype == torch.float32:
                fused_weight_gradient_mlp_cuda.wgrad_gemm_accum_fp32(total_input, grad_output, weight.main_grad)
            else:
                fused_weight_gradient_mlp_cuda.wgrad_gemm_accum_fp16(total_input, grad_output, weight.main_grad)
'''


def test_in_function_kernel_import_before_after():
    assert_codemod(
        "fused-kernel-fallbacks",
        DRAIN,
        DRAIN.replace(
            "    import fused_weight_gradient_mlp_cuda\n",
            (
                "    try:\n"
                "        import fused_weight_gradient_mlp_cuda\n"
                "    except ImportError:  # rocmport: no apex kernel (ROCm apex does not build it): torch fallback\n"
                "        from megatron.core._rocm import WgradGemmFallback as fused_weight_gradient_mlp_cuda\n"
            ),
        ),
        "megatron/core/utils.py",
        sites=1,
    )
    # a kernel without a torch fallback is left, and reported with the reason
    src = "def forward(x):\n    import scaled_masked_softmax_cuda\n    return scaled_masked_softmax_cuda.forward(x)\n"
    after, sites, reports = rewrite_with_reports(
        "fused-kernel-fallbacks", src, "megatron/core/fusions/fused_softmax.py"
    )
    assert (after, sites) == (src, 0)
    assert [(r.kind, r.line) for r in reports] == [("skip", 2)] and "no torch fallback" in reports[0].message


DRAIN_PROBE = """
import torch, types
from megatron.core.utils import drain_embedding_wgrad_compute
torch.manual_seed(0)
inputs, grads = [torch.randn(6, 4)], [torch.randn(6, 3)]
for dtype in (torch.float32, torch.bfloat16):
    weight = types.SimpleNamespace(main_grad=torch.ones(3, 4, dtype=dtype))
    drain_embedding_wgrad_compute(types.SimpleNamespace(gradient_accumulation_fusion=True), list(inputs), list(grads), weight, None)
    expected = (torch.ones(3, 4) + grads[0].t() @ inputs[0]).to(dtype)
    print(dtype, torch.allclose(weight.main_grad.float(), expected.float(), rtol=2e-2, atol=5e-2))
"""


@pytest.mark.torch
def test_drain_embedding_wgrad_without_apex_matches_the_formula(tmp_path):
    """Without apex's kernel (ROCm apex does not build it) upstream fails at the import; the port
    accumulates main_grad += grad_output^T @ input on torch. With the kernel present nothing changes."""
    after, _ = rewrite("fused-kernel-fallbacks", DRAIN, "megatron/core/utils.py")
    ported = run_tree(tmp_path / "p", {"megatron/core/utils.py": after}, DRAIN_PROBE, hip="6.4.43482")
    assert ported.stdout.splitlines() == ["torch.float32 True", "torch.bfloat16 True"], ported.stderr
    upstream = run_tree(tmp_path / "u", {"megatron/core/utils.py": DRAIN}, DRAIN_PROBE, hip="6.4.43482")
    assert "No module named 'fused_weight_gradient_mlp_cuda'" in upstream.stderr
    kernel = {
        "fused_weight_gradient_mlp_cuda.py": "def wgrad_gemm_accum_fp32(i, g, m):\n    m.fill_(7)\nwgrad_gemm_accum_fp16 = wgrad_gemm_accum_fp32\n"
    }
    with_kernel = run_tree(tmp_path / "k", {**kernel, "megatron/core/utils.py": after}, DRAIN_PROBE)
    assert with_kernel.stdout.splitlines() == ["torch.float32 False", "torch.bfloat16 False"], (
        with_kernel.stderr
    )  # the kernel ran


# tensor_parallel/layers.py's module-level guard, as v0.15 .. v0.19 and main spell it (issue 28:
# Megatron-Bridge's GPTModelProvider sets gradient_accumulation_fusion=True whenever Transformer
# Engine imports, and never calls validate_args; ColumnParallelLinear then raises without apex).
LAYERS = """\
import torch

_grad_accum_fusion_available = True
try:
    import fused_weight_gradient_mlp_cuda
except ImportError:
    _grad_accum_fusion_available = False

try:
    import transformer_engine  # pylint: disable=unused-import

    HAVE_TE = True
except ImportError:
    HAVE_TE = False


def wgrad(total_input, grad_output, main_grad):
    if main_grad.dtype == torch.float32:
        fused_weight_gradient_mlp_cuda.wgrad_gemm_accum_fp32(total_input, grad_output, main_grad)
    else:
        fused_weight_gradient_mlp_cuda.wgrad_gemm_accum_fp16(total_input, grad_output, main_grad)
"""

LAYERS_AFTER = LAYERS.replace(
    "    _grad_accum_fusion_available = False\n",
    "    _grad_accum_fusion_available = False\n"
    "    from megatron.core._rocm import is_hip\n"
    "    if is_hip():  # rocmport: no apex kernel on ROCm: gradient-accumulation fusion on torch\n"
    "        from megatron.core._rocm import WgradGemmFallback as fused_weight_gradient_mlp_cuda\n"
    "        _grad_accum_fusion_available = True\n",
)
LAYERS_REL = "megatron/core/tensor_parallel/layers.py"


def test_layers_wgrad_guard_gets_a_hip_branch():
    """Only the except body grows (upstream's line kept, CUDA unchanged); once; a second run is a no-op."""
    assert_codemod("fused-kernel-fallbacks", LAYERS, LAYERS_AFTER, LAYERS_REL, sites=1)
    _, _, reports = rewrite_with_reports("fused-kernel-fallbacks", LAYERS, LAYERS_REL)
    assert [(r.kind, r.line) for r in reports] == [("site", 4)]
    assert "WgradGemmFallback, _grad_accum_fusion_available stays True" in reports[0].message
    # A handler that does anything but set a flag is not this site.
    other = LAYERS.replace("    _grad_accum_fusion_available = False\n", "    raise\n")
    assert rewrite("fused-kernel-fallbacks", other, LAYERS_REL) == (other, 0)


LAYERS_PROBE = """
import torch
from megatron.core.tensor_parallel import layers
print("available", layers._grad_accum_fusion_available)
torch.manual_seed(0)
for act, grad in ((torch.float32, torch.float32), (torch.bfloat16, torch.float32), (torch.bfloat16, torch.bfloat16)):
    total_input, grad_output = torch.randn(6, 4).to(act), torch.randn(6, 3).to(act)
    main_grad = torch.randn(3, 4).to(grad)
    expected = main_grad.float() + grad_output.float().t() @ total_input.float()
    before = main_grad.data_ptr()
    layers.wgrad(total_input, grad_output, main_grad)
    ok = main_grad.data_ptr() == before and torch.allclose(main_grad.float(), expected, rtol=2e-2, atol=5e-2)
    print(act, grad, ok)
"""


@pytest.mark.torch
def test_layers_wgrad_on_hip_without_apex_matches_the_formula(tmp_path):
    """On HIP without apex: the flag stays True and main_grad += grad_output^T @ input, in place, for
    an fp32 main_grad (fp32 or bf16 activations) and a bf16 one (the fp16 variant). On CUDA without
    the kernel the flag is False as upstream has it."""
    after, _ = rewrite("fused-kernel-fallbacks", LAYERS, LAYERS_REL)
    files = {LAYERS_REL: after, "megatron/core/tensor_parallel/__init__.py": ""}
    hip = run_tree(tmp_path / "h", files, LAYERS_PROBE, hip="6.4.43482")
    assert hip.stdout.splitlines() == [
        "available True",
        "torch.float32 torch.float32 True",
        "torch.bfloat16 torch.float32 True",
        "torch.bfloat16 torch.bfloat16 True",
    ], hip.stderr
    cuda = run_tree(tmp_path / "c", files, LAYERS_PROBE)
    assert cuda.stdout.splitlines()[0] == "available False"
    assert "name 'fused_weight_gradient_mlp_cuda' is not defined" in cuda.stderr  # upstream's behaviour


LINEAR_PROBE = """
import torch
from megatron.core.tensor_parallel import layers
print("available", layers._grad_accum_fusion_available)
torch.manual_seed(0)
for act, grad in ((torch.float32, torch.float32), (torch.bfloat16, torch.float32), (torch.bfloat16, torch.bfloat16)):
    x = torch.randn(5, 2, 4).to(act)  # [sequence, batch, hidden]: backward flattens to 2-D
    w0, dy = torch.randn(3, 4).to(act), torch.randn(5, 2, 3).to(act)
    results = []
    for fusion in (False, True):
        inp, w = x.clone().requires_grad_(), w0.clone().requires_grad_()
        w.main_grad = torch.full((3, 4), 0.5, dtype=grad)
        out = layers.linear_with_grad_accumulation_and_async_allreduce(inp, w, None, fusion, False, False)
        out.backward(dy)
        results.append(w.grad.float() + 0.5 if not fusion else w.main_grad.float())
        assert fusion or w.grad is not None
    print(act, grad, torch.allclose(results[0], results[1], rtol=2e-2, atol=5e-2))
"""


@needs_mlm_mirror
@pytest.mark.mirror
@pytest.mark.torch
def test_real_linear_backward_with_fusion_on_hip_matches_without(tmp_path):
    """core_v0.19.0's megatron/core from the mirror, layers.py rewritten, HIP simulated, no apex:
    LinearWithGradAccumulationAndAsyncCommunication's backward with gradient_accumulation_fusion=True
    puts into main_grad what the unfused backward puts into weight.grad (tp1, CPU)."""
    root = tmp_path / "t"
    root.mkdir()
    archive = subprocess.run(
        ["git", f"--git-dir={MLM}", "archive", "core_v0.19.0", "megatron/core"], capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "x"], input=archive, cwd=root, check=True)
    upstream = (root / LAYERS_REL).read_text()
    after, sites = rewrite("fused-kernel-fallbacks", upstream, LAYERS_REL)
    assert sites == 1
    files = {"megatron/core/__init__.py": (root / "megatron/core/__init__.py").read_text(), LAYERS_REL: after}
    ported = run_tree(root, files, LINEAR_PROBE, hip="6.4.43482")
    assert ported.stdout.splitlines() == [
        "available True",
        "torch.float32 torch.float32 True",
        "torch.bfloat16 torch.float32 True",
        "torch.bfloat16 torch.bfloat16 True",
    ], ported.stderr[-3000:]
    files[LAYERS_REL] = upstream
    upstream_run = run_tree(root, files, LINEAR_PROBE, hip="6.4.43482")
    assert upstream_run.stdout.splitlines()[0] == "available False"
    assert "name 'fused_weight_gradient_mlp_cuda' is not defined" in upstream_run.stderr
