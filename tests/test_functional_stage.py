"""verify stage 4: upstream's functional GPT case turned into a pretrain_gpt.py command line, run
under torchrun, its losses parsed from Megatron's log, goldens recorded and compared, and a CPU
blocker reported as unsupported-in-proxy with its upstream site."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from rocmport.verify import environment
from rocmport.verify.functional import build_args, default_case, golden_path, parse_losses, stage_functional

CASE = "gpt3_mcore_tp1_pp1_uninstall_te"
# Shaped like upstream's gpt3_mcore_tp2_pp2_uninstall_te/model_config.yaml (abridged).
CONFIG = textwrap.dedent("""\
    ENV_VARS:
      CUDA_DEVICE_MAX_CONNECTIONS: 1
      NVTE_ALLOW_NONDETERMINISTIC_ALGO: 0
    MODEL_ARGS:
      --num-layers: 12
      --hidden-size: 512
      --num-attention-heads: 8
      --micro-batch-size: 4
      --global-batch-size: 32
      --seq-length: 1024
      --max-position-embeddings: 1024
      --train-iters: 50
      --tensorboard-dir: ${TENSORBOARD_PATH}
      --save: ${CHECKPOINT_SAVE_PATH}
      --load: ${CHECKPOINT_LOAD_PATH}
      --data-path: ${DATA_PATH}/my-gpt3_00_text_document
      --vocab-file: ${DATA_PATH}/bpe/vocab.json
      --merge-file: ${DATA_PATH}/bpe/merges.txt
      --split: 949,50,1
      --distributed-backend: nccl
      --eval-interval: 1000
      --transformer-impl: local
      --tensor-model-parallel-size: 1
      --pipeline-model-parallel-size: 1
      --no-gradient-accumulation-fusion: true
      --fp16: true
      --use-mcore-models: true
    """)

# Prints Megatron's training log line for each iteration; FAKE_SHIFT moves the curve.
FAKE_PRETRAIN = textwrap.dedent("""\
    import os, sys
    iters = int(sys.argv[sys.argv.index("--train-iters") + 1])
    shift = float(os.environ.get("FAKE_SHIFT", "0"))
    assert os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"  # the case's ENV_VARS reach the script
    for i in range(1, iters + 1):
        print(f" [2026-11-23 07:00:0{i % 10}] iteration {i:8d}/{iters:8d} | consumed samples: {8 * i:10d} | "
              f"elapsed time per iteration (ms): 12.3 | learning rate: 1.5E-04 | global batch size:     8 | "
              f"lm loss: {10.9 - 0.25 * i + shift:.6E} | loss scale: 1.0 | grad norm: 3.1 |", flush=True)
    """)

BLOCKED_PRETRAIN = "from megatron.training.initialize import initialize_megatron\ninitialize_megatron()\n"
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
    return root


def env_for(tmp_path: Path, tree: Path, **extra) -> dict:
    (tmp_path / "boot").mkdir(exist_ok=True)
    return environment.child_env(tree, tmp_path / "boot", extra)


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
    assert pairs["--data-path"] == "/data/gpt3/my-gpt3_00_text_document" and "--mock-data" not in real and "--fp16" in real
    assert pairs["--num-layers"] == "12" and pairs["--distributed-backend"] == "nccl"


def test_parse_losses_and_default_case():
    log = ("iteration        2/      50 | consumed samples: 64 | lm loss: 1.073209E+01 | loss scale: 4096.0 |\n"
           "noise\n iteration        1/      50 | consumed samples: 32 | lm loss: 1.092717E+01 |\n"
           " iteration        3/      50 | consumed samples: 96 | skipped iterations:   1 |\n")
    assert parse_losses(log) == [10.92717, 10.73209]
    assert default_case(2, 2, te_present=False) == "gpt3_mcore_tp2_pp2_uninstall_te"
    assert default_case(2, 2, te_present=True) == "gpt3_mcore_te_tp2_pp2"


@pytest.mark.torch
@pytest.mark.slow
def test_functional_case_runs_records_and_compares_golden(tmp_path):
    tree = make_tree(tmp_path / "tree", FAKE_PRETRAIN)
    series_dir = tmp_path / "series"
    kwargs = dict(case=CASE, dp=1, iters=4, proxy=True, data_path=None, series_dir=series_dir, device_kind="cpu-proxy")
    res, data = stage_functional(tree, env_for(tmp_path, tree), record=True, **kwargs)
    assert res.status == "pass", res.reason
    assert data["losses"] == [10.65, 10.4, 10.15, 9.9]
    golden = golden_path(series_dir, CASE, "cpu-proxy")
    assert json.loads(golden.read_text())["losses"] == data["losses"] and "golden recorded" in res.reason
    same, _ = stage_functional(tree, env_for(tmp_path, tree), record=False, **kwargs)
    assert same.status == "pass" and "max relative drift vs golden 0" in same.reason
    drifted, data = stage_functional(tree, env_for(tmp_path, tree, FAKE_SHIFT="0.5"), record=False, **kwargs)
    assert drifted.status == "fail" and data["golden"]["max_rel_drift"] > 0.04
    other, _ = stage_functional(tree, env_for(tmp_path, tree), record=False, **{**kwargs, "device_kind": "rocm-amd-instinct-mi300x"})
    assert other.status == "pass" and "no golden for this device kind" in other.reason


def test_upstream_a100_golden_side_by_side(tmp_path):
    from rocmport.verify.functional import upstream_golden

    cdir = tmp_path / "case"
    cdir.mkdir()
    assert upstream_golden(cdir, [1.0]) is None
    (cdir / "golden_values_dev_dgx_a100.json").write_text(json.dumps(
        {"lm loss": {"start_step": 1, "end_step": 50, "step_interval": 5, "values": {"1": 10.92717, "5": 10.92928, "10": 10.91616}}}))
    ref = upstream_golden(cdir, [10.9, 10.8, 10.7, 10.6, 10.5, 10.4])
    assert [s["step"] for s in ref["steps"]] == [1, 5] and ref["steps"][1] == {"step": 5, "a100": 10.92928, "here": 10.5}
    assert ref["summary"] == "step 1: 10.9272 vs 10.9000, step 5: 10.9293 vs 10.5000"


@pytest.mark.torch
@pytest.mark.slow
def test_cpu_blocker_is_unsupported_in_proxy_with_site(tmp_path):
    tree = make_tree(tmp_path / "tree", BLOCKED_PRETRAIN)
    kwargs = dict(case=CASE, dp=1, iters=3, data_path=None, series_dir=None, record=False, device_kind="cpu-proxy")
    res, _ = stage_functional(tree, env_for(tmp_path, tree), proxy=True, **kwargs)
    assert res.status == "unsupported-in-proxy"
    assert res.reason.endswith("AssertionError: Megatron requires CUDA. at megatron/training/initialize.py:7 (initialize_megatron)")
    # On a GPU machine the same exit is a failure, never excused.
    res, _ = stage_functional(tree, env_for(tmp_path, tree), proxy=False, **kwargs)
    assert res.status == "fail" and "Megatron requires CUDA" in res.reason


def test_missing_case(tmp_path):
    tree = make_tree(tmp_path / "tree", FAKE_PRETRAIN)
    kwargs = dict(dp=1, iters=3, proxy=True, data_path=None, series_dir=None, record=False, device_kind="cpu-proxy")
    res, _ = stage_functional(tree, {}, case="gpt3_mcore_tp8_pp8_uninstall_te", defaulted=True, **kwargs)
    assert res.status == "skipped" and CASE in res.reason and "--case" in res.reason
    res, _ = stage_functional(tree, {}, case="gpt3_typo", **kwargs)
    assert res.status == "fail"
