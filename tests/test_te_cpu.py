"""The CPU stand-in for Transformer Engine's compiled extension against torch reference math
(forward and backward). Tolerances: fp32 kernels 1e-5 relative to the reference's scale (the
kernels compute in fp32 like TE's; the reference takes another summation order), bf16 outputs 1e-2."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from rocmport.verify.runtime import te_cpu as tex  # noqa: E402

pytestmark = pytest.mark.torch
TOL = dict(rtol=1e-5, atol=1e-5)


def _gen(*shape, seed=0):
    g = torch.Generator().manual_seed(seed + sum(shape))
    return torch.randn(*shape, generator=g)


def gemm(A, transa, B, transb, **kw):
    args = dict(
        D=None,
        quantizer=None,
        out_dtype=None,
        bias=None,
        bias_type=None,
        gelu=False,
        gelu_in=None,
        grad=False,
        workspace=torch.empty(0),
        workspaceSize=0,
        accumulate=False,
        use_split_accumulator=False,
    )
    args.update(kw)
    return tex.generic_gemm(A, transa, B, transb, **args)


# ---- GEMM: TE's three layouts (Linear's forward TN, dgrad NN, wgrad NT) and its epilogues ----


def test_gemm_layouts_are_linears_forward_dgrad_and_wgrad():
    x, w, dy = _gen(6, 4), _gen(3, 4), _gen(6, 3)
    out, *_ = gemm(w, True, x, False)  # layout TN: y = x @ W^T
    torch.testing.assert_close(out, x @ w.t(), **TOL)
    dgrad, *_ = gemm(w, False, dy, False)  # NN: dx = dy @ W
    torch.testing.assert_close(dgrad, dy @ w, **TOL)
    wgrad, *_ = gemm(x, False, dy, True)  # NT: dW = dy^T @ x
    torch.testing.assert_close(wgrad, dy.t() @ x, **TOL)


def test_gemm_keeps_the_leading_dimensions_of_a_3d_input():
    x, w = _gen(5, 2, 4), _gen(3, 4)
    out, *_ = gemm(w, True, x, False)
    assert out.shape == (5, 2, 3)
    torch.testing.assert_close(out, x @ w.t(), **TOL)


def test_gemm_bias_and_gelu_epilogue_return_the_pre_activation():
    x, w, b = _gen(6, 4), _gen(3, 4), _gen(3)
    out, bias_grad, pre, _ = gemm(w, True, x, False, bias=b, gelu=True)
    ref_pre = x @ w.t() + b
    torch.testing.assert_close(pre, ref_pre, **TOL)
    torch.testing.assert_close(out, F.gelu(ref_pre, approximate="tanh"), **TOL)
    assert bias_grad is None


def test_gemm_dgelu_epilogue_and_bias_gradients():
    w, dy, pre = _gen(3, 4), _gen(6, 3), _gen(6, 4, seed=1)
    b = torch.zeros(4)
    out, bias_grad, _, _ = gemm(w, False, dy, False, grad=True, gelu=True, gelu_in=pre, bias=b)
    x = pre.clone().requires_grad_(True)
    (dx,) = torch.autograd.grad(F.gelu(x, approximate="tanh"), x, dy @ w)
    torch.testing.assert_close(out, dx, **TOL)
    torch.testing.assert_close(bias_grad, dx.sum(0), **TOL)
    # wgrad with the bias gradient (BGRADB): the column sums of the output gradient
    x2 = _gen(6, 4, seed=2)
    _, bgrad, _, _ = gemm(x2, False, dy, True, grad=True, bias=torch.zeros(3))
    torch.testing.assert_close(bgrad, dy.sum(0), **TOL)


def test_gemm_accumulates_into_main_grad_in_place():
    x, dy = _gen(6, 4), _gen(6, 3)
    main_grad = _gen(3, 4, seed=3)
    before = main_grad.clone()
    out, *_ = gemm(x, False, dy, True, D=main_grad, accumulate=True)
    assert out is main_grad
    torch.testing.assert_close(main_grad, before + dy.t() @ x, **TOL)


def test_gemm_output_dtype_and_bf16_inputs():
    x, w = _gen(6, 4).bfloat16(), _gen(3, 4).bfloat16()
    out, *_ = gemm(w, True, x, False, out_dtype=tex.DType.kBFloat16)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), x.float() @ w.float().t(), rtol=1e-2, atol=1e-2)


def test_a_gemm_output_quantizer_without_a_cpu_cast_is_unsupported_naming_the_kernel():
    class Float8BlockQuantizer:  # FP8 block scaling: no CPU cast (te_fp8 has per-tensor and MXFP8)
        pass

    with pytest.raises(tex.UnsupportedInProxy, match=r"transformer_engine_torch\.quantize .*Float8BlockQuantizer"):
        gemm(_gen(3, 4), True, _gen(6, 4), False, quantizer=Float8BlockQuantizer())


def test_a_kernel_without_a_cpu_implementation_fails_when_called_naming_itself():
    kernel = tex.fused_attn_fwd  # a real kernel of the extension that the proxy does not provide
    with pytest.raises(tex.UnsupportedInProxy) as err:
        kernel(1, 2, 3)
    assert err.value.kernel == "transformer_engine_torch.fused_attn_fwd"
    assert "unsupported-in-proxy" in str(err.value)
    with pytest.raises(tex.UnsupportedInProxy, match="mxfp8_quantize"):
        tex.mxfp8_quantize(torch.zeros(2))
    with pytest.raises(tex.UnsupportedInProxy, match="CommOverlap"):
        tex.CommOverlap()


# ---- normalization ----


@pytest.mark.parametrize("zero_centered", [False, True])
def test_layernorm_forward_and_backward_match_torch(zero_centered):
    x, g, b, dz = _gen(8, 16), _gen(16, seed=1) * 0.1, _gen(16, seed=2), _gen(8, 16, seed=3)
    out, mu, rsigma = tex.layernorm_fwd(x, g, b, 1e-5, None, None, tex.DType.kFloat32, 0, zero_centered)
    gamma = g + 1 if zero_centered else g
    xr, gr, br = (t.clone().requires_grad_(True) for t in (x, gamma, b))
    ref = F.layer_norm(xr, (16,), gr, br, 1e-5)
    torch.testing.assert_close(out, ref.detach(), **TOL)
    dx, dg, db = tex.layernorm_bwd(dz, x, mu, rsigma, g, 0, zero_centered)
    rdx, rdg, rdb = torch.autograd.grad(ref, (xr, gr, br), dz)
    torch.testing.assert_close(dx, rdx, **TOL)
    torch.testing.assert_close(dg, rdg, **TOL)
    torch.testing.assert_close(db, rdb, **TOL)


@pytest.mark.parametrize("zero_centered", [False, True])
def test_rmsnorm_forward_and_backward_match_torch(zero_centered):
    x, g, dz = _gen(8, 16), _gen(16, seed=1) * 0.1, _gen(8, 16, seed=3)
    out, none, rsigma = tex.rmsnorm_fwd(x, g, 1e-5, None, None, tex.DType.kFloat32, 0, zero_centered)
    assert none is None
    gamma = g + 1 if zero_centered else g
    xr, gr = x.clone().requires_grad_(True), gamma.clone().requires_grad_(True)
    ref = xr * torch.rsqrt(xr.pow(2).mean(-1, keepdim=True) + 1e-5) * gr
    torch.testing.assert_close(out, ref.detach(), **TOL)
    dx, dg = tex.rmsnorm_bwd(dz, x, rsigma, g, 0, zero_centered)
    rdx, rdg = torch.autograd.grad(ref, (xr, gr), dz)
    torch.testing.assert_close(dx, rdx, **TOL)
    torch.testing.assert_close(dg, rdg, **TOL)


def test_layernorm_writes_into_the_given_output_in_its_dtype():
    x, g, b = _gen(4, 8), torch.ones(8), torch.zeros(8)
    ln_out = torch.empty(4, 8, dtype=torch.bfloat16)
    out, _, _ = tex.layernorm_fwd(x, g, b, 1e-5, ln_out, None, tex.DType.kBFloat16, 0, False)
    assert out is ln_out and out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), F.layer_norm(x, (8,), eps=1e-5), rtol=1e-2, atol=1e-2)


# ---- activations ----

REFERENCE_ACTS = {
    "gelu": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
    "silu": F.silu,
    "qgelu": lambda x: x * torch.sigmoid(1.702 * x),
    "srelu": lambda x: F.relu(x) ** 2,
    "geglu": lambda x: F.gelu(x.chunk(2, -1)[0], approximate="tanh") * x.chunk(2, -1)[1],
    "swiglu": lambda x: F.silu(x.chunk(2, -1)[0]) * x.chunk(2, -1)[1],
    "reglu": lambda x: F.relu(x.chunk(2, -1)[0]) * x.chunk(2, -1)[1],
}


@pytest.mark.parametrize("name", sorted(REFERENCE_ACTS))
def test_activations_and_their_backward(name):
    x = _gen(6, 8)
    ref_fn = REFERENCE_ACTS[name]
    out = getattr(tex, name)(x, None)
    torch.testing.assert_close(out, ref_fn(x), **TOL)
    grad = _gen(*out.shape, seed=5)
    xr = x.clone().requires_grad_(True)
    (rdx,) = torch.autograd.grad(ref_fn(xr), xr, grad)
    torch.testing.assert_close(getattr(tex, "d" + name)(grad, x, None), rdx, **TOL)


def test_dbias_dgelu_returns_the_bias_gradient_and_dgrad():
    x, grad = _gen(6, 8), _gen(6, 8, seed=7)
    dbias, dx = tex.dbias_dgelu(grad, x, None)
    xr = x.clone().requires_grad_(True)
    (rdx,) = torch.autograd.grad(F.gelu(xr, approximate="tanh"), xr, grad)
    torch.testing.assert_close(dx, rdx, **TOL)
    torch.testing.assert_close(dbias, rdx.sum(0), **TOL)


def test_gelu_derivative_is_the_tanh_approximations():
    x = torch.linspace(-4, 4, 101, dtype=torch.float64)
    xr = x.clone().requires_grad_(True)
    (ref,) = torch.autograd.grad(F.gelu(xr, approximate="tanh").sum(), xr)
    torch.testing.assert_close(tex._dgelu(x), ref, rtol=1e-12, atol=1e-12)


# ---- softmax variants ----


def test_softmax_variants_forward_and_backward():
    x, grad = _gen(2, 3, 5, 5), _gen(2, 3, 5, 5, seed=9)
    scale = 0.5
    torch.testing.assert_close(tex.scaled_softmax_forward(x, scale), torch.softmax(x * scale, -1), **TOL)
    mask = torch.zeros(2, 1, 5, 5, dtype=torch.bool)
    mask[..., -1] = True
    ref_masked = torch.softmax((x * scale).masked_fill(mask, -10000.0), -1)
    torch.testing.assert_close(tex.scaled_masked_softmax_forward(x, mask, scale), ref_masked, **TOL)
    x3 = x.reshape(6, 5, 5)
    causal = torch.ones(5, 5, dtype=torch.bool).triu(1)
    ref_causal = torch.softmax((x3 * scale).masked_fill(causal, -10000.0), -1)
    y = tex.scaled_upper_triang_masked_softmax_forward(x3, scale)
    torch.testing.assert_close(y, ref_causal, **TOL)
    xr = x3.clone().requires_grad_(True)
    (rdx,) = torch.autograd.grad(
        torch.softmax((xr * scale).masked_fill(causal, -10000.0), -1), xr, grad.reshape(6, 5, 5)
    )
    torch.testing.assert_close(
        tex.scaled_upper_triang_masked_softmax_backward(grad.reshape(6, 5, 5), y, scale), rdx, **TOL
    )
    # bottom-right aligned causal mask for sk > sq
    x4 = _gen(1, 2, 3, 5)
    aligned = torch.ones(3, 5, dtype=torch.bool).triu(1 + 2)
    torch.testing.assert_close(
        tex.scaled_aligned_causal_masked_softmax_forward(x4, 1.0),
        torch.softmax(x4.masked_fill(aligned, -10000.0), -1),
        **TOL,
    )


# ---- RoPE ----


def _rope_reference(t, freqs, interleaved=False):
    d2 = freqs.shape[-1]
    rot, rest = t[..., :d2], t[..., d2:]
    if interleaved:
        x1, x2 = rot[..., 0::2], rot[..., 1::2]
        rotated = torch.stack((-x2, x1), -1).flatten(-2)
    else:
        x1, x2 = rot.chunk(2, -1)
        rotated = torch.cat((-x2, x1), -1)
    return torch.cat((rot * freqs.cos() + rotated * freqs.sin(), rest), -1)


@pytest.mark.parametrize("interleaved", [False, True])
def test_rope_sbhd_and_bshd_forward_and_backward(interleaved):
    s, b, h, d = 6, 2, 3, 8
    freqs = _gen(s, 1, 1, 6) * 0.3
    t = _gen(s, b, h, d)
    fmt = tex.NVTE_QKV_Format
    out = tex.fused_rope_forward(t, freqs, None, fmt.NVTE_SBHD, interleaved, None, 1, 0)
    ref = _rope_reference(t, freqs, interleaved)
    torch.testing.assert_close(out, ref, **TOL)
    out_b = tex.fused_rope_forward(t.transpose(0, 1).contiguous(), freqs, None, fmt.NVTE_BSHD, interleaved, None, 1, 0)
    torch.testing.assert_close(out_b, ref.transpose(0, 1), **TOL)
    grad = _gen(s, b, h, d, seed=11)
    tr = t.clone().requires_grad_(True)
    (rdx,) = torch.autograd.grad(_rope_reference(tr, freqs, interleaved), tr, grad)
    torch.testing.assert_close(tex.fused_rope_backward(grad, freqs, fmt.NVTE_SBHD, interleaved, None, 1, 0), rdx, **TOL)
    # TE 2.10+ pass the positions to the backward too (start_positions None in training)
    torch.testing.assert_close(
        tex.fused_rope_backward(grad, freqs, None, fmt.NVTE_SBHD, interleaved, None, 1, 0), rdx, **TOL
    )
    # with positions: each sequence of the batch rotated from its own offset
    pos = torch.tensor([0, 2])
    long_freqs = _gen(s + 2, 1, 1, 6, seed=5) * 0.3
    out = tex.fused_rope_forward(t, long_freqs, pos, fmt.NVTE_SBHD, interleaved, None, 1, 0)
    ref = torch.cat(
        [_rope_reference(t[:, i : i + 1], long_freqs[p : p + s], interleaved) for i, p in enumerate([0, 2])], 1
    )
    torch.testing.assert_close(out, ref, **TOL)
    tr = t.clone().requires_grad_(True)
    ref = torch.cat(
        [_rope_reference(tr[:, i : i + 1], long_freqs[p : p + s], interleaved) for i, p in enumerate([0, 2])], 1
    )
    (rdx,) = torch.autograd.grad(ref, tr, grad)
    torch.testing.assert_close(
        tex.fused_rope_backward(grad, long_freqs, pos, fmt.NVTE_SBHD, interleaved, None, 1, 0), rdx, **TOL
    )


@pytest.mark.parametrize("interleaved", [False, True])
def test_fused_qkv_rope_splits_groups_rotates_q_and_k_and_passes_v(interleaved):
    """megatron's fused QKV RoPE (TE's FusedQKVRoPEFunc): 2 groups, 2 query heads per group, head dim 8
    (rotated over 6), v of the same size; forward and the qkv gradient against torch."""
    s, b, groups, d, per = 5, 2, 2, 8, 2
    split = [per * d, d, d]
    qkv = _gen(s, b, groups, sum(split))
    qf, kf = _gen(s, 1, 1, 6, seed=3) * 0.3, _gen(s, 1, 1, 6, seed=4) * 0.3

    def reference(x):
        q, k, v = x.split(split, dim=-1)
        q = q.reshape(s, b, groups * per, d)
        return _rope_reference(q, qf, interleaved), _rope_reference(k, kf, interleaved), v

    fmt = tex.NVTE_QKV_Format.NVTE_SBHD
    outs = tex.fused_qkv_rope_forward(qkv, qf, kf, None, split, fmt, interleaved, 1, 0)
    for got, want in zip(outs, reference(qkv)):
        torch.testing.assert_close(got, want, **TOL)
    grads = [_gen(*o.shape, seed=20 + i) for i, o in enumerate(outs)]
    x = qkv.clone().requires_grad_(True)
    (rdx,) = torch.autograd.grad(reference(x), x, grads)
    torch.testing.assert_close(tex.fused_qkv_rope_backward(*grads, qf, kf, split, fmt, interleaved, 1, 0), rdx, **TOL)


def test_rope_thd_restarts_positions_per_sequence():
    freqs = _gen(5, 1, 1, 4) * 0.3
    t = _gen(7, 2, 4)  # two sequences: 3 and 4 tokens
    cu = torch.tensor([0, 3, 7], dtype=torch.int32)
    out = tex.fused_rope_forward(t, freqs, None, tex.NVTE_QKV_Format.NVTE_THD, False, cu, 1, 0)
    ref = torch.cat([_rope_reference(t[:3], freqs[:3].squeeze(1)), _rope_reference(t[3:], freqs[:4].squeeze(1))])
    torch.testing.assert_close(out, ref, **TOL)


def test_rope_with_context_parallelism_is_unsupported():
    with pytest.raises(tex.UnsupportedInProxy, match="fused_rope_forward"):
        tex.fused_rope_forward(
            _gen(4, 1, 1, 4), _gen(8, 1, 1, 4), None, tex.NVTE_QKV_Format.NVTE_SBHD, False, None, 2, 0
        )


# ---- multi-tensor kernels ----


@pytest.mark.parametrize("mode", [0, 1])
def test_multi_tensor_adam_matches_torch(mode):
    params = [_gen(4, 3), _gen(5, seed=1)]
    grads = [_gen(4, 3, seed=2), _gen(5, seed=3)]
    ref = [p.clone().requires_grad_(True) for p in params]
    opt = (torch.optim.AdamW if mode == 1 else torch.optim.Adam)(
        ref, lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1
    )
    m, v = [torch.zeros_like(p) for p in params], [torch.zeros_like(p) for p in params]
    for step in (1, 2):
        for r, g in zip(ref, grads):
            r.grad = g.clone()
        opt.step()
        tex.multi_tensor_adam(
            2048, torch.zeros(1, dtype=torch.int), [grads, params, m, v], 1e-2, 0.9, 0.95, 1e-8, step, mode, 1, 0.1
        )
    for p, r in zip(params, ref):
        torch.testing.assert_close(p, r.detach(), **TOL)


def test_multi_tensor_l2norm_and_scale():
    ts = [_gen(3, 3), _gen(4, seed=1)]
    total, per = tex.multi_tensor_l2norm(2048, torch.zeros(1, dtype=torch.int), [ts], True)
    torch.testing.assert_close(total, torch.cat([t.flatten() for t in ts]).norm().reshape(1), **TOL)
    torch.testing.assert_close(per, torch.stack([t.norm() for t in ts]), **TOL)
    out = [torch.empty_like(t) for t in ts]
    flag = torch.zeros(1, dtype=torch.int)
    tex.multi_tensor_scale(2048, flag, [ts, out], 0.5)
    torch.testing.assert_close(out[0], ts[0] * 0.5)
    assert int(flag) == 0
    tex.multi_tensor_scale(2048, flag, [[torch.tensor([math.inf])], [torch.zeros(1)]], 1.0)
    assert int(flag) == 1
    # TE 2.17+: the scale as a tensor (megatron's clip coefficient, kept on the device), in place
    grads = [t.clone() for t in ts]
    tex.multi_tensor_scale_tensor(2048, torch.zeros(1, dtype=torch.int), [grads, grads], torch.tensor([0.25]))
    torch.testing.assert_close(grads[1], ts[1] * 0.25)


def test_enums_are_what_te_reads():
    # TE 2.17+ asserts its Python DType has exactly the extension's members.
    assert set(tex.DType.__members__) == {
        "kByte",
        "kInt32",
        "kFloat32",
        "kFloat16",
        "kBFloat16",
        "kFloat8E4M3",
        "kFloat8E5M2",
        "kFloat4E2M1",
    }
    fmt = tex.NVTE_QKV_Format
    assert fmt(int(fmt.NVTE_THD)) is fmt.NVTE_THD
    late = fmt.NVTE_QKV_Format_NOT_SET  # a member a newer TE names: made once, stable
    assert late is fmt.NVTE_QKV_Format_NOT_SET and int(late) not in {int(fmt.NVTE_SBHD), int(fmt.NVTE_THD)}
    assert tex.get_fused_attn_backend() == tex.NVTE_Fused_Attn_Backend.NVTE_No_Backend


def test_grouped_gemm_is_one_gemm_per_group_and_splits_a_single_output():
    """TE's GroupedLinear (MoE experts): each group's tokens times its own weight; with a single
    output the groups' rows are its m_splits pieces, in place."""
    w = [_gen(3, 4, seed=s) for s in (1, 2)]
    x = [_gen(2, 4, seed=3), _gen(5, 4, seed=4)]
    out = [torch.empty(7, 3)]
    bias = [torch.empty(0), torch.empty(0)]
    tex.te_general_grouped_gemm(
        w,
        True,
        x,
        False,
        out,
        tex.DType.kFloat32,
        [2, 5],
        bias,
        tex.DType.kFloat32,
        True,
        [torch.empty(0)] * 2,
        False,
        [torch.empty(0)],
        0,
        False,
        False,
        0,
    )
    torch.testing.assert_close(out[0], torch.cat([x[0] @ w[0].t(), x[1] @ w[1].t()]), **TOL)
    # wgrad, accumulated into each expert's main_grad
    dy = [_gen(2, 3, seed=5), _gen(5, 3, seed=6)]
    main = [torch.ones(3, 4), torch.ones(3, 4)]
    tex.te_general_grouped_gemm(
        x,
        False,
        dy,
        True,
        main,
        tex.DType.kFloat32,
        [2, 5],
        [None, None],
        tex.DType.kFloat32,
        False,
        [torch.empty(0)] * 2,
        True,
        [torch.empty(0)],
        0,
        True,
        False,
        0,
    )
    for i in range(2):
        torch.testing.assert_close(main[i], 1 + dy[i].t() @ x[i], **TOL)


def test_a_delayed_weight_gradient_writes_into_the_backward_s_views_with_grad_enabled():
    """--delay-wgrad-compute: TE's backward stores the wgrad GEMM and its outputs (views the backward
    made, in no-grad mode) and GroupedLinear.backward_dw runs it later, with grad enabled. A kernel
    writes memory and records no autograd history; the CPU one wrote with copy_ under grad mode:
    "A view was created in no_grad mode and is being modified inplace with grad mode enabled" (v0.19's
    delay-wgrad-compute reach variant, TE 2.17.1)."""
    # the stored inputs: the layer's input pieces, which require grad
    x = [_gen(2, 4, seed=3).requires_grad_(), _gen(5, 4, seed=4).requires_grad_()]
    dy = [_gen(2, 3, seed=5), _gen(5, 3, seed=6)]
    with torch.no_grad():  # as the backward makes the wgrad outputs: views of one buffer
        wgrads = list(torch.empty(2, 3, 4).unbind(0))
    assert torch.is_grad_enabled()
    tex.te_general_grouped_gemm(
        x,
        False,
        dy,
        True,
        wgrads,
        tex.DType.kFloat32,
        [2, 5],
        [None, None],
        tex.DType.kFloat32,
        False,
        [torch.empty(0)] * 2,
        True,
        [torch.empty(0)],
        0,
        False,
        False,
        0,
    )
    for i in range(2):
        torch.testing.assert_close(wgrads[i], (dy[i].t() @ x[i]).detach(), **TOL)
        assert wgrads[i].grad_fn is None


# ---- Fp8Padding / Fp8Unpadding (an FP8 MoE's grouped GEMM input, rows padded per expert) ----


def test_multi_row_padding_pads_each_split_with_zero_rows_and_unpadding_takes_them_back():
    x = _gen(3 + 0 + 5, 4)
    splits, padded = [3, 0, 5], [16, 0, 16]
    out = torch.full((sum(padded), 4), float("nan"))  # torch.empty's garbage: every row must be written
    tex.fused_multi_row_padding(x, out, splits, padded)
    reference = torch.cat([x[:3], torch.zeros(13, 4), x[3:], torch.zeros(11, 4)])
    assert torch.equal(out, reference)
    back = torch.full_like(x, float("nan"))
    tex.fused_multi_row_unpadding(out, back, padded, splits)
    assert torch.equal(back, x)
