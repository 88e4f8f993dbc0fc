"""The `capability-gates` codemod's runtime helpers: NVIDIA compute-capability gates as they should read on
HIP.

Only the text between the `# >>> helper part N` / `# <<< helper part N` markers goes into the
generated helper module (rocmport/codemods/helper.py assembles it, parts in N order); what is
above the first marker is for the type checker and readers (the generated module defines
these names itself)."""

import torch

from rocmport.codemods.runtime.core import is_hip

# >>> helper part 80
# ---- device capability ------------------------------------------------------------------------------

# NVIDIA compute-capability gates (Ampere 8, Hopper 9, Blackwell 10+) switch NVIDIA-specific behaviour.
# AMD GPUs report their gfx numbers there (MI300X: 9.4, MI355X: 9.5, RDNA4: 12.0), so on HIP the
# gates see Hopper-class semantics: no Blackwell-only relaxation ever applies by accident.
HIP_ARCH_EQUIVALENT = 9


def nvidia_arch_major(device=None) -> int:
    if is_hip():
        return HIP_ARCH_EQUIVALENT
    return torch.cuda.get_device_capability(device)[0]


def nvidia_capability(device=None) -> tuple:
    """torch.cuda.get_device_capability() as NVIDIA gates read it: (HIP_ARCH_EQUIVALENT, 0) on HIP."""
    if is_hip():
        return (HIP_ARCH_EQUIVALENT, 0)
    return torch.cuda.get_device_capability(device)


def nvidia_hopper_or_newer(device=None) -> bool:
    """A `major >= 9` test switches on Hopper-only NVIDIA hardware features (NVLS multimem, TMA,
    FlashAttention-3): never on HIP, where MI300-class GPUs also report major 9 (AMD's fork guards
    the NVLS kernels the same way). CUDA: the device's answer, unchanged."""
    if is_hip():
        return False
    return torch.cuda.get_device_capability(device)[0] >= 9


# <<< helper part 80
