"""verify's Megatron-Bridge stage on Bridge-shaped fixture trees (the real one runs in CI's main job
and in tests/test_apply_mirror.py)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from rocmport.verify import environment, firewall
from rocmport.verify.bridge_stage import bridge_env, stage_bridge


def _bridge_tree(root: Path, init: str, pyproject: str = '[project]\nname = "megatron-bridge"\n') -> Path:
    tree = root / "megatron-bridge"
    pkg = tree / "src" / "megatron" / "bridge"
    (pkg / "models").mkdir(parents=True)
    (tree / "pyproject.toml").write_text(pyproject)
    (tree / "src" / "megatron" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text(init)
    (pkg / "models" / "__init__.py").write_text("")
    (pkg / "models" / "gpt_provider.py").write_text("import megatron.bridge\n")
    return tree


def _env(tmp: Path, mlm: Path) -> dict:
    extra = {"ROCMPORT_BACKEND": "gloo", "ROCMPORT_PROXY": "1", **firewall.firewall_env("cpu-proxy")}
    return environment.child_env(mlm, firewall.write_bootstrap(tmp), extra)


def test_nvidia_only_import_in_bridge_fails_the_stage(tmp_path):
    mlm = tmp_path / "megatron-lm"
    (mlm / "megatron").mkdir(parents=True)
    tree = _bridge_tree(tmp_path, "import modelopt.torch.opt  # an unguarded NVIDIA-only import\n")
    result, training = stage_bridge(tree, _env(tmp_path, mlm), 1, 1, 1, 2)
    assert result.status == "fail" and training == {}
    assert result.reason.startswith("megatron.bridge: ModuleNotFoundError") and "(missing: modelopt" in result.reason
    assert result.details["modules"] == ["megatron.bridge", "megatron.bridge.models.gpt_provider"]


def test_bridge_needing_a_newer_python_is_skipped(tmp_path):
    mlm = tmp_path / "megatron-lm"
    (mlm / "megatron").mkdir(parents=True)
    tree = _bridge_tree(tmp_path, "", '[project]\nname = "megatron-bridge"\nrequires-python = ">=3.99"\n')
    result, _ = stage_bridge(tree, _env(tmp_path, mlm), 1, 1, 1, 2)
    assert result.status == "skipped" and ">=3.99" in result.reason and sys.version.split()[0] in result.reason


def test_bridge_src_goes_after_the_firewall_and_before_the_megatron_lm_tree(tmp_path):
    mlm = tmp_path / "megatron-lm"
    env = bridge_env(_env(tmp_path, mlm), tmp_path / "megatron-bridge")
    parts = env["PYTHONPATH"].split(os.pathsep)
    assert parts[1:3] == [str(tmp_path / "megatron-bridge" / "src"), str(mlm)]


def test_bridge_training_entry_point_is_imported_behind_the_firewall(tmp_path):
    """A tree that has Bridge's training entry point gets it imported too: an NVIDIA-only import
    there fails the stage, named by module."""
    mlm = tmp_path / "megatron-lm"
    (mlm / "megatron").mkdir(parents=True)
    tree = _bridge_tree(tmp_path, "")
    training = tree / "src" / "megatron" / "bridge" / "training"
    training.mkdir()
    (training / "__init__.py").write_text("")
    (training / "pretrain.py").write_text("import modelopt.torch.opt  # an unguarded NVIDIA-only import\n")
    result, training_data = stage_bridge(tree, _env(tmp_path, mlm), 1, 1, 1, 2)
    assert result.status == "fail" and training_data == {}
    assert result.details["modules"] == ["megatron.bridge", "megatron.bridge.models.gpt_provider", "megatron.bridge.training.pretrain"]
    assert list(result.details["failures"]) == ["megatron.bridge.training.pretrain"]
    assert result.reason.startswith("megatron.bridge.training.pretrain: ModuleNotFoundError") and "(missing: modelopt" in result.reason


def test_import_failure_from_a_dependency_outside_bridge_s_declared_range_says_environment(tmp_path):
    """Bridge v0.5 declares transformers>=5.8.1,<5.9 and imports a module transformers 5.24 removed: the
    stage fails (it cannot pass on a broken environment) and says the environment is at fault, with the
    pip command; a declared range this interpreter meets, or a failure in another package, is not blamed."""
    from importlib import metadata

    mlm = tmp_path / "megatron-lm"
    (mlm / "megatron").mkdir(parents=True)
    installed = metadata.version("PyYAML")
    pyproject = ('[project]\nname = "megatron-bridge"\n'
                 'dependencies = ["pyyaml<1.0", "click>=1", "torch<0.1", "megatron-core>=99", "nosuchdist-rocmport>=1"]\n')
    tree = _bridge_tree(tmp_path, "import yaml.modeling_attn_mask_utils  # gone from the installed release\n", pyproject)
    result, _ = stage_bridge(tree, _env(tmp_path, mlm), 1, 1, 1, 2)
    assert result.status == "fail"
    assert result.reason.startswith("megatron.bridge: ModuleNotFoundError") and "(missing: yaml.modeling_attn_mask_utils)" in result.reason
    assert f"an environment problem: pyyaml {installed} is installed, Megatron-Bridge declares pyyaml<1.0 (pyproject.toml)" in result.reason
    assert result.reason.endswith(f"`{sys.executable} -m pip install 'pyyaml<1.0'`")
    # click is within its range; torch and megatron-core are verify's own business; the absent one is the probe's.
    assert result.details["declared_unmet"] == {"pyyaml": {"installed": installed, "declared": "pyyaml<1.0"}}

    other = _bridge_tree(tmp_path / "other", "import modelopt.torch.opt  # an unguarded NVIDIA-only import\n", pyproject)
    result, _ = stage_bridge(other, _env(tmp_path, mlm), 1, 1, 1, 2)
    assert result.status == "fail" and "environment problem" not in result.reason and "(missing: modelopt" in result.reason
