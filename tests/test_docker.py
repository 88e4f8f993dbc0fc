"""`rocmport emit docker`: the recipe's content, and a real Dockerfile linter (hadolint) on it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rocmport.cli import main
from rocmport.errors import BadInput
from rocmport.package.docker import Sdist, check_python, dockerfile, remaining_requirements, tag_python
from rocmport import components
from rocmport.patches.series import load_series
from rocmport.port.manifests import Policy, rewrite_tree
from tests.helpers.manifests import BRIDGE_PYPROJECT, MLM_PYPROJECT
from tests.helpers.patches import Project

HADOLINT = Path(sys.executable).with_name("hadolint")
PATCHSETS = Path(__file__).resolve().parents[1] / "patchsets"
LINES = ("v0.15", "v0.16", "v0.17", "v0.18", "v0.19")


def _trees(tmp_path: Path) -> list[Path]:
    trees = []
    for name, text in (("megatron-lm", MLM_PYPROJECT), ("megatron-bridge", BRIDGE_PYPROJECT)):
        tree = tmp_path / name
        tree.mkdir(parents=True)
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
    text = dockerfile(
        remaining_requirements(_trees(tmp_path), {"megatron-core": ["mlm"]}), base_tag="rocm7.0_test", arch="gfx942"
    )
    assert "ARG ROCM_PYTORCH_TAG=rocm7.0_test\n" in text and "\nFROM rocm/pytorch:${ROCM_PYTORCH_TAG} AS base\n" in text
    assert 'ARG PYTORCH_ROCM_ARCH="gfx942"' in text and "PYTORCH_ROCM_ARCH=${PYTORCH_ROCM_ARCH}" in text
    env = text.split("\nENV ")[-1].split("\n\n")[0]
    for pair in ("NVTE_FLASH_ATTN=0", "NVTE_FUSED_ATTN=1", "CUDA_DEVICE_MAX_CONNECTIONS=1", "HSA_NO_SCRATCH_RECLAIM=1"):
        assert pair in env
    # one arch: its launch profile too (rocmport env --arch gfx942); several: the common part only
    assert "HSA_KERNARG_POOL_SIZE=12582912" in env and "#   HSA_KERNARG_POOL_SIZE=12582912: gfx942: " in text
    reqs = remaining_requirements(_trees(tmp_path / "again"), {"megatron-core": ["mlm"]})
    both = dockerfile(reqs, base_tag="rocm7.0_test", arch="gfx942;gfx950")
    assert "HSA_KERNARG_POOL_SIZE" not in both and "NVTE_ROCM_ENABLE_MXFP8" not in both
    gfx950 = dockerfile(reqs, base_tag="rocm7.0_test", arch="gfx950")
    assert "NVTE_ROCM_ENABLE_MXFP8=1" in gfx950 and "RCCL_WARP_SPEED_AUTO=0" in gfx950
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
    for bad in (
        text.replace("pip install --no-cache-dir --constraint", "pip install --constraint"),
        text.replace("RUN pip install --no-cache-dir --no-deps", "RUN cd /tmp && pip install --no-cache-dir --no-deps"),
    ):
        assert bad != text
        path.write_text(bad)
        assert _lint(path).returncode != 0


def _runs(text: str) -> list[str]:
    """The shell of every RUN instruction, continuation lines joined."""
    joined = text.replace("\\\n", " ")
    return [line[4:] for line in joined.splitlines() if line.startswith("RUN ")]


def _bash_parses(text: str) -> None:
    for body in _runs(text):
        proc = subprocess.run(["bash", "-n", "-c", body], capture_output=True, text=True)
        assert proc.returncode == 0, f"{body}\n{proc.stderr}"


@pytest.mark.parametrize("line", LINES)
def test_every_line_renders_and_lints(tmp_path, line):
    """The full image of each Megatron-LM line: its matrix's components for its default archs."""
    series = load_series(PATCHSETS / "megatron-lm" / line / "series")
    matrix = series.rocm
    chosen, _ = components.choose(matrix, "all", ["gfx942", "gfx950"])
    text = dockerfile(
        remaining_requirements(_trees(tmp_path), {"megatron-core": ["mlm"]}, {"transformer-engine"}),
        base_tag=matrix.base_tag,
        arch="gfx942;gfx950",
        choices=chosen,
        matrix=matrix,
        file_name="Dockerfile.rocm",
        sdists=[Sdist("megatron-core"), Sdist("megatron-bridge", isolation=False)],
    )
    path = tmp_path / "Dockerfile.rocm"
    path.write_text(text)
    proc = _lint(path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    _bash_parses(text)
    assert f"ARG ROCM_PYTORCH_TAG={matrix.base_tag}\n" in text and "docker build -f Dockerfile.rocm ." in text
    # One stage per component, its ref an ARG, clone and build in separate layers; the final stage takes each wheel.
    for choice in chosen:
        c = choice.component
        stage = c.name.replace("_", "-")
        assert (
            f"FROM base AS {stage}\n" in text
            and f"COPY --from={stage} /opt/rocmport/wheels/ /tmp/rocmport-components/" in text
        )
        assert f'python -c "{c.smoke}"' in text.split("FROM base AS image")[1]
        if "{" not in c.ref:
            assert f"ARG {c.name.upper()}_REF={c.ref}\n" in text
        # Built without isolation: what its build imports is installed first, the image's torch pinned.
        needs = " ".join(f'"{r}"' for r in c.build_requires)
        assert needs and f"pip install --no-cache-dir --constraint /opt/rocmport/torch-constraint.txt {needs}" in text
    assert "NVTE_ROCM_ARCH=\"$(echo \"${PYTORCH_ROCM_ARCH}\" | tr ';' ',')\"" in text  # ROCm TE's comma list
    assert 'GPU_ARCHS="${PYTORCH_ROCM_ARCH}"' in text  # flash-attention's ';' list
    assert ("sed -i '/--offload-arch=gfx942/d' /opt/rocmport/src/grouped_gemm/setup.py" in text) == (
        "grouped_gemm" in matrix.components
    )
    # The ported packages are built in the image, for its Python, from the sdists (never host wheels).
    assert "COPY dist/megatron_core-*.tar.gz dist/megatron_bridge-*.tar.gz /opt/rocmport/sdist/" in text
    assert (
        "pip wheel --no-cache-dir --no-deps --wheel-dir /opt/rocmport/port-wheels /opt/rocmport/sdist/megatron_core-*.tar.gz"
        in text
    )
    assert (
        "--no-build-isolation --wheel-dir /opt/rocmport/port-wheels /opt/rocmport/sdist/megatron_bridge-*.tar.gz"
        in text
    )
    assert "*.whl /tmp" not in text and "COPY dist/*.whl" not in text
    # torch: recorded in the base stage, compared at the end (the build fails if it changed).
    base, final = text.split("FROM base AS image")
    assert "pip freeze | grep -i -E" in base and "> /opt/rocmport/torch-freeze.txt" in base
    assert "| sort | diff -u /opt/rocmport/torch-freeze.txt -" in final
    for run in re.findall(r"^RUN (?:shopt[^\n]*\n[^\n]*)?pip install[^\n]*", text, re.M):
        assert "--no-deps" in run or "--constraint /opt/rocmport/torch-constraint.txt" in run
    assert "NVTE_FLASH_ATTN=0" in final and "NVTE_FUSED_ATTN=1" in final


def test_the_torch_check_really_fails_when_torch_changed(tmp_path):
    """The recording and the final comparison, run as the Dockerfile's own bash with `pip freeze` replaced
    by a recorded freeze: the same torch passes, a replaced torch fails the build with the difference."""
    text = dockerfile([], choices=())
    record = next(r for r in _runs(text) if "> /opt/rocmport/torch-freeze.txt" in r).split(" && ")[-1]
    check = next(r for r in _runs(text) if "diff -u" in r).split(" && ")[0]
    freeze = tmp_path / "torch-freeze.txt"

    def run(cmd: str, pip_freeze: str) -> subprocess.CompletedProcess:
        (tmp_path / "pip-freeze").write_text(pip_freeze)
        cmd = cmd.replace("pip freeze", f"cat {tmp_path / 'pip-freeze'}").replace(
            "/opt/rocmport/torch-freeze.txt", str(freeze)
        )
        return subprocess.run(["bash", "-o", "pipefail", "-c", cmd], capture_output=True, text=True)

    image = (
        "numpy==2.1.0\ntorch==2.7.1+rocm7.0.0.git698b58a9\npytorch-triton-rocm==3.3.1\ntorchvision==0.22.1+rocm7.0.0\n"
    )
    assert run(record, image).returncode == 0
    assert freeze.read_text().splitlines() == [
        "pytorch-triton-rocm==3.3.1",
        "torch==2.7.1+rocm7.0.0.git698b58a9",
        "torchvision==0.22.1+rocm7.0.0",
    ]
    assert run(check, image.replace("numpy==2.1.0", "numpy==1.26.4")).returncode == 0  # other packages may move
    changed = run(check, image.replace("torch==2.7.1+rocm7.0.0.git698b58a9", "torch==2.9.0"))
    assert changed.returncode == 1 and "+torch==2.9.0" in changed.stdout


def _project_with_matrix(tmp_path, monkeypatch, line: str = "v0.16") -> Project:
    proj = Project(tmp_path, monkeypatch)
    data = yaml.safe_load((proj.series_dir / "series").read_text())
    data["rocm"] = yaml.safe_load((PATCHSETS / "megatron-lm" / line / "series").read_text())["rocm"]
    (proj.series_dir / "series").write_text(yaml.safe_dump(data, sort_keys=False))
    return proj


def test_emit_docker_command(tmp_path, monkeypatch, capsys):
    proj = _project_with_matrix(tmp_path, monkeypatch)
    root = str(proj.root)
    assert main(["-C", root, "emit", "docker"]) == 2  # nothing applied yet
    assert main(["-C", root, "apply"]) == 0
    capsys.readouterr()
    assert main(["-C", root, "emit", "docker", "--arch", "gfx950"]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("# syntax=docker/dockerfile:1") and 'ARG PYTORCH_ROCM_ARCH="gfx950"' in printed
    assert "docker build -f <this file> ." in printed and "FROM base AS transformer-engine" in printed
    out = tmp_path / "Dockerfile.gfx942"
    assert main(["-C", root, "emit", "docker", "-o", str(out), "--extra", "nonsense"]) == 2
    assert main(["-C", root, "emit", "docker", "-o", str(out)]) == 0
    text = out.read_text()
    assert (
        "docker build -f Dockerfile.gfx942 ." in text and "Dockerfile.rocm" not in text
    )  # the header names its own file
    assert "rocm7.0_ubuntu24.04_py3.12_pytorch_release_2.7.1" in text  # the matrix's base image
    assert _lint(out).returncode == 0
    # --components none: today's slim image, no component stage.
    slim = tmp_path / "Dockerfile.slim"
    assert main(["-C", root, "emit", "docker", "--components", "none", "-o", str(slim)]) == 0
    assert (
        "FROM base AS " in slim.read_text()
        and "transformer-engine" not in slim.read_text()
        and _lint(slim).returncode == 0
    )
    capsys.readouterr()
    # Bad options: exit 2, one line naming what to do, nothing written.
    for args, message in (
        (["--base-tag", ""], "--base-tag '': not a Docker image tag"),
        (["--base-tag", "x y"], "not a Docker image tag"),
        (["--arch", "gfx1100"], "--arch gfx1100: transformer_engine does not build there"),
        (["--arch", "gfx942;sm_90"], "'sm_90' is not a gfx arch name"),
        (["--components", "flash_attn", "--arch", "gfx1100"], "use --components flash_attn:triton"),
        (["--components", "cudnn"], "'cudnn' is not in the"),
        (["--components", "apex,apex"], "--components: apex is named twice (apex, apex); name each component once"),
        (["--components", "flash_attn,flash_attn:triton"], "flash_attn is named twice (flash_attn, flash_attn:triton)"),
        (["--max-jobs", "0"], "0"),
        (["--dist", "../elsewhere"], "inside the build context"),
    ):
        bad = tmp_path / "bad.Dockerfile"
        assert main(["-C", root, "emit", "docker", "-o", str(bad), *args]) == 2, args
        assert message in capsys.readouterr().err and not bad.exists(), args
    # What the arch cannot build, swapped for what it can: Radeon with flash-attention's Triton backend.
    radeon = tmp_path / "Dockerfile.radeon"
    assert (
        main(
            [
                "-C",
                root,
                "emit",
                "docker",
                "--arch",
                "gfx1100",
                "--components",
                "apex,flash_attn:triton",
                "-o",
                str(radeon),
            ]
        )
        == 0
    )
    text = radeon.read_text()
    assert 'FLASH_ATTENTION_TRITON_AMD_ENABLE="TRUE"' in text and "FLASH_ATTENTION_TRITON_AMD_ENABLE=TRUE \\" in text
    assert "transformer-engine" not in text and _lint(radeon).returncode == 0
    assert "apex on gfx1100: unverified" in capsys.readouterr().err


def test_a_base_image_whose_python_the_tree_refuses(tmp_path):
    tree = tmp_path / "megatron-lm"
    tree.mkdir()
    (tree / "pyproject.toml").write_text('[project]\nname = "megatron-core"\nrequires-python = ">=3.12"\n')
    with pytest.raises(BadInput, match=r"its Python 3.10 does not satisfy megatron-lm's requires-python >=3.12"):
        check_python("rocm6.4_ubuntu22.04_py3.10_pytorch_release_2.5.1", [tree])
    check_python("rocm7.0_ubuntu24.04_py3.12_pytorch_release_2.7.1", [tree])
    check_python("latest", [tree])  # a tag that does not say its Python is not judged
    assert tag_python("rocm7.2.4_ubuntu24.04_py3.12_pytorch_release_2.10.0") == "3.12"


def test_emit_docker_without_a_matrix_is_the_slim_image(tmp_path, monkeypatch, capsys):
    proj = Project(tmp_path, monkeypatch)
    assert main(["-C", str(proj.root), "apply"]) == 0
    out = tmp_path / "Dockerfile"
    assert main(["-C", str(proj.root), "emit", "docker", "-o", str(out)]) == 0
    assert "no rocm: section" in capsys.readouterr().err and "AS transformer-engine" not in out.read_text()
    assert main(["-C", str(proj.root), "emit", "docker", "--components", "all"]) == 2
