"""The host's random generators (Python's, numpy's and torch's CPU generator) seeded as Megatron's own
initialize seeds them: the one function stage 2's worker (gpt_worker) and stage 3's plugin
(pytest_plugin, each test from its id) share, in a module of its own so neither imports the other for
it. Imports nothing at import time but the standard library: the plugin loads it in every rank's
pytest session, numpy and torch are imported (or looked up) only when it seeds."""

from __future__ import annotations

import importlib
import sys
from types import ModuleType


def seed_host_generators(seed: int, *, imported_only: bool = False) -> None:
    """Seed Python's ``random``, numpy's global generator and torch's CPU generator with ``seed``, in
    that order, as Megatron's training/initialize.py `_set_random_seed` does before
    `model_parallel_cuda_manual_seed` (which leaves torch's CPU generator alone; torch seeds it at
    random in every process). The proxy draws stage 2's weights on the CPU (`use_cpu_initialization`),
    from that generator: unseeded, every run drew other weights, and the FP8 tp2-against-tp1
    difference, which depends on them, moved from run to run (0.0009, 0.0018 and 0.0124 measured
    against a bound of 0.0097). ``imported_only``: numpy's and torch's only where the process has
    imported them already (the plugin, which imports neither into a test session); else both are
    imported first (the worker)."""
    import random

    numpy: ModuleType | None
    torch: ModuleType | None
    if imported_only:
        numpy, torch = sys.modules.get("numpy"), sys.modules.get("torch")
    else:
        numpy, torch = importlib.import_module("numpy"), importlib.import_module("torch")
    random.seed(seed)
    if numpy is not None:
        numpy.random.seed(seed)
    if torch is not None:
        torch.manual_seed(seed)
