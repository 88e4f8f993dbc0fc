"""capability-gates: before/after, and what the gates see on ROCm vs CUDA."""

import pytest

from tests.helpers.codemods import assert_idempotent, rewrite, run_tree

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
