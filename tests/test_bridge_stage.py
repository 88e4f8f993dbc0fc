"""verify's Megatron-Bridge stage on Bridge-shaped fixture trees (the real one runs in CI's main job
and in tests/test_apply_mirror.py)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from rocmport.verify.orchestration import environment
from rocmport.verify.orchestration import firewall
from rocmport.verify.stages.bridge import bridge_env, stage_bridge


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
    assert result.status == "fail" and training is None
    assert result.reason.startswith("megatron.bridge: ModuleNotFoundError") and "(missing: modelopt" in result.reason
    assert result.details.modules == ["megatron.bridge", "megatron.bridge.models.gpt_provider"]


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
    assert result.status == "fail" and training_data is None
    assert result.details.modules == [
        "megatron.bridge",
        "megatron.bridge.models.gpt_provider",
        "megatron.bridge.training.pretrain",
    ]
    assert list(result.details.failures) == ["megatron.bridge.training.pretrain"]
    assert (
        result.reason.startswith("megatron.bridge.training.pretrain: ModuleNotFoundError")
        and "(missing: modelopt" in result.reason
    )


def test_import_failure_from_a_dependency_outside_bridge_s_declared_range_says_environment(tmp_path):
    """Bridge v0.5 declares transformers>=5.8.1,<5.9 and imports a module transformers 5.24 removed: the
    stage fails (it cannot pass on a broken environment) and says the environment is at fault, with the
    pip command; a declared range this interpreter meets, or a failure in another package, is not blamed."""
    from importlib import metadata

    mlm = tmp_path / "megatron-lm"
    (mlm / "megatron").mkdir(parents=True)
    installed = metadata.version("PyYAML")
    pyproject = (
        '[project]\nname = "megatron-bridge"\n'
        'dependencies = ["pyyaml<1.0", "click>=1", "torch<0.1", "megatron-core>=99", "nosuchdist-rocmport>=1"]\n'
    )
    tree = _bridge_tree(
        tmp_path, "import yaml.modeling_attn_mask_utils  # gone from the installed release\n", pyproject
    )
    result, _ = stage_bridge(tree, _env(tmp_path, mlm), 1, 1, 1, 2)
    assert result.status == "fail"
    assert (
        result.reason.startswith("megatron.bridge: ModuleNotFoundError")
        and "(missing: yaml.modeling_attn_mask_utils)" in result.reason
    )
    assert (
        f"an environment problem: pyyaml {installed} is installed, Megatron-Bridge declares pyyaml<1.0 (pyproject.toml)"
        in result.reason
    )
    assert result.reason.endswith(f"`{sys.executable} -m pip install 'pyyaml<1.0'`")
    # click is within its range; torch and megatron-core are verify's own business; the absent one is the probe's.
    assert result.details.declared_unmet == {"pyyaml": {"installed": installed, "declared": "pyyaml<1.0"}}

    other = _bridge_tree(
        tmp_path / "other", "import modelopt.torch.opt  # an unguarded NVIDIA-only import\n", pyproject
    )
    result, _ = stage_bridge(other, _env(tmp_path, mlm), 1, 1, 1, 2)
    assert (
        result.status == "fail" and "environment problem" not in result.reason and "(missing: modelopt" in result.reason
    )


def test_the_readme_s_python_3_12_block_installs_the_pins_stage_5_suggests():
    """One source (BRIDGE_PINS): the 3.12 block of docs/install.md (once the README's) runs as written for Bridge v0.5+, and its pin
    is what stage 5 suggests (v0.19: the README said >=5.8.1,<5.9, stage 5 <=5.12.1,>=5.8)."""
    import re

    from rocmport.verify.stages.bridge import BRIDGE_PINS

    readme = (Path(__file__).resolve().parents[1] / "docs" / "install.md").read_text(encoding="utf-8")
    section = readme.split("## Python 3.12 for v0.17 and later", 1)[1].split("\n## ", 1)[0]
    block = section.split("```sh\n", 1)[1].split("```", 1)[0]
    pins = [line for line in block.splitlines() if "transformers" in line]
    assert len(pins) == 1 and tuple(re.findall(r"'([^']+)'", pins[0].split("#")[0])) == BRIDGE_PINS
    assert block.index("transformers") < block.index("rocmport verify")  # installed before verify runs
    assert all(f"'{p}'" in section.split("```", 2)[2] for p in BRIDGE_PINS)  # the prose below says the same


def test_stage_5_suggests_the_readme_s_pin_when_bridge_s_declared_range_admits_it(tmp_path):
    """v0.19's Bridge declares transformers>=5.8,<=5.12.1; with a transformers outside it the stage says
    the environment is at fault and gives the README's command; a range the pin is outside of
    (Bridge v0.3's <5) gets its own declared range."""
    import pytest
    from importlib import metadata

    from packaging.specifiers import SpecifierSet

    from rocmport.verify.stages.bridge import BRIDGE_PINS

    try:
        installed = metadata.version("transformers")
    except metadata.PackageNotFoundError:
        pytest.skip("transformers is not installed (the [bridge] extra)")
    if SpecifierSet(">=5.8,<=5.12.1").contains(installed):
        pytest.skip(f"transformers {installed} is inside v0.19's range: nothing to blame")
    mlm = tmp_path / "megatron-lm"
    (mlm / "megatron").mkdir(parents=True)
    gone = "import transformers.rocmport_gone_module  # as Bridge imports a module a newer transformers removed\n"
    for declared, wanted in (
        ("transformers>=5.8,<=5.12.1", " ".join(f"'{p}'" for p in BRIDGE_PINS)),
        ("transformers<5", "'transformers<5'"),
    ):
        tree = _bridge_tree(
            tmp_path / declared.replace("<", "lt").replace(">", "gt").replace(",", "_").replace("=", "e"),
            gone,
            f'[project]\nname = "megatron-bridge"\ndependencies = ["{declared}"]\n',
        )
        result, _ = stage_bridge(tree, _env(tmp_path, mlm), 1, 1, 1, 2)
        assert (
            result.status == "fail"
            and f"an environment problem: transformers {installed} is installed" in result.reason
        ), result.reason
        assert f"-m pip install {wanted}`" in result.reason
        assert ("the README's pin" in result.reason) == (declared != "transformers<5")
