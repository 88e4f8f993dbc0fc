"""apex-to-torch: before/after on upstream-shaped code, and both ways at run time."""

import pytest

from tests.helpers.codemods import assert_codemod, assert_idempotent, rewrite, rewrite_with_reports, run_tree

AMP_BEFORE = """\
import torch
from .utils import divide

try:
    if is_torch_min_version("2.4.0a0"):
        custom_fwd = partial(torch.amp.custom_fwd, device_type="cuda")
    else:
        custom_fwd = torch.cuda.amp.custom_fwd
except:
    custom_fwd = torch.cuda.amp.custom_fwd


class LinearWithGradAccumulation(torch.autograd.Function):
    @staticmethod
    @torch.cuda.amp.custom_fwd(cast_inputs=torch.float32)
    def forward(ctx, x):
        return x

    @staticmethod
    @torch.cuda.amp.custom_bwd
    def backward(ctx, grad):
        with torch.cuda.amp.autocast(enabled=False):
            return grad


scaler = torch.cuda.amp.GradScaler()
"""

AMP_AFTER = """\
import torch
from .utils import divide
import functools

try:
    if is_torch_min_version("2.4.0a0"):
        custom_fwd = partial(torch.amp.custom_fwd, device_type="cuda")
    else:
        custom_fwd = functools.partial(torch.amp.custom_fwd, device_type="cuda")
except:
    custom_fwd = functools.partial(torch.amp.custom_fwd, device_type="cuda")


class LinearWithGradAccumulation(torch.autograd.Function):
    @staticmethod
    @torch.amp.custom_fwd(cast_inputs=torch.float32, device_type="cuda")
    def forward(ctx, x):
        return x

    @staticmethod
    @torch.amp.custom_bwd(device_type="cuda")
    def backward(ctx, grad):
        with torch.amp.autocast("cuda", enabled=False):
            return grad


scaler = torch.amp.GradScaler("cuda")
"""

VISION_BEFORE = '''\
"""Inpainting model (shaped like megatron/legacy/model/vision/inpainting.py)."""
import math
import apex
import torch
from apex.optimizers import FusedAdam as Adam
from apex.normalization import MixedFusedLayerNorm


class Head(torch.nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.norm = apex.parallel.SyncBatchNorm(dim)
        self.ln = MixedFusedLayerNorm(dim, eps=1e-5, no_persist_layer_norm=True, sequence_parallel=False)

    def optimizer(self):
        return Adam(self.parameters(), lr=1e-3, weight_decay=0.1, adam_w_mode=True)
'''


def test_amp_before_after():
    after, sites = rewrite("apex-to-torch", AMP_BEFORE, "megatron/core/tensor_parallel/layers.py")
    assert after == AMP_AFTER
    assert sites == 6


def test_amp_idempotent_and_functools_never_duplicated():
    assert_idempotent("apex-to-torch", AMP_BEFORE)
    src = "import functools\nimport torch\nf = torch.cuda.amp.custom_fwd\n"
    after, _ = rewrite("apex-to-torch", src)
    assert after.count("import functools") == 1


@pytest.mark.torch
def test_rewritten_amp_module_runs(tmp_path):
    body = AMP_AFTER.replace("from .utils import divide\n", "").replace('is_torch_min_version("2.4.0a0")', "False")
    proc = run_tree(
        tmp_path,
        {"megatron/core/layers.py": body},
        """
        import torch
        from megatron.core import layers
        x = torch.ones(3, requires_grad=True)
        y = layers.LinearWithGradAccumulation.apply(x)
        y.sum().backward()
        print(x.grad.tolist(), type(layers.scaler).__module__)
    """,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split()[0:3] == ["[1.0,", "1.0,", "1.0]"]


def test_vision_imports_guarded_with_torch_fallbacks():
    after, sites = rewrite("apex-to-torch", VISION_BEFORE, "megatron/legacy/model/vision/inpainting.py")
    assert sites == 3  # one site per guarded import statement
    assert after.count("try:") == 2
    assert "    apex = apex_fallback('apex')" in after
    assert "    Adam = apex_fallback('apex.optimizers.FusedAdam')" in after
    assert "    MixedFusedLayerNorm = apex_fallback('apex.normalization.MixedFusedLayerNorm')" in after
    assert_idempotent("apex-to-torch", VISION_BEFORE, "megatron/legacy/model/vision/inpainting.py")


@pytest.mark.torch
def test_vision_model_without_apex_uses_torch(tmp_path):
    after, _ = rewrite("apex-to-torch", VISION_BEFORE, "megatron/legacy/model/vision/inpainting.py")
    proc = run_tree(
        tmp_path,
        {"megatron/legacy/__init__.py": "", "megatron/legacy/inpainting.py": after},
        """
        import torch
        from megatron.legacy import inpainting as m
        h = m.Head(8)
        opt = h.optimizer()
        out = h.ln(torch.ones(2, 8))
        print(m.HAVE_APEX, type(h.norm).__name__, type(h.ln).__mro__[1].__name__, type(opt).__name__, tuple(out.shape))
    """,
        hip="6.3.0",
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False SyncBatchNorm LayerNorm AdamW (2, 8)"


@pytest.mark.torch
def test_vision_model_with_apex_is_unchanged(tmp_path):
    fake_apex = {
        "apex/__init__.py": "from . import parallel\n",
        "apex/parallel.py": "class SyncBatchNorm:\n    def __init__(self, dim): self.dim = dim\n",
        "apex/optimizers.py": "class FusedAdam:\n    def __init__(self, params, **kw): self.kw = kw\n",
        "apex/normalization.py": "class MixedFusedLayerNorm:\n    def __init__(self, dim, **kw): self.kw = kw\n",
    }
    after, _ = rewrite("apex-to-torch", VISION_BEFORE, "megatron/legacy/model/vision/inpainting.py")
    proc = run_tree(
        tmp_path,
        {**fake_apex, "megatron/legacy/__init__.py": "", "megatron/legacy/inpainting.py": after},
        """
        from megatron.legacy import inpainting as m
        h = m.Head(8)
        print(m.HAVE_APEX, type(h.norm).__module__, type(h.ln).__module__, type(h.optimizer()).__module__)
    """,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "True apex.parallel apex.normalization apex.optimizers"


@pytest.mark.torch
def test_apex_amp_fallback_trains_with_torch_amp(tmp_path):
    src = """\
import torch
from apex import amp


def train(steps=3):
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = amp.initialize(model, opt, opt_level="O1")
    x, y = torch.ones(8, 4), torch.zeros(8, 1)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x).float(), y)
        with amp.scale_loss(loss, opt) as scaled:
            scaled.backward()
        opt.step()
        losses.append(loss.item())
    return losses
"""
    after, sites = rewrite("apex-to-torch", src, "megatron/legacy/amp_user.py")
    assert sites == 1 and "    amp = apex_fallback('apex.amp')" in after
    proc = run_tree(
        tmp_path,
        {"megatron/legacy/__init__.py": "", "megatron/legacy/amp_user.py": after},
        """
        from megatron.legacy import amp_user as m
        losses = m.train()
        print(m.HAVE_APEX, losses[-1] < losses[0], type(m.amp.scaler).__name__)
    """,
        hip="6.3.0",
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False True GradScaler"


# Aliases: the same rewrite whatever spelling the module used for torch.cuda.amp. The rewritten
# references need `torch` (added once, after the docstring and `from __future__`), and an import
# that only served the old spelling goes.


def test_alias_import_module_as():
    assert_codemod(
        "apex-to-torch",
        '''\
        """Doc."""
        from __future__ import annotations

        import torch.cuda.amp as amp


        class F:
            @staticmethod
            @amp.custom_fwd
            def forward(ctx, x):
                with amp.autocast(enabled=False):
                    return x
        ''',
        '''\
        """Doc."""
        from __future__ import annotations
        import torch


        class F:
            @staticmethod
            @torch.amp.custom_fwd(device_type="cuda")
            def forward(ctx, x):
                with torch.amp.autocast("cuda", enabled=False):
                    return x
        ''',
        sites=2,
    )


def test_alias_from_torch_cuda_import_amp():
    assert_codemod(
        "apex-to-torch",
        """\
        from torch.cuda import amp

        scaler = amp.GradScaler(init_scale=2.0)
        fwd = amp.custom_fwd
        """,
        """\
        import torch
        import functools

        scaler = torch.amp.GradScaler("cuda", init_scale=2.0)
        fwd = functools.partial(torch.amp.custom_fwd, device_type="cuda")
        """,
        sites=2,
    )


def test_alias_from_amp_import_names_as():
    assert_codemod(
        "apex-to-torch",
        """\
        import os
        from torch.cuda.amp import custom_bwd as cb, GradScaler


        @cb
        def backward(ctx, grad):
            return grad


        s = GradScaler()
        """,
        """\
        import os
        import torch


        @torch.amp.custom_bwd(device_type="cuda")
        def backward(ctx, grad):
            return grad


        s = torch.amp.GradScaler("cuda")
        """,
        sites=2,
    )


def test_alias_import_kept_when_still_used():
    """`amp` still serves a name the codemod does not rewrite: the import stays."""
    assert_codemod(
        "apex-to-torch",
        """\
        import torch
        from torch.cuda import amp

        s = amp.GradScaler()
        other = amp.common
        """,
        """\
        import torch
        from torch.cuda import amp

        s = torch.amp.GradScaler("cuda")
        other = amp.common
        """,
        sites=1,
    )


def test_same_names_that_are_not_torch_cuda_amp_are_left():
    src = """\
        import torch
        from mylib import custom_fwd, GradScaler

        custom_bwd = 3
        s = GradScaler()


        @custom_fwd
        def f():
            with torch.autocast("cuda"):
                return torch.amp.custom_fwd
        """
    assert_codemod("apex-to-torch", src, src, sites=0)


def test_functools_never_duplicated_and_placed_after_the_docstring():
    assert_codemod(
        "apex-to-torch",
        '''\
        """Doc."""
        import functools
        import torch

        f = torch.cuda.amp.custom_fwd
        ''',
        '''\
        """Doc."""
        import functools
        import torch

        f = functools.partial(torch.amp.custom_fwd, device_type="cuda")
        ''',
        sites=1,
    )


def test_apex_aliases_are_guarded():
    assert_codemod(
        "apex-to-torch",
        """\
        import torch
        from apex import amp as a
        import apex.optimizers as opt
        """,
        """\
        import torch
        try:
            from apex import amp as a
            import apex.optimizers as opt
            HAVE_APEX = True
        except ImportError:
            from megatron.core._rocm import apex_fallback
            a = apex_fallback('apex.amp')
            opt = apex_fallback('apex.optimizers')
            HAVE_APEX = False
        """,
        relpath="megatron/legacy/model/x.py",
        sites=2,
    )


def test_reports_name_each_site_and_line():
    _, sites, reports = rewrite_with_reports(
        "apex-to-torch", "import torch\nfrom apex import amp as a\n\nf = torch.cuda.amp.custom_fwd\n"
    )
    assert sites == 2
    assert [(r.codemod, r.kind, r.line) for r in reports] == [
        ("apex-to-torch", "site", 4),
        ("apex-to-torch", "site", 2),
    ]
    assert (
        reports[0].message == 'torch.cuda.amp.custom_fwd -> functools.partial(torch.amp.custom_fwd, device_type="cuda")'
    )
    assert reports[1].message == "guarded: from apex import amp as a (except ImportError: HAVE_APEX = False)"


@pytest.mark.torch
def test_aliased_amp_module_runs_and_keeps_cuda_semantics(tmp_path):
    after, _ = rewrite(
        "apex-to-torch",
        """\
        import torch
        from torch.cuda.amp import custom_fwd as cf, custom_bwd as cb


        class Double(torch.autograd.Function):
            @staticmethod
            @cf(cast_inputs=torch.float32)
            def forward(ctx, x):
                return x * 2

            @staticmethod
            @cb
            def backward(ctx, g):
                return g * 2
        """,
        "megatron/core/double.py",
    )
    proc = run_tree(
        tmp_path,
        {"megatron/core/double.py": after},
        """
        import torch, warnings
        warnings.simplefilter("error", FutureWarning)  # torch.cuda.amp.* is deprecated: must not be called
        from megatron.core.double import Double
        x = torch.ones(2, requires_grad=True)
        Double.apply(x).sum().backward()
        print(x.grad.tolist())
    """,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[2.0, 2.0]"
