"""async-checkpoint-spawn: before/after, the writer process spawned on ROCm and forked on CUDA; and
the HIP runtime version patch 0001 decides by."""

import pytest

from tests.helpers.codemods import assert_codemod, rewrite, rewrite_with_reports, run_tree

# Shaped like megatron/core/dist_checkpointing/strategies/async_utils.py at core_v0.16.1.
ASYNC_UTILS = """\
from time import time

import torch
from torch import multiprocessing as mp


class AsyncCaller:
    pass


class TemporalAsyncCaller(AsyncCaller):
    def __init__(self):
        self.process = None

    def schedule_async_call(self, async_req):
        ctx = mp.get_context('fork')
        self.start_time = time()
        self.process = ctx.Process(target=async_req.async_fn, args=async_req.async_fn_args)
        self.process.start()


class PersistentAsyncCaller(AsyncCaller):
    def start(self):
        return mp.get_context('spawn')


def elsewhere():
    return mp.get_context('fork')  # not an async-checkpoint caller: left
"""

REL = "megatron/core/dist_checkpointing/strategies/async_utils.py"


def test_exact_before_after():
    after = ASYNC_UTILS.replace(
        "from torch import multiprocessing as mp\n",
        "from torch import multiprocessing as mp\nfrom megatron.core._rocm import async_start_method\n",
    ).replace("        ctx = mp.get_context('fork')\n", "        ctx = mp.get_context(async_start_method('fork'))\n")
    assert_codemod("async-checkpoint-spawn", ASYNC_UTILS, after, REL, sites=1)


def test_aliases_of_multiprocessing():
    """multiprocessing or torch.multiprocessing under any name, in a subclass of an imported AsyncCaller."""
    src = (
        "import multiprocessing\nimport torch.multiprocessing as tmp\n"
        "from megatron.core.dist_checkpointing.strategies.async_utils import AsyncCaller as Base\n\n\nclass C(Base):\n"
        "    def a(self):\n        return multiprocessing.get_context(\"fork\"), tmp.get_context('fork'), tmp.get_context('spawn')\n"
    )
    after, sites, reports = rewrite_with_reports("async-checkpoint-spawn", src, "megatron/core/x.py")
    assert sites == 2 and after.count("async_start_method(") == 2 and "tmp.get_context('spawn')" in after
    assert [r.line for r in reports] == [8, 8]


FILES = {
    "megatron/core/dist_checkpointing/__init__.py": "",
    "megatron/core/dist_checkpointing/strategies/__init__.py": "",
    "ckpt_writer.py": "def write(path):\n    open(path, 'w').write('written')\n",
}
PROBE = """
import types, ckpt_writer
from megatron.core.dist_checkpointing.strategies.async_utils import TemporalAsyncCaller
caller = TemporalAsyncCaller()
caller.schedule_async_call(types.SimpleNamespace(async_fn=ckpt_writer.write, async_fn_args=("out.txt",)))
caller.process.join(60)
print(type(caller.process).__name__, caller.process.exitcode, open("out.txt").read())
"""


@pytest.mark.torch
def test_writer_is_spawned_on_rocm_and_forked_on_cuda(tmp_path):
    after, _ = rewrite("async-checkpoint-spawn", ASYNC_UTILS, REL)
    rocm = run_tree(tmp_path / "r", {**FILES, REL: after}, PROBE, hip="6.4.43482")
    assert rocm.stdout.strip() == "SpawnProcess 0 written", rocm.stderr
    cuda = run_tree(tmp_path / "c", {**FILES, REL: after}, PROBE)
    upstream = run_tree(tmp_path / "u", {**FILES, REL: ASYNC_UTILS}, PROBE)
    assert cuda.stdout == upstream.stdout and cuda.stdout.strip() == "ForkProcess 0 written", cuda.stderr


RUNTIME = """
import ctypes, torch
from megatron.core._rocm import hip_runtime_version
print(hip_runtime_version())


class FakeHip:  # libamdhip64's hipRuntimeGetVersion writing HIP_VERSION (major*10^7 + minor*10^5 + patch)
    class hipRuntimeGetVersion:
        argtypes = restype = None

        def __new__(cls, out):
            ctypes.cast(out, ctypes.POINTER(ctypes.c_int))[0] = 70_152_000
            return 0


real = ctypes.CDLL
ctypes.CDLL = lambda name, *a, **k: FakeHip() if name.startswith("libamdhip64") else real(name, *a, **k)
print(hip_runtime_version())
"""


@pytest.mark.torch
def test_hip_runtime_version_prefers_the_runtime_over_the_build(tmp_path):
    """Patch 0001 decides by hip_runtime_version(): a 7.1 runtime under a torch built for 6.3 keeps
    the fast copy; with no runtime library to ask, the build's version decides."""
    proc = run_tree(tmp_path, {}, RUNTIME, hip="6.3.42131-fa1d09cbd")
    assert proc.stdout.splitlines() == ["(6, 3)", "(7, 1)"], proc.stderr
    assert (
        run_tree(
            tmp_path / "c", {}, "from megatron.core._rocm import hip_runtime_version\nprint(hip_runtime_version())"
        ).stdout.strip()
        == "(0, 0)"
    )
