"""Megatron-Bridge companions from a local mirror: each line's series codemods leave no unguarded
NVIDIA-only import (TE included) in src/, and, where this Python can run the line, the ported
`import megatron.bridge` works behind the cpu-proxy firewall with the matching Megatron-LM port."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rocmport.codemods import compute_layers
from rocmport.nvidia_only import scan_unguarded_imports
from rocmport.patches.series import select_series
from rocmport.verify.orchestration.firewall import firewall_env, write_bootstrap
from tests.helpers.real import BRIDGE, MLM, REPO, needs_mirrors

pytestmark = [pytest.mark.mirror, needs_mirrors]

# Bridge release -> can this Python (3.11) import it? v0.4+ declare Python >=3.12.
LINES = {"v0.2.2": True, "v0.3.1": True, "v0.4.2": False, "v0.5.1": False, "v0.6.0": False}


def archive(mirror: str, tag: str, dest: Path, *paths: str) -> Path:
    dest.mkdir(parents=True)
    data = subprocess.run(["git", "-C", mirror, "archive", tag, *paths], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=data, check=True)
    return dest


def port(tree: Path, upstream: str, version: str, cache: Path) -> dict:
    series = select_series(REPO / "patchsets", upstream, version)
    result = compute_layers(tree, series.codemods, cache_dir=cache)
    assert result.failures == []
    for layer in result.layers:
        for rel, text in layer.files.items():
            (tree / rel).parent.mkdir(parents=True, exist_ok=True)
            (tree / rel).write_text(text)
    return {layer.name: sum(layer.sites.values()) for layer in result.layers}


@pytest.mark.parametrize("tag", list(LINES))
def test_bridge_line(tmp_path, tag, capsys):
    importable = LINES[tag]
    bridge = archive(BRIDGE, tag, tmp_path / "bridge", "src", "pyproject.toml")
    version = tag.lstrip("v")
    start = time.monotonic()
    sites = port(bridge, "megatron-bridge", version, tmp_path / "cache")
    seconds = time.monotonic() - start
    leftovers = [x for x in scan_unguarded_imports(bridge / "src", "rocm")]
    te_left = [x for x in scan_unguarded_imports(bridge / "src", "cpu-proxy") if x[2].startswith("transformer_engine")]
    assert leftovers == [] and te_left == [], (leftovers, te_left)
    note = "import not checked (needs Python 3.12)"
    # Bridge's ordinary (non-NVIDIA) dependencies for these imports.
    deps = all(importlib.util.find_spec(m) for m in ("transformers", "omegaconf", "datasets", "tensorboard"))
    if importable and deps:
        # The Megatron-LM commit this Bridge release gitlinks, ported with its own series.
        from rocmport.upstream.companion import gitlink
        from rocmport.upstream.refs import version_at

        mlm_commit = gitlink(Path(BRIDGE), tag)
        mlm = archive(MLM, mlm_commit, tmp_path / "mlm", "megatron")
        port(mlm, "megatron-lm", version_at(Path(MLM), mlm_commit, "megatron-lm"), tmp_path / "cache")
        boot = write_bootstrap(tmp_path / "boot")
        env = {
            **os.environ,
            **firewall_env("cpu-proxy"),
            "PYTHONPATH": os.pathsep.join(map(str, (boot, bridge / "src", mlm))),
        }
        proc = subprocess.run(
            [
                sys.executable,
                "-W",
                "ignore",
                "-c",
                "import megatron.bridge, megatron.bridge.peft.lora, megatron.bridge.models.gpt_provider, "
                "megatron.bridge.training.pretrain, megatron.bridge.training.gpt_step, megatron.bridge.training.train, "
                "megatron.bridge.training.checkpointing, megatron.bridge.training.post_training.distillation",
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert all(importlib.util.find_spec(m) is None for m in ("transformer_engine", "modelopt"))
        note = "megatron.bridge, peft.lora, models.gpt_provider and the training modules import behind the cpu-proxy firewall"
    elif importable:
        note = "import not checked (install transformers, omegaconf, datasets, tensorboard)"
    with capsys.disabled():
        print(
            f"\nBridge {tag}: codemods {sites} in {seconds:.2f}s; unguarded NVIDIA-only/TE imports in src/: 0; {note}"
        )
