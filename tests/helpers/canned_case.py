"""The canned upstream GPT case stage 4's tests build their trees with (tests/test_functional_stage.py,
tests/test_functional_cases.py, tests/test_rank_server.py): one model_config.yaml and one set of
arguments for running it on the CPU proxy, so the modules cannot drift apart."""

from __future__ import annotations

import textwrap
from typing import Any

CASE = "gpt3_mcore_tp1_pp1_uninstall_te"
# Shaped like upstream's gpt3_mcore_tp2_pp2_uninstall_te/model_config.yaml (abridged). Variants add
# a line after "MODEL_ARGS:\n" or "ENV_VARS:\n" (CONFIG.replace(..., 1)).
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


def proxy_case_kwargs(**overrides: Any) -> dict[str, Any]:
    """run_case / stage_functional's arguments for CASE on the CPU proxy with the HIP simulation:
    one data-parallel rank, six iterations (a resume from iteration 3), no golden read or written."""
    from rocmport.verify.orchestration.device_kind import DeviceKind
    from rocmport.verify.runtime import hip_sim

    return {
        "case": CASE,
        "dp": 1,
        "iters": 6,
        "proxy": True,
        "data_path": None,
        "series_dir": None,
        "record": False,
        "device_kind": DeviceKind("cpu-proxy"),
        "hip": hip_sim.DEFAULT_VERSION,
        **overrides,
    }
