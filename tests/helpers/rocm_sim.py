"""Run the rewritten functions of a ported (or upstream) Megatron-LM tree under a simulated ROCm or
CUDA build of torch; print one JSON object: {check: outcome}.

    python rocm_sim.py HIP_VERSION|None   (cwd: the tree; PYTHONPATH: the tree)

A GPU reporting major 9 is simulated in both modes (an MI300X under HIP, an H100 under CUDA);
torch.cuda.synchronize is a no-op and torch.distributed runs on gloo. What the machine cannot do
(build a CUDA extension, a real device copy) is replaced at the call that would do it, and the
outcome says what the code decided. Used by tests/codemods/test_rocm_simulation.py."""

from __future__ import annotations

import ctypes
import importlib
import json
import os
import sys
import tempfile
import traceback
import types
import warnings

import torch

HIP = sys.argv[1] if sys.argv[1] != "None" else None
RUNTIME = sys.argv[2] if len(sys.argv) > 2 else None  # a HIP runtime version to simulate ("7.1"), else none loadable
torch.version.hip = HIP
# Under HIP the device is an MI300X: its arch (gfx942) is what the FP8 check judges by.
_PROPS = types.SimpleNamespace(
    major=9, minor=4, name="simulated", **({"gcnArchName": "gfx942:sramecc+:xnack-"} if HIP else {})
)
torch.cuda.get_device_properties = lambda device=None: _PROPS
torch.cuda.get_device_capability = lambda device=None: (9, 4)
torch.cuda.synchronize = lambda *a, **k: None
torch.cuda.is_available = lambda: True
if RUNTIME:
    major, minor = (int(x) for x in RUNTIME.split("."))

    class _FakeHip:  # libamdhip64's hipRuntimeGetVersion (HIP_VERSION = major*10^7 + minor*10^5)
        class hipRuntimeGetVersion:
            argtypes = restype = None

            def __new__(cls, out):
                ctypes.cast(out, ctypes.POINTER(ctypes.c_int))[0] = major * 10_000_000 + minor * 100_000
                return 0

    _real_cdll = ctypes.CDLL
    ctypes.CDLL = lambda name, *a, **k: _FakeHip() if str(name).startswith("libamdhip64") else _real_cdll(name, *a, **k)

# rocmport's launcher and deterministic environment (rocmport/launch_env.py), named by the test.
ENV = os.environ.get("ROCM_SIM_ENV_NAMES", "CUDA_DEVICE_MAX_CONNECTIONS,NCCL_ALGO").split(",")
for name in ENV:
    os.environ.pop(name, None)
os.environ.update(WORLD_SIZE="2", RANK="0", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1")
warnings.simplefilter("ignore")
out: dict[str, object] = {}


def check(name):
    def run(fn):
        try:
            out[name] = fn()
        except BaseException as exc:  # noqa: BLE001 - the outcome is what we report
            out[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
            if os.environ.get("ROCM_SIM_DEBUG"):
                traceback.print_exc()
        return fn

    return run


def parsed(*extra):
    from megatron.training.arguments import parse_args

    argv = sys.argv
    sys.argv = [
        "pretrain_gpt.py",
        "--num-layers",
        "2",
        "--hidden-size",
        "64",
        "--num-attention-heads",
        "4",
        "--seq-length",
        "128",
        "--max-position-embeddings",
        "128",
        "--micro-batch-size",
        "2",
        "--tokenizer-type",
        "NullTokenizer",
        "--vocab-size",
        "128",
        "--mock-data",
        "--lr",
        "1e-4",
        "--train-iters",
        "2",
        "--transformer-impl",
        "local",
        *extra,
    ]
    try:
        return parse_args()
    finally:
        sys.argv = argv


@check("validate_args: tp2, --deterministic-mode, --tp-comm-overlap")
def _validate():
    from megatron.training.arguments import validate_args

    args = parsed(
        "--tensor-model-parallel-size", "2", "--deterministic-mode", "--tp-comm-overlap", "--sequence-parallel"
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        validate_args(args)
    return {
        "tp_comm_overlap": args.tp_comm_overlap,
        "env": {k: os.environ.get(k) for k in ENV if k in os.environ},
        "warnings": sorted(str(w.message)[:120] for w in caught if "ROCm" in str(w.message)),
    }


def _gloo():
    import torch.distributed as dist

    if not dist.is_initialized():
        os.environ["MASTER_PORT"] = str(29500 + os.getpid() % 2000)
        dist.init_process_group("gloo", rank=0, world_size=1)


@check("async checkpoint: TemporalAsyncCaller writer process")
def _async():
    from megatron.core.dist_checkpointing.strategies import async_utils

    _gloo()
    caller = async_utils.TemporalAsyncCaller()
    target = os.path.join(tempfile.mkdtemp(), "written")
    req = types.SimpleNamespace(
        async_fn=open, async_fn_args=[target, "w"], async_fn_kwargs={}, preload_fn=None, finalize_fns=[], call_idx=0
    )
    caller.schedule_async_call(req)
    caller.process.join(120)
    return {
        "process": type(caller.process).__name__,
        "exitcode": caller.process.exitcode,
        "wrote": os.path.exists(target),
    }


@check("patch 0001: preload_tensors non_blocking")
def _preload():
    from megatron.core.dist_checkpointing.strategies.filesystem_async import FileSystemWriterAsync

    bucket = [("f", "k", ([], [("item", torch.ones(2))]))]
    seen = []
    real_to = torch.Tensor.to

    def to(self, *a, **k):
        seen.append(k.get("non_blocking"))
        return real_to(self, *a, **{x: y for x, y in k.items() if x != "non_blocking"})

    torch.Tensor.to = to
    try:
        FileSystemWriterAsync.preload_tensors(bucket, True)
    finally:
        torch.Tensor.to = real_to
    return {"non_blocking": seen[0] if seen else None}


class _Squares(torch.utils.data.Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        return torch.tensor(i * i)


@check("data loader: workers' start method")
def _loader():
    sampler_mod = next(
        m
        for m in ("megatron.training.datasets.data_samplers", "megatron.legacy.data.data_samplers")
        if importlib.util.find_spec(m.rsplit(".", 1)[0]) and importlib.util.find_spec(m)
    )
    samplers = importlib.import_module(sampler_mod)
    samplers.mpu.get_data_parallel_rank = lambda *a, **k: 0
    samplers.mpu.get_data_parallel_world_size = lambda *a, **k: 1
    args = parsed()
    args.dataloader_type, args.num_workers, args.data_sharding = "single", 2, True
    args.exit_signal_handler, args.hybrid_context_parallel = False, False
    samplers.get_args = lambda: args
    loader = samplers.build_pretraining_data_loader(_Squares(), 0)
    loader.pin_memory = False  # no device to pin for (a CUDA build of torch would look for its driver)
    batches = [b.tolist() for b in loader]
    ctx = loader.multiprocessing_context
    return {"context": ctx.get_start_method() if ctx is not None else "fork (default)", "batches": batches}


@check("nccl allocator: link flags")
def _nccl():
    from torch.utils import cpp_extension

    from megatron.core import nccl_allocator

    seen = {}

    def load_inline(**kwargs):
        seen.update(kwargs)
        raise RuntimeError("build skipped")

    cpp_extension.load_inline = load_inline
    try:
        nccl_allocator._build_nccl_allocator()
    except RuntimeError:
        pass
    return {"extra_ldflags": seen.get("extra_ldflags")}


@check("unified memory allocator: link flags")
def _unified_memory():
    """The allocator's build as load_inline sees it (the build itself replaced): at import (v0.15
    upstream, and the port on CUDA) or at first use (v0.16+, and the v0.15 port on HIP)."""
    from torch.utils import cpp_extension

    seen: list = []

    def load_inline(**kwargs):
        seen.append(kwargs.get("extra_ldflags"))
        raise RuntimeError("build skipped")

    real = cpp_extension.load_inline, torch.cuda.current_device
    cpp_extension.load_inline, torch.cuda.current_device = load_inline, lambda: "cpu"
    try:
        um = importlib.reload(importlib.import_module("megatron.core.inference.unified_memory"))
        at_import = bool(seen)
        if hasattr(um, "compile_allocator"):  # v0.16+: gathers the outcome across ranks
            _gloo()
            um.compile_allocator()
        elif hasattr(um, "unified_memory_available"):  # the v0.15 port
            um.unified_memory_available()
    finally:
        cpp_extension.load_inline, torch.cuda.current_device = real
    return {"extra_ldflags": seen[0] if seen else None, "builds": len(seen), "at_import": at_import}


@check("FP8 recipe the device cannot run: --fp8-recipe mxfp8")
def _fp8_mxfp8():
    from megatron.training.arguments import validate_args

    os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] = "1"
    args = parsed("--bf16", "--fp8-format", "hybrid", "--fp8-recipe", "mxfp8")
    validate_args(args)
    return {"validated": True}


@check("drain_embedding_wgrad_compute without apex")
def _drain():
    from megatron.core import utils

    torch.manual_seed(0)
    acts, grads = [torch.randn(3, 2, 4) for _ in range(2)], [torch.randn(3, 2, 5) for _ in range(2)]
    weight = types.SimpleNamespace(main_grad=torch.zeros(5, 4))
    config = types.SimpleNamespace(gradient_accumulation_fusion=True, sequence_parallel=False)
    group = types.SimpleNamespace(size=lambda: 1)
    utils.drain_embedding_wgrad_compute(config, list(acts), list(grads), weight, group)
    expected = sum(g.reshape(-1, 5).t() @ a.reshape(-1, 4) for a, g in zip(acts, grads))
    return {"main_grad_matches": bool(torch.allclose(weight.main_grad, expected, atol=1e-5))}


@check("NVLS (Hopper-only multimem) gate")
def _nvls():
    try:
        from megatron.core.inference.communication.torch_symm_triton import utils as symm
    except ImportError:
        symm = None
    if hasattr(symm, "is_device_nvls_capable"):  # v0.17+; v0.16 checks in inference_layers.py
        return {"nvls": symm.is_device_nvls_capable(torch.device("cuda"))}
    try:
        from megatron.core.tensor_parallel import inference_layers as il
    except ImportError:
        return {"nvls": None}  # no NVLS path at this line (v0.15)

    used = []
    il.multimem_all_gather = lambda *a, **k: used.append("nvls")
    il.gather_along_first_dim = lambda x, **k: (used.append("nccl"), (x, None))[1]
    me = types.SimpleNamespace(tp_size=2, tp_group=None)
    buf = {"handle": object(), "tensor": torch.zeros(2, dtype=torch.bfloat16)}
    # Without TE the class derives from a stand-in; run the method's own (rewritten) code.
    import ast

    tree = ast.parse(open(il.__file__).read())
    cls = next(
        n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "InferenceLayerNormColumnParallelLinear"
    )
    fn = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "_all_gather")
    fn.decorator_list = []
    namespace = dict(vars(il))
    exec(compile(ast.Module([fn], []), il.__file__, "exec"), namespace)
    namespace["_all_gather"](me, torch.ones(2, dtype=torch.bfloat16), buf)
    return {"nvls": used == ["nvls"]}


@check("GroupedGEMM capability check")
def _grouped():
    from megatron.training.arguments import validate_args

    os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] = "1"
    args = parsed("--num-experts", "2", "--moe-grouped-gemm", "--bf16", "--moe-router-load-balancing-type", "none")
    validate_args(args)
    return {"validated": True}


print(json.dumps(out, sort_keys=True))
