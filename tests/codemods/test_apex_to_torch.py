"""apex-to-torch: before/after on upstream-shaped code, and both ways at run time."""

import pytest

from tests.helpers.codemods import assert_idempotent, rewrite, run_tree

AMP_BEFORE = '''\
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
'''

AMP_AFTER = '''\
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
'''

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
    body = AMP_AFTER.replace("from .utils import divide\n", "").replace("is_torch_min_version(\"2.4.0a0\")", "False")
    proc = run_tree(tmp_path, {"megatron/core/layers.py": body}, """
        import torch
        from megatron.core import layers
        x = torch.ones(3, requires_grad=True)
        y = layers.LinearWithGradAccumulation.apply(x)
        y.sum().backward()
        print(x.grad.tolist(), type(layers.scaler).__module__)
    """)
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
    proc = run_tree(tmp_path, {"megatron/legacy/__init__.py": "", "megatron/legacy/inpainting.py": after}, """
        import torch
        from megatron.legacy import inpainting as m
        h = m.Head(8)
        opt = h.optimizer()
        out = h.ln(torch.ones(2, 8))
        print(m.HAVE_APEX, type(h.norm).__name__, type(h.ln).__mro__[1].__name__, type(opt).__name__, tuple(out.shape))
    """, hip="6.3.0")
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
    proc = run_tree(tmp_path, {**fake_apex, "megatron/legacy/__init__.py": "", "megatron/legacy/inpainting.py": after}, """
        from megatron.legacy import inpainting as m
        h = m.Head(8)
        print(m.HAVE_APEX, type(h.norm).__module__, type(h.ln).__module__, type(h.optimizer()).__module__)
    """)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "True apex.parallel apex.normalization apex.optimizers"


@pytest.mark.torch
def test_apex_amp_fallback_trains_with_torch_amp(tmp_path):
    src = '''\
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
'''
    after, sites = rewrite("apex-to-torch", src, "megatron/legacy/amp_user.py")
    assert sites == 1 and "    amp = apex_fallback('apex.amp')" in after
    proc = run_tree(tmp_path, {"megatron/legacy/__init__.py": "", "megatron/legacy/amp_user.py": after}, """
        from megatron.legacy import amp_user as m
        losses = m.train()
        print(m.HAVE_APEX, losses[-1] < losses[0], type(m.amp.scaler).__name__)
    """, hip="6.3.0")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False True GradScaler"
