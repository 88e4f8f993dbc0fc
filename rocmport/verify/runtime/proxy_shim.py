"""CPU-proxy runtime shim: lets megatron-core train on CPU/gloo in verify's own processes.

Active only in proxy mode, never written into the ported tree. It redirects CUDA-only calls to
the CPU (the CUDA generator and megatron's RNG tracker on a CPU generator of their own,
`device="cuda"` -> cpu, `.cuda()` no-op, no-op synchronize; for upstream's training script also
device properties, memory statistics, streams and events) and logs every site it redirects. It does not paper over port bugs: a missing
hook in the tree is reported as `unsupported-in-proxy`, naming it."""

from __future__ import annotations

import collections
import os
import sys
import types
import weakref

import torch
from torch.overrides import TorchFunctionMode

from rocmport.verify.runtime import protocol

REDIRECTS: collections.Counter = collections.Counter()


class Unsupported(Exception):
    """The tree's internals differ from what the shim knows; the message names the missing hook."""


def _site() -> str:
    """The innermost megatron frame that called into the shim (`megatron/core/utils.py:631`)."""
    f: types.FrameType | None = sys._getframe(1)
    while f is not None:
        name = f.f_code.co_filename
        if "/megatron/" in name:
            return f"{name[name.index('/megatron/') + 1 :]}:{f.f_lineno}"
        f = f.f_back
    return "<outside megatron>"


def _is_cuda(dev) -> bool:
    if isinstance(dev, torch.device):
        return dev.type == "cuda"
    if isinstance(dev, str):
        return dev.startswith("cuda")
    return isinstance(dev, int) and not isinstance(dev, bool)


# The simulated device's random generator. A GPU keeps CUDA's generator apart from the CPU's: the
# model's dropout draws from the device one (saved in a checkpoint as `cuda_rng_state`), the data
# loader's seed from the CPU one. With one generator for both, a resumed run (which builds its data
# loader after loading the checkpoint) would shift dropout's stream; so the proxy keeps two.
DEVICE_RNG = torch.Generator()
# Random ops that run on the device in a GPU run: dropout and Bernoulli masks on the model's
# tensors, and random factories asked for device="cuda".
_DEVICE_RANDOM = {
    torch.nn.functional.dropout,
    torch.nn.functional.dropout1d,
    torch.nn.functional.dropout2d,
    torch.nn.functional.dropout3d,
    torch.nn.functional.alpha_dropout,
    torch.nn.functional.feature_alpha_dropout,
    torch.dropout,
    torch.bernoulli,
    torch.Tensor.bernoulli_,
    torch.Tensor.bernoulli,
}
_FACTORIES = {
    torch.rand,
    torch.randn,
    torch.randint,
    torch.randperm,
    torch.normal,
    torch.rand_like,
    torch.randn_like,
    torch.randint_like,
}


def on_device_rng(call):
    """``call()`` drawing from DEVICE_RNG (swapped in as the default generator for its duration)."""
    cpu = torch.default_generator.get_state()
    torch.default_generator.set_state(DEVICE_RNG.get_state())
    try:
        return call()
    finally:
        DEVICE_RNG.set_state(torch.default_generator.get_state())
        torch.default_generator.set_state(cpu)


class CudaToCpu(TorchFunctionMode):
    """`device="cuda"` -> cpu, `.cuda()` -> self, `.to("cuda")` -> cpu; each redirect is counted.
    Random ops that would run on the device draw from DEVICE_RNG."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func is torch.device and args == (_CURRENT_DEVICE_STRING,) and not kwargs:
            # Megatron-FSDP names its device f"cuda:{torch.cuda.current_device()}" (mcore_fsdp_adapter's and
            # megatron_fsdp's __init__), which the proxy's answer 'cpu' makes 'cuda:cpu': torch has no such
            # device string. It is the CPU, the device that answer stands for.
            REDIRECTS[f"torch.device('{_CURRENT_DEVICE_STRING}') -> cpu @ {_site()}"] += 1
            return func("cpu")
        device_random = func in _DEVICE_RANDOM or (func in _FACTORIES and _is_cuda(kwargs.get("device")))
        if device_random and kwargs.get("generator") is None:
            if "device" in kwargs and _is_cuda(kwargs["device"]):
                kwargs["device"] = "cpu"
            return on_device_rng(lambda: func(*args, **kwargs))
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
        redirected = False
        if "device" in kwargs and _is_cuda(kwargs["device"]):
            REDIRECTS[f"{getattr(func, '__name__', func)}(device=cuda) @ {_site()}"] += 1
            kwargs["device"], redirected = "cpu", True
        if func is torch.Tensor.to and _staged_from_the_device(args, kwargs):
            # The device-to-host copy a GPU makes of TE's quantized tensor (Megatron's checkpoint staging,
            # `tensor.to("cpu")`): on the proxy it already says cpu and torch would return it as is; copied,
            # it takes TE's own _to_copy, as on the GPU (TE 2.12: dequantized; 2.17: a Float8Tensor on the CPU).
            REDIRECTS[f"Tensor.to(cpu) of a TE quantized tensor: copied as from the device @ {_site()}"] += 1
            return func(*args, **{**kwargs, "copy": True})
        if func is torch.Tensor.to and len(args) > 1 and _is_cuda(args[1]):
            REDIRECTS[f"Tensor.to(cuda) @ {_site()}"] += 1
            args, redirected = (args[0], "cpu", *args[2:]), True
        if redirected:
            return func(*args, **kwargs)
        return passed_through_unchanged(func, args, kwargs)


def _staged_from_the_device(args, kwargs) -> bool:
    """``Tensor.to(args, kwargs)`` asks for the CPU copy of one of TE's quantized tensors (Float8Tensor and
    the rest: on a GPU always on the device)."""
    if (
        not args
        or kwargs.get("copy")
        or not any(c.__module__.startswith("transformer_engine.") for c in type(args[0]).__mro__)
    ):
        return False
    target = kwargs.get("device", args[1] if len(args) > 1 else None)
    if isinstance(target, str):
        return target.split(":")[0] == "cpu"
    return isinstance(target, torch.device) and target.type == "cpu"


def _cpu_stream_synchronizes() -> None:
    """torch's CPU stream (what torch.cuda.current_stream() answers on the proxy) synchronizes at once: the
    CPU runs in order. torch's stand-in has no synchronize, and torch's distributed checkpoint writer calls
    it where torch.cuda.is_available() (which the proxy's device answers make True): FileSystemWriter's
    _OverlappingCpuLoader stages the tensors on the current stream and synchronizes it before writing
    (Megatron's fsdp_dtensor save: "'Stream' object has no attribute 'synchronize'" on every rank, v0.16's
    gpt3_mcore_te_tp2_zp_z3_resume_fsdp_dtensor at its iteration-5 checkpoint). Counted by call site."""
    stream = torch.cpu.Stream
    if hasattr(stream, "synchronize"):
        return

    def synchronize(self) -> None:
        REDIRECTS[f"cpu.Stream.synchronize (the CPU runs in order) @ {_site()}"] += 1

    setattr(stream, "synchronize", synchronize)


def _cpu_tensors_record_no_stream() -> None:
    """``Tensor.record_stream(stream)`` on a CPU tensor returns at once: the CPU runs in order, so no
    other stream can still be using the tensor's memory when it is freed (what record_stream tells
    CUDA's caching allocator). torch has no CPU kernel for it, and the proxy's streams (torch's CPU
    stream, _Stream) are no torch.Stream, whose parse error torch cannot even word ("RuntimeError:
    unknown parameter type"). Megatron's EP-overlap schedule frees a MoE node's inputs after its
    forward so (pipeline_parallel/utils.py ScheduleNode._forward, `--overlap-moe-expert-parallel-comm`:
    v0.16's delay-wgrad-compute reach variant stopped there). A GPU tensor's call is torch's own.
    Counted by call site."""
    real = torch.Tensor.record_stream
    if getattr(real, "_rocmport", False):
        return

    def record_stream(self, stream):
        if self.device.type != "cpu":
            return passed_through_unchanged(real, (self, stream), {})
        REDIRECTS[f"Tensor.record_stream on the CPU (the CPU runs in order) @ {_site()}"] += 1
        return None

    record_stream._rocmport = True  # type: ignore[attr-defined]
    torch.Tensor.record_stream = record_stream


def passed_through_unchanged(func, args, kwargs):
    """``func(*args, **kwargs)``, called as the caller got it: the shim's wrappers hand on through this
    function the calls they did not change, so that a traceback tells the shim's pass-through (this
    frame and its caller's) from a frame where it acted (proxy_causes.PASS_THROUGH names it)."""
    return func(*args, **kwargs)


# What torch.cuda.current_device() answers megatron on the proxy (install), and so what its
# f"cuda:{torch.cuda.current_device()}" is.
_CURRENT_DEVICE = "cpu"
_CURRENT_DEVICE_STRING = f"cuda:{_CURRENT_DEVICE}"


def _answer(name: str, answer) -> None:
    """torch.cuda.<name> answers with ``answer`` on the CPU; each call is counted by its megatron call site."""

    def redirected(*args, **kwargs):
        REDIRECTS[f"cuda.{name} @ {_site()}"] += 1
        return answer(*args, **kwargs)

    redirected.__name__ = name
    setattr(redirected, "_rocmport_proxy", True)
    setattr(torch.cuda, name, redirected)


def install(megatron: bool = True) -> None:
    """Patch torch.cuda and megatron's RNG hooks; enter the redirecting mode for this process.
    ``megatron=False``: torch only (a process that runs TE's modules without megatron)."""
    _answer("current_device", lambda: _CURRENT_DEVICE)
    _answer("synchronize", lambda device=None: None)
    # DDP's start_grad_sync (v0.19+) waits through torch.cuda.current_stream() for events a CUDA graph
    # replay recorded; on the CPU everything runs in order: torch's CPU stream answers (its waits return).
    _answer("current_stream", lambda device=None: torch.cpu.current_stream())
    _cpu_stream_synchronizes()
    _cpu_tensors_record_no_stream()
    _answer("get_rng_state", lambda device="cuda": DEVICE_RNG.get_state())
    torch.cuda.random.get_rng_state = torch.cuda.get_rng_state
    _answer("set_rng_state", lambda state, device="cuda": DEVICE_RNG.set_state(state))
    # torch.manual_seed seeds the CPU generator and calls torch.cuda.manual_seed_all: the device's.
    _answer("manual_seed", lambda seed: DEVICE_RNG.manual_seed(int(seed)))
    _answer("manual_seed_all", lambda seed: DEVICE_RNG.manual_seed(int(seed)))
    _answer("initial_seed", lambda: DEVICE_RNG.initial_seed())
    if megatron:
        try:
            from megatron.core.tensor_parallel import random as mrandom
        except ImportError as exc:
            raise Unsupported(f"megatron.core.tensor_parallel.random does not import ({exc})") from None
        for hook in ("_get_cuda_rng_state", "_set_cuda_rng_state", "CudaRNGStatesTracker"):
            if not hasattr(mrandom, hook):
                raise Unsupported(
                    f"megatron.core.tensor_parallel.random.{hook} (the shim backs the RNG tracker with its device generator through it)"
                )
    import torch.cuda.nvtx as nvtx

    if type(nvtx._nvtx).__name__ == "_NVTXStub":
        nvtx._nvtx = _Nvtx()
    if megatron:
        mrandom._get_cuda_rng_state = lambda *a, **k: DEVICE_RNG.get_state()
        mrandom._set_cuda_rng_state = lambda state, *a, **k: DEVICE_RNG.set_state(state)
    _one_gloo_device()
    _coalesced_all_gather_by_dtype()
    _coalescing_without_device()
    _p2p_buffers_held_until_released()
    _split_sizes_as_lists()
    CudaToCpu().__enter__()


def _split_sizes_as_lists() -> None:
    """megatron's MoE all-to-all dispatcher brings its split sizes to the host as numpy arrays when
    they are on the GPU (moe_utils.maybe_move_tensor_to_cpu asks `tensor.is_cuda`); on the proxy they
    are CPU tensors already and stay tensors, which all_to_all_single does not take. Given as lists,
    the values the GPU path gives."""
    real = torch.distributed.all_to_all_single
    if getattr(real, "_rocmport", False):
        return

    def all_to_all_single(output, input, output_split_sizes=None, input_split_sizes=None, *args, **kwargs):
        sizes, changed = [], False
        for split in (output_split_sizes, input_split_sizes):
            if isinstance(split, torch.Tensor):
                REDIRECTS[f"all_to_all_single(split sizes: tensor -> list) @ {_site()}"] += 1
                split, changed = split.tolist(), True
            sizes.append(split)
        if not changed:
            return passed_through_unchanged(real, (output, input, *sizes, *args), kwargs)
        return real(output, input, *sizes, *args, **kwargs)

    all_to_all_single._rocmport = True  # type: ignore[attr-defined]
    torch.distributed.all_to_all_single = all_to_all_single


class _Works:
    """The works of one coalesced collective issued as several calls: waiting waits for each."""

    def __init__(self, works: list) -> None:
        self.works = works

    def wait(self, timeout=None) -> bool:
        for work in self.works:
            if work is not None:
                work.wait() if timeout is None else work.wait(timeout)
        return True

    def is_completed(self) -> bool:
        return all(work is None or work.is_completed() for work in self.works)

    def is_success(self) -> bool:
        return all(work is None or work.is_success() for work in self.works)


# torch's names of the coalesced all-gather into one tensor per input (2.13: allgather_into_tensor_coalesced;
# 2.14 also all_gather_single_coalesced, which its _coalescing_manager calls).
_COALESCED_ALL_GATHERS = ("allgather_into_tensor_coalesced", "all_gather_single_coalesced")


def _coalescing_without_device() -> None:
    """torch's _coalescing_manager given a ``device`` starts the process group's own coalescing
    (ProcessGroup._start_coalescing), which gloo does not implement ('Backend gloo does not implement
    startCoalescing'): TE's FP8 all-gathers pass the device (distributed.py's MXFP8 and NVFP4 gathers, an FP8
    MoE's sequence-parallel input under MXFP8). Without it torch records the collectives made inside and
    issues them as one coalesced call at the end, its fast path, which gloo implements and Megatron's
    distributed optimizer takes: the same collectives and results; only NCCL's batching of their launches
    is not simulated."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d

    real = distributed_c10d._coalescing_manager
    if getattr(real, "_rocmport", False):
        return

    def coalescing_manager(group=None, device=None, async_ops=False):
        if device is not None and dist.get_backend(group) == "gloo":
            REDIRECTS[f"torch.distributed._coalescing_manager(device=...) -> without a device (gloo) @ {_site()}"] += 1
            device = None
        return real(group, device, async_ops)

    coalescing_manager._rocmport = True  # type: ignore[attr-defined]
    distributed_c10d._coalescing_manager = dist._coalescing_manager = coalescing_manager


def _coalesced_all_gather_by_dtype() -> None:
    """gloo's coalesced all-gather (ProcessGroupGloo's allgather_into_tensor_coalesced, what torch's
    _coalescing_manager issues for all_gather_into_tensor calls made inside it) flattens every input into one
    buffer and unflattens the result into the outputs: inputs of different dtypes come back as each other's
    bytes (measured, torch 2.13 and 2.14: a uint8 and a bf16 shard gathered together give the uint8 output
    the bf16 bytes). Megatron's distributed optimizer gathers each bucket group's buckets in one coalesced
    call, and with --fp8-param-gather a group holds the FP8 weights' uint8 bucket beside the bf16 one: the
    FP8 weights came back as bf16 bytes, some of them FNUZ's NaN (0x80), and the next iteration's loss was
    NaN. NCCL gathers each tensor in its own dtype, and so does gloo given one dtype: here inputs of mixed
    dtypes are gathered one coalesced call per dtype (in the order the dtypes first appear: the same on
    every rank). Inputs of one dtype take gloo's path unchanged."""
    cls = torch.distributed.ProcessGroup
    for name in _COALESCED_ALL_GATHERS:
        real = getattr(cls, name, None)
        if real is None or getattr(real, "_rocmport", False):
            continue

        def coalesced(self, outputs, inputs, *args, _real=real, _name=name, **kwargs):
            dtypes = list(dict.fromkeys(t.dtype for t in inputs))
            if len(dtypes) <= 1:
                return _real(self, outputs, inputs, *args, **kwargs)
            REDIRECTS[f"ProcessGroup.{_name} (mixed dtypes: one call per dtype) @ {_site()}"] += 1
            works = []
            for dtype in dtypes:
                picked = [i for i, t in enumerate(inputs) if t.dtype == dtype]
                works.append(_real(self, [outputs[i] for i in picked], [inputs[i] for i in picked], *args, **kwargs))
            return _Works(works)

        coalesced._rocmport = True  # type: ignore[attr-defined]
        setattr(cls, name, coalesced)


# ProcessGroup's point-to-point methods (what torch.distributed's send/isend/recv/irecv and batch_isend_irecv call)
_P2P_METHODS = ("send", "recv", "recv_anysource")


def _p2p_buffers_held_until_released() -> None:
    """The memory of a tensor being sent or received stays allocated while its request does (until the
    caller waits on it and lets it go), as the CUDA caching allocator keeps it on a GPU. Megatron's
    interleaved (virtual-pipeline) schedule, with --overlap-p2p-communication (its default there), isends a
    stage's output and frees its memory at once (schedules.deallocate_output_tensor: ``out.data =
    torch.empty((1,))``, keeping the tensor for its grad_fn), waiting on the send only at the next one. On a
    GPU the block is not reused before the NCCL stream is done with it. gloo sends from the tensor's memory
    when the receiver has posted its recv (a raw pointer; it copies nothing), and the CPU allocator hands
    freed memory to the next allocation at once: the next stage received another tensor's bytes and
    allocator bookkeeping (measured: 221 of 16384 floats replaced, values like -3e22), and every
    gpt3_mcore_te_tp1_pp4_vp1* case stopped on a NaN loss at iteration 2, on both trees. Here each request
    holds its tensors' storages until the request object is let go (after the caller's wait); a tensor
    whose memory the caller swapped out while its request was outstanding is counted in the redirects by
    the site that sent or received it. 1F1B without virtual stages waits on each send before freeing the
    output: nothing to hold there."""
    import weakref

    cls = torch.distributed.ProcessGroup
    for name in _P2P_METHODS:
        real = getattr(cls, name, None)
        if real is None or getattr(real, "_rocmport", False):
            continue

        def p2p(self, tensors, *args, _real=real, _name=name, **kwargs):
            work = _real(self, tensors, *args, **kwargs)
            if work is not None:
                held = [(t.untyped_storage(), weakref.ref(t)) for t in tensors]
                weakref.finalize(work, _p2p_request_let_go, held, f"ProcessGroup.{_name} @ {_site()}")
            return work

        p2p._rocmport = True  # type: ignore[attr-defined]
        setattr(cls, name, p2p)


def _p2p_request_let_go(held: list, where: str) -> None:
    """A point-to-point request was let go: its storages are released (by returning); each tensor still
    alive whose memory is no longer the one it was sent from or received into is counted."""
    for storage, tensor_ref in held:
        tensor = tensor_ref()
        if tensor is not None and tensor.untyped_storage().data_ptr() != storage.data_ptr():
            REDIRECTS[f"{where} (its tensor's memory freed while in flight: held until the request was let go)"] += 1


def _one_gloo_device() -> None:
    """Every gloo process group of this process shares one TCP device. torch gives each group a
    device of its own, and each device an event-loop thread that wakes every 10 ms (epoll_wait's
    timeout): megatron's initialize_model_parallel makes dozens of groups, upstream's tests keep
    hundreds alive, and on the proxy's 8 ranks thousands of such threads woke 100 times a second
    each: most of the machine's time went to the kernel (load average above 200 on 2 cores), tests
    slowed and watchdogs fired on starved ranks. One device per process is how gloo is meant to be
    used (a device serves any number of pairs); a group's pairs, worker threads and rendezvous are
    its own as before. NCCL has no such threads: the GPU runs are unaffected."""
    from torch.distributed import distributed_c10d as c10d

    base = c10d.ProcessGroupGloo
    if getattr(base, "_rocmport_shared_device", False):
        return
    # What each group would create (GLOO_SOCKET_IFNAME, else the hostname's), made with the first group:
    # a device starts its event-loop thread, and a rank server (runtime.rank_server) installs this
    # shim before it forks the ranks, which must find no thread but the main one.
    shared: list = []

    class ProcessGroupGloo(base):  # type: ignore[misc,valid-type]
        _rocmport_shared_device = True

        def __init__(self, store, rank, size, timeout=None, **kwargs):
            if isinstance(timeout, base._Options):
                options = timeout
            else:
                if not shared:
                    shared.append(base.create_default_device())
                options = base._Options()
                options._devices = [shared[0]]
                options._threads = 2  # as torch gives each group
                if timeout is not None:
                    options._timeout = timeout
                for key, value in kwargs.items():  # enable_reconfigure (torch 2.14+)
                    setattr(options, key, value)
            super().__init__(store, rank, size, options)

    c10d.ProcessGroupGloo = ProcessGroupGloo


def install_for_upstream_code() -> list[str]:
    """install(), plus what upstream's own entry points (unit tests, pretrain_gpt.py) need on CPU:
    they call `cuda.set_device`, size things by `cuda.device_count()` and ask for nccl. Returns
    the list of swaps, for the report."""
    import torch.distributed as dist

    if getattr(torch.cuda.set_device, "_rocmport_proxy", False):
        return _UPSTREAM_SWAPS
    install()

    _answer("set_device", lambda device: None)
    # One device per rank of the node, as on the GPU nodes upstream's tests are written for: they
    # assert `device_count() == world` (test_utils, test_optimizer) and size meshes and skips by it.
    _answer("device_count", lambda: int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    real_init = dist.init_process_group

    def init_process_group(backend=None, *args, **kwargs):
        if backend in (None, "nccl", "cuda:nccl"):
            backend = "gloo"
        device_id = kwargs.get("device_id")
        if device_id is not None and _is_cuda(device_id):  # gloo binds no device
            REDIRECTS[f"init_process_group(device_id=cuda) @ {_site()}"] += 1
            kwargs["device_id"] = None
        return real_init(backend, *args, **kwargs)

    dist.init_process_group = init_process_group
    _subgroups_on_gloo()
    _meshes_on_the_cpu()
    _name_groups_by_members()
    _in_order_streams()
    return _UPSTREAM_SWAPS


def _subgroups_on_gloo() -> None:
    """Subgroups asked for on nccl get gloo, as the default group does: upstream names the backend of
    some groups itself (main's HyperCommGrid(..., backend="nccl") in test_utils.py), and torch would
    build a ProcessGroupNCCL ("only supported with GPUs"). new_group and new_subgroups_by_enumeration
    both create through _new_group_with_tag; each swap is counted by its megatron call site."""
    from torch.distributed import distributed_c10d as c10d

    nccl_options = _nccl_options_class()
    real = c10d._new_group_with_tag

    def _new_group_with_tag(ranks=None, timeout=None, backend=None, backend_options=None, *args, **kwargs):
        if backend is not None and "nccl" in str(backend).lower():
            REDIRECTS[f"new_group(backend={str(backend).lower()}) -> gloo @ {_site()}"] += 1
            backend, backend_options = "gloo", None  # NCCL's options mean nothing to gloo
        elif isinstance(backend_options, nccl_options):  # the group gets the default backend: gloo
            REDIRECTS[f"new_group(pg_options=NCCL) -> none for gloo @ {_site()}"] += 1
            backend_options = None
        else:
            return passed_through_unchanged(real, (ranks, timeout, backend, backend_options, *args), kwargs)
        return real(ranks, timeout, backend, backend_options, *args, **kwargs)

    c10d._new_group_with_tag = _new_group_with_tag


def _meshes_on_the_cpu() -> None:
    """A device mesh asked for on 'cuda' is made on 'cpu'. Its groups are the proxy's gloo ones, and what
    runs over it asks the mesh's device type for its device: torch-FSDP2 (megatron's
    `DeviceMesh.from_group(group, "cuda")` for --use-torch-fsdp2) builds its device from
    `torch.cuda.current_device()`, which the proxy answers 'cpu', not an index. from_group,
    init_device_mesh and slicing all construct through DeviceMesh.__init__; counted by its call site."""
    from torch.distributed import device_mesh as dm

    mesh = dm.DeviceMesh
    if getattr(mesh, "_rocmport_on_cpu", False):
        return
    real = mesh.__init__

    def __init__(self, device_type, *args, **kwargs):
        if device_type != "cuda":
            return passed_through_unchanged(real, (self, device_type, *args), kwargs)
        REDIRECTS[f"DeviceMesh('cuda') -> cpu @ {_site()}"] += 1
        real(self, "cpu", *args, **kwargs)

    mesh.__init__ = __init__
    mesh._rocmport_on_cpu = True


class _NcclOptions:
    """What megatron's parallel_state.get_nccl_options sets on ProcessGroupNCCL.Options (the stream
    priority, the communicator's CTA and network settings), where torch's CPU build has no
    ProcessGroupNCCL: every --use-torch-fsdp2 case asks for a high-priority dp_cp group. The proxy's
    groups are gloo, which takes none of it; _subgroups_on_gloo drops it, counted."""

    def __init__(self, is_high_priority_stream: bool = False) -> None:
        import types

        self.is_high_priority_stream = is_high_priority_stream
        self.config = types.SimpleNamespace(cga_cluster_size=None, max_ctas=None, min_ctas=None, net_name=None)


def _nccl_options_class() -> type:
    """torch's ProcessGroupNCCL.Options, or the stand-in given to a build without NCCL (a ROCm build has
    it: RCCL), so that upstream code building NCCL options runs on the proxy."""
    import torch.distributed as dist

    if not hasattr(dist, "ProcessGroupNCCL"):
        dist.ProcessGroupNCCL = type("ProcessGroupNCCL", (), {"Options": _NcclOptions})
    return dist.ProcessGroupNCCL.Options


def _wrapper_subclasses_on_the_cpu() -> None:
    """TE's quantized tensors (Float8Tensor and the rest) are wrapper subclasses made on the device TE names:
    up to 2.12 ``QuantizedTensor.__new__`` gives ``torch.cuda.current_device()`` (0, the simulated device's
    index) where the caller names none, as ``Float8Tensor.detach`` does when an FP8 weight becomes a
    Parameter (quantized_model_init, Megatron's --fp8-param-gather). torch takes the index for its
    accelerator, which the proxy's torch lacks ("Cannot access accelerator device when none is available");
    _make_wrapper_subclass is a constructor the redirecting mode does not see. Put on the CPU, where the
    tensor's data already is."""
    real = torch.Tensor._make_wrapper_subclass
    if getattr(real, "_rocmport", False):
        return

    def _make_wrapper_subclass(cls, *args, **kwargs):
        if _is_cuda(kwargs.get("device")):
            REDIRECTS[f"Tensor._make_wrapper_subclass(device=cuda) @ {_site()}"] += 1
            kwargs["device"] = torch.device("cpu")
        return real(cls, *args, **kwargs)

    _make_wrapper_subclass._rocmport = True  # type: ignore[attr-defined]
    torch.Tensor._make_wrapper_subclass = staticmethod(_make_wrapper_subclass)


def _in_order_streams() -> None:
    """Streams and events on the CPU: one in-order queue, so waits and synchronisation return at
    once. Upstream's tests and training loop make side streams (`torch.cuda.Stream()` in the
    param-norm and attention tests, the DDP overlap); on the CPU build torch has none ("not compiled
    with CUDA"), on a CUDA build without a driver it raises cudaErrorInsufficientDriver: either way
    an artifact of the machine, not the port. Every call is counted by its megatron call site."""
    global _DEFAULT_STREAM
    _DEFAULT_STREAM = _Stream()
    _answer("synchronize", lambda device=None: None)
    _answer("default_stream", lambda device=None: torch.cpu.current_stream())
    _answer("set_stream", lambda stream: None)
    # `with torch.cuda.stream(s)`: s may be the CPU stream current_stream answers, which is no context
    # manager (v0.19's schedule nodes enter the current stream); on the CPU every stream is the one queue
    _answer("stream", lambda stream=None: stream if hasattr(stream, "__enter__") else _DEFAULT_STREAM)
    setattr(torch.cuda, "Stream", _Stream)
    setattr(torch.cuda, "Event", _Event)


class _Event:
    """torch.cuda.Event on the CPU: records wall time; synchronize/wait/query are immediate."""

    def __init__(self, enable_timing=False, blocking=False, interprocess=False, **unused):
        self._t = None

    def record(self, stream=None):
        import time

        self._t = time.perf_counter()

    def elapsed_time(self, end):
        return (end._t - self._t) * 1000.0

    def synchronize(self):
        return None

    def wait(self, stream=None):
        return None

    def query(self):
        return True


class _Stream:
    """torch.cuda.Stream on the CPU: one in-order queue (the CPU), so waits are immediate."""

    device = torch.device("cpu")

    def __init__(self, device=None, priority=0, **unused):
        self.priority = priority

    def wait_stream(self, other):
        return None

    def wait_event(self, event):
        return None

    def record_event(self, event=None):
        event = event or _Event()
        event.record()
        return event

    def synchronize(self):
        return None

    def query(self):
        return True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def __eq__(self, other):
        return isinstance(other, _Stream)

    def __hash__(self):
        return 0


_DEFAULT_STREAM = None


def _rss() -> tuple[int, int]:
    """This process's resident memory now and at its peak, in bytes (the CPU is the device)."""
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    try:
        with open("/proc/self/statm") as fh:
            now = int(fh.read().split()[1]) * resource.getpagesize()
    except OSError:
        now = peak
    return now, max(now, peak)


def _meminfo() -> tuple[int, int]:
    """(free, total) host memory in bytes."""
    info = {}
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                key, _, rest = line.partition(":")
                info[key] = int(rest.split()[0]) * 1024
    except OSError:
        return 0, 0
    return info.get("MemAvailable", 0), info.get("MemTotal", 0)


class _Nvtx:
    """torch.cuda.nvtx's backend where torch's CPU build has none (its stub raises "NVTX functions
    not installed"; CUDA builds have NVTX, ROCm builds roctx behind the same calls): the calls
    return at once, a push its nesting depth, and record nothing. Each is counted by its site."""

    def __init__(self):
        self._depth = 0
        self._handle = 0

    def rangePushA(self, msg):
        REDIRECTS[f"cuda.nvtx.range_push @ {_site()}"] += 1
        self._depth += 1
        return self._depth - 1

    def rangePop(self):
        REDIRECTS[f"cuda.nvtx.range_pop @ {_site()}"] += 1
        self._depth = max(0, self._depth - 1)
        return self._depth

    def rangeStartA(self, msg):
        REDIRECTS[f"cuda.nvtx.range_start @ {_site()}"] += 1
        self._handle += 1
        return self._handle

    def rangeEnd(self, handle):
        REDIRECTS[f"cuda.nvtx.range_end @ {_site()}"] += 1

    def markA(self, msg):
        REDIRECTS[f"cuda.nvtx.mark @ {_site()}"] += 1


class _CudaRt:
    """torch.cuda.cudart() on the CPU: the profiler range calls succeed and do nothing."""

    @staticmethod
    def cudaProfilerStart():
        return 0

    @staticmethod
    def cudaProfilerStop():
        return 0


def install_device_answers(hip: bool) -> None:
    """What upstream's training entry point (pretrain_gpt.py) asks torch.cuda on a GPU, answered
    honestly for the CPU it runs on: a device exists (a simulated MI300X under the HIP simulation,
    an A100 on the CUDA path) for the properties megatron reads; memory statistics are this
    process's resident memory; the profiler range calls return at once (streams and events:
    install_for_upstream_code). Every call is counted by its megatron call site."""
    from rocmport.verify.runtime import hip_sim

    props = hip_sim.device(hip)

    def stats(device=None):
        # The caching allocator's statistics: bytes are this process's resident memory, counts the
        # CPU allocator does not keep are 0 (a defaultdict: any key torch's allocator reports exists).
        now, peak = _rss()
        out = collections.defaultdict(int)
        for kind in ("allocated_bytes", "reserved_bytes", "active_bytes", "requested_bytes"):
            out[f"{kind}.all.current"], out[f"{kind}.all.peak"] = now, peak
        return out

    answers = {
        "is_available": lambda: True,
        "get_device_properties": lambda device=None: props,
        "get_device_capability": lambda device=None: (props.major, props.minor),
        "get_device_name": lambda device=None: props.name,
        "memory_stats": stats,
        "memory_allocated": lambda device=None: _rss()[0],
        "max_memory_allocated": lambda device=None: _rss()[1],
        "memory_reserved": lambda device=None: _rss()[0],
        "max_memory_reserved": lambda device=None: _rss()[1],
        "device_memory_used": lambda device=None: _rss()[0],
        "mem_get_info": lambda device=None: _meminfo(),
        "reset_peak_memory_stats": lambda device=None: None,
        "reset_max_memory_allocated": lambda device=None: None,
        "empty_cache": lambda: None,
        "cudart": lambda: _CudaRt,
        "check_error": lambda result: None,
        "is_initialized": lambda: True,
        "init": lambda: None,
    }
    for name, answer in answers.items():
        _answer(name, answer)
    torch.cuda.memory.memory_stats = torch.cuda.memory_stats
    _torch_sees_no_accelerator()


def install_for_te() -> None:
    """What Transformer Engine's Python layer asks torch.cuda besides megatron's questions, answered
    for the CPU: a device exists (TE asserts it; the simulated MI300X under the HIP simulation, an
    A100 on the CUDA path), no CUDA graph is being captured. Counted by call site like the rest.
    The device's existence is told to TE's own frames only: told to everyone, torch.compile'd
    megatron code (the fused cross entropy) would compile for that device."""
    from rocmport.verify.runtime import hip_sim

    props = hip_sim.device(bool(protocol.HIP_SIM.read()))
    # current_device: TE builds torch.device("cuda", current_device()) (utils.canonicalize_device, its
    # fusible ops); the index is 0, and the redirecting mode puts what it allocates there on the CPU.
    for name, te_answer in (
        ("is_available", lambda: True),
        ("get_device_properties", lambda device=None: props),
        ("get_device_capability", lambda device=None: (props.major, props.minor)),
        ("current_device", lambda: 0),
    ):
        _answer_te_frames(name, te_answer)
    _wrapper_subclasses_on_the_cpu()
    _in_order_streams()  # TE's modules keep side streams for weight-gradient and offload work
    _answer("is_current_stream_capturing", lambda: False)
    torch.cuda.graphs.is_current_stream_capturing = torch.cuda.is_current_stream_capturing

    class device(torch.cuda.device):  # noqa: N801 - torch's own name
        """`with torch.cuda.device(param.device)` around each TE module's forward: the parameters
        live on the CPU here, for which selecting a device is nothing to do."""

        def __init__(self, device):
            # Selecting a device is nothing to do on the CPU (the simulated device is the one there is).
            REDIRECTS[f"cuda.device({device}) no-op @ {_site()}"] += 1
            super().__init__(-1)

    torch.cuda.device = device

    # TE asserts its inputs and parameters are on the device (`assert inp.is_cuda`); on the proxy the
    # device is the CPU. Asked from TE's own frames only, a tensor answers as being on the simulated
    # device; torch and megatron keep seeing where it really is.
    # The asker is the frame that asked: a tensor subclass's own is_cuda (TE 2.14+'s Float8Tensor asks its
    # `_data.is_cuda` from its TE file) answers for whoever asked it, so Megatron or torch asking an FP8
    # weight sees the CPU as they do of any other tensor here (they saw the simulated device before).
    real = torch._C.TensorBase.is_cuda

    def is_cuda(self):
        # Read without torch-function dispatch, as is_cpu below: TE 2.12's QuantizedTensor.__torch_function__
        # handed the question back from a TE frame, and Megatron asking got True.
        with torch._C.DisableTorchFunction():
            if real.__get__(self):
                return True
        asker = sys._getframe(1)
        if asker.f_code.co_name == "is_cuda" and asker.f_back is not None:  # a tensor subclass's own is_cuda property
            asker = asker.f_back
        where = _te_file(asker.f_code.co_filename)
        if where is not None:
            REDIRECTS[f"Tensor.is_cuda (on the simulated device) @ {where}"] += 1
            return True
        return False

    torch.Tensor.is_cuda = property(is_cuda)

    # And the same tensor is not on the CPU to TE. TE 2.14+ dequantizes a Float8Tensor whose data is on the
    # CPU by reading the uint8 bits as NVIDIA's OCP dtypes (TE_DType_To_Torch) instead of asking
    # tex.dequantize, the CPU layer's cast, which decodes in the flavour's encoding (FNUZ on gfx942: read as
    # OCP, every value doubled and ±240 a NaN); Megatron's --fp8-param-gather makes its fp32 master weights
    # from FP8 parameters. Answered as is_cuda is: from TE's frames, a tensor is on the simulated device,
    # including through TE's own `Float8Tensor.is_cpu` property when TE asks it; when Megatron or torch ask
    # that property (Megatron's checkpoint writer asserts `tensor.is_cpu` of each staged tensor, which on the
    # proxy may be the parameter itself: its bytes already lie on the CPU), the tensor is where it really is.
    real_cpu = torch._C.TensorBase.is_cpu

    def is_cpu(self):
        # Read without torch-function dispatch: TE 2.12's QuantizedTensor.__torch_function__ would hand the
        # question back to this property from a TE frame, and Megatron's `assert tensor.is_cpu` of a staged
        # Float8Tensor got False (the writer's empty AssertionError, "Worker failure: ").
        with torch._C.DisableTorchFunction():
            if not real_cpu.__get__(self):
                return False
        asker = sys._getframe(1)
        if asker.f_code.co_name == "is_cpu" and asker.f_back is not None:  # a tensor subclass's own is_cpu property
            asker = asker.f_back
        where = _te_file(asker.f_code.co_filename)
        if where is not None:
            REDIRECTS[f"Tensor.is_cpu (on the simulated device) @ {where}"] += 1
            return False
        return True

    torch.Tensor.is_cpu = property(is_cpu)

    # The autograd engine runs a custom Function's backward without the thread's torch-function
    # modes, so the redirecting mode is not in force there; TE's backward passes allocate on the
    # device (`torch.Tensor().cuda()` in utils._empty_tensor, `device="cuda"` buffers). Re-entered
    # around each custom backward.
    from torch.autograd.function import BackwardCFunction
    from torch.overrides import _get_current_function_mode_stack

    backward_apply = BackwardCFunction.apply

    def apply(self, *args):
        if any(isinstance(m, CudaToCpu) for m in _get_current_function_mode_stack()):
            return passed_through_unchanged(backward_apply, (self, *args), {})
        with CudaToCpu():
            return backward_apply(self, *args)

    BackwardCFunction.apply = apply


def _te_caller() -> str | None:
    """When the function that calls this was called from TE's own code: that file
    (transformer_engine/...); else None."""
    return _te_file(sys._getframe(2).f_code.co_filename)


def _te_file(filename: str) -> str | None:
    """``filename`` as transformer_engine/... when it is TE's own code; else None."""
    return filename[filename.index("/transformer_engine/") + 1 :] if "/transformer_engine/" in filename else None


def _answer_te_frames(name: str, answer) -> None:
    """torch.cuda.<name> answers with ``answer`` when TE's own code asks, as before otherwise."""
    previous = getattr(torch.cuda, name)

    def redirected(*args, **kwargs):
        if _te_caller() is not None:
            REDIRECTS[f"cuda.{name} (asked by TE) @ {_site()}"] += 1
            return answer(*args, **kwargs)
        return passed_through_unchanged(previous, args, kwargs)

    redirected.__name__ = name
    setattr(torch.cuda, name, redirected)


def _torch_sees_no_accelerator() -> None:
    """torch's own accelerator layer sees the machine as it is, as torch's CPU build does: no
    accelerator (`torch.accelerator.current_accelerator()` is None), while megatron's torch.cuda
    questions get the simulated device. torch.accelerator delegates its availability to
    torch.cuda.is_available(), which the device answers make True: on a CUDA build of torch (PyPI's,
    for Python 3.12) torch itself then calls a driver this machine lacks (cudaErrorInsufficientDriver):
    the DataLoader pins megatron's batches from a thread that sets the device index
    (training.py's _get_iterator), torch.optim's graph-capture check asks for the current stream
    (optimizer.py's step_with_ready_grads). An explicit `Tensor.pin_memory()` returns the tensor:
    page-locked host memory only speeds copies to a device, which is the CPU here (patched on the
    class: the loader's thread does not see the redirecting mode). Each call is counted by its site."""

    def current_accelerator(check_available=False):
        REDIRECTS[f"accelerator.current_accelerator (none) @ {_site()}"] += 1

    def pin_memory(self, device=None):
        REDIRECTS[f"Tensor.pin_memory @ {_site()}"] += 1
        return self

    setattr(torch.accelerator, "current_accelerator", current_accelerator)
    torch.Tensor.pin_memory = pin_memory


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


_UPSTREAM_SWAPS = [
    "proxy shim (RNG on CPU, device=cuda -> cpu, nvtx ranges where torch's CPU build has none, "
    "one gloo device per process)",
    "cuda.set_device no-op",
    "cuda.device_count = the node's ranks (LOCAL_WORLD_SIZE)",
    "init_process_group nccl -> gloo",
    "new_group/new_subgroups nccl -> gloo",
    "device meshes asked for on cuda made on the cpu",
    "NCCL group options dropped for gloo (ProcessGroupNCCL.Options stood in where torch's CPU build lacks it)",
    "subgroup rendezvous named by members (gloo connects at creation, NCCL at first use)",
    "cuda.Stream/Event/stream in order on the CPU (waits return at once)",
]


def install_for_script() -> None:
    """The shim for one worker of upstream's training script (pretrain_gpt.py): everything upstream
    code needs on CPU, the device answers, and this process's redirect counts written at exit to
    protocol.SHIM_OUT (when set)."""
    import atexit

    out = protocol.SHIM_OUT.read()
    try:
        install_for_upstream_code()
    except Unsupported as exc:  # the stage reports it (unsupported-in-proxy, naming the hook)
        if out:
            from rocmport.fsutil import write_file

            write_file(os.path.join(out, "unsupported.txt"), str(exc), durable=False)
        return
    install_device_answers(hip=bool(protocol.HIP_SIM.read()))
    if protocol.TE.read():  # TE's Python layer runs (verify --te)
        install_for_te()
    _persistent_writer_forked()
    _abort_writers_on_uncaught_exception()
    if out:
        atexit.register(write_redirects, out)


ASYNC_UTILS = "megatron.core.dist_checkpointing.strategies.async_utils"
FILESYSTEM_ASYNC = "megatron.core.dist_checkpointing.strategies.filesystem_async"
FORKED_WRITER = (
    "two processes of upstream's checkpoint saving start by fork on the CPU proxy, not spawn: the persistent "
    "writer (--use-persistent-ckpt-worker; PersistentAsyncCaller) and the Manager behind the write-results "
    "queue (filesystem_async._get_write_results_queue, at each run's first save, async or not). Spawned, each "
    "imports torch, megatron and TE again (about 13 s per save on 2 cores); what they carry still goes through "
    "the same queues. A GPU run keeps spawn (a forked CUDA or HIP context is unsafe); the port's start methods "
    "(TemporalAsyncCaller's per-save writer, the data-loader workers) are untouched"
)


def _persistent_writer_forked() -> None:
    """FORKED_WRITER: upstream's PersistentAsyncCaller starts its writer, and filesystem_async its
    write-results Manager, with a fork context in this process (their queues carry the requests and
    results as before). A tree without the hook (no such function or class, no module-level ``mp``)
    keeps spawn."""
    from rocmport.verify.runtime.module_hooks import ModuleHooks

    hooks = {ASYNC_UTILS: _fork_persistent_writer, FILESYSTEM_ASYNC: _fork_results_manager}
    for name, hook in hooks.items():
        module = sys.modules.get(name)
        if module is not None:
            hook(module)
        else:
            sys.meta_path.insert(0, ModuleHooks({name: [("after", hook)]}))


class _ForkContext:
    """multiprocessing's fork context whose Process runs its target with this process's redirect
    counts reset and written at the end (a forked child ends by os._exit: no atexit runs)."""

    def __init__(self, ctx) -> None:
        self._ctx = ctx

    def __getattr__(self, name):
        return getattr(self._ctx, name)

    def Process(self, *args, target=None, **kwargs):  # noqa: N802 - multiprocessing's name
        def run(*a, **k):
            REDIRECTS.clear()
            try:
                return target(*a, **k) if target is not None else None
            finally:
                out = protocol.SHIM_OUT.read()
                if out:
                    write_redirects(out)

        return self._ctx.Process(*args, target=run, **kwargs)


class _ForkForSpawn:
    """A module's ``mp`` while one of its processes starts: spawn's context, asked for, is fork's
    (counted as a redirect named ``what``)."""

    def __init__(self, real_mp, what: str) -> None:
        self._real, self._what = real_mp, what

    def __getattr__(self, name):
        return getattr(self._real, name)

    def get_context(self, method=None):
        if method != "spawn":
            return self._real.get_context(method)
        REDIRECTS[f"{self._what}: fork (spawn on a GPU) @ {_site()}"] += 1
        return _ForkContext(self._real.get_context("fork"))


def _forking(module, call, what: str):
    """``call`` run with the module's ``mp`` answering spawn with fork."""
    real_mp = module.mp
    module.mp = _ForkForSpawn(real_mp, what)
    try:
        return call()
    finally:
        module.mp = real_mp


def _fork_persistent_writer(module) -> None:
    caller = getattr(module, "PersistentAsyncCaller", None)
    real = getattr(caller, "schedule_async_call", None)
    if caller is None or getattr(module, "mp", None) is None or real is None or getattr(real, "_rocmport", False):
        return

    def schedule_async_call(self, async_req):
        if getattr(self, "process", None) is not None or getattr(async_req, "async_fn", None) is None:
            return real(self, async_req)
        _WRITERS.add(self)  # WRITER_ABORTED: ended if its rank ends on an uncaught exception
        return _forking(module, lambda: real(self, async_req), "PersistentAsyncCaller writer")

    schedule_async_call._rocmport = True  # type: ignore[attr-defined]
    caller.schedule_async_call = schedule_async_call


# The persistent writers this process started (PersistentAsyncCaller instances), for WRITER_ABORTED.
_WRITERS: weakref.WeakSet = weakref.WeakSet()
WRITER_ABORTED = (
    "the proxy aborted the persistent checkpoint writer (PersistentAsyncCaller.close(abort=True)) as its rank "
    "ended on an uncaught exception: upstream's exception path leaves it waiting on its queue for a DONE nobody "
    "sends, and multiprocessing's exit handler would join it for ever (so would upstream's spawned writer on a GPU "
    "up to core_v0.18; core_v0.19 makes it a daemon)"
)


def _abort_writers_on_uncaught_exception() -> None:
    """WRITER_ABORTED: this process's sys.excepthook, which the interpreter calls for the exception that ends
    it (never for sys.exit or a normal end, which keep upstream's behaviour), prints it first and then aborts
    the persistent writers still alive, before the exit handlers join them. A rank forked by the rank server
    inherits it from the server, which installed the shim before forking."""
    previous = sys.excepthook
    if getattr(previous, "_rocmport", False):
        return

    def excepthook(kind, value, traceback) -> None:
        previous(kind, value, traceback)  # the rank's own exception, in its stderr, first
        _abort_live_writers()

    excepthook._rocmport = True  # type: ignore[attr-defined]
    sys.excepthook = excepthook


def _abort_live_writers() -> None:
    for caller in list(_WRITERS):
        process = getattr(caller, "process", None)
        if process is None or not process.is_alive():
            continue
        REDIRECTS["PersistentAsyncCaller writer aborted at an uncaught exception"] += 1
        sys.stderr.write(f"rocmport proxy: {WRITER_ABORTED} (writer pid {process.pid})\n")
        sys.stderr.flush()
        try:
            caller.close(abort=True)  # upstream's own abort: kill, and no DONE/join left for __del__
        except Exception:  # noqa: BLE001 - its log line asks torch.distributed for the rank, which may be gone
            process.kill()
            caller.process = None
        process.join(10)
        # Nothing reads the writer's queues now: their feeder threads must not wait at exit to flush into them.
        for queue in vars(caller).values():
            cancel = getattr(queue, "cancel_join_thread", None)
            if callable(cancel):
                cancel()


def _fork_results_manager(module) -> None:
    real = getattr(module, "_get_write_results_queue", None)
    if not callable(real) or getattr(module, "mp", None) is None or getattr(real, "_rocmport", False):
        return

    def get_write_results_queue():
        if getattr(module, "_results_queue", None) is not None:
            return real()
        return _forking(module, real, "write-results queue's Manager")

    get_write_results_queue._rocmport = True  # type: ignore[attr-defined]
    module._get_write_results_queue = get_write_results_queue


def write_redirects(directory: str) -> None:
    """This process's redirect counts, as <directory>/redirects-rank<RANK>-<pid>.json, and where TE's
    CPU kernels cast to FP8, those casts by encoding as <directory>/fp8-casts-rank<RANK>-<pid>.json."""
    import json
    import sys

    from rocmport.fsutil import write_file

    name = f"rank{os.environ.get('RANK', '0')}-{os.getpid()}.json"
    casts = getattr(sys.modules.get("rocmport.verify.runtime.te_fp8"), "CASTS", None)
    if casts:
        write_file(os.path.join(directory, f"fp8-casts-{name}"), json.dumps(casts), durable=False)
    if not REDIRECTS:  # e.g. a build step's Python that the rank started
        return
    write_file(os.path.join(directory, f"redirects-{name}"), json.dumps(dict(REDIRECTS.most_common())), durable=False)


def read_fp8_casts(directory) -> dict[str, int]:
    """The FP8 casts (encoding -> count) every process of a run wrote to ``directory``, summed."""
    import json
    from pathlib import Path

    total: collections.Counter = collections.Counter()
    for path in sorted(Path(directory).glob("fp8-casts-rank*.json")):
        total.update(json.loads(path.read_text()))
    return dict(sorted(total.items()))


def read_redirects(directory) -> dict[str, int]:
    """The redirect counts every process of a run wrote to ``directory``, summed."""
    import json
    from pathlib import Path

    total: collections.Counter = collections.Counter()
    for path in sorted(Path(directory).glob("redirects-rank*.json")):
        total.update(json.loads(path.read_text()))
    return dict(total.most_common())
