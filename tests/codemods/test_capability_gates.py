"""capability-gates: before/after, and what the gates see on ROCm vs CUDA."""

import pytest

from tests.helpers.codemods import assert_codemod, assert_idempotent, rewrite, rewrite_with_reports, run_tree

CUDA_GRAPHS = """\
import os

import torch


def check(config):
    if torch.cuda.get_device_capability()[0] < 10:
        return "pre-blackwell"
    return "blackwell"
"""

TRAINING_UTILS = '''\
import torch


def get_device_arch_version():
    """Returns GPU arch version (8: Ampere, 9: Hopper, 10: Blackwell, ...)"""
    return torch.cuda.get_device_properties(torch.device("cuda:0")).major
'''


def test_before_after():
    after, sites = rewrite("capability-gates", CUDA_GRAPHS, "megatron/core/transformer/cuda_graphs.py")
    assert sites == 1
    assert "import torch\nfrom megatron.core._rocm import nvidia_arch_major\n" in after
    assert "    if nvidia_arch_major() < 10:\n" in after
    assert_idempotent("capability-gates", CUDA_GRAPHS, "megatron/core/transformer/cuda_graphs.py")
    after, sites = rewrite("capability-gates", TRAINING_UTILS, "megatron/training/utils.py")
    assert sites == 1 and "    if is_hip():\n        return HIP_ARCH_EQUIVALENT" in after
    assert_idempotent("capability-gates", TRAINING_UTILS, "megatron/training/utils.py")


@pytest.mark.torch
def test_rdna4_is_not_blackwell_but_cuda_unchanged(tmp_path):
    after, _ = rewrite("capability-gates", CUDA_GRAPHS, "megatron/core/transformer/cuda_graphs.py")
    files = {"megatron/core/transformer/__init__.py": "", "megatron/core/transformer/cuda_graphs.py": after}
    # The device reports major 12: an RDNA4 GPU under HIP, or a future NVIDIA GPU under CUDA.
    code = "import torch\ntorch.cuda.get_device_capability = lambda *a: (12, 0)\nfrom megatron.core.transformer.cuda_graphs import check\nprint(check(None))\n"
    assert run_tree(tmp_path / "r", files, code, hip="6.4.1").stdout.strip() == "pre-blackwell"
    assert run_tree(tmp_path / "c", files, code).stdout.strip() == "blackwell"


def test_exact_before_after():
    assert_codemod(
        "capability-gates",
        CUDA_GRAPHS,
        """\
        import os

        import torch
        from megatron.core._rocm import nvidia_arch_major


        def check(config):
            if nvidia_arch_major() < 10:
                return "pre-blackwell"
            return "blackwell"
        """,
        "megatron/core/transformer/cuda_graphs.py",
        sites=1,
    )
    assert_codemod(
        "capability-gates",
        TRAINING_UTILS,
        TRAINING_UTILS.replace(
            '    """Returns GPU arch version (8: Ampere, 9: Hopper, 10: Blackwell, ...)"""\n',
            '    """Returns GPU arch version (8: Ampere, 9: Hopper, 10: Blackwell, ...)"""\n'
            "    from megatron.core._rocm import is_hip, HIP_ARCH_EQUIVALENT\n"
            "    if is_hip():\n"
            "        return HIP_ARCH_EQUIVALENT  # rocmport: AMD gfx numbers are not NVIDIA architectures\n",
        ),
        "megatron/training/utils.py",
        sites=1,
    )


def test_aliases_of_torch_cuda_and_of_the_function():
    assert_codemod(
        "capability-gates",
        '''\
        """Doc."""
        from __future__ import annotations

        import torch.cuda as tc
        from torch.cuda import get_device_capability as cap


        def a():
            return tc.get_device_capability()[0] >= 9


        def b():
            return cap()[0] < 10
        ''',
        '''\
        """Doc."""
        from __future__ import annotations

        import torch.cuda as tc
        from torch.cuda import get_device_capability as cap
        from megatron.core._rocm import nvidia_arch_major, nvidia_hopper_or_newer


        def a():
            return nvidia_hopper_or_newer()


        def b():
            return nvidia_arch_major() < 10
        ''',
        "megatron/core/transformer/cuda_graphs.py",
        sites=2,
    )


def test_other_capability_reads_are_left():
    """The minor number, or someone else's get_device_capability: not these gates."""
    src = """\
        import torch
        from mylib import get_device_capability


        def f(dev):
            return torch.cuda.get_device_capability()[1], get_device_capability()[0], torch.cuda.get_device_properties(dev).name
        """
    assert_codemod("capability-gates", src, src, "megatron/core/x.py", sites=0)


def test_reports_name_each_gate():
    _, _, reports = rewrite_with_reports("capability-gates", CUDA_GRAPHS, "megatron/core/transformer/cuda_graphs.py")
    assert [(r.kind, r.line, r.message) for r in reports] == [
        ("site", 7, "torch.cuda.get_device_capability()[0] -> nvidia_arch_major()")
    ]


# ---- issue 17 item 8: the gates still left ---------------------------------------------------------

ARGUMENTS = """\
import torch


def validate_args(args, defaults={}):
    if args.moe_grouped_gemm:
        assert args.bf16, 'Currently GroupedGEMM for MoE only supports bf16 dtype.'
        dc = torch.cuda.get_device_capability()
        assert dc[0] >= 8, "Unsupported compute capability for GroupedGEMM kernels."
    return args
"""

INFERENCE_LAYERS = """\
import torch


class InferenceRowParallelLinear:
    def _matmul_reduce_scatter(self, x):
        is_hopper_or_newer = torch.cuda.get_device_properties(x.device).major >= 9
        return "multimem (NVLS)" if is_hopper_or_newer else "nccl"
"""

SYMM_UTILS = """\
import torch


def is_device_nvls_capable(device):
    return device.type == "cuda" and torch.cuda.get_device_properties(device).major >= 9
"""


def test_item8_before_after():
    assert_codemod(
        "capability-gates",
        ARGUMENTS,
        ARGUMENTS.replace(
            "import torch\n", "import torch\nfrom megatron.core._rocm import nvidia_capability\n"
        ).replace("dc = torch.cuda.get_device_capability()", "dc = nvidia_capability()"),
        "megatron/training/arguments.py",
        sites=1,
    )
    assert_codemod(
        "capability-gates",
        INFERENCE_LAYERS,
        INFERENCE_LAYERS.replace(
            "import torch\n", "import torch\nfrom megatron.core._rocm import nvidia_hopper_or_newer\n"
        ).replace("torch.cuda.get_device_properties(x.device).major >= 9", "nvidia_hopper_or_newer(x.device)"),
        "megatron/core/tensor_parallel/inference_layers.py",
        sites=1,
    )
    assert_codemod(
        "capability-gates",
        SYMM_UTILS,
        SYMM_UTILS.replace(
            "import torch\n", "import torch\nfrom megatron.core._rocm import nvidia_hopper_or_newer\n"
        ).replace("torch.cuda.get_device_properties(device).major >= 9", "nvidia_hopper_or_newer(device)"),
        "megatron/core/inference/communication/torch_symm_triton/utils.py",
        sites=1,
    )
    # a device argument and the Blackwell test (mamba_ssm.py at v0.19)
    src = "import torch\n\n\ndef f(x):\n    return torch.cuda.get_device_capability(x.device)[0] >= 10\n"
    assert_codemod(
        "capability-gates",
        src,
        src.replace("import torch\n", "import torch\nfrom megatron.core._rocm import nvidia_arch_major\n").replace(
            "torch.cuda.get_device_capability(x.device)[0]", "nvidia_arch_major(x.device)"
        ),
        "megatron/core/ssm/ops/mamba_ssm.py",
        sites=1,
    )


NVLS_PROBE = """
import torch, types
torch.cuda.get_device_properties = lambda d: types.SimpleNamespace(major=9)  # an MI300X under HIP, an H100 under CUDA
torch.cuda.get_device_capability = lambda d=None: (9, 4)
from megatron.core.tensor_parallel.inference_layers import InferenceRowParallelLinear
from megatron.core.training_arguments import validate_args
x = types.SimpleNamespace(device="cuda:0")
print(InferenceRowParallelLinear()._matmul_reduce_scatter(x), validate_args(types.SimpleNamespace(moe_grouped_gemm=True, bf16=True)) is not None)
"""


@pytest.mark.torch
def test_nvls_off_on_rocm_and_unchanged_on_cuda(tmp_path):
    """MI300 reports major 9 like Hopper: the NVLS multimem kernels (NVIDIA-only PTX) stay off on HIP."""
    files = {}
    for rel, src, name in (
        ("megatron/core/tensor_parallel/inference_layers.py", INFERENCE_LAYERS, "inference_layers"),
        ("megatron/core/training_arguments.py", ARGUMENTS, "arguments"),
    ):
        files[rel], _ = rewrite("capability-gates", src, rel)
    files["megatron/core/tensor_parallel/__init__.py"] = ""
    assert run_tree(tmp_path / "r", files, NVLS_PROBE, hip="6.4.43482").stdout.strip() == "nccl True"
    cuda = run_tree(tmp_path / "c", files, NVLS_PROBE)
    upstream = run_tree(
        tmp_path / "u",
        {
            **files,
            "megatron/core/tensor_parallel/inference_layers.py": INFERENCE_LAYERS,
            "megatron/core/training_arguments.py": ARGUMENTS,
        },
        NVLS_PROBE,
    )
    assert cuda.stdout == upstream.stdout and cuda.stdout.strip() == "multimem (NVLS) True", cuda.stderr
