"""HIP simulation: verify's processes on a CPU see a ROCm build of torch.

Installed by verify's bootstrap (sitecustomize) in every process it starts when
protocol.HIP_SIM holds a ROCm version: `torch.version.hip` is that version, `torch.version.cuda`
None, `torch.utils.cpp_extension` reports a HIP extension toolchain (IS_HIP_EXTENSION, ROCM_HOME,
no CUDA_HOME). Device questions (properties, capability, name) are answered as a GPU of the
simulated architecture would (protocol.HIP_SIM_ARCH, verify's --hip-arch; an MI300X, gfx942, by default).
Nothing is written into the tree; nothing here runs unless verify asks for it."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from rocmport.verify.runtime import protocol

# torch.version.hip as a ROCm 7.1 build of torch reports it (6.4 builds: "6.4.43482-0f2d60242").
DEFAULT_VERSION = "7.1.25424-4179531dcd"


def parse_version(text: str) -> tuple[int, int]:
    """``"7.1.25424-..."`` -> (7, 1); BadInput when it is not a ROCm version."""
    from rocmport.errors import BadInput

    # ASCII digits only ('²'.isdigit() is true and int('²') fails); the hash a plain word: the version
    # goes into every started process's environment and torch.version.hip.
    match = _VERSION.fullmatch(text) if len(text) <= 64 else None
    if match is None:
        raise BadInput(
            f"--hip-version {text[:80]!r}: not a ROCm version; expected MAJOR.MINOR[.BUILD][-HASH], "
            f"e.g. 7.1 or 6.4.43482-0f2d60242 (--no-hip-sim for the CUDA path)"
        )
    return int(match[1]), int(match[2])


_VERSION = re.compile(r"([0-9]{1,6})\.([0-9]{1,6})(?:\.[0-9]{1,12})*(?:-[0-9A-Za-z][0-9A-Za-z._+-]*)?", re.ASCII)


@dataclass(frozen=True)
class DeviceProperties:
    """What `torch.cuda.get_device_properties` returns, for a simulated device (what megatron and torch read)."""

    name: str
    major: int
    minor: int
    gcnArchName: str  # noqa: N815 - torch's own attribute name
    total_memory: int
    multi_processor_count: int
    warp_size: int
    L2_cache_size: int  # noqa: N815
    max_threads_per_multi_processor: int = 2048
    regs_per_multiprocessor: int = 65536
    shared_memory_per_block: int = 64 * 2**10
    is_integrated: bool = False
    is_multi_gpu_board: bool = False
    uuid: str = "00000000-0000-0000-0000-000000000000"
    pci_bus_id: int = 0
    pci_device_id: int = 0
    pci_domain_id: int = 0

    def __repr__(self):
        return (
            f"_CudaDeviceProperties(name='{self.name}', major={self.major}, minor={self.minor}, gcnArchName='{self.gcnArchName}', "
            f"total_memory={self.total_memory // 2**20}MB, multi_processor_count={self.multi_processor_count})"
        )


# The simulated devices: an MI300X under the HIP simulation, an A100 (upstream's golden machine) on the CUDA path.
MI300X = DeviceProperties(
    name="AMD Instinct MI300X",
    major=9,
    minor=4,
    gcnArchName="gfx942:sramecc+:xnack-",
    total_memory=192 * 2**30,
    multi_processor_count=304,
    warp_size=64,
    L2_cache_size=4 * 2**20,
)
A100 = DeviceProperties(
    name="NVIDIA A100-SXM4-80GB",
    major=8,
    minor=0,
    gcnArchName="NVIDIA A100-SXM4-80GB",
    total_memory=80 * 2**30,
    multi_processor_count=108,
    warp_size=32,
    L2_cache_size=40 * 2**20,
    shared_memory_per_block=48 * 2**10,
)
# The CUDA path's FP8 control (TE runs FP8 from compute capability 8.9): protocol.CUDA_SIM_ARCH=sm_90.
H100 = DeviceProperties(
    name="NVIDIA H100 80GB HBM3",
    major=9,
    minor=0,
    gcnArchName="NVIDIA H100 80GB HBM3",
    total_memory=80 * 2**30,
    multi_processor_count=132,
    warp_size=32,
    L2_cache_size=50 * 2**20,
)
CUDA_DEVICES = {"sm_80": A100, "sm_90": H100}
# One GPU of each architecture rocmport has a launch profile for (--hip-arch), as ROCm's torch reports it
# (major/minor: the gfx number's digits, as HIP's hipDeviceProp_t gives them).
SIM_DEVICES = {
    "gfx942": MI300X,
    "gfx950": DeviceProperties(
        name="AMD Instinct MI355X",
        major=9,
        minor=5,
        gcnArchName="gfx950:sramecc+:xnack-",
        total_memory=288 * 2**30,
        multi_processor_count=256,
        warp_size=64,
        L2_cache_size=4 * 2**20,
    ),
    "gfx90a": DeviceProperties(
        name="AMD Instinct MI250X/MI250",
        major=9,
        minor=0,
        gcnArchName="gfx90a:sramecc+:xnack-",
        total_memory=64 * 2**30,
        multi_processor_count=110,
        warp_size=64,
        L2_cache_size=8 * 2**20,
    ),
    "gfx1100": DeviceProperties(
        name="AMD Radeon RX 7900 XTX",
        major=11,
        minor=0,
        gcnArchName="gfx1100",
        total_memory=24 * 2**30,
        multi_processor_count=48,
        warp_size=32,
        L2_cache_size=6 * 2**20,
    ),
    "gfx1201": DeviceProperties(
        name="AMD Radeon AI PRO R9700",
        major=12,
        minor=0,
        gcnArchName="gfx1201",
        total_memory=32 * 2**30,
        multi_processor_count=32,
        warp_size=32,
        L2_cache_size=8 * 2**20,
    ),
    "gfx906": DeviceProperties(
        name="AMD Instinct MI50/MI60",
        major=9,
        minor=0,
        gcnArchName="gfx906:sramecc+:xnack-",
        total_memory=32 * 2**30,
        multi_processor_count=60,
        warp_size=64,
        L2_cache_size=4 * 2**20,
    ),
}
DEFAULT_ARCH = "gfx942"


def parse_arch(text: str) -> str:
    """``--hip-arch``'s value, checked; BadInput naming the known ones."""
    from rocmport.errors import BadInput

    if text not in SIM_DEVICES:
        raise BadInput(
            f"--hip-arch {text[:40]!r}: no simulated GPU of that architecture; choose one of {', '.join(SIM_DEVICES)}"
        )
    return text


def sim_arch() -> str:
    """The simulated architecture of this process (protocol.HIP_SIM_ARCH; gfx942 when unset or unknown)."""
    name = protocol.HIP_SIM_ARCH.read() or DEFAULT_ARCH
    return name if name in SIM_DEVICES else DEFAULT_ARCH


def device(hip: bool) -> DeviceProperties:
    if hip:
        return SIM_DEVICES[sim_arch()]
    return CUDA_DEVICES.get(protocol.CUDA_SIM_ARCH.raw(), A100)


def arch(hip: bool) -> str:
    props = device(hip)
    return props.gcnArchName.split(":")[0] if hip else f"sm_{props.major}{props.minor}"


def install(version: str | None = None) -> None:
    """Make this process's torch a ROCm build of ``version`` (default: protocol.HIP_SIM)."""
    version = version or protocol.HIP_SIM.read() or ""
    major, minor = parse_version(version)
    import torch

    torch.version.hip = version
    torch.version.cuda = None
    from torch.utils import cpp_extension

    rocm = os.environ.get("ROCM_HOME") or "/opt/rocm"
    cpp_extension.ROCM_HOME = rocm
    cpp_extension.HIP_HOME = os.path.join(rocm, "hip")
    cpp_extension.IS_HIP_EXTENSION = True
    cpp_extension.ROCM_VERSION = (major, minor)
    cpp_extension.CUDA_HOME = None
    # Device questions answer as an MI300X (whether a device can run anything is the proxy shim's
    # business: outside upstream's training script, torch.cuda.is_available() stays False).
    props = device(True)
    answers = {
        "get_device_properties": lambda device=None: props,
        "get_device_capability": lambda device=None: (props.major, props.minor),
        "get_device_name": lambda device=None: props.name,
        "get_arch_list": lambda: [arch(True)],
    }
    for name, answer in answers.items():
        setattr(torch.cuda, name, answer)


def child_env(version: str, gfx: str = DEFAULT_ARCH) -> dict[str, str | None]:
    """What verify's processes get under the simulation (on top of the firewall's): the version and
    the simulated architecture, a ROCm image's toolchain variables (ROCM_HOME set, CUDA_HOME unset)
    and attention settings (NVTE_FLASH_ATTN=0 NVTE_FUSED_ATTN=1), and the `rocmport env` launcher environment."""
    from rocmport.launch_env import launch_env

    parse_version(version)
    return {
        **protocol.HIP_SIM.entry(version),
        **protocol.HIP_SIM_ARCH.entry(parse_arch(gfx)),
        "ROCM_HOME": "/opt/rocm",
        "CUDA_HOME": None,
        "CUDA_PATH": None,
        "NVTE_FLASH_ATTN": "0",
        "NVTE_FUSED_ATTN": "1",
        **launch_env(),
    }


@dataclass
class HipSim:
    """The HIP simulation a CPU-proxy run had (`hip_sim` of the report)."""

    version: str
    arch: str
    device: str

    def to_dict(self) -> dict[str, str]:
        return {"version": self.version, "arch": self.arch, "device": self.device}


def summary(version: str | None, gfx: str = DEFAULT_ARCH) -> HipSim | None:
    """The report's `hip_sim`: {version, arch, device} (None when the simulation is off)."""
    if not version:
        return None
    return HipSim(version, gfx, SIM_DEVICES[gfx].name)


_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+), in (\S+)')
_HIP_WORDS = re.compile(r"\b(hip|rocm|hipcc|ROCM_HOME|HIP_HOME|amdgpu|gfx9\d\d)", re.I)


def simulation_break(stderr: str, tree: Path) -> str | None:
    """Where the simulation itself broke a run, as a ROCm build of torch would not: the innermost
    frame of the last traceback lies outside the tree (torch or a dependency) and the error or
    that frame's code names HIP/ROCm. Returns "path:line (function): error", else None (a failure
    inside the tree is the tree's: the simulation never hides it)."""
    lines = [ln.split("]: ", 1)[-1] if ln.startswith("[rank") else ln for ln in stderr.splitlines()]
    starts = [i for i, ln in enumerate(lines) if ln.startswith("Traceback (most recent call last)")]
    if not starts:
        return None
    frame, code, error = None, "", ""
    for i, line in enumerate(lines[starts[-1] + 1 :], starts[-1] + 1):
        m = _FRAME.match(line)
        if m:
            frame, code = m.groups(), (lines[i + 1].strip() if i + 1 < len(lines) else "")
        elif frame and line and not line.startswith(" "):
            error = line.strip()
            break
    if not frame or not error:
        return None
    path, lineno, func = frame
    root = str(tree.resolve()) + os.sep
    if path.startswith(root) or not (_HIP_WORDS.search(error) or _HIP_WORDS.search(code)):
        return None
    return f"{path}:{lineno} ({func}): {error[:200]}"
