"""The device kind a run's goldens are kept for, composed and parsed here only: `cpu-proxy`,
`cpu-proxy-te<version>` with TE's Python layer on the proxy, or the platform and the first GPU's
name (`rocm-amd-instinct-mi300x`, `cuda-nvidia-a100-sxm4-80gb`)."""

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


@dataclass(frozen=True)
class DeviceKind:
    platform: Platform
    gpu: str | None = None  # the first GPU's name, lower-case words joined by '-' (a GPU platform)
    te: str | None = None  # TE's Python layer version the CPU proxy ran (--te)

    def __str__(self) -> str:
        if self.platform == PROXY:
            return f"{PROXY}{_TE}{self.te}" if self.te else PROXY
        return f"{self.platform}-{self.gpu}"

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
        if text == PROXY:
            return cls(PROXY)
        if text.startswith(PROXY + _TE) and len(text) > len(PROXY + _TE):
            return cls(PROXY, te=text[len(PROXY + _TE) :])
        platform, _, gpu = text.partition("-")
        if platform in ("rocm", "cuda") and gpu:
            return cls("rocm" if platform == "rocm" else "cuda", gpu=gpu)
        raise ValueError(f"{text!r}: not a device kind (cpu-proxy, cpu-proxy-te<version>, rocm-<gpu>, cuda-<gpu>)")
