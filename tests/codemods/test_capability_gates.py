"""capability-gates: before/after, and what the gates see on ROCm vs CUDA."""

import pytest

from tests.helpers.codemods import assert_codemod, assert_idempotent, rewrite, rewrite_with_reports, run_tree

CUDA_GRAPHS = '''\
import os

import torch


def check(config):
    if torch.cuda.get_device_capability()[0] < 10:
        return "pre-blackwell"
    return "blackwell"
'''

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
    assert_codemod("capability-gates", CUDA_GRAPHS, '''\
        import os

        import torch
        from megatron.core._rocm import nvidia_arch_major


        def check(config):
            if nvidia_arch_major() < 10:
                return "pre-blackwell"
            return "blackwell"
        ''', "megatron/core/transformer/cuda_graphs.py", sites=1)
    assert_codemod("capability-gates", TRAINING_UTILS, TRAINING_UTILS.replace(
        '    """Returns GPU arch version (8: Ampere, 9: Hopper, 10: Blackwell, ...)"""\n',
        '    """Returns GPU arch version (8: Ampere, 9: Hopper, 10: Blackwell, ...)"""\n'
        "    from megatron.core._rocm import is_hip, HIP_ARCH_EQUIVALENT\n"
        "    if is_hip():\n"
        "        return HIP_ARCH_EQUIVALENT  # rocmport: AMD gfx numbers are not NVIDIA architectures\n"),
        "megatron/training/utils.py", sites=1)


def test_aliases_of_torch_cuda_and_of_the_function():
    assert_codemod("capability-gates", '''\
        """Doc."""
        from __future__ import annotations

        import torch.cuda as tc
        from torch.cuda import get_device_capability as cap


        def a():
            return tc.get_device_capability()[0] >= 9


        def b():
            return cap()[0] < 10
        ''', '''\
        """Doc."""
        from __future__ import annotations

        import torch.cuda as tc
        from torch.cuda import get_device_capability as cap
        from megatron.core._rocm import nvidia_arch_major


        def a():
            return nvidia_arch_major() >= 9


        def b():
            return nvidia_arch_major() < 10
        ''', "megatron/core/transformer/cuda_graphs.py", sites=2)


def test_other_capability_reads_are_left():
    """A device argument, the minor number, or someone else's get_device_capability: not this gate."""
    src = '''\
        import torch
        from mylib import get_device_capability


        def f(dev):
            return torch.cuda.get_device_capability(dev)[0], torch.cuda.get_device_capability()[1], get_device_capability()[0]
        '''
    assert_codemod("capability-gates", src, src, "megatron/core/x.py", sites=0)


def test_reports_name_each_gate():
    _, _, reports = rewrite_with_reports("capability-gates", CUDA_GRAPHS, "megatron/core/transformer/cuda_graphs.py")
    assert [(r.kind, r.line, r.message) for r in reports] == [
        ("site", 7, "torch.cuda.get_device_capability()[0] -> nvidia_arch_major()")]
