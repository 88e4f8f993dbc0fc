"""verify stage 4: upstream's functional GPT case turned into a pretrain_gpt.py command line, run
under torchrun, its losses parsed from Megatron's log, goldens recorded and compared, and a CPU
blocker reported as unsupported-in-proxy with its upstream site."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest

from rocmport.verify.orchestration import environment

from rocmport.verify.orchestration import firewall
from rocmport.verify.runtime import hip_sim
from rocmport.verify.orchestration.device_kind import DeviceKind
from rocmport.verify.stages.functional import build_args, default_case, golden_path, parse_losses, stage_functional
from tests.helpers.canned_case import CASE, CONFIG, proxy_case_kwargs

# Prints Megatron's training log line for each iteration; FAKE_SHIFT moves the curve.
FAKE_PRETRAIN = textwrap.dedent("""\
    import os, sys
    iters = int(sys.argv[sys.argv.index("--train-iters") + 1])
    shift = float(os.environ.get("FAKE_SHIFT", "0"))
    slope = -1.0 if os.environ.get("FAKE_RISE") else 1.0
    assert os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"  # the case's ENV_VARS reach the script
    for i in range(1, iters + 1):
        print(f" [2026-11-23 07:00:0{i % 10}] iteration {i:8d}/{iters:8d} | consumed samples: {8 * i:10d} | "
              f"elapsed time per iteration (ms): 12.3 | learning rate: 1.5E-04 | global batch size:     8 | "
              f"lm loss: {10.9 - slope * 0.25 * i + shift:.6E} | loss scale: 1.0 | grad norm: 3.1 |", flush=True)
    """)

BLOCKED_PRETRAIN = "from megatron.training.initialize import initialize_megatron\ninitialize_megatron()\n"

# Shaped like pretrain_gpt.py on the path stage 4 exercises: megatron/training asks torch.cuda what
# upstream's training loop asks (availability, device properties, memory statistics, events and
# streams, synchronisation, the profiler hooks, device="cuda" tensors), trains, saves at
# --save-interval and resumes from --load (--ckpt-step picks the iteration).
TRAIN_LOOP = textwrap.dedent("""\
    import argparse, json, os, sys
    import torch

    # the loop knows: ckpt_step, async_save, use_persistent_ckpt_worker


    def train(argv):
        p = argparse.ArgumentParser()
        for flag in ("--train-iters", "--save-interval", "--ckpt-step"):
            p.add_argument(flag, type=int)
        p.add_argument("--save")
        p.add_argument("--load")
        p.add_argument("--lr", type=float, default=1e-4)
        p.add_argument("--ckpt-format", default="torch_dist")
        p.add_argument("--async-save", action="store_true")
        args, _ = p.parse_known_args(argv)
        assert torch.cuda.is_available(), "Megatron requires CUDA."
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        seen = {"hip": torch.version.hip, "name": props.name, "arch": getattr(props, "gcnArchName", "")}
        if os.environ.get("FAKE_SEEN"):
            json.dump(seen, open(os.environ["FAKE_SEEN"], "w"))
        start, state = 0, 10.0
        if args.load and os.path.isfile(os.path.join(args.load, "latest")):
            step = args.ckpt_step or int(open(os.path.join(args.load, "latest")).read())
            state = json.load(open(os.path.join(args.load, f"iter_{step}.json")))["state"] + float(os.environ.get("FAKE_RESUME_SHIFT", "0"))
            start = step
            print(f"  successfully loaded checkpoint from {args.load} [ t 1/1, p 1/1 ] at iteration {step}", flush=True)
        stream = torch.cuda.Stream()
        for it in range(start + 1, args.train_iters + 1):
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            with torch.cuda.stream(stream):
                loss = torch.tensor([state], device="cuda")
            torch.cuda.synchronize()
            end.record()
            stats = torch.cuda.memory_stats()
            state -= args.lr * 2500
            print(f" iteration {it:8d}/{args.train_iters:8d} | elapsed time per iteration (ms): {begin.elapsed_time(end):.1f} | "
                  f"lm loss: {float(loss):.6E} | mem {stats['allocated_bytes.all.current'] > 0} |", flush=True)
            if args.save and (it % args.save_interval == 0 or it == args.train_iters):
                save_checkpoint(args, it, state)
        torch.cuda.check_error(torch.cuda.cudart().cudaProfilerStop())
        # megatron's samplers ask for pinned batches (DataLoader(pin_memory=True)), and the async checkpoint preload pins.
        loader = torch.utils.data.DataLoader(torch.arange(4.0), batch_size=2, pin_memory=True)
        assert [b.tolist() for b in loader] == [[0.0, 1.0], [2.0, 3.0]] and torch.ones(1).pin_memory().device.type == "cpu"
        assert torch.accelerator.current_accelerator() is None  # torch's own view (the loader's pinning, optimizers' graph-capture check)


    def save_checkpoint(args, iteration, state):
        # megatron/training/checkpointing.py's save_checkpoint: only torch_dist has an async writer
        if args.async_save and args.ckpt_format == "torch":
            raise NotImplementedError("Async checkpoint save not implemented for legacy checkpoints")
        if args.async_save and args.ckpt_format != "torch_dist":
            raise NotImplementedError(f"Async checkpoint save not implemented for {args.ckpt_format} distributed checkpoint format")
        os.makedirs(args.save, exist_ok=True)
        json.dump({"state": state}, open(os.path.join(args.save, f"iter_{iteration}.json"), "w"))
        open(os.path.join(args.save, "latest"), "w").write(str(iteration))
    """)
SHAPED_PRETRAIN = "import sys\nfrom megatron.training.loop import train\n\ntrain(sys.argv[1:])\n"
# A CUDA call the shim has no CPU answer for: the CPU build lacks its binding, a CUDA build without a
# GPU finds no driver (cuBLAS needs a context).
CUDA_ONLY_PRETRAIN = (
    "import torch\nfrom megatron.training.initialize import initialize_megatron\n"
    "initialize_megatron(allow_no_cuda=True)\ntorch.cuda.current_blas_handle()\n"
)
INITIALIZE = textwrap.dedent("""\
    import torch


    def initialize_megatron(allow_no_cuda=False):
        if not allow_no_cuda:
            # Make sure cuda is available.
            assert torch.cuda.is_available(), "Megatron requires CUDA."
    """)


def make_tree(root: Path, script: str) -> Path:
    case = root / "tests" / "functional_tests" / "test_cases" / "gpt" / CASE
    case.mkdir(parents=True)
    (case / "model_config.yaml").write_text(CONFIG)
    (root / "pretrain_gpt.py").write_text(script)
    (root / "megatron" / "training").mkdir(parents=True)
    (root / "megatron" / "__init__.py").write_text("")
    (root / "megatron" / "training" / "__init__.py").write_text("")
    (root / "megatron" / "training" / "initialize.py").write_text(INITIALIZE)
    (root / "megatron" / "training" / "loop.py").write_text(TRAIN_LOOP)
    # The RNG hooks the proxy shim backs with the CPU generator.
    (root / "megatron" / "core" / "tensor_parallel").mkdir(parents=True)
    (root / "megatron" / "core" / "__init__.py").write_text("")
    (root / "megatron" / "core" / "tensor_parallel" / "__init__.py").write_text("")
    (root / "megatron" / "core" / "tensor_parallel" / "random.py").write_text(
        "def _get_cuda_rng_state():\n    pass\n\n\ndef _set_cuda_rng_state(state):\n    pass\n\n\nclass CudaRNGStatesTracker:\n    pass\n"
    )
    return root


def env_for(tmp_path: Path, tree: Path, **extra) -> dict:
    (tmp_path / "boot").mkdir(exist_ok=True)
    return environment.child_env(tree, tmp_path / "boot", extra)


def proxy_env(tmp_path: Path, tree: Path, hip: str | None = hip_sim.DEFAULT_VERSION, **extra) -> dict:
    """verify's own environment for the started processes: the bootstrap (firewall, proxy shim in
    upstream scripts' workers) and, by default, the HIP simulation."""
    boot = firewall.write_bootstrap(tmp_path / "realboot")
    sim = hip_sim.child_env(hip) if hip else {}
    return environment.child_env(
        tree, boot, {**firewall.firewall_env("cpu-proxy"), "ROCMPORT_PROXY": "1", **sim, **extra}
    )


def test_build_args_mock_data_and_proxy_scale(tmp_path):
    import yaml

    config = yaml.safe_load(CONFIG)
    args = build_args(config, iters=5, proxy=True, data_path=None, work=tmp_path)
    pairs = dict(zip(args, args[1:]))
    assert "--mock-data" in args and pairs["--tokenizer-type"] == "NullTokenizer"
    assert not {"--data-path", "--vocab-file", "--merge-file", "--split", "--fp16"} & set(args)
    assert pairs["--train-iters"] == "5" and pairs["--distributed-backend"] == "gloo" and pairs["--num-layers"] == "4"
    assert pairs["--save"] == str(tmp_path / "ckpt") and pairs["--tensorboard-dir"] == str(tmp_path / "tensorboard")
    assert pairs["--transformer-impl"] == "local" and "--use-mcore-models" in args  # the case's own flags stay
    real = build_args(config, iters=50, proxy=False, data_path="/data/gpt3", work=tmp_path)
    pairs = dict(zip(real, real[1:]))
    assert (
        pairs["--data-path"] == "/data/gpt3/my-gpt3_00_text_document" and "--mock-data" not in real and "--fp16" in real
    )
    assert pairs["--num-layers"] == "12" and pairs["--distributed-backend"] == "nccl"


def test_parse_losses_and_default_case():
    log = (
        "iteration        2/      50 | consumed samples: 64 | lm loss: 1.073209E+01 | loss scale: 4096.0 |\n"
        "noise\n iteration        1/      50 | consumed samples: 32 | lm loss: 1.092717E+01 |\n"
        " iteration        3/      50 | consumed samples: 96 | skipped iterations:   1 |\n"
    )
    assert parse_losses(log) == [10.92717, 10.73209]
    assert default_case(2, 2, te_present=False) == "gpt3_mcore_tp2_pp2_uninstall_te"
    assert default_case(2, 2, te_present=True) == "gpt3_mcore_te_tp2_pp2"


def test_default_case_by_v015_names(tmp_path):
    """Up to v0.15 upstream's merge-request cases carry the suite and machine in their names."""
    cases = tmp_path / "tests" / "functional_tests" / "test_cases" / "gpt"
    for name in (
        "gpt3_mr_mcore_tp2_pp2_uninstall_te_dgx_a100_1N8G",
        "gpt3_mr_mcore_tp2_pp2_resume_torch_dist_uninstall_te_dgx_a100_1N8G",
        "gpt3_mr_mcore_te_tp2_pp2_dgx_a100_1N8G",
        "gpt3_mr_mcore_te_tp2_pp2_mla_dgx_a100_1N8G",
    ):
        (cases / name).mkdir(parents=True)
    assert default_case(2, 2, te_present=False, tree=tmp_path) == "gpt3_mr_mcore_tp2_pp2_uninstall_te_dgx_a100_1N8G"
    assert default_case(2, 2, te_present=True, tree=tmp_path) == "gpt3_mr_mcore_te_tp2_pp2_dgx_a100_1N8G"
    assert (
        default_case(1, 1, te_present=False, tree=tmp_path) == "gpt3_mcore_tp1_pp1_uninstall_te"
    )  # none: today's name, for the message
    (cases / "gpt3_mcore_tp2_pp2_uninstall_te").mkdir()
    assert default_case(2, 2, te_present=False, tree=tmp_path) == "gpt3_mcore_tp2_pp2_uninstall_te"


@pytest.mark.torch
@pytest.mark.slow
def test_functional_case_runs_records_and_compares_golden(tmp_path):
    tree = make_tree(tmp_path / "tree", FAKE_PRETRAIN)
    series_dir = tmp_path / "series"
    # This fake never loads a checkpoint: with the round trip on, the stage says so and fails
    # (its losses alone would match); the round trip itself is test_shim_answers_training_loop_and_resume_matches's.
    kwargs = dict(
        case=CASE, dp=1, iters=4, proxy=True, data_path=None, series_dir=series_dir, device_kind=DeviceKind("cpu-proxy")
    )
    no_load, _ = stage_functional(tree, env_for(tmp_path, tree), record=False, resume=True, **kwargs)
    assert no_load.status == "fail" and "the resumed run did not load iteration 2 (it says None)" in no_load.reason
    kwargs["resume"] = False
    rising, _ = stage_functional(tree, env_for(tmp_path, tree, FAKE_RISE="1"), record=True, **kwargs)
    golden = golden_path(series_dir, CASE, "cpu-proxy")
    assert rising.status == "fail" and "golden not recorded: the run failed" in rising.reason and not golden.exists()
    res, data = stage_functional(tree, env_for(tmp_path, tree), record=True, **kwargs)
    assert res.status == "pass", res.reason
    assert data.losses == [10.65, 10.4, 10.15, 9.9]
    assert json.loads(golden.read_text())["losses"] == data.losses and "golden recorded" in res.reason
    same, _ = stage_functional(tree, env_for(tmp_path, tree), record=False, **kwargs)
    assert same.status == "pass" and "max relative drift vs golden 0" in same.reason
    drifted, data = stage_functional(tree, env_for(tmp_path, tree, FAKE_SHIFT="0.5"), record=False, **kwargs)
    assert drifted.status == "fail" and data.golden.max_rel_drift > 0.04
    other, _ = stage_functional(
        tree,
        env_for(tmp_path, tree),
        record=False,
        **{**kwargs, "device_kind": DeviceKind("rocm", "amd-instinct-mi300x")},
    )
    assert other.status == "pass" and "no golden for this device kind" in other.reason


def test_upstream_a100_golden_side_by_side(tmp_path):
    from rocmport.verify.stages.functional import upstream_golden

    cdir = tmp_path / "case"
    cdir.mkdir()
    assert upstream_golden(cdir, [1.0]) is None
    (cdir / "golden_values_dev_dgx_a100.json").write_text(
        json.dumps(
            {
                "lm loss": {
                    "start_step": 1,
                    "end_step": 50,
                    "step_interval": 5,
                    "values": {"1": 10.92717, "5": 10.92928, "10": 10.91616},
                }
            }
        )
    )
    ref = upstream_golden(cdir, [10.9, 10.8, 10.7, 10.6, 10.5, 10.4]).to_dict()
    assert [s["step"] for s in ref["steps"]] == [1, 5] and ref["steps"][1] == {
        "step": 5,
        "a100": 10.92928,
        "here": 10.5,
    }
    assert ref["summary"] == "step 1: 10.9272 vs 10.9000, step 5: 10.9293 vs 10.5000"


@pytest.mark.torch
@pytest.mark.slow
def test_cpu_blocker_is_unsupported_in_proxy_with_site(tmp_path):
    # Without the shim (a bare bootstrap), upstream's own assertion is the blocker, named with its site.
    tree = make_tree(tmp_path / "tree", BLOCKED_PRETRAIN)
    kwargs = dict(
        case=CASE, dp=1, iters=3, data_path=None, series_dir=None, record=False, device_kind=DeviceKind("cpu-proxy")
    )
    res, _ = stage_functional(tree, env_for(tmp_path, tree), proxy=True, **kwargs)
    assert res.status == "unsupported-in-proxy"
    assert res.reason.endswith(
        "AssertionError: Megatron requires CUDA. at megatron/training/initialize.py:7 (initialize_megatron)"
    )
    # On a GPU machine the same exit is a failure, never excused.
    res, _ = stage_functional(tree, env_for(tmp_path, tree), proxy=False, **kwargs)
    assert res.status == "fail" and "Megatron requires CUDA" in res.reason
    # With the shim, a CUDA call it has no CPU answer for is still named, never papered over.
    tree = make_tree(tmp_path / "tree2", CUDA_ONLY_PRETRAIN)
    res, _ = stage_functional(tree, proxy_env(tmp_path, tree), proxy=True, **kwargs)
    import torch

    blocker = "has no attribute '_cuda_getCurrentBlasHandle'" if torch.version.cuda is None else "CUDA driver"
    assert res.status == "unsupported-in-proxy" and blocker in res.reason, res.reason
    assert res.reason.endswith("at pretrain_gpt.py:4 (<module>)"), res.reason


@pytest.mark.torch
@pytest.mark.slow
def test_shim_answers_training_loop_and_resume_matches(tmp_path):
    """A pretrain_gpt.py-shaped script through the real bootstrap: the shim answers its torch.cuda
    calls (counted by call site), the HIP simulation is what it sees, and the resumed run's losses
    equal the uninterrupted run's."""
    tree = make_tree(tmp_path / "tree", SHAPED_PRETRAIN)
    seen = tmp_path / "seen.json"
    kwargs = proxy_case_kwargs()
    res, data = stage_functional(tree, proxy_env(tmp_path, tree, FAKE_SEEN=str(seen)), **kwargs)
    assert res.status == "pass", res.reason
    assert json.loads(seen.read_text()) == {
        "hip": hip_sim.DEFAULT_VERSION,
        "name": "AMD Instinct MI300X",
        "arch": "gfx942:sramecc+:xnack-",
    }
    lr = 3e-3 * 2500  # the proxy's learning rate (PROXY_TRAINING) moves the fake loss
    assert data.losses == pytest.approx([10.0 - lr * i for i in range(6)])
    assert data.resume.to_dict() == {
        "from_iteration": 3,
        "loaded_iteration": 3,
        "max_abs_diff": 0.0,
        "tolerance": 1e-5,
        "async_save": True,
        "losses": data.losses[3:],
    }
    assert "resumed from the iteration-3 checkpoint (async torch_dist): max |Δ| 0 over iterations 4-6" in res.reason
    redirects = data.redirects
    for call in (
        "cuda.is_available @ megatron/training/loop.py:17",
        "cuda.get_device_properties @ megatron/training/loop.py:18",
        "cuda.memory_stats @ megatron/training/loop.py:36",
        "cuda.synchronize @ megatron/training/loop.py:34",
        "cuda.stream @ megatron/training/loop.py:32",
        "cuda.cudart @ megatron/training/loop.py:42",
        "tensor(device=cuda) @ megatron/training/loop.py:33",
        "Tensor.pin_memory @ megatron/training/loop.py:45",
        "accelerator.current_accelerator (none) @ megatron/training/loop.py:46",
    ):
        assert redirects.get(call, 0) >= 1, (call, redirects)
    assert redirects["cuda.synchronize @ megatron/training/loop.py:34"] == 6  # the uninterrupted run's (the report's)
    assert data.proxy_env and "TORCHDYNAMO_DISABLE=1" in data.proxy_env
    # The CUDA path (--no-hip-sim) runs the same loop with an A100's answers.
    res, data = stage_functional(
        tree, proxy_env(tmp_path, tree, hip=None, FAKE_SEEN=str(seen)), **{**kwargs, "hip": None}
    )
    assert (
        res.status == "pass"
        and json.loads(seen.read_text())["hip"] is None
        and json.loads(seen.read_text())["name"].startswith("NVIDIA A100")
    )
    # A resumed run that does not continue the same curve fails the stage.
    res, data = stage_functional(tree, proxy_env(tmp_path, tree, FAKE_RESUME_SHIFT="0.01"), **kwargs)
    assert res.status == "fail" and "resumed losses differ from the uninterrupted run's by 0.01" in res.reason
    assert data.resume.max_abs_diff == pytest.approx(0.01)


def test_missing_case(tmp_path):
    tree = make_tree(tmp_path / "tree", FAKE_PRETRAIN)
    kwargs = dict(
        dp=1, iters=3, proxy=True, data_path=None, series_dir=None, record=False, device_kind=DeviceKind("cpu-proxy")
    )
    res, _ = stage_functional(tree, {}, case="gpt3_mcore_tp8_pp8_uninstall_te", defaulted=True, **kwargs)
    assert res.status == "skipped" and CASE in res.reason and "--case" in res.reason
    res, _ = stage_functional(tree, {}, case="gpt3_typo", **kwargs)
    assert res.status == "fail"


def test_expected_resumed_losses_follow_the_training_logs_intervals():
    from rocmport.verify.stages.functional import expected_resumed

    steps = {1: 7.0, 2: 6.9, 3: 6.8, 4: 6.7, 5: 6.6, 6: 6.5}
    assert expected_resumed(steps, 3, 6, first_two_together=False) == {4: 6.7, 5: 6.6, 6: 6.5}
    # Megatron (v0.16: training.py keeps the first iteration in the running total, should_reset =
    # not is_first_iteration) logs the mean of a run's first two iterations at its second.
    assert expected_resumed(steps, 3, 6, first_two_together=True) == {4: 6.7, 5: pytest.approx(6.65), 6: 6.5}
    assert expected_resumed(steps, 5, 6, first_two_together=True) == {6: 6.5}


def test_resume_support_reads_the_training_loop(tmp_path):
    from rocmport.verify.stages.functional import ResumeSupport, resume_support

    (tmp_path / "megatron" / "training").mkdir(parents=True)
    assert resume_support(tmp_path) == ResumeSupport(False, False, False, False)
    (tmp_path / "megatron" / "training" / "training.py").write_text(
        "ckpt_step = None\nasync_save = use_persistent_ckpt_worker = False\nshould_reset = not is_first_iteration\n"
    )
    assert resume_support(tmp_path) == ResumeSupport(
        ckpt_step=True, async_save=True, async_strategy=False, first_two_logged_together=True
    )
    (tmp_path / "megatron" / "training" / "async_utils.py").write_text('async_strategy = "nvrx"\n')
    assert resume_support(tmp_path).async_strategy is True
    assert resume_support(tmp_path).async_formats == ("torch_dist",)  # no guard read: the one every line has
    (tmp_path / "megatron" / "training" / "checkpointing.py").write_text(
        "    if args.async_save:\n        if ckpt_type == CheckpointType.LEGACY:\n"
        "            raise NotImplementedError('Async checkpoint save not implemented for legacy checkpoints')\n"
        "        elif ckpt_type == CheckpointType.GLOBAL and args.ckpt_format not in [\n"
        "            'torch_dist',\n            'fsdp_dtensor',\n        ]:\n"
        "            raise NotImplementedError(\n"
        "                f'Async checkpoint save not implemented for {args.ckpt_format} distributed checkpoint format'\n"
    )
    assert resume_support(tmp_path).async_formats == ("torch_dist", "fsdp_dtensor")


@pytest.mark.mirror
@pytest.mark.skipif(not os.environ.get("ROCMPORT_TEST_MLM_MIRROR"), reason="set ROCMPORT_TEST_MLM_MIRROR")
@pytest.mark.parametrize(
    "ref, formats",
    [
        ("core_v0.15.3", ("torch_dist",)),
        ("core_v0.16.1", ("torch_dist",)),
        ("core_v0.17.1", ("torch_dist", "torch_dcp", "fsdp_dtensor")),
        ("core_v0.19.0", ("torch_dist", "torch_dcp", "fsdp_dtensor")),
    ],
)
def test_the_async_checkpoint_formats_are_read_from_upstreams_save_checkpoint(ref, formats, tmp_path):
    """The formats each line's save_checkpoint writes with --async-save, read from its own guard: what
    decides whether verify's round trip saves a case async (never the legacy torch format)."""
    import subprocess

    from rocmport.verify.stages.functional import resume_support

    path = "megatron/training/checkpointing.py"
    text = subprocess.run(
        ["git", f"--git-dir={os.environ['ROCMPORT_TEST_MLM_MIRROR']}", "show", f"{ref}:{path}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    (tmp_path / "megatron" / "training").mkdir(parents=True)
    (tmp_path / path).write_text(text)
    assert resume_support(tmp_path).async_formats == formats


@pytest.mark.torch
@pytest.mark.slow
def test_async_writer_chosen_on_the_cuda_path_left_to_the_port_on_hip(tmp_path):
    """v0.17+ write async checkpoints through --async-strategy, whose default (nvrx) needs
    nvidia-resiliency-ext: behind the firewall, the CUDA path runs with mcore, said in the report;
    on HIP the port decides (async-save-strategy), so verify adds nothing. A golden's args leave
    the writer out: the losses do not depend on it."""
    tree = make_tree(tmp_path / "tree", FAKE_PRETRAIN)
    (tree / "megatron" / "training" / "async_utils.py").write_text('async_strategy = "nvrx"\n')
    series_dir = tmp_path / "series"
    kwargs = dict(
        case=CASE,
        dp=1,
        iters=4,
        proxy=True,
        data_path=None,
        series_dir=series_dir,
        device_kind=DeviceKind("cpu-proxy"),
        resume=False,
    )
    env = env_for(tmp_path, tree, ROCMPORT_FIREWALL="transformer_engine,nvidia_resiliency_ext")
    cuda, data = stage_functional(tree, env, record=True, **kwargs)
    assert cuda.status == "pass", cuda.reason
    assert "--async-save --use-persistent-ckpt-worker --async-strategy mcore" in data.command
    assert "nvidia-resiliency-ext" in data.chosen_args["--async-strategy mcore"]
    golden = json.loads(golden_path(series_dir, CASE, "cpu-proxy").read_text())
    assert (
        "--async-save" in golden["args"] and "--async-strategy" not in golden["args"] and "mcore" not in golden["args"]
    )
    hip, data = stage_functional(tree, env, record=False, rocm=True, hip=hip_sim.DEFAULT_VERSION, **kwargs)
    assert hip.status == "pass" and "--async-strategy" not in data.command and data.chosen_args == {}
    assert "max relative drift vs golden 0" in hip.reason  # the same golden: compared, not "other args"


@pytest.mark.torch
@pytest.mark.slow
def test_a_legacy_checkpoint_case_is_saved_synchronously(tmp_path):
    """Verify's async save (its persistent worker) is torch_dist's alone: megatron's save_checkpoint refuses
    it for `--ckpt-format torch` ("Async checkpoint save not implemented for legacy checkpoints"; v0.16's
    gpt3_mcore_tp4_pp1_resume_torch and gpt3_mcore_te_tp1_pp4_vp1_resume_torch_decoupled_lr stopped there on
    both trees and were labelled upstream-known). Such a case saves synchronously, resumes from that
    checkpoint, and the reason names its format; the default format's async round trip is
    test_shim_answers_training_loop_and_resume_matches's."""
    tree = make_tree(tmp_path / "tree", SHAPED_PRETRAIN)
    cfg = tree / "tests" / "functional_tests" / "test_cases" / "gpt" / CASE / "model_config.yaml"
    cfg.write_text(CONFIG.replace("MODEL_ARGS:\n", "MODEL_ARGS:\n  --ckpt-format: torch\n", 1))
    res, data = stage_functional(tree, proxy_env(tmp_path, tree), **proxy_case_kwargs())
    assert res.status == "pass", res.reason
    assert "--ckpt-format torch" in data.command and "--async-save" not in data.command
    assert "--use-persistent-ckpt-worker" not in data.command
    assert "persistent checkpoint writer started by fork" not in (data.proxy_env or {})  # no writer to fork
    assert data.resume.loaded_iteration == 3 and data.resume.async_save is False
    assert "resumed from the iteration-3 checkpoint (torch): max |Δ| 0 over iterations 4-6" in res.reason


@pytest.mark.torch
@pytest.mark.slow
def test_the_cuda_path_unsets_the_attention_variable_upstreams_check_refuses_and_says_why(tmp_path):
    """v0.16's weekly FP8 cases set NVTE_FUSED_ATTN=0 in ENV_VARS, which upstream's
    LanguageModule._set_attention_backend refuses under --attention-backend auto: the CUDA control's run
    unsets it (the report's proxy_env says why); on HIP the port's attention-backend-env takes it: it stays."""
    seen = tmp_path / "seen"
    # what upstream's check_and_set_env_variable asserts for auto, then the fake's training log
    check = (
        "import os\n"
        "v = os.environ.get('NVTE_FUSED_ATTN')\n"
        "open(os.environ['FAKE_ATTN_SEEN'], 'a').write(f'{v}\\n')\n"
        "assert os.environ.get('ROCMPORT_HIP_SIM') or v in (None, '1'), "
        "f'NVTE_FUSED_ATTN set to {v}, but expected 1 for attention backend type auto'\n"
    )
    tree = make_tree(tmp_path / "tree", check + FAKE_PRETRAIN)
    cfg = tree / "tests" / "functional_tests" / "test_cases" / "gpt" / CASE / "model_config.yaml"
    cfg.write_text(CONFIG.replace("ENV_VARS:\n", "ENV_VARS:\n  NVTE_FUSED_ATTN: 0\n", 1))
    kwargs = dict(case=CASE, dp=1, iters=3, proxy=True, data_path=None, series_dir=None, record=False, resume=False)
    cuda_env = proxy_env(tmp_path, tree, hip=None, FAKE_ATTN_SEEN=str(seen))
    cuda, data = stage_functional(tree, cuda_env, device_kind="cpu-proxy", **kwargs)
    assert cuda.status == "pass", cuda.reason
    why = data.proxy_env["NVTE_FUSED_ATTN unset (the case's 0)"]
    assert "_set_attention_backend asserts NVTE_FUSED_ATTN unset or 1 under --attention-backend auto" in why
    assert seen.read_text() == "None\n"
    hip_env = proxy_env(tmp_path, tree, FAKE_ATTN_SEEN=str(seen))  # AMD's baked NVTE_FUSED_ATTN=1, the case's 0 over it
    hip, data = stage_functional(
        tree, hip_env, device_kind="cpu-proxy", rocm=True, hip=hip_sim.DEFAULT_VERSION, **kwargs
    )
    assert hip.status == "pass", hip.reason
    assert seen.read_text() == "None\n0\n" and not [k for k in data.proxy_env if "unset" in k]


@pytest.mark.torch
@pytest.mark.slow
def test_an_fsdp_case_runs_without_the_launch_profiles_cuda_device_max_connections_and_says_why(tmp_path):
    """The HIP simulation gives every run the launch profile's CUDA_DEVICE_MAX_CONNECTIONS=1, which
    upstream's validate_args refuses under FSDP: an FSDP case's runs leave it unset (the report's
    proxy_env says why), as upstream's CI launch and the port's launch-env leave it."""
    seen = tmp_path / "seen"
    check = (  # upstream's assertion (arguments.py, v0.16), then the fake's training log
        "import os\n"
        "v = os.environ.get('CUDA_DEVICE_MAX_CONNECTIONS')\n"
        "open(os.environ['FAKE_SEEN_CONNECTIONS'], 'a').write(f'{v}\\n')\n"
        "assert v != '1', 'FSDP always requires CUDA_DEVICE_MAX_CONNECTIONS value large than one'\n"
    )
    tree = make_tree(
        tmp_path / "tree",
        check
        + FAKE_PRETRAIN.replace(
            'assert os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"  # the case\'s ENV_VARS reach the script\n', ""
        ),
    )
    cfg = tree / "tests" / "functional_tests" / "test_cases" / "gpt" / CASE / "model_config.yaml"
    cfg.write_text(
        CONFIG.replace("  CUDA_DEVICE_MAX_CONNECTIONS: 1\n", "").replace(
            "MODEL_ARGS:\n", "MODEL_ARGS:\n  --use-torch-fsdp2: true\n", 1
        )
    )
    kwargs = proxy_case_kwargs(iters=3, resume=False)
    res, data = stage_functional(tree, proxy_env(tmp_path, tree, FAKE_SEEN_CONNECTIONS=str(seen)), **kwargs)
    assert res.status == "pass", res.reason
    assert seen.read_text() == "None\nNone\n"  # both ranks (FSDP shards over dp2)
    why = data.proxy_env["CUDA_DEVICE_MAX_CONNECTIONS unset (it was 1)"]
    assert why.startswith("--use-torch-fsdp2: upstream's validate_args asserts CUDA_DEVICE_MAX_CONNECTIONS is not 1")


def test_stage_4_says_each_training_iteration_as_megatron_logs_it(tmp_path, capsys):
    """A run of minutes is not silent: a line per logged iteration with the elapsed time; the output is
    still captured whole for the loss parser; the time limit still ends the run."""
    import subprocess
    import sys

    from rocmport.verify.stages.functional import _launch

    script = (
        "import sys, time\n"
        "for i in range(1, 4):\n"
        "    print(f' [2026-11-26 01:30:00] iteration {i:8d}/       3 | consumed samples: 8 | lm loss: 1.0E+00 |', flush=True)\n"
        "print('a warning', file=sys.stderr)\n"
    )
    proc = _launch([sys.executable, "-c", script], tmp_path, None, what="resumed from iteration 1")
    assert proc.returncode == 0 and proc.stdout.count("iteration") == 3 and proc.stderr == "a warning\n"
    said = [ln for ln in capsys.readouterr().err.splitlines() if "stage 4" in ln]
    assert [ln.split(",")[0] for ln in said] == [
        f"stage 4 resumed from iteration 1: iteration {i}/3" for i in (1, 2, 3)
    ]
    with pytest.raises(subprocess.TimeoutExpired):
        _launch([sys.executable, "-c", "import time; time.sleep(30)"], tmp_path, None, timeout=1)


def test_a_case_the_proxy_cannot_run_is_unsupported_with_its_plans_reason_before_any_launch(tmp_path):
    """The case's own plan decides (case_plan): a CUDA-graph case is gpu-only, said before a rank starts."""
    tree = make_tree(tmp_path / "tree", "raise SystemExit('pretrain_gpt.py must not start')\n")
    cfg = tree / "tests" / "functional_tests" / "test_cases" / "gpt" / CASE / "model_config.yaml"
    cfg.write_text(CONFIG.replace("MODEL_ARGS:\n", "MODEL_ARGS:\n  --enable-cuda-graph: true\n", 1))
    kwargs = dict(dp=1, iters=3, data_path=None, series_dir=None, record=False, device_kind="cpu-proxy")
    res, data = stage_functional(tree, {}, case=CASE, proxy=True, **kwargs)
    assert res.status == "unsupported-in-proxy" and data is None
    assert res.reason == f"{CASE} (gpu-only): --enable-cuda-graph: CUDA graph capture", res.reason


def test_the_ranks_and_the_model_size_follow_the_cases_plan(tmp_path):
    import yaml

    from rocmport.verify.stages import case_plan
    from rocmport.verify.stages.functional import world_size

    config = yaml.safe_load(CONFIG)
    margs = config["MODEL_ARGS"]
    margs.update(
        {
            "--tensor-model-parallel-size": 1,
            "--pipeline-model-parallel-size": 4,
            "--decoder-first-pipeline-num-layers": 2,
            "--decoder-last-pipeline-num-layers": 2,
            "--use-distributed-optimizer": True,
        }
    )
    plan = case_plan.plan_case("c", config)
    assert isinstance(plan, case_plan.CasePlan)
    assert world_size(config, 1, plan) == 8  # pp4 × dp2 (the distributed optimizer shards over 2), not tp·pp·--dp
    assert world_size(config, 1, None) == 4  # on a GPU: the case's tp·pp·--dp, as before
    args = build_args(config, iters=4, proxy=True, data_path=None, work=tmp_path, plan=plan)
    pairs = dict(zip(args, args[1:]))
    # The proxy's old fixed 4 layers left pp4's middle stages none; the plan keeps 1:2:2:1.
    assert (pairs["--num-layers"], pairs["--decoder-first-pipeline-num-layers"]) == ("6", "1")
    assert pairs["--global-batch-size"] == "16"  # micro 2 × dp 2 × 4 micro-batches


def test_a_failures_reason_is_the_exception_not_its_source_line():
    from rocmport.verify.stages.functional import exception_line

    stderr = textwrap.dedent("""\
        [rank0]: Traceback (most recent call last):
        [rank0]:   File "megatron/core/transformer/transformer_block.py", line 80, in get_num_layers_to_build
        [rank0]:     raise ValueError(
        [rank0]: ValueError: 0 middle layers remaining but 2 middle PP stages available
        torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
        """)
    assert exception_line(stderr) == "ValueError: 0 middle layers remaining but 2 middle PP stages available"
    assert exception_line("all good\n") is None


# An FP8 case's pretrain_gpt.py: megatron's validate_args runs the port's fp8-arch-check first (the
# tree's generated helper, megatron/core/_rocm.py, where the port wrote it), then it trains.
FP8_PRETRAIN = (
    textwrap.dedent("""\
    import sys
    from types import SimpleNamespace

    argv = sys.argv[1:]


    def value(flag):
        return argv[argv.index(flag) + 1] if flag in argv else None


    try:
        from megatron.core._rocm import check_fp8_for_arch
    except ImportError:  # the unported tree: no such check
        check_fp8_for_arch = None
    if check_fp8_for_arch is not None:
        check_fp8_for_arch(SimpleNamespace(fp8=value("--fp8-format"), fp8_recipe=value("--fp8-recipe") or "delayed"))
    """)
    + FAKE_PRETRAIN
)


def fp8_tree(root: Path, recipe: str, ported: bool) -> Path:
    from rocmport.codemods.runner import helper_text

    tree = make_tree(root, FP8_PRETRAIN)
    cfg = tree / "tests" / "functional_tests" / "test_cases" / "gpt" / CASE / "model_config.yaml"
    cfg.write_text(
        CONFIG.replace("MODEL_ARGS:\n", f"MODEL_ARGS:\n  --fp8-format: hybrid\n  --fp8-recipe: {recipe}\n", 1)
    )
    if ported:
        (tree / "megatron" / "core" / "_rocm.py").write_text(helper_text(["fp8-arch-check"]))
    return tree


@pytest.mark.torch
@pytest.mark.slow
def test_an_fp8_recipe_the_gpu_cannot_run_passes_when_argument_validation_refuses_it(tmp_path):
    """MXFP8 on a simulated gfx942: the port's own check (its generated helper under the HIP simulation
    and the shim) refuses it before any iteration, naming the arch and the recipe: the stage passes
    saying so. The unported tree, which has no such check, trains: the stage fails."""
    from rocmport.verify.stages.case_plan import ProxyTE

    te = ProxyTE("rocm", "fnuz", "gfx942")
    kwargs = dict(case=CASE, dp=1, iters=4, proxy=True, data_path=None, series_dir=None, record=False)
    kwargs.update(device_kind=DeviceKind("cpu-proxy"), te=te, hip=hip_sim.DEFAULT_VERSION)
    tree = fp8_tree(tmp_path / "port", "mxfp8", ported=True)
    res, data = stage_functional(tree, proxy_env(tmp_path / "p", tree), **kwargs)
    assert res.status == "pass", res.reason
    assert "refused in argument validation as planned (mxfp8 on gfx942, the port's fp8-arch-check)" in res.reason
    assert data.fp8["refused"].startswith("--fp8-format hybrid --fp8-recipe mxfp8: gfx942 cannot run the mxfp8 recipe")
    assert data.losses == [] and data.resume is None  # nothing trained, nothing resumed
    unported = fp8_tree(tmp_path / "unported", "mxfp8", ported=False)
    res, _ = stage_functional(unported, proxy_env(tmp_path / "u", unported), **kwargs)
    assert res.status == "fail" and "argument validation must refuse it" in res.reason and "it trained" in res.reason


@pytest.mark.torch
@pytest.mark.slow
def test_an_fp8_case_whose_run_made_no_fp8_cast_fails(tmp_path):
    """Delayed scaling on gfx942 passes the port's check and trains; a run in which no cast reached TE's
    FP8 kernels (here a script without TE) is not an FP8 pass."""
    from rocmport.verify.stages.case_plan import ProxyTE

    tree = fp8_tree(tmp_path / "port", "delayed", ported=True)
    kwargs = dict(case=CASE, dp=1, iters=4, proxy=True, data_path=None, series_dir=None, record=False, resume=False)
    kwargs.update(
        device_kind=DeviceKind("cpu-proxy"), te=ProxyTE("rocm", "fnuz", "gfx942"), hip=hip_sim.DEFAULT_VERSION
    )
    res, data = stage_functional(tree, proxy_env(tmp_path / "p", tree), **kwargs)
    assert res.status == "fail" and "no FP8 cast ran (the FP8 path was not taken)" in res.reason, res.reason
    assert data.fp8 == {"format": "hybrid", "recipe": "delayed", "encoding": "fnuz", "device": "gfx942", "casts": {}}
