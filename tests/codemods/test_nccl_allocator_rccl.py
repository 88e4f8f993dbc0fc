"""nccl-allocator-rccl: before/after, and the link flags the --use-nccl-ub extension is built with."""

import pytest

from tests.helpers.codemods import assert_codemod, rewrite, run_tree

# Shaped like megatron/core/nccl_allocator.py at core_v0.16.1.
ALLOCATOR = """\
import os

import torch
from torch.utils import cpp_extension


def _build_nccl_allocator():
    nccl_allocator_source = "#include <nccl.h>"
    nccl_allocator = torch.utils.cpp_extension.load_inline(
        name="nccl_allocator",
        cpp_sources=nccl_allocator_source,
        with_cuda=True,
        extra_ldflags=["-lnccl"],
        verbose=True,
        is_python_module=True,
    )
    return nccl_allocator
"""

REL = "megatron/core/nccl_allocator.py"


def test_exact_before_after():
    after = ALLOCATOR.replace(
        "from torch.utils import cpp_extension\n",
        "from torch.utils import cpp_extension\nfrom megatron.core._rocm import nccl_ldflags\n",
    ).replace('extra_ldflags=["-lnccl"],', 'extra_ldflags=nccl_ldflags(["-lnccl"]),')
    assert_codemod("nccl-allocator-rccl", ALLOCATOR, after, REL, sites=1)


def test_aliased_builder_and_other_flags_left():
    src = (
        "from torch.utils.cpp_extension import load_inline as build\n\n"
        "a = build(name='a', cpp_sources='', extra_ldflags=['-lcudart', '-lnccl'])\n"
        "b = build(name='b', cpp_sources='', extra_ldflags=['-lcudart'])\n"
    )
    after, sites = rewrite("nccl-allocator-rccl", src, REL)
    assert (
        sites == 1
        and "extra_ldflags=nccl_ldflags(['-lcudart', '-lnccl']))" in after
        and "extra_ldflags=['-lcudart'])" in after
    )


PROBE = """
from torch.utils import cpp_extension
cpp_extension.load_inline = lambda **kw: kw["extra_ldflags"]  # what the build would link
from megatron.core.nccl_allocator import _build_nccl_allocator
print(_build_nccl_allocator())
"""


@pytest.mark.torch
def test_rccl_on_rocm_nccl_on_cuda(tmp_path):
    after, _ = rewrite("nccl-allocator-rccl", ALLOCATOR, REL)
    assert run_tree(tmp_path / "r", {REL: after}, PROBE, hip="6.4.43482").stdout.strip() == "['-lrccl']"
    cuda = run_tree(tmp_path / "c", {REL: after}, PROBE)
    upstream = run_tree(tmp_path / "u", {REL: ALLOCATOR}, PROBE)
    assert cuda.stdout == upstream.stdout and cuda.stdout.strip() == "['-lnccl']", cuda.stderr
