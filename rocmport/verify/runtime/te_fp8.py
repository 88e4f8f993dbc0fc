"""FP8 kernels of Transformer Engine's compiled extension, on the CPU, for verify's proxy: what TE's
Python reaches under ``fp8_autocast`` with the delayed, current and MXFP8 recipes.

- casts (``quantize``): per-tensor scaling (delayed: the quantizer's scale, the tensor's amax
  recorded; current: the scale from this tensor's amax, all-reduced over the quantizer's group), the
  row-wise data and its transpose (cast-transpose), and MXFP8's 1×32 blocks with E8M0 scales;
- ``dequantize``, ``compute_amax``, ``fp8_transpose``;
- delayed scaling's amax history and scale update (``fused_amax_and_scale_update_after_reduction``);
- FP8 GEMM operands: dequantized, multiplied in fp32 (``operand``; the GEMM itself is te_cpu's).

The encoding is torch's own float8 dtypes: round to nearest even, finite values beyond the format's
largest saturate to it (TE's kernels convert with saturation), NaN stays NaN. The formats are OCP's
``float8_e4m3fn`` / ``float8_e5m2`` (NVIDIA, gfx950), or the FNUZ ones on gfx942 under the ROCm TE
flavour (``float8_e4m3fnuz``, max 240; ``float8_e5m2fnuz``): one NaN (0x80), no negative zero.
The protocol's TE_FP8 (set by te_flavour in the started processes) says which: ``ocp`` or ``fnuz``."""

from __future__ import annotations
from rocmport.verify.runtime import protocol

import inspect
import math
import os
import sys
from dataclasses import dataclass
from typing import Any

import torch

ENV = protocol.TE_FP8.name
MX_BLOCK = 32  # MXFP8: one E8M0 scale per 32 consecutive values (along a row, or a column)
# This process's casts by the encoding they wrote (e4m3fnuz: 120, ...): what the run's report shows
# as the FP8 that ran, the evidence that gfx942 cast FNUZ and not OCP (te_flavour.fp8_casts_differ).
CASTS: dict[str, int] = {}


@dataclass(frozen=True)
class Fp8Format:
    """One FP8 encoding: its torch dtype and its largest finite value."""

    name: str
    dtype: torch.dtype

    @property
    def max(self) -> float:
        return float(torch.finfo(self.dtype).max)

    @property
    def emax(self) -> int:
        """The exponent of the largest power of two not above ``max`` (MXFP8's scale: amax / 2^emax)."""
        return math.floor(math.log2(self.max))


OCP = {"e4m3": Fp8Format("e4m3fn", torch.float8_e4m3fn), "e5m2": Fp8Format("e5m2", torch.float8_e5m2)}
FNUZ = {"e4m3": Fp8Format("e4m3fnuz", torch.float8_e4m3fnuz), "e5m2": Fp8Format("e5m2fnuz", torch.float8_e5m2fnuz)}


def family() -> str:
    """``ocp`` or ``fnuz``: this process's FP8 encodings (protocol.TE_FP8; OCP when unset)."""
    return "fnuz" if os.environ.get(ENV) == "fnuz" else "ocp"


def fp8_format(te_dtype: Any, which: str | None = None) -> Fp8Format:
    """The format of TE's ``DType.kFloat8E4M3`` / ``kFloat8E5M2`` (by name) in this process's family."""
    name = getattr(te_dtype, "name", str(te_dtype))
    kind = "e5m2" if "E5M2" in name.upper() else "e4m3"
    return (FNUZ if (which or family()) == "fnuz" else OCP)[kind]


# ---- encode / decode (uint8 storage, as TE keeps FP8 data) ----


def encode(values: torch.Tensor, fmt: Fp8Format) -> torch.Tensor:
    """fp32 values -> FP8 bits (uint8): saturated to ±max, NaN kept, rounded by torch's cast."""
    v = values.float()
    v = torch.where(torch.isnan(v), v, v.clamp(-fmt.max, fmt.max))
    return v.to(fmt.dtype).view(torch.uint8)


def decode(bits: torch.Tensor, fmt: Fp8Format) -> torch.Tensor:
    return bits.view(fmt.dtype).float()


def amax(t: torch.Tensor) -> torch.Tensor:
    """max |t| as a one-element fp32 tensor (NaN propagates, as the kernel's max does)."""
    if t.numel() == 0:
        return torch.zeros(1)
    a = t.detach().float().abs()
    return (a.max() if not torch.isnan(a).any() else torch.tensor(float("nan"))).reshape(1)


def compute_scale(amax_value: torch.Tensor, fmt: Fp8Format, epsilon: float = 0.0, pow2: bool = False) -> torch.Tensor:
    """Current scaling's scale from an amax: max / max(amax, epsilon); 1 where that amax is 0 or not
    finite (TE's compute_scale_from_amax); rounded down to a power of two with ``pow2``."""
    return scale_from_amax(amax_value, fmt.max, epsilon, pow2)


def scale_from_amax(amax_value: torch.Tensor, max_fp8: float, epsilon: float = 0.0, pow2: bool = False) -> torch.Tensor:
    """compute_scale with the format's largest value given as a number (TE's
    multi_tensor_compute_scale_and_scale_inv takes it from its caller: 448, or 240 under ROCm TE's FNUZ)."""
    a = torch.clamp(amax_value.float(), min=epsilon) if epsilon else amax_value.float()
    scale = max_fp8 / a
    scale = torch.where((a > 0) & torch.isfinite(a) & torch.isfinite(scale), scale, torch.ones_like(scale))
    scale = torch.where(
        scale > torch.finfo(torch.float32).max, torch.full_like(scale, torch.finfo(torch.float32).max), scale
    )
    if pow2:
        scale = torch.exp2(torch.floor(torch.log2(scale)))
    return scale


def multi_tensor_compute_scale_and_scale_inv(
    tensor_lists: list[list[torch.Tensor]], max_fp8: float, pow2: bool = False, epsilon: float = 0.0
) -> None:
    """TE's multi-tensor scale update of current scaling's FP8 weights (tensor/utils.py's cast of the
    master weights): for each (amax, scale, scale_inv) of ``tensor_lists``, scale = scale_from_amax(amax)
    and scale_inv = 1 / scale, written in place."""
    for amax_t, scale_t, scale_inv_t in zip(*tensor_lists):
        scale = scale_from_amax(amax_t.reshape(-1)[:1], max_fp8, epsilon, pow2)
        scale_t.reshape(-1)[:1].copy_(scale)
        scale_inv_t.reshape(-1)[:1].copy_(1.0 / scale)


def _transpose_bits(bits: torch.Tensor) -> torch.Tensor:
    """TE's FP8 transpose: [..., n] -> [n, ...] (the 2-D [rows, n] transposed, leading dims kept)."""
    if bits.dim() < 2:
        return bits.clone()
    return bits.reshape(-1, bits.shape[-1]).t().contiguous().reshape(bits.shape[-1], *bits.shape[:-1])


def fp8_transpose(input: torch.Tensor, dtype: Any = None, out: torch.Tensor | None = None) -> torch.Tensor:
    result = _transpose_bits(input)
    if out is not None:
        out.copy_(result.reshape(out.shape))
        return out
    return result


# ---- quantizers (TE's Python classes, recognised by name: TE's own objects are passed in) ----


def kind(quantizer: Any) -> str:
    name = type(quantizer).__name__
    if name in ("Float8Quantizer", "Float8CurrentScalingQuantizer", "MXFP8Quantizer"):
        return name
    from rocmport.verify.runtime.te_types import UnsupportedInProxy

    raise UnsupportedInProxy("quantize", f"quantizer {name} (the CPU proxy has delayed, current and MXFP8 scaling)")


def _classes(quantizer: Any, tensor_class: str) -> tuple[type, type]:
    """TE's tensor class for ``quantizer`` (from the quantizer's own module) and its storage class."""
    cls = getattr(sys.modules[type(quantizer).__module__], tensor_class)
    storage = next(
        c for c in cls.__mro__ if c.__name__ == tensor_class + "Storage" or c.__name__ == tensor_class + "Base"
    )
    return cls, storage


def _new(cls: type, internal: bool, shape, dtype, device, fields: dict) -> Any:
    """A TE tensor made as the extension's create_tensor makes it: the storage class for TE's internal
    use, else the tensor class with its shape, nominal dtype and device (TE's own make_empty would
    ask torch.cuda for the device: the proxy's is the CPU)."""
    params = inspect.signature(cls.__new__).parameters
    kw = {k: v for k, v in fields.items() if k in params}
    if "fake_dtype" in params:
        kw["fake_dtype"] = dtype
    if not internal:
        kw.update(shape=shape, dtype=dtype, requires_grad=False, device=device)
    return cls(**kw)


def _empty(quantizer: Any, which: str, shape: tuple[int, ...], dtype: torch.dtype, device) -> Any:
    internal = bool(getattr(quantizer, "internal", False))
    rowwise = bool(getattr(quantizer, "rowwise_usage", True))
    columnwise = bool(getattr(quantizer, "columnwise_usage", True))
    if which == "MXFP8Quantizer":
        cls, storage = _classes(quantizer, "MXFP8Tensor")
        rows = math.prod(shape[:-1])
        fields = {
            "rowwise_data": torch.empty(shape, dtype=torch.uint8) if rowwise else None,
            "rowwise_scale_inv": torch.empty(_up(rows, 128), _up(shape[-1] // MX_BLOCK, 4), dtype=torch.uint8)
            if rowwise
            else None,
            "columnwise_data": torch.empty(shape, dtype=torch.uint8) if columnwise else None,
            "columnwise_scale_inv": torch.empty(_up(rows // MX_BLOCK, 4), _up(shape[-1], 128), dtype=torch.uint8)
            if columnwise
            else None,
            "fp8_dtype": quantizer.dtype,
            "quantizer": quantizer,
            "with_gemm_swizzled_scales": False,
        }
    else:
        cls, storage = _classes(quantizer, "Float8Tensor")
        fields = {
            "data": torch.empty(shape, dtype=torch.uint8) if rowwise else None,
            "fp8_scale_inv": torch.empty(1, dtype=torch.float32),
            "fp8_dtype": quantizer.dtype,
            "data_transpose": torch.empty([shape[-1], *shape[:-1]], dtype=torch.uint8) if columnwise else None,
            "quantizer": quantizer,
        }
    return _new(storage if internal else cls, internal, shape, dtype, device, fields)


def create_empty(quantizer: Any, shape: tuple[int, ...], dtype: torch.dtype, device: Any) -> Any:
    """``tex.create_empty_quantized_tensor`` (TE 2.17's Quantizer.make_empty for every quantizer): the
    quantized tensor ``quantizer`` makes, its data uninitialised, as the extension's create_tensor makes
    it. A CUDA device is the proxy's: where torch itself has no CUDA, the tensor is on the CPU."""
    try:
        device = torch.empty(0, device=device).device  # under the proxy's shim, "cuda" lands on the CPU
    except (RuntimeError, AssertionError):
        device = torch.device("cpu")
    return _empty(quantizer, kind(quantizer), tuple(int(n) for n in shape), dtype, device)


def _up(n: int, multiple: int) -> int:
    return (n + multiple - 1) // multiple * multiple


def _reduce_amax(value: torch.Tensor, quantizer: Any) -> torch.Tensor:
    group = getattr(quantizer, "amax_reduction_group", None)
    if getattr(quantizer, "with_amax_reduction", False) and torch.distributed.is_initialized():
        torch.distributed.all_reduce(value, op=torch.distributed.ReduceOp.MAX, group=group)
    return value


def quantize(tensor: torch.Tensor, quantizer: Any, output: Any = None, noop: torch.Tensor | None = None) -> Any:
    """``tex.quantize``: ``tensor`` cast by ``quantizer`` into ``output`` (made by the quantizer's own
    ``make_empty`` when None). ``noop`` holding 1 leaves ``output`` as it is (TE's skip of a cached
    weight's cast)."""
    which = kind(quantizer)
    if output is None:
        output = _empty(quantizer, which, tuple(tensor.shape), tensor.dtype, tensor.device)
    if noop is not None and noop.numel() and float(noop.reshape(-1)[0]) == 1.0:
        return output
    src = tensor.detach().float()
    fmt = fp8_format(quantizer.dtype)
    CASTS[fmt.name] = CASTS.get(fmt.name, 0) + 1
    if which == "MXFP8Quantizer":
        _mx_quantize(src, quantizer, output, fmt)
        return output
    if which == "Float8Quantizer":  # delayed scaling: the scale the recipe's history gave; record amax
        scale = quantizer.scale.float().reshape(-1)[:1]
        a = amax(src)
        # the kernel's atomic max into the recipe's amax slot (zeroed at each scale update): every
        # cast through this quantizer between two updates counts
        slot = quantizer.amax.reshape(-1)[:1]
        slot.copy_(torch.maximum(slot.float(), a).to(slot.dtype))
    else:  # current scaling: this tensor's amax (over the group), its scale
        a = _reduce_amax(amax(src), quantizer)
        scale = compute_scale(
            a,
            fmt,
            float(getattr(quantizer, "amax_epsilon", 0.0)),
            bool(getattr(quantizer, "force_pow_2_scales", False)),
        )
        # TE keeps this cast's amax and scale on the quantizer up to 2.16; 2.17's holds neither
        # (AttributeError: 'Float8CurrentScalingQuantizer' object has no attribute 'amax').
        for name, value in (("amax", a), ("scale", scale)):
            if getattr(quantizer, name, None) is not None:
                getattr(quantizer, name).reshape(-1)[:1].copy_(value)
    bits = encode(src * scale, fmt)
    scale_inv = (1.0 / scale).reshape(1)
    if getattr(output, "_scale_inv", None) is not None and output._scale_inv.numel() == 1:
        output._scale_inv.copy_(scale_inv.to(output._scale_inv.dtype).reshape(output._scale_inv.shape))
    else:
        output._scale_inv = scale_inv
    if getattr(output, "_data", None) is not None:
        output._data.copy_(bits.reshape(output._data.shape))
    if getattr(output, "_transpose", None) is not None:
        output._transpose.copy_(_transpose_bits(bits).reshape(output._transpose.shape))
        output._transpose_invalid = False
    output._fp8_dtype = quantizer.dtype
    return output


def _mx_scales(blocks: torch.Tensor, fmt: Fp8Format) -> torch.Tensor:
    """E8M0 exponents (unbiased) of 32-value blocks (last dim): ceil(log2(amax / max)), as TE's
    float_to_e8m0 of amax·(1/max) rounding up; 2^-127 for an all-zero block."""
    a = blocks.abs().amax(-1)
    ratio = a / fmt.max
    e = torch.ceil(torch.log2(torch.where(ratio > 0, ratio, torch.ones_like(ratio))))
    e = torch.where(ratio > 0, e, torch.full_like(e, -127.0))
    return e.clamp(-127, 127)


def _mx_rowwise(x2: torch.Tensor, fmt: Fp8Format) -> tuple[torch.Tensor, torch.Tensor]:
    rows, cols = x2.shape
    blocks = x2.reshape(rows, cols // MX_BLOCK, MX_BLOCK)
    e = _mx_scales(blocks, fmt)
    bits = encode(blocks * torch.exp2(-e).unsqueeze(-1), fmt).reshape(rows, cols)
    return bits, (e + 127).to(torch.uint8)


def _put_scales(target: torch.Tensor | None, scales: torch.Tensor) -> torch.Tensor:
    """Scales into TE's padded scale-inverse buffer (its top-left corner; the rest is padding)."""
    if target is None:
        return scales
    target.zero_()
    target[: scales.shape[0], : scales.shape[1]].copy_(scales)
    return target


def _mx_quantize(src: torch.Tensor, quantizer: Any, output: Any, fmt: Fp8Format) -> None:
    x2 = src.reshape(-1, src.shape[-1])
    if x2.shape[0] % MX_BLOCK or x2.shape[1] % MX_BLOCK:
        from rocmport.verify.runtime.te_types import UnsupportedInProxy

        raise UnsupportedInProxy("quantize", f"MXFP8 needs both dimensions divisible by 32, got {tuple(x2.shape)}")
    if getattr(output, "_rowwise_data", None) is not None:
        bits, scales = _mx_rowwise(x2, fmt)
        output._rowwise_data.copy_(bits.reshape(output._rowwise_data.shape))
        output._rowwise_scale_inv = _put_scales(output._rowwise_scale_inv, scales)
    if getattr(output, "_columnwise_data", None) is not None:
        # column-wise: 32 consecutive rows share a scale; the data keeps the row-wise layout
        bits_t, scales_t = _mx_rowwise(x2.t().contiguous(), fmt)
        output._columnwise_data.copy_(bits_t.t().reshape(output._columnwise_data.shape))
        output._columnwise_scale_inv = _put_scales(output._columnwise_scale_inv, scales_t.t().contiguous())
    if hasattr(output, "_with_gemm_swizzled_scales"):
        output._with_gemm_swizzled_scales = False  # compact scales: what this module reads back
    output._fp8_dtype = quantizer.dtype


# ---- back to high precision ----


def shape_of(t: Any) -> tuple[int, ...]:
    """The shape of a tensor, or of a TE quantized storage (which has no size(): its data's)."""
    try:
        return tuple(t.size())
    except Exception:  # noqa: BLE001 - a storage without size(): its data's shape
        data = t._rowwise_data if t._rowwise_data is not None else t._columnwise_data
        return tuple(data.shape)


def values(t: Any) -> torch.Tensor:
    """The fp32 values a quantized tensor (TE's Float8 / MXFP8 tensor or storage) stands for."""
    if "MXFP8" in type(t).__name__:  # MXFP8Tensor / MXFP8TensorStorage (block-wise FP8 also has _rowwise_*)
        fmt = fp8_format(t._fp8_dtype)
        if t._rowwise_data is not None:
            data = t._rowwise_data
            x2 = decode(data.reshape(-1, data.shape[-1]), fmt)
            rows, cols = x2.shape
            e = t._rowwise_scale_inv[:rows, : cols // MX_BLOCK].float() - 127
            out = (x2.reshape(rows, cols // MX_BLOCK, MX_BLOCK) * torch.exp2(e).unsqueeze(-1)).reshape(rows, cols)
            return out.reshape(data.shape)
        data = t._columnwise_data
        x2 = decode(data.reshape(-1, data.shape[-1]), fmt)
        rows, cols = x2.shape
        e = t._columnwise_scale_inv[: rows // MX_BLOCK, :cols].float() - 127
        out = (x2.reshape(rows // MX_BLOCK, MX_BLOCK, cols) * torch.exp2(e).unsqueeze(1)).reshape(rows, cols)
        return out.reshape(data.shape)
    if type(t).__name__.startswith("Float8Tensor"):  # per-tensor FP8 (delayed / current): Float8Tensor(Storage)
        fmt = fp8_format(t._fp8_dtype)
        scale_inv = t._scale_inv.float().reshape(-1)[0]
        if t._data is not None:
            return decode(t._data, fmt) * scale_inv
        tr = t._transpose
        back = tr.reshape(tr.shape[0], -1).t().contiguous().reshape(*tr.shape[1:], tr.shape[0])
        return decode(back, fmt) * scale_inv
    from rocmport.verify.runtime.te_types import UnsupportedInProxy

    raise UnsupportedInProxy("dequantize", f"quantized tensor {type(t).__name__}")


def is_quantized(t: Any) -> bool:
    return t is not None and (hasattr(t, "_fp8_dtype") or hasattr(t, "_rowwise_scale_inv"))


def dequantize(input: Any, otype: Any) -> torch.Tensor:
    from rocmport.verify.runtime.te_types import _torch_dtype

    return values(input).to(_torch_dtype(otype, torch.float32))


def compute_amax(input: torch.Tensor, amax_out: torch.Tensor) -> None:
    amax_out.reshape(-1)[:1].copy_(amax(input))


# ---- delayed scaling: amax history and scale ----


def amax_and_scale_update(
    amax_history: torch.Tensor, scale: torch.Tensor, fmt: Fp8Format, algo: str, margin: float
) -> None:
    """One tensor group's update, in place: the amax the recipe uses (the history's max, or its
    newest row), the history rolled one step (the newest row zeroed for the next casts), and
    scale = (max / amax) / 2^margin, kept where amax is 0 or not finite (TE's delayed scaling)."""
    if algo == "max":
        a = amax_history.float().max(dim=0).values
    else:  # most_recent
        a = amax_history[0].float().clone()
    if amax_history.shape[0] > 1:
        amax_history.copy_(torch.roll(amax_history, -1, 0))
    amax_history[0].fill_(0.0)
    new = (fmt.max / a) / (2.0**margin)
    keep = ~((a > 0) & torch.isfinite(a)) | ~torch.isfinite(new)
    scale.copy_(torch.where(keep, scale.float(), new).to(scale.dtype))


def fused_amax_and_scale_update_after_reduction(
    amax_reduction_buffer: torch.Tensor,
    amax_histories: list[torch.Tensor],
    scales: list[torch.Tensor],
    amax_compute_algo: str,
    fp8_dtype: Any,
    margin: float,
) -> None:
    """The reduced amaxes (one flat buffer, in the histories' order) put into each history's newest
    row, then each group's amax-and-scale update."""
    fmt = fp8_format(fp8_dtype)
    offset = 0
    for history, scale in zip(amax_histories, scales):
        n = history.shape[-1]
        if amax_reduction_buffer is not None and amax_reduction_buffer.numel():
            history[0].copy_(amax_reduction_buffer[offset : offset + n].to(history.dtype))
        offset += n
        amax_and_scale_update(history, scale, fmt, amax_compute_algo, margin)
