"""`rocmport build` on the real ported megatron-core (package index) and its refusals."""

from __future__ import annotations

import json
import os
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
    assert bridge["dry_run"]["error"] == "" or "emerging_optimizers" in bridge["dry_run"]["error"]
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
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], capture_output=True, text=True).stdout.strip()
    Path(site, "borrowed-torch.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", str(wheel)], check=True, capture_output=True)
    probe = ("import importlib.metadata as m, megatron.core, megatron.core._rocm as r, megatron.core._rocm_build as b; "
             "print(m.version('megatron-core'), b.SERIES_HASH == %r, r.is_hip(), megatron.core.__file__)" % built["metadata"]["series_hash"])
    proc = subprocess.run([str(py), "-c", probe], capture_output=True, text=True, cwd=tmp_path, env={**os.environ, "PYTHONPATH": ""})
    assert proc.returncode == 0, proc.stderr[-2000:]
    version, same_hash, hip, where = proc.stdout.split()
    assert (version, same_hash, hip) == ("0.16.1+rocm.1", "True", "False") and str(venv) in where
