"""CPU-proxy runtime shim: lets megatron-core train on CPU/gloo in verify's own processes.

Active only in proxy mode, never written into the ported tree. It redirects CUDA-only calls to
the CPU (RNG tracker on the CPU generator, `device="cuda"` -> cpu, `.cuda()` no-op, no-op
synchronize) and logs every site it redirects. It does not paper over port bugs: a missing
hook in the tree is reported as `unsupported-in-proxy`, naming it."""

from __future__ import annotations

import collections
import sys
from types import FrameType

import torch
from torch.overrides import TorchFunctionMode

REDIRECTS: collections.Counter = collections.Counter()


class Unsupported(Exception):
    """The tree's internals differ from what the shim knows; the message names the missing hook."""


def _site() -> str:
    f: FrameType | None = sys._getframe(3)
    while f is not None:
        name = f.f_code.co_filename
        if "/megatron/" in name:
            return f"{name[name.index('/megatron/') + 1:]}:{f.f_lineno}"
        f = f.f_back
    return "<outside megatron>"


def _is_cuda(dev) -> bool:
    if isinstance(dev, torch.device):
        return dev.type == "cuda"
    if isinstance(dev, str):
        return dev.startswith("cuda")
    return isinstance(dev, int) and not isinstance(dev, bool)


class CudaToCpu(TorchFunctionMode):
    """`device="cuda"` -> cpu, `.cuda()` -> self, `.to("cuda")` -> cpu; each redirect is counted."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func is torch.Tensor.cuda:
            REDIRECTS[f"Tensor.cuda @ {_site()}"] += 1
            return args[0]
        if func is torch.Tensor.type and len(args) == 1 and not kwargs:
            # clip_grads asserts grads are 'torch.cuda.FloatTensor'; report the CUDA name on CPU.
            out = func(*args)
            if out.startswith("torch.") and not out.startswith("torch.cuda."):
                REDIRECTS[f"Tensor.type @ {_site()}"] += 1
                return out.replace("torch.", "torch.cuda.", 1)
            return out
        if "device" in kwargs and _is_cuda(kwargs["device"]):
            REDIRECTS[f"{getattr(func, '__name__', func)}(device=cuda) @ {_site()}"] += 1
            kwargs["device"] = "cpu"
        if func is torch.Tensor.to and len(args) > 1 and _is_cuda(args[1]):
            REDIRECTS[f"Tensor.to(cuda) @ {_site()}"] += 1
            args = (args[0], "cpu", *args[2:])
        return func(*args, **kwargs)


def install() -> None:
    """Patch torch.cuda and megatron's RNG hooks; enter the redirecting mode for this process."""
    torch.cuda.current_device = lambda: "cpu"
    torch.cuda.synchronize = lambda *a, **k: None
    # DDP's start_grad_sync (v0.19+) waits through torch.cuda.current_stream() for events a CUDA graph
    # replay recorded; on the CPU everything runs in order: torch's CPU stream answers (its waits return).
    torch.cuda.current_stream = lambda device=None: torch.cpu.current_stream()
    torch.cuda.get_rng_state = lambda device="cuda": torch.get_rng_state()
    torch.cuda.random.get_rng_state = torch.cuda.get_rng_state
    torch.cuda.set_rng_state = lambda state, device="cuda": torch.set_rng_state(state)
    # torch.manual_seed itself calls torch.cuda.manual_seed_all: seed the CPU generator directly.
    torch.cuda.manual_seed = lambda seed: torch.default_generator.manual_seed(int(seed))
    torch.cuda.manual_seed_all = lambda seed: None
    try:
        from megatron.core.tensor_parallel import random as mrandom
    except ImportError as exc:
        raise Unsupported(f"megatron.core.tensor_parallel.random does not import ({exc})") from None
    for hook in ("_get_cuda_rng_state", "_set_cuda_rng_state", "CudaRNGStatesTracker"):
        if not hasattr(mrandom, hook):
            raise Unsupported(f"megatron.core.tensor_parallel.random.{hook} (the shim backs the RNG tracker with the CPU generator through it)")
    mrandom._get_cuda_rng_state = lambda *a, **k: torch.get_rng_state()
    mrandom._set_cuda_rng_state = lambda state, *a, **k: torch.set_rng_state(state)
    CudaToCpu().__enter__()


def install_for_upstream_code() -> list[str]:
    """install(), plus what upstream's own entry points (unit tests, pretrain_gpt.py) need on CPU:
    they call `cuda.set_device`, size things by `cuda.device_count()` and ask for nccl. Returns
    the list of swaps, for the report."""
    import torch.distributed as dist

    if getattr(torch.cuda.set_device, "_rocmport_proxy", False):
        return _UPSTREAM_SWAPS
    install()

    def set_device(*args, **kwargs):
        return None

    setattr(set_device, "_rocmport_proxy", True)  # marks the swap as done (a second install is a no-op)
    torch.cuda.set_device = set_device
    torch.cuda.device_count = lambda: 1
    real_init = dist.init_process_group

    def init_process_group(backend=None, *args, **kwargs):
        if backend in (None, "nccl", "cuda:nccl"):
            backend = "gloo"
        return real_init(backend, *args, **kwargs)

    dist.init_process_group = init_process_group
    _name_groups_by_members()
    return _UPSTREAM_SWAPS


def _name_groups_by_members() -> None:
    """gloo connects a subgroup's members when the group is created, through the store under the
    group's name, and torch names a group by a creation counter; NCCL connects on first use. Upstream
    tests create groups from each rank's own pipeline view (`dist.new_group([0, 6])` on ranks 0 and 6
    while ranks 1 and 7 make `[1, 7]` at the same count): NCCL never notices, gloo's two pairs share
    one rendezvous and hang. Adding the members to the name keeps groups that every rank creates
    alike exactly as before and gives such per-view groups rendezvous of their own."""
    import hashlib

    from torch.distributed import distributed_c10d as c10d

    counted = c10d._process_group_name

    def process_group_name(ranks, use_hashed_name):
        name = counted(ranks, use_hashed_name)
        if use_hashed_name or not ranks:  # the default group, or already named by its members
            return name
        members = hashlib.sha1(",".join(map(str, ranks)).encode()).hexdigest()[:12]
        return f"{name}-{members}"

    c10d._process_group_name = process_group_name


_UPSTREAM_SWAPS = ["proxy shim (RNG on CPU, device=cuda -> cpu)", "cuda.set_device no-op", "cuda.device_count = 1",
                   "init_process_group nccl -> gloo",
                   "subgroup rendezvous named by members (gloo connects at creation, NCCL at first use)"]
