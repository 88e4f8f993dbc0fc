"""The machine rocmport runs on: the invoking interpreter and its torch (never modified), the devices
and, on ROCm, the first device's arch. Probed once per process: the machine does not change under a
running rocmport."""

from __future__ import annotations

import functools
import platform
import sys
from dataclasses import dataclass, field

from rocmport.components import base_arch
from rocmport.errors import BadInput


@dataclass
class Environment:
    python: str
    torch: str | None
    hip: str | None
    cuda: str | None
    device_count: int
    devices: list[str] = field(default_factory=list)

    @property
    def has_gpu(self) -> bool:
        return self.device_count > 0

    def to_dict(self) -> dict:
        return dict(self.__dict__)


@functools.cache  # the machine does not change under a running rocmport: probed once per process
def probe() -> Environment:
    try:
        import torch
    except ImportError:
        raise BadInput(
            f"verify needs torch in the Python it runs with ({sys.executable}) and there is none: "
            f"on a CPU or CUDA machine `{sys.executable} -m pip install torch`; on ROCm run rocmport "
            f"with the image's Python, whose torch must never be replaced"
        ) from None

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return Environment(
        python=platform.python_version(),
        torch=torch.__version__,
        hip=getattr(torch.version, "hip", None),
        cuda=getattr(torch.version, "cuda", None),
        device_count=count,
        devices=[torch.cuda.get_device_name(i) for i in range(count)],
    )


def gpu_arch() -> str | None:
    """The first visible GPU's arch (gfx942 from 'gfx942:sramecc+:xnack-'), None without one."""
    try:
        import torch
    except ImportError:
        return None
    if not getattr(torch.version, "hip", None) or not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        return None
    return base_arch(getattr(torch.cuda.get_device_properties(0), "gcnArchName", None))
