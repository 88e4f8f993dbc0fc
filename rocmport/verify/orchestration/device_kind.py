"""The device kind a run's goldens are kept for, composed and parsed here only: `cpu-proxy`,
`cpu-proxy-te<version>` with TE's Python layer on the proxy (`cpu-proxy-te<version>-fp8-<encoding>`
for an FP8 case: its casts' encoding, `fnuz` on a simulated gfx942 under the rocm flavour, `ocp`
otherwise, decides its losses), or the platform and the first GPU's name (`rocm-amd-instinct-mi300x`,
`cuda-nvidia-a100-sxm4-80gb`)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from rocmport.machine.probe import Environment
    from rocmport.verify.orchestration.te_layer import TELayer

Platform = Literal["cpu-proxy", "rocm", "cuda"]
PROXY: Platform = "cpu-proxy"
_TE = "-te"
_FP8 = "-fp8-"
FP8_ENCODINGS = ("ocp", "fnuz")


@dataclass(frozen=True)
class DeviceKind:
    platform: Platform
    gpu: str | None = None  # the first GPU's name, lower-case words joined by '-' (a GPU platform)
    te: str | None = None  # TE's Python layer version the CPU proxy ran (--te)
    # an FP8 case on the proxy: the encoding of its casts (FP8_ENCODINGS). A GPU's name says it already
    # (an MI300X is FNUZ); on the proxy one TE version casts FNUZ on a simulated gfx942 and OCP on the
    # CUDA control or gfx950, and the losses differ, so their goldens must not share a name.
    fp8: str | None = None

    def __str__(self) -> str:
        if self.platform == PROXY:
            base = f"{PROXY}{_TE}{self.te}" if self.te else PROXY
            return f"{base}{_FP8}{self.fp8}" if self.fp8 else base
        return f"{self.platform}-{self.gpu}"

    def for_fp8(self, encoding: str | None) -> DeviceKind:
        """The kind an FP8 case's golden is kept for: on the proxy, this kind with the case's FP8
        encoding (None: not an FP8 case, the kind itself); a GPU's kind names its FP8 already."""
        if encoding is None or not self.proxy:
            return self
        if encoding not in FP8_ENCODINGS:
            raise ValueError(f"{encoding!r}: not an FP8 encoding ({', '.join(FP8_ENCODINGS)})")
        return DeviceKind(self.platform, self.gpu, self.te, encoding)

    @property
    def proxy(self) -> bool:
        return self.platform == PROXY

    @classmethod
    def of_run(cls, mode: str, machine: Environment, te: TELayer | None) -> DeviceKind:
        """The kind of a run: the CPU proxy (with its TE layer's version), or the platform and its first GPU."""
        return cls.of_parts(mode, machine.devices, machine.hip, te.version if te else None)

    @classmethod
    def of_parts(cls, mode: str, devices: Sequence[str], hip: str | None, te: str | None) -> DeviceKind:
        """The kind from a run's facts as a verify report keeps them (its mode, env.devices, env.hip and
        te.version): a report read back names the kind its run had."""
        if mode == PROXY or not devices:
            return cls(PROXY, te=te)
        name = re.sub(r"[^a-z0-9]+", "-", devices[0].lower()).strip("-")
        return cls("rocm" if hip else "cuda", gpu=name)

    @classmethod
    def parse(cls, text: str) -> DeviceKind:
        """A kind as `str()` wrote it (a golden's ``device_kind``, its file name); ValueError for another text."""
        base, sep, fp8 = text.rpartition(_FP8)
        if sep and fp8 in FP8_ENCODINGS and base.startswith(PROXY):
            return cls.parse(base).for_fp8(fp8)
        if text == PROXY:
            return cls(PROXY)
        if text.startswith(PROXY + _TE) and len(text) > len(PROXY + _TE):
            return cls(PROXY, te=text[len(PROXY + _TE) :])
        platform, _, gpu = text.partition("-")
        if platform in ("rocm", "cuda") and gpu:
            return cls("rocm" if platform == "rocm" else "cuda", gpu=gpu)
        raise ValueError(
            f"{text!r}: not a device kind (cpu-proxy, cpu-proxy-te<version>, either with -fp8-ocp or -fp8-fnuz, "
            "rocm-<gpu>, cuda-<gpu>)"
        )
