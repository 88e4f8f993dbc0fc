"""fused-kernel-fallbacks: before/after on upstream-shaped code, and both ways at run time."""

import pytest

from tests.helpers.codemods import assert_codemod, assert_idempotent, rewrite, run_tree

LOAD_BEFORE = '''\
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
'''

LOAD_AFTER_HEAD = '''\
def load(args):
    from megatron.core._rocm import cuda_toolkit_missing
    if cuda_toolkit_missing():
        return  # rocmport: no nvcc (ROCm, or CUDA_HOME unset): nothing to build

    # Check if cuda 11 is installed for compute capability 8.0
'''

ARGS_BEFORE = '''\
def validate_args(args, defaults={}):
    if args.rank == 0:
        print("validating")

    return args


def other(args):
    return args
'''

ARGS_AFTER = '''\
def validate_args(args, defaults={}):
    if args.rank == 0:
        print("validating")

    from megatron.core._rocm import disable_missing_fusions
    return disable_missing_fusions(args)


def other(args):
    return args
'''

KERNEL_IMPORTS = '''\
import torch
import amp_C
import fused_weight_gradient_mlp_cuda
'''

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
    proc = run_tree(tmp_path, _load_tree(tmp_path), """
        from megatron.legacy import fused_kernels
        print(fused_kernels.load(None))
    """, hip="6.3.42131")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "None"


@pytest.mark.torch
def test_load_on_cuda_still_runs_nvcc(tmp_path):
    cuda = tmp_path / "cuda"
    (cuda / "bin").mkdir(parents=True)
    (cuda / "bin" / "nvcc").write_text("#!/bin/sh\necho 'Cuda compilation tools, release 12.4, V12.4.131'\n")
    (cuda / "bin" / "nvcc").chmod(0o755)
    # A CUDA build of torch resolves CUDA_HOME at import; this CPU build leaves it None, so set it.
    proc = run_tree(tmp_path, _load_tree(tmp_path), f"""
        from torch.utils import cpp_extension
        cpp_extension.CUDA_HOME = {str(cuda)!r}
        from megatron.legacy import fused_kernels
        print(fused_kernels.load(None))
    """)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "12"


@pytest.mark.torch
def test_fusion_flags_off_on_rocm_only(tmp_path):
    files = {"megatron/training/__init__.py": "", ARGS_REL: ARGS_AFTER}
    code = """
        import types, warnings
        from megatron.training.arguments import validate_args
        args = types.SimpleNamespace(rank=1, gradient_accumulation_fusion=True, masked_softmax_fusion=True)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            validate_args(args)
        print(args.gradient_accumulation_fusion, args.masked_softmax_fusion, "|".join(str(x.message) for x in w))
    """
    rocm = run_tree(tmp_path, files, code, hip="6.3.0")
    assert rocm.returncode == 0, rocm.stderr
    assert rocm.stdout.startswith("False False ")
    assert "kernel fused_weight_gradient_mlp_cuda is not available" in rocm.stdout
    cuda = run_tree(tmp_path, files, code, hip=None)
    assert cuda.stdout.strip() == "True True"


def test_load_exact_before_after():
    assert_codemod("fused-kernel-fallbacks", LOAD_BEFORE, LOAD_BEFORE.replace(
        "def load(args):\n\n    # Check if cuda 11 is installed for compute capability 8.0\n", LOAD_AFTER_HEAD), LOAD_REL, sites=1)


def test_kernel_imports_exact_with_aliases():
    assert_codemod("fused-kernel-fallbacks", '''\
        import torch
        import amp_C as kernels
        import fused_weight_gradient_mlp_cuda
        ''', '''\
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
        ''', "megatron/core/optimizer/x.py", sites=2)
