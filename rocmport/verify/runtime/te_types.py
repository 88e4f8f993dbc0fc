"""What TE's CPU extension (te_cpu) and its FP8 kernels (te_fp8) share: the extension's DType enum,
its torch dtypes, and the error a kernel the proxy lacks raises. Its own module so neither of the
two imports the other for it."""

from __future__ import annotations

import enum

import torch


class UnsupportedInProxy(RuntimeError):
    """TE's Python layer reached a kernel the CPU proxy has no reference implementation for."""

    def __init__(self, name: str, why: str = "") -> None:
        self.kernel = f"transformer_engine_torch.{name}"
        super().__init__(
            f"unsupported-in-proxy: {self.kernel} has no CPU reference implementation" + (f" ({why})" if why else "")
        )


class DType(enum.IntEnum):
    # Exactly the members the extension binds, with transformer_engine::DType's values (TE 2.17+
    # asserts its Python DType mirrors this enum's member names).
    kByte = 0
    kInt32 = 2
    kFloat32 = 4
    kFloat16 = 5
    kBFloat16 = 6
    kFloat8E4M3 = 7
    kFloat8E5M2 = 8
    kFloat4E2M1 = 10


_TORCH_OF = {
    DType.kByte: torch.uint8,
    DType.kInt32: torch.int32,
    DType.kFloat32: torch.float32,
    DType.kFloat16: torch.float16,
    DType.kBFloat16: torch.bfloat16,
}


def _torch_dtype(otype, default: torch.dtype) -> torch.dtype:
    if otype is None:
        return default
    if isinstance(otype, torch.dtype):
        return otype
    if int(otype) in _TORCH_OF:
        return _TORCH_OF[DType(int(otype))]
    raise UnsupportedInProxy("DType", f"output type {otype!r} is a quantized format")
