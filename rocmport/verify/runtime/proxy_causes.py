"""What in a failure is the CPU proxy's own doing, for stages 3 and 4's labels: one reading of a
traceback's frames of the proxy shim (runtime/proxy_shim.py) and one list of the messages in which
the CPU backend says it lacks something a GPU has.

The shim's TorchFunctionMode (CudaToCpu.__torch_function__) sits in every torch op's call stack,
so nearly every torch error raised on the proxy passes through a frame of the shim's. Where the
shim changed nothing it hands the call on through ``passed_through_unchanged`` (PASS_THROUGH): that
frame, and the shim's frame that called it, are not the shim acting, and a failure raised through
them alone is not the shim's (the distributed optimizer's "a view of a leaf Variable that requires
grad is being used in an in-place operation" fails the same way on a GPU). A frame where the shim
acted (it rewrote device='cuda', answered a torch.cuda call, made a group gloo) still is.

Imports nothing but the standard library: the pytest plugin reads it inside the ranks."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import TypeVar

SHIM_FILE = "rocmport/verify/runtime/proxy_shim.py"
# The shim's function through which it hands on a call it did not change (proxy_shim defines it by
# this name; a traceback prints a frame by its function's name, and this one is the module's own).
PASS_THROUGH = "passed_through_unchanged"

Frame = TypeVar("Frame", bound=Sequence)


def in_shim(path: str) -> bool:
    """Whether ``path`` (as a traceback or pytest writes it, absolute or relative) is the proxy shim's file."""
    return path.replace("\\", "/").endswith(SHIM_FILE)


def without_hand_ons(frames: Iterable[Frame]) -> list[Frame]:
    """``frames`` (innermost first, each starting (path, function name, ...)) less the shim's hand-ons:
    each PASS_THROUGH frame and the shim's frame that called it (the wrapper that handed the call on)."""
    kept: list[Frame] = []
    caller_hands_on = False
    for frame in frames:
        path, function = frame[0], frame[1]
        if caller_hands_on and in_shim(path):
            caller_hands_on = False
            continue
        caller_hands_on = in_shim(path) and function == PASS_THROUGH
        if not caller_hands_on:
            kept.append(frame)
    return kept


def acting_shim_frame(frames: Iterable[Frame]) -> Frame | None:
    """The innermost frame (innermost first, as ``without_hand_ons`` takes them) where the shim acted, if any."""
    return next((f for f in without_hand_ons(frames) if in_shim(f[0])), None)


# Messages in which the CPU backend (or this machine's torch, built for it) says it lacks what a GPU
# has. A failure with one of them on both trees is the proxy's, not upstream's: on a GPU the call
# would have its device, kernel or backend. Seen on the proxy (stage 3 and 4 reports, v0.16/v0.19):
# pin_memory's, "Torch not compiled with CUDA enabled", triton's "0 active drivers", megatron's
# "requires CUDA tensors" / "must be a CUDA tensor", "has no attribute 'ProcessGroupNCCL'"; the rest
# are torch's, gloo's and the dispatcher's words for the same lack. Not any "CUDA error": on a GPU
# most are a kernel's real failure; only those that say there is no device or driver.
CPU_BACKEND_LACKS = re.compile(
    "|".join(
        (
            r"not (?:currently )?implemented for (?:the )?'?CPU'?",  # an op with no CPU kernel
            r"with arguments from the 'CPU' backend",  # the dispatcher: "Could not run 'aten::x' with ..."
            r"\"\w*cpu\w*\" not implemented for '\w+'",  # a CPU kernel without the dtype ("addmm_impl_cpu_" ... 'Half')
            r"(?:is )?not supported on (?:the )?CPU",
            r"requires a CUDA or other accelerator backend",  # pin_memory=True
            r"Found no NVIDIA driver on your system",
            r"Torch not compiled with CUDA enabled",
            r"No CUDA GPUs are available",
            r"CUDA error: (?:no CUDA-capable device is detected|CUDA driver version is insufficient)",
            r"\d+ active drivers \(\[\]\)",  # triton finds no GPU driver
            r"requires CUDA tensors",  # megatron's kernels asked for their device ("Batch-invariant GEMM ...")
            r"must be a CUDA tensor",
            r"has no attribute 'ProcessGroupNCCL'",  # a torch built without NCCL
            r"doesn't have NCCL built in",
            r"only supported with GPUs",  # ProcessGroupNCCL
            r"not supported (?:by|with|on|for) (?:the )?[Gg]loo",
            r"[Gg]loo does not support",
            r"Cannot use ReduceOp\.\w+ with Gloo",
            r"ProcessGroupGloo::\w+: unsupported",
        )
    )
)


def cpu_backend_lack(message: str) -> str | None:
    """The words of ``message`` that say the CPU backend lacks something (CPU_BACKEND_LACKS), if any."""
    found = CPU_BACKEND_LACKS.search(message)
    return found.group(0) if found else None


def cpu_backend_mechanism(message: str) -> str | None:
    """The proxy's mechanism behind ``message`` when the CPU backend says it lacks something: "the CPU
    backend (...)", quoting the message; else None."""
    lack = cpu_backend_lack(message)
    return f"the CPU backend ({' '.join(message.split())[:200]})" if lack else None
