"""Dependency manifests: format-preserving rewrite, the denylist, and pip's own resolution."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rocmport.port import manifests
from rocmport.port.manifests import (
    Policy,
    cuda_only_requirements,
    rewrite_pyproject,
    rewrite_requirements,
    rewrite_tree,
)
from tests.helpers.manifests import BRIDGE_PYPROJECT, MLM_PYPROJECT


def test_pyproject_rewrite_drops_cuda_only_and_touches_nothing_else():
    new, changes = rewrite_pyproject(MLM_PYPROJECT, Policy())
    dropped = {(c.where, c.requirement) for c in changes if c.action == "dropped"}
    assert dropped == {
        ("optional-dependencies.dev", "nvidia-modelopt[torch]>=0.44; sys_platform != 'darwin'"),
        ("optional-dependencies.dev", "nvidia-resiliency-ext==0.6.0"),
        ("optional-dependencies.dev", "flashinfer-python>=0.5.0,<0.7.0"),
        ("optional-dependencies.dev", "nvidia-cudnn-frontend[cutedsl]==1.26.0"),
        ("optional-dependencies.te", "transformer-engine[pytorch,core_cu13]"),
        ("optional-dependencies.ssm", "mamba-ssm"),
        ("optional-dependencies.ssm", "causal-conv1d~=1.5"),
    }
    assert all(c.reason for c in changes)
    trimmed = [c for c in changes if c.action == "extras-trimmed"]
    assert [(c.requirement, c.reason) for c in trimmed] == [
        ("jax[cuda12,tpu]", "CUDA-specific extras removed: now jax[tpu]")
    ]
    # Everything else byte for byte: tool tables, dependency groups, the base dependencies, comments.
    for kept in (
        '[tool.uv]\nno-build-isolation-package = ["transformer-engine", "mamba-ssm"]\n',
        '[dependency-groups]\nbuild = ["nvidia-mathdx", "pybind11"]\n',
        'dependencies = ["torch>=2.6.0", "numpy", "packaging>=24.2"]\n',
        '    "einops~=0.8",                # keep me and my comment\n',
        'transformer-engine = { git = "https://github.com/NVIDIA/TransformerEngine.git", rev = "5671fd36" }\n',
    ):
        assert kept in new
    assert "# rocmport: transformer-engine has no ROCm build on PyPI; on ROCm: pip install" in new
    assert "ROCm/mamba" in new
    again, more = rewrite_pyproject(new, Policy())
    assert (again, more) == (new, [])  # idempotent


def test_bridge_path_dependency_is_repointed_at_the_ported_tree():
    new, changes = rewrite_pyproject(BRIDGE_PYPROJECT, Policy(megatron_lm_path="../megatron-lm"))
    assert 'megatron-core = { path = "../megatron-lm", editable = true }' in new
    assert '"megatron-core[dev,mlm]>=0.15.0a0,<0.17.0",' in new and "nvidia-resiliency-ext" not in new
    assert [c.action for c in changes].count("repointed") == 1
    assert rewrite_pyproject(new, Policy(megatron_lm_path="../megatron-lm")) == (new, [])


def test_series_policy_keeps_drops_and_turns_off():
    new, _ = rewrite_pyproject(MLM_PYPROJECT, Policy(keep=["mamba_ssm"], drop={"fastapi": "not on our ROCm image"}))
    assert '"mamba-ssm",' in new and "fastapi" not in new
    assert manifests.policy_from_series(False) is None
    assert manifests.policy_from_series({"keep": ["x"]}).keep == ["x"]


def test_requirements_file_rewrite_keeps_comments_and_options():
    text = "# base\n--extra-index-url https://example.invalid\ntorch\nnvidia-modelopt  # ptq\npackaging\n"
    new, changes = rewrite_requirements(text, Policy(), "requirements.txt")
    assert new == "# base\n--extra-index-url https://example.invalid\ntorch\npackaging\n"
    assert [(c.where, c.requirement) for c in changes] == [("line 4", "nvidia-modelopt")]


def test_denylist_check_finds_cuda_only_before_and_nothing_after(tmp_path):
    (tmp_path / "pyproject.toml").write_text(MLM_PYPROJECT)
    (tmp_path / "requirements.txt").write_text("torch\nnv-grouped-gemm~=1.1\n")
    before = cuda_only_requirements(tmp_path)
    assert ("requirements.txt", "nv-grouped-gemm~=1.1") in before and len(before) == 8
    texts, _ = rewrite_tree(tmp_path, Policy())
    for rel, text in texts.items():
        (tmp_path / rel).write_text(text)
    assert cuda_only_requirements(tmp_path) == []


def _dist(root: Path, name: str, deps: list[str]) -> Path:
    """A buildable sdist-style project directory (pyproject + setuptools) for a fake distribution."""
    d = root / name
    (d / name.replace("-", "_")).mkdir(parents=True)
    (d / name.replace("-", "_") / "__init__.py").write_text("")
    (d / "pyproject.toml").write_text(
        textwrap.dedent(
            f'''\
        [build-system]
        requires = ["setuptools"]
        build-backend = "setuptools.build_meta"
        [project]
        name = "{name}"
        version = "1.0"
        dependencies = {deps!r}
        '''.replace("'", '"')
        )
    )
    return d


@pytest.mark.torch
@pytest.mark.slow
def test_pip_dry_run_shows_what_would_be_pulled(tmp_path):
    """pip's own resolver on a local wheel house: the unported manifest pulls a CUDA-only chain
    (transformer-engine -> nvidia-cudnn-cu12), the ported one pulls nothing CUDA-only."""
    house = tmp_path / "house"
    house.mkdir()
    for name, deps in (("transformer-engine", ["nvidia-cudnn-cu12"]), ("nvidia-cudnn-cu12", []), ("tqdm-fake", [])):
        src = _dist(tmp_path / "src", name, deps)
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "-q",
                "--no-deps",
                "--no-build-isolation",
                "-w",
                str(house),
                str(src),
            ],
            check=True,
            capture_output=True,
        )
    project = _dist(tmp_path, "ported-core", ["torch>=2.0", "tqdm-fake", "transformer-engine[pytorch]"])
    args = ("--no-index", "--find-links", str(house))
    names, error = manifests.pip_dry_run([str(project)], extra_args=args)
    assert error == "" and manifests.cuda_only_installs(names) == ["nvidia-cudnn-cu12", "transformer-engine"]
    assert "torch" not in names  # the installed torch satisfies it: never replaced
    texts, _ = rewrite_tree(project, Policy())
    (project / "pyproject.toml").write_text(texts["pyproject.toml"])
    names, error = manifests.pip_dry_run([str(project)], extra_args=args)
    assert error == "" and manifests.cuda_only_installs(names) == [] and "tqdm-fake" in names


@pytest.mark.slow
def test_pip_dry_run_names_a_dependency_whose_build_fails(tmp_path):
    """When a dependency's own build fails, pip ends on "hint: See above for details."; the error
    says what failed, the build's exception and what pip was collecting (seen under Python 3.12:
    Bridge v0.3's transformers<5 backtracked to a tokenizers sdist whose build needs setuptools_rust)."""
    house = tmp_path / "house"
    house.mkdir()
    broken = _dist(tmp_path / "src", "needs-rust-fake", [])
    (broken / "setup.py").write_text("import setuptools_rust_rocmport_absent\n")
    subprocess.run(
        [sys.executable, "-m", "build", "--sdist", "--no-isolation", "--outdir", str(house), str(broken)],
        check=False,
        capture_output=True,
    )
    if not list(house.glob("*.tar.gz")):  # building the sdist runs setup.py too: copy it by hand instead
        import tarfile

        with tarfile.open(house / "needs_rust_fake-1.0.tar.gz", "w:gz") as tar:
            tar.add(broken, arcname="needs_rust_fake-1.0")
    fine = _dist(tmp_path / "fine", "ported-core", [])
    if manifests.pip_dry_run([str(fine)], extra_args=("--no-index",))[1]:
        pytest.skip(
            "this interpreter cannot build a setuptools project without isolation (setuptools < 70.1 wants `wheel`)"
        )
    project = _dist(tmp_path, "ported-core", ["needs-rust-fake"])
    names, error = manifests.pip_dry_run([str(project)], extra_args=("--no-index", "--find-links", str(house)))
    assert names == []
    assert error.startswith(
        "metadata-generation-failed: ModuleNotFoundError: No module named 'setuptools_rust_rocmport_absent'"
    ), error
    assert error.endswith("needs_rust_fake-1.0.tar.gz (from ported-core==1.0))") and "(processing " in error, error


def _matrix(**changes):
    import dataclasses

    from rocmport.patches.series import load_series

    matrix = load_series(Path(__file__).resolve().parents[1] / "patchsets" / "megatron-lm" / "v0.16" / "series").rocm
    return dataclasses.replace(matrix, **changes)


def test_the_line_matrix_gives_the_exact_install_command():
    pyproject = MLM_PYPROJECT.replace('    "tqdm",\n', '    "tqdm",\n    "nv-grouped-gemm~=1.1",\n')
    matrix = _matrix()
    new, changes = rewrite_pyproject(pyproject, Policy(rocm=matrix))
    te, gg = matrix.components["transformer_engine"], matrix.components["grouped_gemm"]
    assert (
        f"# rocmport: transformer-engine has no ROCm build on PyPI; on ROCm (gfx942;gfx950; set the archs for your GPUs): "
        f"{te.install_command('gfx942;gfx950')}\n" in new
    )
    assert "git clone --recursive --branch release_v2.10_rocm https://github.com/ROCm/TransformerEngine.git" in new
    assert (
        f"{gg.install_command('gfx942;gfx950')}\n" in new
        and "sed -i '/--offload-arch=gfx942/d' grouped_gemm/setup.py" in new
    )
    reasons = {c.requirement: c.reason for c in changes}
    assert reasons["transformer-engine[pytorch,core_cu13]"].endswith(
        "from https://github.com/ROCm/TransformerEngine.git@release_v2.10_rocm"
    )
    assert "nv-grouped-gemm" not in new.split("# rocmport")[0].split("[project.optional-dependencies]")[1]
    assert rewrite_pyproject(new, Policy(rocm=matrix)) == (new, [])


def test_a_rocm_package_index_makes_the_replacement_a_real_requirement(tmp_path):
    matrix = _matrix(package_index="https://rocm.example.org/simple/")
    new, changes = rewrite_pyproject(MLM_PYPROJECT, Policy(rocm=matrix))
    assert 'te = ["transformer-engine-rocm-torch<2.13,>=2.9.0a0",' in new
    assert "pip install --extra-index-url https://rocm.example.org/simple/" in new
    replaced = [c for c in changes if c.action == "replaced"]
    assert [(c.requirement, c.where) for c in replaced] == [
        ("transformer-engine[pytorch,core_cu13]", "optional-dependencies.te")
    ]
    assert rewrite_pyproject(new, Policy(rocm=matrix)) == (new, [])  # the ROCm build is never dropped again
    assert not manifests.is_cuda_only("transformer-engine-rocm-torch<2.13")
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "pyproject.toml").write_text(new)
    (tree / "requirements.txt").write_text("transformer-engine>=2.9  # TE\nnumpy\n")
    texts, _ = rewrite_tree(tree, Policy(rocm=matrix))
    assert texts["requirements.txt"] == "transformer-engine-rocm-torch<2.13,>=2.9.0a0  # TE\nnumpy\n"
    assert cuda_only_requirements(tree) == [("requirements.txt", "transformer-engine>=2.9")]
    (tree / "requirements.txt").write_text(texts["requirements.txt"])
    assert cuda_only_requirements(tree) == []
    # Without an index, no distribution is named: the dependency goes and the comment says how to build it.
    plain, _ = rewrite_pyproject(MLM_PYPROJECT, Policy(rocm=_matrix()))
    assert "transformer-engine-rocm-torch" not in plain and "release_v2.10_rocm" in plain


def test_apply_rewrites_with_the_series_matrix(tmp_path, monkeypatch):
    import yaml

    from rocmport.cli import main
    from tests.helpers.patches import Project

    proj = Project(tmp_path, monkeypatch)
    proj.pin(proj.upstream_commit({"pyproject.toml": MLM_PYPROJECT}, "upstream pyproject"))
    proj.refresh_mirror()
    data = yaml.safe_load((proj.series_dir / "series").read_text())
    data["rocm"] = yaml.safe_load(
        (Path(__file__).resolve().parents[1] / "patchsets/megatron-lm/v0.16/series").read_text()
    )["rocm"]
    (proj.series_dir / "series").write_text(yaml.safe_dump(data, sort_keys=False))
    assert main(["-C", str(proj.root), "apply"]) == 0
    ported = (proj.tree / "pyproject.toml").read_text()
    assert "git clone --recursive --branch release_v2.10_rocm https://github.com/ROCm/TransformerEngine.git" in ported
    log = subprocess.run(
        ["git", "-C", str(proj.tree), "log", "-1", "--format=%B", "--", "pyproject.toml"],
        capture_output=True,
        text=True,
    ).stdout
    assert "manifests: ROCm dependency declarations 2" in log and "ROCm/TransformerEngine.git@release_v2.10_rocm" in log
