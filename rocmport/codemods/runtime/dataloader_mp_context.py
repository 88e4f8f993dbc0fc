"""The `dataloader-mp-context` codemod's runtime helpers: data-loader workers started with spawn on HIP.

Only the text between the `# >>> helper part N` / `# <<< helper part N` markers goes into the
generated helper module (rocmport/codemods/helper.py assembles it, parts in N order); what is
above the first marker is for the type checker and readers (the generated module defines
these names itself)."""

import importlib
import os
import warnings

from rocmport.codemods.runtime.core import is_hip

# >>> helper part 180
# ---- data-loader workers --------------------------------------------------------------------------

DATALOADER_CONTEXT_ENV = "ROCMPORT_DATALOADER_MP_CONTEXT"


def _picklable(obj) -> bool:
    import pickle

    try:
        pickle.dumps(obj)
        return True
    except Exception:
        return False


def _rebuild_function(code: bytes, module: str, name: str, defaults, cells: tuple):
    import marshal
    import types

    closure = tuple(types.CellType(value) for value in cells) if cells else None
    return types.FunctionType(marshal.loads(code), vars(importlib.import_module(module)), name, defaults, closure)


class _ShippedFunction:
    """A function defined inside another one (a local worker_init_fn or collate_fn), sent to a
    spawned worker as its code, its module and its closure's values: the worker runs the same code
    (same interpreter) in a fresh process. Pickle it with its closure values, or not at all."""

    def __init__(self, fn):
        self.fn = fn

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs)

    def __reduce__(self):
        import marshal

        fn = self.fn
        cells = tuple(_shippable(c.cell_contents) for c in (fn.__closure__ or ()))
        return _rebuild_function, (marshal.dumps(fn.__code__), fn.__module__, fn.__name__, fn.__defaults__, cells)


def _shippable(obj):
    import types

    if isinstance(obj, types.FunctionType) and "<locals>" in obj.__qualname__ or getattr(obj, "__name__", "") == "<lambda>":
        return _ShippedFunction(obj)
    return obj


def hip_worker_context(dataloader_cls):
    """Wraps a DataLoader class: on HIP, workers start with 'spawn' (or what
    ROCMPORT_DATALOADER_MP_CONTEXT says: spawn | forkserver | fork), not forked from a trainer whose
    HIP runtime is initialised (that crashes on some ROCm set-ups: multi-node, RDMA). `fork` is
    upstream's behaviour, the explicit opt-out. A local worker_init_fn or collate_fn (upstream's
    close the NVIDIA fds / install the exit-signal handler, the hybrid-CP collate) goes to the
    workers as its code and closure values; one that still cannot be pickled keeps fork, with a
    warning. On CUDA the class is returned as it is.

    Spawned workers receive the dataset by pickling: Megatron's memory-mapped index arrays are
    copied into each worker (memory per worker grows with the dataset's sample count)."""
    if not is_hip():
        return dataloader_cls

    def make(*args, **kwargs):
        workers = kwargs.get("num_workers", 0)
        if workers and kwargs.get("multiprocessing_context") is None:
            choice = os.environ.get(DATALOADER_CONTEXT_ENV, "spawn")
            if choice not in ("spawn", "forkserver", "fork"):
                raise ValueError(f"{DATALOADER_CONTEXT_ENV}={choice!r}: use spawn, forkserver or fork")
            if choice != "fork":
                hooks = {k: _shippable(kwargs[k]) for k in ("worker_init_fn", "collate_fn") if kwargs.get(k) is not None}
                blockers = [k for k, hook in hooks.items() if not _picklable(hook)]
                if blockers:
                    warnings.warn(f"ROCm: data-loader workers are forked: {' and '.join(blockers)} cannot be pickled for "
                                  f"{choice!r} workers", stacklevel=2)
                else:
                    kwargs.update(hooks, multiprocessing_context=choice)
        return dataloader_cls(*args, **kwargs)

    return make


# <<< helper part 180
