"""The `empty-cache-interval` codemod's runtime helper: train_step's per-iteration empty_cache() on HIP
every ROCMPORT_EMPTY_CACHE_INTERVAL iterations.

Only the text between the `# >>> helper part N` / `# <<< helper part N` markers goes into the
generated helper module (rocmport/codemods/helper.py assembles it, parts in N order); what is
above the first marker is for the type checker and readers (the generated module defines
these names itself)."""

import os
import warnings

import torch

from rocmport.codemods.runtime.core import is_hip

# >>> helper part 196
# ---- train_step's empty_cache() --------------------------------------------------------------------

_EMPTY_CACHE_CALLS = [0]


def empty_cache_interval(environ=None) -> int:
    """ROCMPORT_EMPTY_CACHE_INTERVAL as a count of iterations: 1 (every one, upstream's behaviour) when
    unset; 0 never; a value that is not a whole number >= 0 is 1, with a warning naming it."""
    text = (os.environ if environ is None else environ).get("ROCMPORT_EMPTY_CACHE_INTERVAL", "").strip()
    if not text:
        return 1
    if not text.isascii() or not text.isdigit():
        warnings.warn(f"ROCMPORT_EMPTY_CACHE_INTERVAL={text[:40]!r} is not a whole number of iterations (0 never, "
                      "N every N-th): emptying the cache every iteration", stacklevel=2)
        return 1
    return int(text)


def empty_cache_on_interval() -> bool:
    """train_step's torch.cuda.empty_cache() under --empty-unused-memory-level >= 1. On HIP with
    ROCMPORT_EMPTY_CACHE_INTERVAL=N it runs on the first call and every N-th after it (0: never),
    sparing the hipFree/hipMalloc of the cached blocks on the other iterations; the first call
    still empties it, so NCCL's first workspace is allocated against a clean cache (AMD's Primus,
    empty_cache_interval_patches.py). On CUDA, and with N=1 (the default), every call empties it.
    Returns whether it emptied the cache."""
    calls = _EMPTY_CACHE_CALLS[0]
    _EMPTY_CACHE_CALLS[0] += 1
    n = empty_cache_interval() if is_hip() else 1
    if calls == 0 and is_hip() and "ROCMPORT_EMPTY_CACHE_INTERVAL" not in os.environ:
        warnings.warn("ROCm: --empty-unused-memory-level empties the allocator cache every iteration (hipFree, then "
                      "hipMalloc again: AMD measured ~5 s of a 7.65 s MI300X step); ROCMPORT_EMPTY_CACHE_INTERVAL=N "
                      "does it on the first iteration and every N-th only", stacklevel=2)
    if n == 0 or (n > 1 and calls % n != 0):
        return False
    torch.cuda.empty_cache()
    return True


# <<< helper part 196
