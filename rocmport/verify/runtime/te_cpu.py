"""A CPU stand-in for Transformer Engine's compiled ``transformer_engine_torch`` extension.

Verify runs TE's own Python layer (a real ``transformer_engine`` package of a chosen release) on the
CPU proxy; only the compiled kernels are replaced, by reference implementations in torch: GEMM with
its epilogues (bias, GELU, dGELU, bias gradient, accumulate into ``main_grad``), layer/RMS norm
forward and backward (zero-centred gamma), the softmax variants, the activations and their
backward, RoPE, the multi-tensor optimizer kernels, and the questions TE asks of its library
(answered as a build without fused attention or userbuffers, so TE picks its own unfused path).

FP8 (delayed and current per-tensor scaling, MXFP8 blocks; casts, amax, scale updates, FP8 GEMM
operands) is ``rocmport.verify.runtime.te_fp8``'s. The enums TE's Python mirrors and asserts against
(``NVTE_Fused_Attn_Backend``) take their members from the TE release in use and its flavour
(``rocmport.verify.runtime.te_flavour``: ROCm TE's backends are CK and AOTriton).

What TE decides in Python stays TE's code. A kernel this module lacks (FP8 block scaling, FP4 casts,
fused attention, userbuffers, ...) raises ``UnsupportedInProxy`` naming the
``transformer_engine_torch`` function when TE calls it: never a silent pass, never zeros.

Installed as ``sys.modules["transformer_engine_torch"]`` by ``rocmport.verify.orchestration.te_layer``; never
written into the ported tree."""

from __future__ import annotations

import math
from typing import Any, Callable

import torch
import torch.nn.functional as F

from rocmport.verify.runtime import te_fp8
from rocmport.verify.runtime import te_types
from rocmport.verify.runtime.te_types import UnsupportedInProxy, _torch_dtype

# The extension's DType, as TE's Python reads it off this module (transformer_engine_torch.DType).
DType = te_types.DType

CALLS: dict[str, int] = {}


def _count(name: str) -> None:
    CALLS[name] = CALLS.get(name, 0) + 1


def _unsupported(name: str):
    def kernel(*args: Any, **kwargs: Any):
        raise UnsupportedInProxy(name)

    kernel.__name__ = name
    kernel.__qualname__ = name
    return kernel


def __getattr__(name: str):
    # Any kernel of the real extension that is not implemented below: a function that fails, when
    # TE calls it, naming itself. Dunder lookups (pickle, inspect) stay AttributeErrors.
    if name.startswith("__"):
        raise AttributeError(name)
    if name[0].isupper():
        # An enum a newer TE binds (2.17: NVTERoutingMapFormat): labels, made on first use.
        globals()[name] = _enum(name, [])
        return globals()[name]
    return _unsupported(name)


# ---- enums of the extension (pybind11 enums: hashable, comparable, int(), .name, .value) ----


class _Member(int):
    """A member of one of the extension's pybind11 enums: an int with a name."""

    name: str
    value: int

    def __new__(cls, owner: str, name: str, value: int) -> _Member:
        member = int.__new__(cls, value)
        member.name, member.value, member._owner = name, value, owner  # type: ignore[attr-defined]
        return member

    def __repr__(self) -> str:
        return f"<{self._owner}.{self.name}: {self.value}>"  # type: ignore[attr-defined]

    __str__ = __repr__


class _OpenEnum(type):
    """The extension's enums of attention layouts, formats and comm types. Their members are labels
    TE's Python passes back to kernels this module does not have, and each TE release adds some
    (2.17: NVTE_QKV_Format_NOT_SET): a member is made on first use, after the ones listed."""

    def __getattr__(cls, name: str) -> _Member:
        if name.startswith("_"):
            raise AttributeError(name)
        members = cls.__dict__["__members__"]
        if name not in members:
            members[name] = _Member(cls.__name__, name, len(members))
        return members[name]

    def __call__(cls, value: int) -> _Member:
        for member in cls.__dict__["__members__"].values():
            if member.value == int(value):
                return member
        raise ValueError(f"{value} is not a valid {cls.__name__}")

    def __iter__(cls):
        return iter(cls.__dict__["__members__"].values())


class _ClosedEnum(_OpenEnum):
    """An enum whose members are exactly those declared (a pybind11 enum's): an unknown name is an
    AttributeError, as TE's Python would meet it on a library that lacks it."""

    def __getattr__(cls, name: str) -> _Member:
        members = cls.__dict__["__members__"]
        if name in members:
            return members[name]
        raise AttributeError(f"type object '{cls.__name__}' has no attribute '{name}'")


def _enum(name: str, members: list[str]) -> Any:
    return _OpenEnum(name, (), {"__members__": {m: _Member(name, m, i) for i, m in enumerate(members)}})


FP8FwdTensors = _enum(
    "FP8FwdTensors",
    [
        "GEMM1_INPUT",
        "GEMM1_WEIGHT",
        "GEMM1_OUTPUT",
        "GEMM2_INPUT",
        "GEMM2_WEIGHT",
        "GEMM2_OUTPUT",
        "GEMM3_INPUT",
        "GEMM3_WEIGHT",
        "GEMM3_OUTPUT",
    ],
)
FP8BwdTensors = _enum(
    "FP8BwdTensors", ["GRAD_OUTPUT1", "GRAD_INPUT1", "GRAD_OUTPUT2", "GRAD_INPUT2", "GRAD_OUTPUT3", "GRAD_INPUT3"]
)
CommOverlapType = _enum("CommOverlapType", ["RS", "AG"])
CommOverlapAlgo = _enum(
    "CommOverlapAlgo",
    [
        "BULK_OVERLAP_AG",
        "BULK_OVERLAP_RS",
        "SPLIT_PIPELINED_AG_P2P",
        "SPLIT_PIPELINED_RS",
        "SPLIT_PIPELINED_RS_P2P",
        "ATOMIC_GEMM_RS",
        "ATOMIC_GEMM_AG_P2P",
        "ATOMIC_GEMM_RS_P2P",
        "EXTERNAL_BULK_OVERLAP_AG",
    ],
)
Float8BlockScaleTensorFormat = _enum("Float8BlockScaleTensorFormat", ["GEMM_READY", "COMPACT"])


def _fused_attn_backend_enum() -> Any:
    """``NVTE_Fused_Attn_Backend`` with the members TE's Python of this run names (its fused_attn.py
    mirrors the enum and, from 2.20, asserts the two agree), as the flavour's library declares them."""
    from rocmport.verify.runtime import te_flavour

    names = te_flavour.fused_attn_backends()
    members = {name: _Member("NVTE_Fused_Attn_Backend", name, value) for name, value in names.items()}
    return _ClosedEnum("NVTE_Fused_Attn_Backend", (), {"__members__": members})


NVTE_Fused_Attn_Backend = _fused_attn_backend_enum()
NVTE_Bias_Type = _enum("NVTE_Bias_Type", ["NVTE_NO_BIAS", "NVTE_PRE_SCALE_BIAS", "NVTE_POST_SCALE_BIAS", "NVTE_ALIBI"])
NVTE_Mask_Type = _enum(
    "NVTE_Mask_Type",
    [
        "NVTE_NO_MASK",
        "NVTE_PADDING_MASK",
        "NVTE_CAUSAL_MASK",
        "NVTE_PADDING_CAUSAL_MASK",
        "NVTE_CAUSAL_BOTTOM_RIGHT_MASK",
        "NVTE_PADDING_CAUSAL_BOTTOM_RIGHT_MASK",
        "NVTE_ARBITRARY_MASK",
    ],
)
NVTE_Softmax_Type = _enum(
    "NVTE_Softmax_Type", ["NVTE_VANILLA_SOFTMAX", "NVTE_OFF_BY_ONE_SOFTMAX", "NVTE_LEARNABLE_SOFTMAX"]
)
NVTE_QKV_Format = _enum(
    "NVTE_QKV_Format",
    ["NVTE_SBHD", "NVTE_BSHD", "NVTE_THD", "NVTE_SBHD_2BSHD", "NVTE_BSHD_2SBHD", "NVTE_THD_2BSHD", "NVTE_THD_2SBHD"],
)
NVTE_QKV_Layout = _enum(
    "NVTE_QKV_Layout",
    [
        "NVTE_SB3HD",
        "NVTE_SBH3D",
        "NVTE_SBHD_SB2HD",
        "NVTE_SBHD_SBH2D",
        "NVTE_SBHD_SBHD_SBHD",
        "NVTE_BS3HD",
        "NVTE_BSH3D",
        "NVTE_BSHD_BS2HD",
        "NVTE_BSHD_BSH2D",
        "NVTE_BSHD_BSHD_BSHD",
        "NVTE_T3HD",
        "NVTE_TH3D",
        "NVTE_THD_T2HD",
        "NVTE_THD_TH2D",
        "NVTE_THD_THD_THD",
        "NVTE_SBHD_BSHD_BSHD",
        "NVTE_BSHD_SBHD_SBHD",
        "NVTE_THD_BSHD_BSHD",
        "NVTE_THD_SBHD_SBHD",
        "NVTE_Paged_KV_BSHD_BSHD_BSHD",
        "NVTE_Paged_KV_BSHD_SBHD_SBHD",
        "NVTE_Paged_KV_SBHD_BSHD_BSHD",
        "NVTE_Paged_KV_SBHD_SBHD_SBHD",
        "NVTE_Paged_KV_THD_BSHD_BSHD",
        "NVTE_Paged_KV_THD_SBHD_SBHD",
    ],
)
NVTERoutingMapFormat = _enum("NVTERoutingMapFormat", ["BYTEMAP", "BITMAP_U8"])
NVTE_Activation_Type = _enum(
    "NVTE_Activation_Type", ["GELU", "GEGLU", "SILU", "SWIGLU", "RELU", "REGLU", "QGELU", "QGEGLU", "SRELU", "SREGLU"]
)


class FP8TensorMeta:
    """Holds FP8 scaling state (a plain data holder in the extension too)."""

    def __init__(self) -> None:
        self.scale = torch.ones(1)
        self.scale_inv = torch.ones(1)
        self.amax_history = torch.zeros(1, 1)


class _Userbuffers:
    """Userbuffers (comm+GEMM overlap) needs the compiled library: constructing one fails, named."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise UnsupportedInProxy(type(self).__name__, "userbuffers communication overlap")


class CommOverlapHelper(_Userbuffers):
    pass


class CommOverlap(_Userbuffers):
    pass


class CommOverlapP2P(_Userbuffers):
    pass


# ---- what TE asks of its library ----


def get_cublasLt_version() -> int:
    return 120800


def get_cudnn_version() -> int:
    """cuDNN's encoded version: none (0) on NVIDIA's flavour here; ROCm TE answers 99.0.0 (its
    get_cudnn_version() is (99, 0, 0) on HIP: see te_flavour)."""
    from rocmport.verify.runtime import te_flavour

    return te_flavour.cudnn_version_encoded()


def get_num_cublas_streams() -> int:
    return 4


def get_stream_priority_range(device_id: int = -1) -> tuple[int, int]:
    return (0, 0)


def device_supports_multicast(device_id: int = -1) -> bool:
    return False


def ubuf_built_with_mpi() -> bool:
    return False


def get_fused_attn_backend(*args: Any, **kwargs: Any):
    # A build without fused attention: TE falls back to its own unfused (plain torch) attention.
    _count("get_fused_attn_backend")
    return NVTE_Fused_Attn_Backend.NVTE_No_Backend


# ---- GEMM ----


def _plain(t: Any, name: str) -> torch.Tensor:
    if t is None or type(t) in (torch.Tensor, torch.nn.Parameter):
        return t
    if isinstance(t, torch.Tensor) and not hasattr(t, "_quantizer") and not hasattr(t, "_data"):
        return t
    raise UnsupportedInProxy(name, f"quantized operand {type(t).__name__}")


def _operand(t: Any) -> torch.Tensor:
    """A GEMM operand as plain values: an FP8 tensor dequantized, a plain tensor as it is."""
    if te_fp8.is_quantized(t):
        return te_fp8.values(t)
    return _plain(t, "generic_gemm")


def _2d(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1, t.shape[-1])


def _gelu(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


def _dgelu(x: torch.Tensor) -> torch.Tensor:
    # d/dx of the tanh-approximated GELU that TE's kernels use.
    c = math.sqrt(2.0 / math.pi)
    inner = c * (x + 0.044715 * x.pow(3))
    t = torch.tanh(inner)
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * c * (1.0 + 3 * 0.044715 * x * x)


# A compiled kernel writes its outputs' memory: no autograd history, whatever the grad mode (TE's
# delayed weight gradient, --delay-wgrad-compute, runs its GEMM after the backward, with grad enabled,
# into views the backward made: an in-place write there is refused under grad mode).
@torch.no_grad()
def generic_gemm(
    A,
    transa,
    B,
    transb,
    D,
    quantizer,
    out_dtype,
    bias,
    bias_type,
    gelu,
    gelu_in,
    grad,
    workspace,
    workspaceSize,
    accumulate,
    use_split_accumulator,
    comm_overlap=None,
    comm_type=None,
    extra_output=None,
    bulk_overlap=False,
    alpha=1.0,
    beta=None,
):
    """cuBLASLt's column-major D = op(A)·op(B) on row-major tensors: D = op(B) @ op(A)^T, i.e.
    (B^T if transb else B) @ (A^T if transa else A), leading dimensions flattened and B's kept."""
    _count("generic_gemm")
    if comm_overlap is not None:
        raise UnsupportedInProxy("generic_gemm", "userbuffers communication overlap")
    # FP8 operands (TE's Float8 / MXFP8 tensors): their values, dequantized; the product in fp32
    if te_fp8.is_quantized(A) or te_fp8.is_quantized(B):
        _count("generic_gemm(fp8)")
    nominal = getattr(B, "dtype", None) if isinstance(getattr(B, "dtype", None), torch.dtype) else torch.float32
    A, B = _operand(A), _operand(B)
    a2, b2 = _2d(A).float(), _2d(B).float()
    op_a = a2.t() if transa else a2
    op_b = b2.t() if transb else b2
    result = op_b @ op_a
    shape = ([B.shape[-1]] if transb else list(B.shape[:-1])) + [op_a.shape[-1]]
    if alpha not in (None, 1.0):
        result = result * alpha
    dtype = _torch_dtype(out_dtype, D.dtype if D is not None and not te_fp8.is_quantized(D) else nominal)
    bias_grad = None
    pre_gelu = None
    if grad:
        if gelu:
            result = result * _dgelu(_2d(gelu_in).float())
            if bias is not None:
                bias_grad = result.sum(0).to(bias.dtype)
        elif bias is not None:
            bias_grad = op_b.sum(-1).to(bias.dtype)
    else:
        if bias is not None and bias.numel():
            result = result + bias.float()
        if gelu:
            pre_gelu = result
            result = _gelu(result)
    result = result.reshape(shape)
    if quantizer is not None:  # FP8 output: the product cast by TE's quantizer (into D when given)
        if D is not None and accumulate:
            result = result + _operand(D).float()
        D = te_fp8.quantize(result, quantizer, D if te_fp8.is_quantized(D) else None)
    elif D is None:
        D = result.to(dtype)
    elif accumulate:
        D.add_(result.to(D.dtype))
    else:
        D.copy_(result)
    gelu_out = None
    if pre_gelu is not None:
        pre = pre_gelu.reshape(shape)
        if gelu_in is not None and gelu_in.numel():
            gelu_in.copy_(pre)
            gelu_out = gelu_in
        else:
            gelu_out = pre.to(_torch_dtype(bias_type, dtype))
    return D, bias_grad, gelu_out, extra_output


@torch.no_grad()  # as generic_gemm: a kernel records no autograd history
def te_general_grouped_gemm(
    A,
    transa,
    B,
    transb,
    D,
    D_type,
    m_splits,
    bias,
    bias_type,
    single_output,
    pre_gelu_out,
    grad,
    workspace,
    workspaceSize,
    accumulate,
    use_split_accumulator,
    math_sm_count,
):
    """One GEMM per group (TE's GroupedLinear); a single output is split by ``m_splits``."""
    _count("te_general_grouped_gemm")
    outs = list(torch.split(D[0], m_splits)) if single_output else D
    grads = []
    for i, (a, b) in enumerate(zip(A, B)):
        # an FP8 operand may be a storage (MXFP8TensorStorage: an FP8 MoE's split_quantize) with no numel()
        if math.prod(te_fp8.shape_of(b)) == 0 and not grad:
            grads.append(bias[i] if bias else None)
            continue
        use_bias = bias is not None and i < len(bias) and bias[i] is not None and bias[i].numel() > 0
        gelu = pre_gelu_out is not None and i < len(pre_gelu_out) and pre_gelu_out[i].numel() > 0
        _, bgrad, _, _ = generic_gemm(
            a,
            transa,
            b,
            transb,
            outs[i],
            None,
            D_type,
            bias[i] if use_bias else None,
            bias_type,
            gelu,
            pre_gelu_out[i] if gelu else None,
            grad,
            None,
            0,
            accumulate,
            use_split_accumulator,
        )
        if grad and use_bias and bgrad is not None:
            bias[i].copy_(bgrad)
    return bias


# ---- normalization ----


def fused_multi_row_padding(input, output, input_row_list, padded_input_row_list) -> None:
    """Fp8Padding's kernel (an FP8 MoE's grouped GEMM input, each expert's rows padded to the recipe's
    alignment): split ``i`` of ``input`` (``input_row_list[i]`` rows) copied to the head of split ``i``
    of ``output`` (``padded_input_row_list[i]`` rows), the rows after it zero, as the kernel writes them."""
    _count("fused_multi_row_padding")
    src = dst = 0
    for rows, padded in zip(input_row_list, padded_input_row_list):
        output[dst : dst + rows].copy_(input[src : src + rows])
        output[dst + rows : dst + padded].zero_()
        src, dst = src + rows, dst + padded


def fused_multi_row_unpadding(input, output, input_row_list, unpadded_input_row_list) -> None:
    """Fp8Unpadding's kernel, the inverse: the first ``unpadded_input_row_list[i]`` rows of split ``i``
    of ``input`` (``input_row_list[i]`` rows) into ``output``, one split after another."""
    _count("fused_multi_row_unpadding")
    src = dst = 0
    for padded, rows in zip(input_row_list, unpadded_input_row_list):
        output[dst : dst + rows].copy_(input[src : src + rows])
        src, dst = src + padded, dst + rows


def _gamma(weight: torch.Tensor, zero_centered_gamma: bool) -> torch.Tensor:
    w = weight.float()
    return w + 1.0 if zero_centered_gamma else w


def _quantized(value: torch.Tensor, quantizer: Any, out: Any = None) -> Any:
    """A kernel's output cast to FP8 by TE's ``quantizer`` (into ``out`` when it is a quantized tensor)."""
    return te_fp8.quantize(value, quantizer, out if te_fp8.is_quantized(out) else None)


def _into(ln_out, value: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if ln_out is not None:
        _plain(ln_out, "layernorm_fwd")
        ln_out.copy_(value.reshape(ln_out.shape))
        return ln_out
    return value.to(dtype)


def layernorm_fwd(input, weight, bias, eps, ln_out, quantizer, otype, sm_margin, zero_centered_gamma):
    _count("layernorm_fwd")
    x = input.float()
    mu = x.mean(-1)
    rsigma = torch.rsqrt(x.var(-1, unbiased=False) + eps)
    y = (x - mu.unsqueeze(-1)) * rsigma.unsqueeze(-1) * _gamma(weight, zero_centered_gamma)
    if bias is not None:
        y = y + bias.float()
    if quantizer is not None:  # the fused norm + FP8 cast
        return _quantized(y, quantizer, ln_out), mu.reshape(-1), rsigma.reshape(-1)
    return _into(ln_out, y, _torch_dtype(otype, input.dtype)), mu.reshape(-1), rsigma.reshape(-1)


def layernorm_bwd(dz, x, mu, rsigma, gamma, sm_margin, zero_centered_gamma):
    """From the saved statistics, as the kernel: xhat = (x - mu)·rsigma, dy = dz·gamma,
    dx = rsigma·(dy - mean(dy) - xhat·mean(dy·xhat)), dgamma = Σ dz·xhat, dbeta = Σ dz."""
    _count("layernorm_bwd")
    xf, dzf = _2d(x).float(), _2d(dz).float()
    r = rsigma.float().reshape(-1, 1)
    xhat = (xf - mu.float().reshape(-1, 1)) * r
    dy = dzf * _gamma(gamma, zero_centered_gamma)
    dx = r * (dy - dy.mean(-1, keepdim=True) - xhat * (dy * xhat).mean(-1, keepdim=True))
    return (dx.to(x.dtype).reshape(x.shape), (dzf * xhat).sum(0).to(gamma.dtype), dzf.sum(0).to(gamma.dtype))


def rmsnorm_fwd(input, weight, eps, ln_out, quantizer, otype, sm_margin, zero_centered_gamma):
    _count("rmsnorm_fwd")
    x = input.float()
    rsigma = torch.rsqrt(x.pow(2).mean(-1) + eps)
    y = x * rsigma.unsqueeze(-1) * _gamma(weight, zero_centered_gamma)
    if quantizer is not None:
        return _quantized(y, quantizer, ln_out), None, rsigma.reshape(-1)
    return _into(ln_out, y, _torch_dtype(otype, input.dtype)), None, rsigma.reshape(-1)


def rmsnorm_bwd(dz, x, rsigma, gamma, sm_margin, zero_centered_gamma):
    """xhat = x·rsigma, dy = dz·gamma, dx = rsigma·(dy - xhat·mean(dy·xhat)), dgamma = Σ dz·xhat."""
    _count("rmsnorm_bwd")
    xf, dzf = _2d(x).float(), _2d(dz).float()
    r = rsigma.float().reshape(-1, 1)
    xhat = xf * r
    dy = dzf * _gamma(gamma, zero_centered_gamma)
    dx = r * (dy - xhat * (dy * xhat).mean(-1, keepdim=True))
    return dx.to(x.dtype).reshape(x.shape), (dzf * xhat).sum(0).to(gamma.dtype)


def rmsnorm_bwd_add(dz, x, add, rsigma, gamma, sm_margin, zero_centered_gamma):
    dx, dg = rmsnorm_bwd(dz, x, rsigma, gamma, sm_margin, zero_centered_gamma)
    return dx + add.to(dx.dtype).reshape(dx.shape), dg


# ---- activations (TE's GELU is the tanh approximation) ----


def _glu(act):
    def fwd(x: torch.Tensor) -> torch.Tensor:
        a, b = x.float().chunk(2, dim=-1)
        return act(a) * b

    return fwd


_ACTS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "gelu": _gelu,
    "relu": F.relu,
    "silu": F.silu,
    "qgelu": lambda x: x * torch.sigmoid(1.702 * x),
    "srelu": lambda x: F.relu(x).pow(2),
}
_ACTS.update(
    {
        "geglu": _glu(_gelu),
        "reglu": _glu(F.relu),
        "swiglu": _glu(F.silu),
        "qgeglu": _glu(_ACTS["qgelu"]),
        "sreglu": _glu(_ACTS["srelu"]),
    }
)


def _activation(name: str):
    fn = _ACTS[name]

    def forward(input, quantizer, *args):
        _count(name)
        if quantizer is not None:
            return _quantized(fn(input.float()), quantizer)
        return fn(input.float()).to(input.dtype)

    def backward(grad, input, quantizer, *args):
        _count("d" + name)
        x = input.detach().float().requires_grad_(True)
        with torch.enable_grad():
            (dx,) = torch.autograd.grad(fn(x), x, grad.float())
        if quantizer is not None:
            return _quantized(dx, quantizer)
        return dx.to(grad.dtype)

    def dbias_backward(grad, input, quantizer, *args):
        _count("dbias_d" + name)
        dx = backward(grad, input, None)
        dbias = _2d(dx).float().sum(0).to(grad.dtype)
        return dbias, (_quantized(dx, quantizer) if quantizer is not None else dx)

    forward.__name__, backward.__name__, dbias_backward.__name__ = name, "d" + name, "dbias_d" + name
    return forward, backward, dbias_backward


gelu, dgelu, dbias_dgelu = _activation("gelu")
relu, drelu, dbias_drelu = _activation("relu")
silu, dsilu, dbias_dsilu = _activation("silu")
qgelu, dqgelu, dbias_dqgelu = _activation("qgelu")
srelu, dsrelu, dbias_dsrelu = _activation("srelu")
geglu, dgeglu, _ = _activation("geglu")
reglu, dreglu, _ = _activation("reglu")
swiglu, dswiglu, _ = _activation("swiglu")
qgeglu, dqgeglu, _ = _activation("qgeglu")
sreglu, dsreglu, _ = _activation("sreglu")
del _


def bgrad_quantize(input, quantizer):
    _count("bgrad_quantize")
    dbias = _2d(input).float().sum(0).to(input.dtype)
    return dbias, (_quantized(input.float(), quantizer) if quantizer is not None else input)


# ---- FP8 (rocmport.verify.runtime.te_fp8: casts, scaling, MXFP8 blocks) ----


def quantize(tensor, quantizer, output=None, noop=None):
    _count("quantize")
    return te_fp8.quantize(tensor, quantizer, output, noop)


def split_quantize(tensor, split_sections, quantizer_list, *args, **kwargs):
    """GroupedLinear's casts: the rows split by ``split_sections``, each cast by its own quantizer."""
    _count("split_quantize")
    return [te_fp8.quantize(part, q) for part, q in zip(torch.split(tensor, list(split_sections)), quantizer_list)]


def create_empty_quantized_tensor(quantizer, shape, dtype, device, pin_memory=False):
    """TE 2.17's Quantizer.make_empty (the FP8 all-gather's output, FP8 weights' buffers)."""
    _count("create_empty_quantized_tensor")
    return te_fp8.create_empty(quantizer, shape, dtype, device)


def dequantize(input, otype):
    _count("dequantize")
    return te_fp8.dequantize(input, otype)


def compute_amax(input, amax):
    _count("compute_amax")
    te_fp8.compute_amax(input, amax)


def multi_tensor_compute_scale_and_scale_inv(
    chunk_size, noop_flag, tensor_lists, max_fp8, force_pow_2_scales=False, epsilon=0.0
):
    _count("multi_tensor_compute_scale_and_scale_inv")
    te_fp8.multi_tensor_compute_scale_and_scale_inv(
        tensor_lists, float(max_fp8), bool(force_pow_2_scales), float(epsilon)
    )


def fp8_transpose(input, dtype=None, out=None):
    _count("fp8_transpose")
    return te_fp8.fp8_transpose(input, dtype, out)


def fused_amax_and_scale_update_after_reduction(
    amax_reduction_buffer, amax_histories, scales, amax_compute_algo, fp8_dtype, margin
):
    _count("fused_amax_and_scale_update_after_reduction")
    te_fp8.fused_amax_and_scale_update_after_reduction(
        amax_reduction_buffer, amax_histories, scales, amax_compute_algo, fp8_dtype, margin
    )


# ---- softmax variants (inputs [b, np, sq, sk] or [b*np, sq, sk]; masked logits get -10000) ----


def _softmax(x: torch.Tensor, scale, mask=None) -> torch.Tensor:
    s = x.float() * float(scale)
    if mask is not None:
        s = s.masked_fill(mask.bool(), -10000.0)
    return torch.softmax(s, dim=-1).to(x.dtype)


def _softmax_bwd(output_grads, softmax_results, scale) -> torch.Tensor:
    y, g = softmax_results.float(), output_grads.float()
    return (float(scale) * y * (g - (g * y).sum(-1, keepdim=True))).to(output_grads.dtype)


def _causal(sq: int, sk: int, aligned_bottom_right: bool) -> torch.Tensor:
    offset = sk - sq if aligned_bottom_right else 0
    return torch.ones(sq, sk, dtype=torch.bool).triu(1 + offset)


def scaled_softmax_forward(input, scale_factor):
    _count("scaled_softmax_forward")
    return _softmax(input, scale_factor)


def scaled_masked_softmax_forward(input, mask, scale_factor):
    _count("scaled_masked_softmax_forward")
    return _softmax(input, scale_factor, mask)


def scaled_upper_triang_masked_softmax_forward(input, scale_factor):
    _count("scaled_upper_triang_masked_softmax_forward")
    return _softmax(input, scale_factor, _causal(input.shape[-2], input.shape[-1], False))


def scaled_aligned_causal_masked_softmax_forward(input, scale_factor):
    _count("scaled_aligned_causal_masked_softmax_forward")
    return _softmax(input, scale_factor, _causal(input.shape[-2], input.shape[-1], True))


scaled_softmax_backward = scaled_masked_softmax_backward = _softmax_bwd
scaled_upper_triang_masked_softmax_backward = scaled_aligned_causal_masked_softmax_backward = _softmax_bwd


# ---- RoPE (sbhd / bshd / thd; non-interleaved rotates halves, interleaved rotates pairs) ----


def _rotate(x: torch.Tensor, interleaved: bool) -> torch.Tensor:
    if interleaved:
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.stack((-x2, x1), dim=-1).flatten(-2)
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def _rope_apply(t: torch.Tensor, freqs: torch.Tensor, interleaved: bool) -> torch.Tensor:
    # freqs: [s, 1, 1, d2] for the rows of t along its sequence dimension (t: [s, ..., d]).
    d2 = freqs.shape[-1]
    f = freqs.float()
    rot, rest = t[..., :d2].float(), t[..., d2:]
    out = rot * torch.cos(f) + _rotate(rot, interleaved) * torch.sin(f)
    return torch.cat((out.to(t.dtype), rest), dim=-1)


def _rope(t, freqs, start_positions, qkv_format, interleaved, cu_seqlens, cp_size, cp_rank, name):
    if cp_size not in (None, 0, 1):
        raise UnsupportedInProxy(name, "context parallelism")
    fmt = NVTE_QKV_Format(int(qkv_format))
    if fmt == NVTE_QKV_Format.NVTE_THD:
        bounds = cu_seqlens.tolist()
        pieces = [
            _rope_apply(t[a:b], freqs[: b - a].reshape(b - a, *([1] * (t.dim() - 2)), -1), interleaved)
            for a, b in zip(bounds, bounds[1:])
        ]
        return torch.cat(pieces) if pieces else t.clone()
    seq = t if fmt == NVTE_QKV_Format.NVTE_SBHD else t.transpose(0, 1)
    if start_positions is not None:
        rows = [
            _rope_apply(seq[:, i : i + 1], freqs[int(p) : int(p) + seq.shape[0]], interleaved)
            for i, p in enumerate(start_positions.tolist())
        ]
        out = torch.cat(rows, dim=1)
    else:
        out = _rope_apply(seq, freqs[: seq.shape[0]], interleaved)
    return out if fmt == NVTE_QKV_Format.NVTE_SBHD else out.transpose(0, 1).contiguous()


def fused_rope_forward(input, freqs, start_positions, qkv_format, interleaved, cu_seqlens, cp_size, cp_rank):
    _count("fused_rope_forward")
    return _rope(
        input, freqs, start_positions, qkv_format, interleaved, cu_seqlens, cp_size, cp_rank, "fused_rope_forward"
    )


def fused_rope_backward(output_grads, freqs, *args):
    """TE up to 2.9: (grads, freqs, qkv_format, interleaved, cu_seqlens, cp_size, cp_rank); from
    2.10 the positions come too: (grads, freqs, start_positions, qkv_format, ...)."""
    # RoPE is linear in its input: the gradient is the transpose map, taken through autograd.
    _count("fused_rope_backward")
    start_positions, (qkv_format, interleaved, cu_seqlens, cp_size, cp_rank) = (
        (args[0], args[1:]) if len(args) == 6 else (None, args)
    )
    x = torch.zeros_like(output_grads, dtype=torch.float32, requires_grad=True)
    with torch.enable_grad():
        y = _rope(
            x, freqs, start_positions, qkv_format, interleaved, cu_seqlens, cp_size, cp_rank, "fused_rope_backward"
        )
        (dx,) = torch.autograd.grad(y, x, output_grads.float())
    return dx.to(output_grads.dtype)


def _qkv_split(qkv_split_arg_list) -> tuple[int, int, int]:
    q, k, v = (int(n) for n in qkv_split_arg_list)
    return q, k, v


def fused_qkv_rope_forward(
    qkv, q_freqs, k_freqs, start_positions, qkv_split_arg_list, qkv_format, interleaved, cp_size, cp_rank
):
    """TE's FusedQKVRoPEFunc (megatron's fused QKV RoPE): ``qkv`` [s, b, h, q+k+v] (or bshd) split along
    its last dimension; q's part holds q/k heads of k's size per group. Returns q [s, b, h*q/k, k]
    and k [s, b, h, k] rotated over their first d2 = freqs' size, v [s, b, h, v] as it is."""
    _count("fused_qkv_rope_forward")
    return _qkv_rope(
        qkv, q_freqs, k_freqs, start_positions, qkv_split_arg_list, qkv_format, interleaved, cp_size, cp_rank
    )


def _qkv_rope(qkv, q_freqs, k_freqs, start_positions, qkv_split_arg_list, qkv_format, interleaved, cp_size, cp_rank):
    q_size, k_size, _ = _qkv_split(qkv_split_arg_list)
    lead = qkv.shape[:2]
    h = qkv.shape[2]
    q = qkv[..., :q_size].reshape(*lead, h * q_size // k_size, k_size)
    k = qkv[..., q_size : q_size + k_size]
    v = qkv[..., q_size + k_size :]
    name = "fused_qkv_rope_forward"
    q_out = _rope(q, q_freqs, start_positions, qkv_format, interleaved, None, cp_size, cp_rank, name)
    k_out = _rope(k, k_freqs, start_positions, qkv_format, interleaved, None, cp_size, cp_rank, name)
    return q_out.contiguous(), k_out.contiguous(), v.contiguous()


def fused_qkv_rope_backward(
    q_grad, k_grad, v_grad, q_freqs, k_freqs, qkv_split_arg_list, qkv_format, interleaved, cp_size, cp_rank
):
    """The gradient of fused_qkv_rope_forward for its qkv input ([s, b, h, q+k+v])."""
    _count("fused_qkv_rope_backward")
    q_size, k_size, v_size = _qkv_split(qkv_split_arg_list)
    h = (q_grad.shape[2] + k_grad.shape[2] + v_grad.shape[2]) * q_grad.shape[3] // (q_size + k_size + v_size)
    x = torch.zeros(*q_grad.shape[:2], h, q_size + k_size + v_size, dtype=torch.float32, requires_grad=True)
    with torch.enable_grad():
        outs = _qkv_rope(x, q_freqs, k_freqs, None, qkv_split_arg_list, qkv_format, interleaved, cp_size, cp_rank)
        (dx,) = torch.autograd.grad(outs, x, (q_grad.float(), k_grad.float(), v_grad.float()))
    return dx.to(q_grad.dtype)


# ---- multi-tensor kernels (TE's FusedAdam / FusedSGD, megatron's grad clipping) ----


def _flag_nonfinite(noop_flag: torch.Tensor, tensors) -> None:
    if any(not torch.isfinite(t).all() for t in tensors):
        noop_flag.fill_(1)


def multi_tensor_scale(chunk_size, noop_flag, tensor_lists, scale):
    _count("multi_tensor_scale")
    src, dst = tensor_lists[0], tensor_lists[1]
    _flag_nonfinite(noop_flag, src)
    for s, d in zip(src, dst):
        d.copy_(s.float() * scale)


def multi_tensor_scale_tensor(chunk_size, noop_flag, tensor_lists, scale):
    """multi_tensor_scale with the scale as a one-element tensor (TE 2.17+; megatron's grad clipping
    keeps the clip coefficient on the device instead of syncing it to the host)."""
    _count("multi_tensor_scale_tensor")
    src, dst = tensor_lists[0], tensor_lists[1]
    _flag_nonfinite(noop_flag, src)
    factor = scale.float().reshape(())
    for s, d in zip(src, dst):
        d.copy_(s.float() * factor)


def multi_tensor_l2norm(chunk_size, noop_flag, tensor_lists, per_tensor=False):
    _count("multi_tensor_l2norm")
    norms = [t.float().norm() for t in tensor_lists[0]]
    total = torch.stack(norms).norm().reshape(1) if norms else torch.zeros(1)
    per = torch.stack(norms) if (per_tensor and norms) else torch.zeros(0)
    return total, per


def multi_tensor_unscale_l2norm(chunk_size, noop_flag, tensor_lists, inv_scale, per_tensor=False):
    _count("multi_tensor_unscale_l2norm")
    scaled = [[t.float() * inv_scale.float() for t in tensor_lists[0]]]
    return multi_tensor_l2norm(chunk_size, noop_flag, scaled, per_tensor)


def multi_tensor_adam(
    chunk_size, noop_flag, tensor_lists, lr, beta1, beta2, epsilon, step, mode, bias_correction, weight_decay
):
    """Adam (mode 0: L2 in the gradient) / AdamW (mode 1: decoupled decay), as TE's kernel; a fifth
    list holds fp32 master weights that are updated and copied back to the model's parameters."""
    _count("multi_tensor_adam")
    grads, params, exp_avgs, exp_avg_sqs = tensor_lists[:4]
    masters = tensor_lists[4] if len(tensor_lists) > 4 else None
    c1 = 1 - beta1**step if bias_correction else 1.0
    c2 = 1 - beta2**step if bias_correction else 1.0
    for i, (g, p, m, v) in enumerate(zip(grads, params, exp_avgs, exp_avg_sqs)):
        target = masters[i] if masters is not None else p
        w, gr = target.float(), g.float()
        if mode == 0 and weight_decay:
            gr = gr + weight_decay * w
        mf = beta1 * m.float() + (1 - beta1) * gr
        vf = beta2 * v.float() + (1 - beta2) * gr * gr
        update = (mf / c1) / ((vf / c2).sqrt() + epsilon)
        if mode == 1 and weight_decay:
            update = update + weight_decay * w
        w = w - lr * update
        m.copy_(mf)
        v.copy_(vf)
        target.copy_(w)
        if masters is not None:
            p.copy_(w)


def multi_tensor_sgd(
    chunk_size,
    noop_flag,
    tensor_lists,
    weight_decay,
    momentum,
    dampening,
    lr,
    nesterov,
    first_run,
    wd_after_momentum,
    scale,
):
    _count("multi_tensor_sgd")
    grads, params, bufs = tensor_lists[:3]
    for g, p, buf in zip(grads, params, bufs):
        d = g.float() * scale
        if weight_decay and not wd_after_momentum:
            d = d + weight_decay * p.float()
        if momentum:
            if first_run:
                buf.copy_(d)
            else:
                buf.mul_(momentum).add_(d, alpha=1 - dampening)
            d = d + momentum * buf.float() if nesterov else buf.float()
        if weight_decay and wd_after_momentum:
            d = d + weight_decay * p.float()
        p.copy_(p.float() - lr * d)
