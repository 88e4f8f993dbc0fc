"""The CPU FP8 kernels (rocmport.verify.runtime.te_fp8) against torch's float8 dtypes and TE's scaling math,
per format: OCP e4m3fn / e5m2 (NVIDIA, gfx950) and FNUZ e4m3fnuz / e5m2fnuz (gfx942 under the rocm
flavour), including where FNUZ differs: max 240, one NaN (0x80), no negative zero.

TE's quantizer and tensor classes are stood in for by classes of the same names and attributes
(the kernels read TE's objects by those); tests/test_te_layer.py runs TE's own under fp8_autocast."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from rocmport.verify.runtime import te_cpu as tex  # noqa: E402
from rocmport.verify.runtime import te_fp8  # noqa: E402

pytestmark = pytest.mark.torch
E4M3, E5M2 = tex.DType.kFloat8E4M3, tex.DType.kFloat8E5M2


# ---- stand-ins with TE's names and fields ----


class Float8TensorStorage:
    def __new__(cls, *args, data, fp8_scale_inv, fp8_dtype, data_transpose=None, quantizer=None, **kwargs):
        inst = object.__new__(cls)
        inst._data, inst._scale_inv, inst._fp8_dtype = data, fp8_scale_inv, fp8_dtype
        inst._transpose, inst._quantizer = data_transpose, quantizer
        inst._transpose_invalid = data_transpose is None
        inst.shape = kwargs.get("shape")
        return inst


class Float8Tensor(Float8TensorStorage):
    pass


class MXFP8TensorStorage:
    def __new__(
        cls, rowwise_data, rowwise_scale_inv, columnwise_data, columnwise_scale_inv, fp8_dtype, quantizer, **kw
    ):
        inst = object.__new__(cls)
        inst._rowwise_data, inst._rowwise_scale_inv = rowwise_data, rowwise_scale_inv
        inst._columnwise_data, inst._columnwise_scale_inv = columnwise_data, columnwise_scale_inv
        inst._fp8_dtype, inst._quantizer = fp8_dtype, quantizer
        return inst


class MXFP8Tensor(MXFP8TensorStorage):
    pass


class Float8Quantizer:
    def __init__(self, scale, amax, dtype, rowwise=True, columnwise=True):
        self.scale, self.amax, self.dtype = scale, amax, dtype
        self.rowwise_usage, self.columnwise_usage, self.internal = rowwise, columnwise, False


class Float8CurrentScalingQuantizer(Float8Quantizer):
    def __init__(self, dtype, epsilon=0.0, pow2=False):
        super().__init__(torch.ones(1), torch.zeros(1), dtype)
        self.amax_epsilon, self.force_pow_2_scales, self.with_amax_reduction = epsilon, pow2, False


class MXFP8Quantizer:
    def __init__(self, dtype, rowwise=True, columnwise=True):
        self.dtype, self.rowwise_usage, self.columnwise_usage, self.internal = dtype, rowwise, columnwise, False


@pytest.fixture(params=["ocp", "fnuz"])
def family(request, monkeypatch):
    monkeypatch.setenv(te_fp8.ENV, request.param)
    return request.param


def _torch_dtype(family: str, kind: str) -> torch.dtype:
    return {
        ("ocp", "e4m3"): torch.float8_e4m3fn,
        ("ocp", "e5m2"): torch.float8_e5m2,
        ("fnuz", "e4m3"): torch.float8_e4m3fnuz,
        ("fnuz", "e5m2"): torch.float8_e5m2fnuz,
    }[(family, kind)]


# ---- encoding: torch's float8 rounding, TE's saturation ----


@pytest.mark.parametrize("kind", ["e4m3", "e5m2"])
def test_encoding_rounds_as_torch_and_saturates_at_the_format_s_max(family, kind):
    fmt = te_fp8.fp8_format(E4M3 if kind == "e4m3" else E5M2)
    dtype = _torch_dtype(family, kind)
    assert fmt.dtype == dtype
    x = torch.randn(4096, generator=torch.Generator().manual_seed(0)) * fmt.max / 8
    torch.testing.assert_close(te_fp8.encode(x, fmt), x.to(dtype).view(torch.uint8), rtol=0, atol=0)
    big = torch.tensor([fmt.max * 4, -fmt.max * 4, float("inf"), float("-inf")])
    assert te_fp8.decode(te_fp8.encode(big, fmt), fmt).tolist() == [fmt.max, -fmt.max, fmt.max, -fmt.max]


def test_where_fnuz_differs_max_nan_and_negative_zero():
    ocp, fnuz = te_fp8.OCP["e4m3"], te_fp8.FNUZ["e4m3"]
    assert (ocp.max, fnuz.max) == (448.0, 240.0)
    assert (te_fp8.OCP["e5m2"].max, te_fp8.FNUZ["e5m2"].max) == (57344.0, 57344.0)
    special = torch.tensor([float("nan"), -0.0, 300.0])
    o, f = te_fp8.encode(special, ocp).tolist(), te_fp8.encode(special, fnuz).tolist()
    assert o[0] in (0x7F, 0xFF) and f[0] == 0x80  # FNUZ: the one NaN is the negative-zero pattern
    assert o[1] == 0x80 and f[1] == 0x00  # FNUZ has no negative zero
    assert te_fp8.decode(torch.tensor([o[2]], dtype=torch.uint8), ocp).item() == 288.0  # 300 rounds on OCP
    assert te_fp8.decode(torch.tensor([f[2]], dtype=torch.uint8), fnuz).item() == 240.0  # saturates on FNUZ
    assert math.isnan(te_fp8.decode(torch.tensor([0x80], dtype=torch.uint8), fnuz).item())


# ---- per-tensor casts: delayed and current scaling, cast-transpose ----


def test_delayed_scaling_cast_uses_the_recipe_s_scale_records_amax_and_writes_the_transpose(family):
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(1)) * 3
    q = Float8Quantizer(torch.tensor([4.0]), torch.tensor([1.5]), E4M3)
    out = tex.quantize(x, q)
    fmt = te_fp8.fp8_format(E4M3)
    expected = (x * 4).clamp(-fmt.max, fmt.max).to(fmt.dtype).view(torch.uint8)
    assert torch.equal(out._data, expected)
    assert torch.equal(out._transpose, expected.t().contiguous())
    assert out._scale_inv.item() == 0.25
    assert q.amax.item() == pytest.approx(float(x.abs().max()))  # max(1.5, amax of x)
    torch.testing.assert_close(tex.dequantize(out, tex.DType.kFloat32), expected.view(fmt.dtype).float() / 4)


def test_a_noop_flag_leaves_the_cached_weight_as_it_is():
    q = Float8Quantizer(torch.tensor([1.0]), torch.zeros(1), E4M3)
    out = tex.quantize(torch.ones(4, 16), q)
    before = out._data.clone()
    tex.quantize(torch.full((4, 16), 7.0), q, out, torch.ones(1))
    assert torch.equal(out._data, before)


def test_current_scaling_takes_the_scale_from_this_tensor_s_amax(family):
    x = torch.randn(16, 32, generator=torch.Generator().manual_seed(2))
    q = Float8CurrentScalingQuantizer(E4M3)
    out = tex.quantize(x, q)
    fmt = te_fp8.fp8_format(E4M3)
    scale = fmt.max / float(x.abs().max())
    assert q.scale.item() == pytest.approx(scale, rel=1e-6)
    assert out._scale_inv.item() == pytest.approx(1 / scale, rel=1e-6)
    # the largest value lands on the format's max: 448 on OCP, 240 on FNUZ
    assert float(out._data.view(fmt.dtype).float().abs().max()) == fmt.max
    back = tex.dequantize(out, tex.DType.kFloat32)
    assert float(((back - x).abs() / x.abs().max()).max()) <= 2**-4  # E4M3: 3 mantissa bits
    zero = Float8CurrentScalingQuantizer(E4M3)
    tex.quantize(torch.zeros(2, 16), zero)
    assert zero.scale.item() == 1.0  # an all-zero tensor keeps scale 1
    pow2 = Float8CurrentScalingQuantizer(E4M3, pow2=True)
    tex.quantize(x, pow2)
    assert math.log2(pow2.scale.item()).is_integer() and pow2.scale.item() <= scale


def test_current_scaling_casts_with_a_quantizer_that_keeps_no_amax_or_scale(family):
    """TE 2.17's Float8CurrentScalingQuantizer holds no amax or scale buffer (v0.19's tensorwise FP8
    stopped on 'object has no attribute amax'): the cast still takes its scale from the tensor's amax."""
    x = torch.randn(16, 32, generator=torch.Generator().manual_seed(3))
    q = Float8CurrentScalingQuantizer(E4M3)
    del q.amax, q.scale
    out = tex.quantize(x, q)
    fmt = te_fp8.fp8_format(E4M3)
    assert out._scale_inv.item() == pytest.approx(float(x.abs().max()) / fmt.max, rel=1e-6)
    assert float(out._data.view(fmt.dtype).float().abs().max()) == fmt.max


def test_the_multi_tensor_scale_update_of_fp8_master_weights_follows_te_s_compute_scale_from_amax():
    """tensor/utils.py's cast of master weights to current-scaling FP8 weights (--fp8-param-gather) sets each
    weight's scale and scale_inv from its amax with the maximum its caller gives: 448 (NVIDIA, OCP) or 240
    (ROCm TE on gfx942); an amax of 0 keeps scale 1, epsilon bounds the amax from below, pow2 rounds down."""
    amaxes = [torch.tensor([2.0]), torch.tensor([0.0]), torch.tensor([3.0])]
    for max_fp8 in (448.0, 240.0):
        scales = [torch.empty(1) for _ in amaxes]
        invs = [torch.empty(1) for _ in amaxes]
        noop = torch.zeros(1, dtype=torch.int)
        tex.multi_tensor_compute_scale_and_scale_inv(2048 * 32, noop, [amaxes, scales, invs], max_fp8, False, 0.0)
        want = [max_fp8 / 2.0, 1.0, max_fp8 / 3.0]
        assert [s.item() for s in scales] == pytest.approx(want, rel=1e-6)
        assert [i.item() for i in invs] == pytest.approx([1 / w for w in want], rel=1e-6)
    tiny = [torch.empty(1)]  # the kernel raises an amax below epsilon to epsilon (0 included) before dividing
    tex.multi_tensor_compute_scale_and_scale_inv(
        0, noop, [[torch.tensor([0.0])], tiny, [torch.empty(1)]], 240.0, False, 1e-3
    )
    assert tiny[0].item() == pytest.approx(240.0 / 1e-3, rel=1e-6)
    pow2 = [torch.empty(1)]
    tex.multi_tensor_compute_scale_and_scale_inv(
        0, torch.zeros(1), [[torch.tensor([3.0])], pow2, [torch.empty(1)]], 240.0, True
    )
    assert pow2[0].item() == 64.0  # 240 / 3 = 80, down to a power of two


def test_an_empty_quantized_tensor_is_made_as_the_quantizer_asks(family):
    """TE 2.17's Quantizer.make_empty goes through tex.create_empty_quantized_tensor (v0.19's FP8 case
    stopped there in the sequence-parallel FP8 all-gather): the quantizer's tensor class, its shape and
    nominal dtype, uint8 data and transpose, on the CPU for a "cuda" device."""
    q = Float8CurrentScalingQuantizer(E4M3)
    out = tex.create_empty_quantized_tensor(q, [4, 8], torch.float32, torch.device("cuda"), False)
    assert type(out) is Float8Tensor and out.shape == (4, 8) and out._fp8_dtype == E4M3
    assert out._data.shape == (4, 8) and out._data.dtype == torch.uint8 and out._transpose.shape == (8, 4)
    assert out._data.device.type == "cpu" and out._scale_inv.numel() == 1
    rows_only = Float8Quantizer(torch.ones(1), torch.zeros(1), E5M2, columnwise=False)
    assert tex.create_empty_quantized_tensor(rows_only, [2, 16], torch.float32, "cpu")._transpose is None
    mx = tex.create_empty_quantized_tensor(MXFP8Quantizer(E4M3), [32, 64], torch.float32, "cpu")
    assert type(mx) is MXFP8Tensor and mx._rowwise_data.shape == (32, 64) and mx._rowwise_scale_inv.shape == (128, 4)


# ---- delayed scaling: amax history and scale update ----


def test_the_scale_update_follows_te_s_delayed_scaling_recipe(family):
    fmt = te_fp8.fp8_format(E4M3)
    history = torch.tensor([[0.0, 0.0], [2.0, 0.5], [1.0, 0.0]])  # rows: oldest..; columns: two tensors
    reduced = torch.tensor([3.0, 0.0])  # this step's all-reduced amaxes go into row 0
    scales = torch.tensor([1.0, 7.0])
    tex.fused_amax_and_scale_update_after_reduction(reduced, [history], [scales], "max", E4M3, 1.0)
    assert scales[0].item() == pytest.approx(fmt.max / 3.0 / 2)  # (max / amax) / 2^margin
    assert scales[1].item() == pytest.approx(fmt.max / 0.5 / 2)
    # rolled one step: row 0 (this step's) moved last, the next casts write a zeroed row 0
    assert history.tolist() == [[0.0, 0.0], [1.0, 0.0], [3.0, 0.0]]
    h2, s2 = torch.tensor([[0.0], [5.0]]), torch.tensor([2.0])
    tex.fused_amax_and_scale_update_after_reduction(torch.tensor([0.0]), [h2], [s2], "most_recent", E4M3, 0.0)
    assert s2.item() == 2.0  # amax 0: the scale is kept
    h3, s3 = torch.tensor([[float("inf")]]), torch.tensor([3.0])
    tex.fused_amax_and_scale_update_after_reduction(None, [h3], [s3], "max", E4M3, 0.0)
    assert s3.item() == 3.0  # amax not finite: kept


# ---- MXFP8 ----


def test_mxfp8_blocks_take_e8m0_scales_rounded_up_and_dequantize_within_e4m3_precision(monkeypatch):
    monkeypatch.setenv(te_fp8.ENV, "ocp")  # gfx950's MXFP8 is OCP
    x = torch.randn(64, 96, generator=torch.Generator().manual_seed(3))
    x[0, :32] = 0.0  # an all-zero block
    x[1, 32:64] *= 1000
    out = tex.quantize(x, MXFP8Quantizer(E4M3))
    blocks = x.reshape(64, 3, 32)
    expected_e = torch.ceil(torch.log2(blocks.abs().amax(-1) / 448.0))
    got_e = out._rowwise_scale_inv[:64, :3].float() - 127
    nonzero = blocks.abs().amax(-1) > 0
    assert torch.equal(got_e[nonzero], expected_e[nonzero])
    assert got_e[0, 0].item() == -127  # the zero block: 2^-127
    assert out._rowwise_scale_inv.shape == (128, 4)  # TE's padded layout
    for t in (out, MXFP8TensorStorage(None, None, out._columnwise_data, out._columnwise_scale_inv, E4M3, None)):
        back = te_fp8.values(t)
        rel = (back - x).abs() / blocks.abs().amax(-1, keepdim=True).expand(64, 3, 32).reshape(64, 96).clamp(min=1e-30)
        assert float(rel.max()) <= 2**-4


# ---- FP8 GEMM ----


def test_an_fp8_gemm_multiplies_the_dequantized_operands_in_fp32_into_the_asked_type(family):
    w, x = torch.randn(32, 16), torch.randn(8, 16)
    qw = tex.quantize(w, Float8CurrentScalingQuantizer(E4M3))
    qx = tex.quantize(x, Float8CurrentScalingQuantizer(E4M3))
    args = dict(bias=None, bias_type=None, gelu=False, gelu_in=None, grad=False, workspace=None, workspaceSize=0)
    args.update(accumulate=False, use_split_accumulator=False)
    out, *_ = tex.generic_gemm(qw, True, qx, False, None, None, torch.bfloat16, **args)
    ref = te_fp8.values(qx) @ te_fp8.values(qw).t()
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, ref.to(torch.bfloat16), rtol=0, atol=0)
    # an FP8 output: the product cast by the output quantizer
    yq = Float8CurrentScalingQuantizer(E5M2)
    y, *_ = tex.generic_gemm(qw, True, qx, False, None, yq, None, **args)
    assert isinstance(y, Float8Tensor) and y._fp8_dtype == E5M2
    assert float(((te_fp8.values(y) - ref).abs() / ref.abs().max()).max()) <= 2**-3  # E5M2: 2 mantissa bits


def test_a_grouped_gemm_takes_fp8_storages_as_its_split_operands(monkeypatch):
    """An FP8 MoE's GroupedLinear: split_quantize casts each expert's rows into an MXFP8 storage (no
    torch.Tensor methods, no numel()); each group multiplies its dequantized operands, an empty one skipped."""
    monkeypatch.setenv(te_fp8.ENV, "ocp")
    g = torch.Generator().manual_seed(5)
    w = [torch.randn(32, 64, generator=g) for _ in range(2)]
    x = torch.randn(32, 64, generator=g)
    qw = [tex.quantize(t, MXFP8Quantizer(E4M3)) for t in w]
    qx = [tex.quantize(x, MXFP8Quantizer(E4M3))]
    rows = qx[0]._rowwise_data
    empty = MXFP8TensorStorage(rows[:0], qx[0]._rowwise_scale_inv[:0], None, None, E4M3, None)
    storages = [MXFP8TensorStorage(rows, qx[0]._rowwise_scale_inv, None, None, E4M3, None), empty]
    out = torch.full((32, 32), float("nan"))
    tex.te_general_grouped_gemm(
        qw, True, storages, False, [out], torch.float32, [32, 0], [], None, True, [], False, [], 0, False, False, 0
    )
    expected = te_fp8.values(qx[0]) @ te_fp8.values(qw[0]).t()
    assert torch.allclose(out, expected, rtol=1e-5, atol=1e-5)
