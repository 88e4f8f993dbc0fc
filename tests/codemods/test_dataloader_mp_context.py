"""dataloader-mp-context: before/after, and the pretraining loader's workers on ROCm vs CUDA."""

import pytest

from tests.helpers.codemods import assert_codemod, rewrite, run_tree

# Shaped like megatron/training/datasets/data_samplers.py at core_v0.16.1.
SAMPLERS = '''\
import torch

from megatron.training import get_args


def build_pretraining_data_loader(dataset, consumed_samples):
    """Build dataloader given an input dataset."""
    args = get_args()

    def worker_init_fn(_):
        pass

    maybe_worker_init_fn = (
        worker_init_fn if args.exit_signal_handler and args.num_workers > 0 else None
    )
    extra_kwargs = {}
    return torch.utils.data.DataLoader(
        dataset,
        batch_size=2,
        num_workers=args.num_workers,
        pin_memory=False,
        persistent_workers=True if args.num_workers > 0 else False,
        worker_init_fn=maybe_worker_init_fn,
        **extra_kwargs,
    )


def other_loader(dataset):
    return torch.utils.data.DataLoader(dataset, num_workers=2)
'''

REL = "megatron/training/datasets/data_samplers.py"


def test_exact_before_after():
    after = SAMPLERS.replace(
        "from megatron.training import get_args\n",
        "from megatron.training import get_args\nfrom megatron.core._rocm import hip_worker_context\n",
    ).replace(
        "    return torch.utils.data.DataLoader(\n        dataset,\n        batch_size=2,",
        "    return hip_worker_context(torch.utils.data.DataLoader)(\n        dataset,\n        batch_size=2,",
    )
    assert_codemod("dataloader-mp-context", SAMPLERS, after, REL, sites=1)


def test_aliased_dataloader():
    src = (
        "from torch.utils.data import DataLoader as DL\n\n\n"
        "def build_pretraining_data_loader(dataset, consumed_samples):\n"
        "    return DL(dataset, num_workers=2)\n"
    )
    after, sites = rewrite("dataloader-mp-context", src, "megatron/legacy/data/data_samplers.py")
    assert sites == 1 and "    return hip_worker_context(DL)(dataset, num_workers=2)\n" in after


FILES = {
    "megatron/training/__init__.py": "import types\nARGS = types.SimpleNamespace(num_workers=2, exit_signal_handler=False)\n"
    "def get_args():\n    return ARGS\n",
    "megatron/training/datasets/__init__.py": "",
    "squares.py": "import torch\nclass Squares(torch.utils.data.Dataset):\n    def __len__(self):\n        return 4\n"
    "    def __getitem__(self, i):\n        return torch.tensor(i * i)\n",
}
PROBE = """
import os, warnings, squares
from megatron.training import ARGS
from megatron.training.datasets.data_samplers import build_pretraining_data_loader
ARGS.__dict__.update(__ARGS__)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    loader = build_pretraining_data_loader(squares.Squares(), 0)
    batches = [b.tolist() for b in loader]
ctx = loader.multiprocessing_context
print(ctx.get_start_method() if ctx is not None else None, batches, [str(w.message) for w in caught if "ROCm" in str(w.message)])
"""


def probe(**args):
    return PROBE.replace("__ARGS__", repr(args))


@pytest.mark.torch
def test_workers_are_spawned_on_rocm_and_the_data_is_the_same(tmp_path):
    after, _ = rewrite("dataloader-mp-context", SAMPLERS, REL)
    rocm = run_tree(tmp_path / "r", {**FILES, REL: after}, probe(), hip="6.4.43482")
    assert rocm.stdout.strip() == "spawn [[0, 1], [4, 9]] []", rocm.stderr
    forkserver = run_tree(
        tmp_path / "f",
        {**FILES, REL: after},
        probe(),
        hip="6.4.43482",
        env={"ROCMPORT_DATALOADER_MP_CONTEXT": "forkserver"},
    )
    assert forkserver.stdout.strip() == "forkserver [[0, 1], [4, 9]] []", forkserver.stderr


@pytest.mark.torch
def test_fork_is_the_explicit_opt_out_and_the_fallback_for_unpicklable_hooks(tmp_path):
    after, _ = rewrite("dataloader-mp-context", SAMPLERS, REL)
    opt_out = run_tree(
        tmp_path / "o", {**FILES, REL: after}, probe(), hip="6.4.43482", env={"ROCMPORT_DATALOADER_MP_CONTEXT": "fork"}
    )
    assert opt_out.stdout.strip() == "None [[0, 1], [4, 9]] []", opt_out.stderr
    # a local worker_init_fn whose closure holds a lock cannot go to a spawned worker
    locked = SAMPLERS.replace(
        "    def worker_init_fn(_):\n        pass\n",
        "    import threading\n    lock = threading.Lock()\n\n    def worker_init_fn(_):\n        lock.acquire()\n        lock.release()\n",
    )
    after, _ = rewrite("dataloader-mp-context", locked, REL)
    local = run_tree(tmp_path / "l", {**FILES, REL: after}, probe(exit_signal_handler=True), hip="6.4.43482")
    assert local.stdout.strip() == (
        'None [[0, 1], [4, 9]] ["ROCm: data-loader workers are forked: worker_init_fn cannot be '
        "pickled for 'spawn' workers\"]"
    ), local.stderr
    bad = run_tree(
        tmp_path / "b",
        {**FILES, REL: after},
        probe(),
        hip="6.4.43482",
        env={"ROCMPORT_DATALOADER_MP_CONTEXT": "threads"},
    )
    assert "ROCMPORT_DATALOADER_MP_CONTEXT='threads': use spawn, forkserver or fork" in bad.stderr


# v0.17+: a local worker_init_fn on every run with workers (it closes /dev/nvidia* fds and, with
# --exit-signal-handler, installs the handler), reading args from its closure.
V017_INIT = """    def worker_init_fn(worker_id):
        import os

        def mark():
            open(os.path.join(args.marks, f"worker{worker_id}"), "w").write(f"{args.exit_signal} {os.getpid()}")

        mark()

    maybe_worker_init_fn = (
        worker_init_fn if args.num_workers > 0 else None
    )
"""


@pytest.mark.torch
def test_a_local_worker_init_fn_runs_in_spawned_workers(tmp_path):
    """The closure goes to the spawned workers as code + closure values and runs there, as with fork."""
    src = SAMPLERS.replace(
        SAMPLERS[SAMPLERS.index("    def worker_init_fn(_):") : SAMPLERS.index("    extra_kwargs = {}")], V017_INIT
    )
    after, _ = rewrite("dataloader-mp-context", src, REL)
    marks = tmp_path / "marks"
    marks.mkdir()
    code = (
        probe(marks=str(marks), exit_signal="SIGTERM")
        + "import os\nprint(sorted(open(os.path.join(ARGS.marks, f)).read().split()[0] for f in os.listdir(ARGS.marks)), len(os.listdir(ARGS.marks)))\n"
    )
    rocm = run_tree(tmp_path / "r", {**FILES, REL: after}, code, hip="6.4.43482")
    assert rocm.stdout.splitlines() == ["spawn [[0, 1], [4, 9]] []", "['SIGTERM', 'SIGTERM'] 2"], rocm.stderr
    for f in marks.iterdir():
        f.unlink()
    upstream = run_tree(tmp_path / "u", {**FILES, REL: src}, code, hip="6.4.43482")
    assert upstream.stdout.splitlines() == ["None [[0, 1], [4, 9]] []", "['SIGTERM', 'SIGTERM'] 2"], upstream.stderr


@pytest.mark.torch
def test_no_workers_and_cuda_are_upstream(tmp_path):
    after, _ = rewrite("dataloader-mp-context", SAMPLERS, REL)
    zero = run_tree(tmp_path / "z", {**FILES, REL: after}, probe(num_workers=0), hip="6.4.43482")
    assert zero.stdout.strip() == "None [[0, 1], [4, 9]] []", zero.stderr
    cuda = run_tree(tmp_path / "c", {**FILES, REL: after}, probe())
    upstream = run_tree(tmp_path / "u", {**FILES, REL: SAMPLERS}, probe())
    assert cuda.stdout == upstream.stdout and cuda.stdout.strip() == "None [[0, 1], [4, 9]] []", cuda.stderr
