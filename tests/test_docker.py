"""`rocmport emit docker`: the recipe's content, and a real Dockerfile linter (hadolint) on it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from rocmport.cli import main
from rocmport.package.docker import dockerfile, remaining_requirements
from rocmport.port.manifests import Policy, rewrite_tree
from tests.helpers.manifests import BRIDGE_PYPROJECT, MLM_PYPROJECT
from tests.helpers.patches import Project

HADOLINT = Path(sys.executable).with_name("hadolint")


def _trees(tmp_path: Path) -> list[Path]:
    trees = []
    for name, text in (("megatron-lm", MLM_PYPROJECT), ("megatron-bridge", BRIDGE_PYPROJECT)):
        tree = tmp_path / name
        tree.mkdir()
        (tree / "pyproject.toml").write_text(text)
        texts, _ = rewrite_tree(tree, Policy())
        (tree / "pyproject.toml").write_text(texts["pyproject.toml"])
        trees.append(tree)
    return trees


def test_remaining_requirements_merge_bounds_and_skip_torch_and_the_wheels(tmp_path):
    reqs = remaining_requirements(_trees(tmp_path), {"megatron-core": ["mlm"]})
    names = [re.split(r"[<>=~!\[ ]", r)[0] for r in reqs]
    assert "torch" not in names and "megatron-core" not in names and "transformer-engine" not in names
    assert "transformers<5.0.0" in reqs  # megatron-core's mlm extra (unbounded) and Bridge's bound, merged
    assert {"numpy", "packaging>=24.2", "flask-restful", "sentencepiece"} <= set(reqs)
    assert "tqdm" not in names  # the dev extra was not asked for


def _lint(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(HADOLINT), "--no-color", str(path)], capture_output=True, text=True)


def test_dockerfile_content_and_hadolint(tmp_path):
    text = dockerfile(remaining_requirements(_trees(tmp_path), {"megatron-core": ["mlm"]}), base_tag="rocm7.0_test", arch="gfx942")
    assert "ARG ROCM_PYTORCH_TAG=rocm7.0_test\nFROM rocm/pytorch:${ROCM_PYTORCH_TAG}\n" in text
    assert 'ARG PYTORCH_ROCM_ARCH="gfx942"' in text and "PYTORCH_ROCM_ARCH=${PYTORCH_ROCM_ARCH}" in text
    for pair in ("NVTE_FLASH_ATTN=0", "NVTE_FUSED_ATTN=1", "CUDA_DEVICE_MAX_CONNECTIONS=1", "HSA_NO_SCRATCH_RECLAIM=1"):
        assert f"    {pair}" in text
    assert "pip install --no-cache-dir --no-deps /tmp/rocmport-wheels/*.whl" in text
    # Never a pip install that could touch torch without the image's torch pinned.
    for run in re.findall(r"^RUN pip install[^\n]*(?:\\\n[^\n]*)*", text, re.M):
        assert "--no-deps" in run or "--constraint /opt/rocmport/torch-constraint.txt" in run
    assert '"torch' not in text
    path = tmp_path / "Dockerfile"
    path.write_text(text)
    proc = _lint(path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # The linter is real: the same file with a pip cache, or with a `cd` in RUN, fails.
    for bad in (text.replace("pip install --no-cache-dir --constraint", "pip install --constraint"),
                text.replace("RUN pip install --no-cache-dir --no-deps", "RUN cd /tmp && pip install --no-cache-dir --no-deps")):
        assert bad != text
        path.write_text(bad)
        assert _lint(path).returncode != 0


def test_emit_docker_command(tmp_path, monkeypatch, capsys):
    proj = Project(tmp_path, monkeypatch)
    assert main(["-C", str(proj.root), "emit", "docker"]) == 2  # nothing applied yet
    assert main(["-C", str(proj.root), "apply"]) == 0
    capsys.readouterr()
    assert main(["-C", str(proj.root), "emit", "docker", "--arch", "gfx950"]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("# syntax=docker/dockerfile:1") and 'ARG PYTORCH_ROCM_ARCH="gfx950"' in printed
    out = tmp_path / "Dockerfile.rocm"
    assert main(["-C", str(proj.root), "emit", "docker", "-o", str(out), "--extra", "nonsense"]) == 2
    assert main(["-C", str(proj.root), "emit", "docker", "-o", str(out)]) == 0
    assert _lint(out).returncode == 0
