"""`rocmport build` on the real ported megatron-core (package index) and its refusals."""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from rocmport.cli import main
from tests.helpers.patches import Project
from tests.helpers.real import project_with
from tests.helpers.sync import g

REPO = Path(__file__).resolve().parents[1]


def test_build_refuses_without_a_port_or_with_edits(tmp_path, monkeypatch, capsys):
    proj = Project(tmp_path, monkeypatch)
    assert main(["-C", str(proj.root), "build"]) == 2
    assert "run `rocmport apply` first" in capsys.readouterr().err
    proj.write_series({})
    assert main(["-C", str(proj.root), "apply"]) == 0
    (proj.tree / "megatron/core/utils.py").write_text("edited\n")
    assert main(["-C", str(proj.root), "build", "--no-check-deps"]) == 2
    assert "uncommitted changes (megatron/core/utils.py)" in capsys.readouterr().err
    assert not (proj.root / "dist").exists()
    assert main(["-C", str(proj.root), "build", "--build-number", "-3"]) == 2
    assert "'--build-number': -3 is not in the range x>=0" in capsys.readouterr().err
    assert not (proj.root / "dist").exists()


@pytest.mark.torch
@pytest.mark.network
def test_build_wheel_of_the_ported_sdist_installs_with_no_deps(tmp_path, real_index, capsys):
    root = project_with(tmp_path / "project", {"megatron-lm": "v0.16", "megatron-bridge": "v0.3"})
    g(tmp_path, "init", "-q", "-b", "main", str(root))
    run = lambda *a: main(["-C", str(root), *a])  # noqa: E731
    assert run("sync", "--ref", "v0.16", "--source", "pypi") == 0
    assert run("apply") == 0
    g(root, "add", "patchsets")
    g(root, "commit", "-qm", "series")
    capsys.readouterr()
    assert run("build", "--json") == 0
    out = json.loads(capsys.readouterr().out)
    built, bridge = out["built"]
    assert built["version"] == "0.16.1+rocm.1" and out["problems"] == []
    # Megatron-Bridge: built against the installed torch (its build wants torch), its generated helper inside.
    assert bridge["version"] == "0.3.1+rocm.1" and bridge["isolation"] is False
    bridge_wheel = next(Path(f) for f in bridge["files"] if f.endswith(".whl"))
    assert "megatron/bridge/_rocm.py" in zipfile.ZipFile(bridge_wheel).namelist()
    # Its megatron-core[dev] asks for emerging_optimizers, which upstream installs from git (not on
    # PyPI): pip says so, and that is reported; whatever pip could resolve has nothing CUDA-only.
    assert bridge["dry_run"]["cuda_only"] == []
    # Under Python 3.12 pip backtracks Bridge v0.3's transformers<5 to a tokenizers sdist whose build needs
    # Rust: reported with the distribution pip was collecting, never a ported wheel of ours.
    error = bridge["dry_run"]["error"]
    assert error == "" or "emerging_optimizers" in error or re.search(r"\(collecting (?!megatron)", error), error
    assert built["dry_run"]["cuda_only"] == [] and "torch" not in built["dry_run"]["would_install"]
    wheel = next(Path(f) for f in built["files"] if f.endswith(".whl"))
    assert wheel.parent == root / "dist" and any(f.endswith(".tar.gz") for f in built["files"])
    names = zipfile.ZipFile(wheel).namelist()
    assert "megatron/core/_rocm.py" in names and "megatron/core/_rocm_build.py" in names
    metadata = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("METADATA"))).decode()
    assert "Version: 0.16.1+rocm.1" in metadata and f"commit/{built['metadata']['upstream_commit']}" in metadata
    assert g(root / "build/megatron-lm", "status", "--porcelain") == ""  # the work tree stays clean
    # A fresh venv that has torch (borrowed from this one) takes the wheel with --no-deps.
    venv = tmp_path / "fresh"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = venv / "bin" / "python"
    site = subprocess.run(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], capture_output=True, text=True
    ).stdout.strip()
    Path(site, "borrowed-torch.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", str(wheel)], check=True, capture_output=True)
    probe = (
        "import importlib.metadata as m, megatron.core, megatron.core._rocm as r, megatron.core._rocm_build as b; "
        "print(m.version('megatron-core'), b.SERIES_HASH == %r, r.is_hip(), megatron.core.__file__)"
        % built["metadata"]["series_hash"]
    )
    proc = subprocess.run(
        [str(py), "-c", probe], capture_output=True, text=True, cwd=tmp_path, env={**os.environ, "PYTHONPATH": ""}
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    version, same_hash, hip, where = proc.stdout.split()
    assert (version, same_hash, hip) == ("0.16.1+rocm.1", "True", "False") and str(venv) in where


def _buildable(proj: Project, requires_python: str | None, setup_py: str | None = None) -> None:
    """The project's upstream becomes a buildable megatron-core (setuptools) declaring ``requires_python``."""
    project = '[project]\nname = "megatron-core"\n' + (
        f'requires-python = "{requires_python}"\ndynamic = ["version"]\n'
        if requires_python
        else 'dynamic = ["version", "requires-python"]\n'
    )
    files = {
        "pyproject.toml": '[build-system]\nrequires = ["setuptools>=64"]\nbuild-backend = "setuptools.build_meta"\n\n'
        + project
        + '\n[tool.setuptools.packages.find]\ninclude = ["megatron*"]\n'
        + (
            ""
            if setup_py
            else '\n[tool.setuptools.dynamic]\nversion = {attr = "megatron.core.package_info.__version__"}\n'
        ),
        "megatron/__init__.py": "",
        "megatron/core/__init__.py": "",
        "megatron/core/package_info.py": "MAJOR, MINOR, PATCH = 0, 16, 1\n__version__ = '0.16.1'\n",
    }
    if setup_py:
        files["setup.py"] = setup_py
    sha = proj.upstream_commit(files, "buildable")
    proj.refresh_mirror()
    proj.pin(sha)
    assert main(["-C", str(proj.root), "apply"]) == 0


def test_a_python_without_pypa_build_is_refused_from_the_project_root(tmp_path, monkeypatch):
    """The check runs where the project's build/ folder (its work trees) cannot pass for pypa's `build`
    package: from the project root, as from anywhere, exit 2 with the hint, and nothing built."""
    proj = Project(tmp_path, monkeypatch)
    assert main(["-C", str(proj.root), "apply"]) == 0 and (proj.root / "build").is_dir()
    bare = tmp_path / "bare-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    python = str(bare / "bin" / "python")
    for cwd in (proj.root, tmp_path):
        proc = subprocess.run(
            [sys.executable, "-m", "rocmport", "-C", str(proj.root), "build", "--no-check-deps", "--python", python],
            capture_output=True,
            text=True,
            cwd=cwd,
            env=os.environ.copy(),
            timeout=120,
        )
        assert proc.returncode == 2, (cwd, proc.stderr)
        assert f"{python} (Python {platform.python_version()}) has no `build` package to build with" in proc.stderr, (
            proc.stderr
        )
        assert f"`{python} -m pip install build`" in proc.stderr
    assert not (proj.root / "dist").exists()


def test_build_needs_the_python_the_tree_requires(tmp_path, monkeypatch, capsys):
    """Like Megatron-LM v0.17+ (>=3.12) where no such Python is: exit 2 before building, saying how to
    get one; a --python that does not satisfy it is refused the same way."""
    proj = Project(tmp_path, monkeypatch)
    _buildable(proj, ">=3.99")
    capsys.readouterr()
    assert main(["-C", str(proj.root), "build", "--no-check-deps"]) == 2
    err = capsys.readouterr().err
    assert "megatron-lm requires Python >=3.99; no such Python here" in err and "give --python PATH" in err
    assert main(["-C", str(proj.root), "build", "--python", sys.executable]) == 2
    assert (
        f"--python {sys.executable} is Python {platform.python_version()}, but megatron-lm requires Python >=3.99"
        in capsys.readouterr().err
    )
    assert not (proj.root / "dist").exists()


@pytest.mark.network
def test_a_wheel_its_python_cannot_install_fails_the_build(tmp_path, monkeypatch, capsys):
    """The tree declares no requires-python in pyproject.toml, its setup.py does (>=3.99): the wheel
    is built, but this Python cannot install it, so build exits 1 naming why (pip's refusal)."""
    proj = Project(tmp_path, monkeypatch)
    _buildable(proj, None, "from setuptools import setup\nsetup(version='0.16.1', python_requires='>=3.99')\n")
    capsys.readouterr()
    assert main(["-C", str(proj.root), "build", "--no-check-deps", "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    [record] = out["built"]
    assert any(f.endswith(".whl") for f in record["files"]) and out["python"] == platform.python_version()
    assert "requires a different Python" in record["installable"]["error"]
    assert out["problems"] == [
        f"megatron-lm: {Path(next(f for f in record['files'] if f.endswith('.whl'))).name} cannot be installed by "
        f"Python {platform.python_version()} ({sys.executable}): {record['installable']['error']}"
    ]
