"""`rocmport doctor` against the line's ROCm matrix: on this machine (nothing installed), and with fake
installed distributions (real dist-info metadata and shared libraries carrying offload-bundle target
names) in a site directory of a subprocess: in range, out of range, built for another arch."""

from __future__ import annotations

import json
import re
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rocmport.cli import main
from rocmport.patches.series import load_series
from rocmport.machine.doctor import component_report, for_verify, offload_archs
from tests.helpers.patches import Project

REPO = Path(__file__).resolve().parents[1]
SERIES = REPO / "patchsets" / "megatron-lm" / "v0.16" / "series"


def _project(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    shutil.copytree(REPO / "patchsets", root / "patchsets")
    return root


def _library(archs: list[str]) -> bytes:
    """What a HIP fat binary holds: an offload bundle naming each code object's target."""
    body = b"\x7fELF" + b"\0" * 64 + b"__CLANG_OFFLOAD_BUNDLE__"
    for arch in archs:
        body += b"\0" * 16 + f"hipv4-amdgcn-amd-amdhsa--{arch}:sramecc+:xnack-".encode() + b"\0" * 32
    return body + b"\0" * 128


def fake_dist(site: Path, name: str, version: str, module: str, archs: list[str] | None = None) -> None:
    """An installed distribution as pip leaves it: the module, a .dist-info with METADATA and RECORD."""
    pkg = site / module
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text(f"__version__ = {version!r}\n")
    files = [f"{module}/__init__.py"]
    if archs is not None:
        (pkg / "_kernels.cpython-311-x86_64-linux-gnu.so").write_bytes(_library(archs))
        files.append(f"{module}/_kernels.cpython-311-x86_64-linux-gnu.so")
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    files += [f"{info.name}/METADATA", f"{info.name}/RECORD"]
    (info / "RECORD").write_text("".join(f"{f},,\n" for f in files))


def _doctor(root: Path, *args, site: Path | None = None) -> tuple[int, dict | str, str]:
    env = dict(os.environ)
    if site is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(site), env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, "-m", "rocmport", "-C", str(root), "doctor", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    out = json.loads(proc.stdout) if "--json" in args and proc.stdout.strip() else proc.stdout
    return proc.returncode, out, proc.stderr


def _rows(data: dict) -> dict:
    return {c["name"]: c for c in data["components"]}


def test_this_machine_has_none_of_the_components_and_says_so(tmp_path):
    root = _project(tmp_path)
    rc, data, _ = _doctor(root, "--line", "v0.16", "--json")
    assert rc == 1
    rows = _rows(data)
    assert set(rows) == {"transformer_engine", "flash_attn", "apex", "grouped_gemm"}
    assert all(r["status"] == "missing" and r["detail"] == "not installed" for r in rows.values())
    assert rows["transformer_engine"]["required"] and rows["transformer_engine"]["problem"]
    assert not rows["flash_attn"]["problem"]  # optional: missing, but no reason to fail
    assert data["arch"] is None and data["arch_source"] == "none" and data["devices"] == []
    none = (
        f"none of the components of {root / 'patchsets/megatron-lm/v0.16/series'} is installed here "
        "(transformer_engine, flash_attn, apex, grouped_gemm)"
    )
    assert data["problems"] == ["transformer_engine: not installed", none]
    rc, text, err = _doctor(root, "--line", "v0.16")
    assert rc == 1
    assert none in " ".join(err.split())
    assert "no GPU and no --arch" in err and "transformer_engine: not installed" in err
    # the table, 100 columns in a log: "not installed" folds onto two lines of its cell
    assert (
        "│ transformer_engine │ yes      │" in text and "missing" in text and "│ not " in text and "installed" in text
    )


def test_in_range_and_built_for_the_arch(tmp_path):
    root, site = _project(tmp_path), tmp_path / "site"
    fake_dist(site, "transformer_engine", "2.10.0", "transformer_engine", ["gfx942", "gfx950"])
    fake_dist(site, "flash_attn", "2.8.0.post2", "flash_attn", ["gfx90a", "gfx942", "gfx950"])
    rc, data, err = _doctor(root, "--line", "v0.16", "--arch", "gfx942", "--json", site=site)
    assert rc == 0, err
    rows = _rows(data)
    assert rows["transformer_engine"]["status"] == "ok" and rows["transformer_engine"]["built_for"] == [
        "gfx942",
        "gfx950",
    ]
    assert rows["transformer_engine"]["version"] == "2.10.0" and rows["flash_attn"]["status"] == "ok"
    assert rows["apex"]["status"] == "missing" and not rows["apex"]["problem"]
    use = {r["topic"]: r["use"] for r in data["recommendations"]}
    assert use["layers"] == "--transformer-impl transformer_engine" and use["fp8"].startswith("available")
    assert data["arch_source"] == "--arch" and data["problems"] == []


def _report(monkeypatch, site: Path, line: str = "v0.16", arch: str | None = "gfx942") -> dict:
    """The same engine in this process, with ``site`` on sys.path (importlib.metadata finds its dist-info)."""
    monkeypatch.syspath_prepend(str(site))
    return {
        r.name: r
        for r in component_report(load_series(REPO / "patchsets" / "megatron-lm" / line / "series").rocm, arch).rows
    }


def test_out_of_range_wrong_arch_and_not_importable_fail(tmp_path, monkeypatch):
    old = tmp_path / "old"
    fake_dist(old, "transformer_engine", "2.14.1", "transformer_engine", ["gfx942"])  # v0.16 runs below 2.13
    te = _report(monkeypatch, old)["transformer_engine"]
    assert te.status == "out-of-range" and te.problem and "2.14.1 is outside <2.13,>=2.9.0a0" in te.detail
    assert _report(monkeypatch, old, "v0.17")["transformer_engine"].status == "ok"  # the line decides
    other = tmp_path / "other"
    fake_dist(other, "transformer_engine", "2.10.0", "transformer_engine", ["gfx950"])
    te = _report(monkeypatch, other)["transformer_engine"]
    assert te.status == "wrong-arch" and te.problem and "built for gfx950, not gfx942" in te.detail


def test_not_importable_and_unrecorded_arch(tmp_path, monkeypatch):
    broken = tmp_path / "broken"
    fake_dist(broken, "transformer_engine", "2.10.0", "transformer_engine")
    shutil.rmtree(broken / "transformer_engine")
    te = _report(monkeypatch, broken)["transformer_engine"]
    assert te.status == "not-importable" and te.problem
    plain = tmp_path / "plain"
    fake_dist(plain, "flash_attn", "2.8.0.post2", "flash_attn")  # no shared library: nothing recorded
    fa = _report(monkeypatch, plain)["flash_attn"]
    assert fa.status == "ok" and fa.built_for is None and fa.detail == "arch not recorded in its libraries"


def test_arch_recommendations_for_radeon_and_mi50(tmp_path, capsys):
    root = _project(tmp_path)
    matrix = load_series(SERIES).rocm
    report = component_report(matrix, "gfx1100")
    te = {r.name: r for r in report.rows}["transformer_engine"]
    assert te.status == "not-for-this-arch" and not te.required and not report.problems  # TE does not build for gfx1100
    use = {t: u for t, u, _ in report.recommendations}
    assert (
        use["layers"] == "--transformer-impl local"
        and "FLASH_ATTENTION_TRITON_AMD_ENABLE=TRUE" in use["flash-attention"]
    )
    assert use["fp8"].startswith("not available")
    recs = {(t, u) for t, u, _ in component_report(matrix, "gfx906").recommendations}
    assert ("environment", "HSA_OVERRIDE_GFX_VERSION=9.0.6") in recs and ("flash-attention", "none") in recs
    assert main(["-C", str(root), "doctor", "--line", "v0.99"]) == 2
    assert main(["-C", str(root), "doctor", "--arch", "sm_90"]) == 2
    err = capsys.readouterr().err
    assert "--line v0.99" in err and "v0.16" in err and "not a gfx arch" in err


def test_an_nvidia_gpu_is_named_as_not_amd_rather_than_as_no_gpu():
    """On an H100 (torch 2.11+cu130) doctor said "none found: run it on the GPU machine", on the GPU machine."""
    matrix = load_series(SERIES).rocm
    recs = component_report(matrix, None, "NVIDIA H100 80GB HBM3").recommendations
    assert recs[0][:2] == ("gpu", "NVIDIA H100 80GB HBM3: not an AMD GPU") and "--arch" in recs[0][2]
    assert component_report(matrix, None).recommendations[0][1] == "none found"  # no GPU at all: as before
    # an arch given wins: its recommendations, whatever GPU this machine has
    assert component_report(matrix, "gfx942", "NVIDIA H100 80GB HBM3").recommendations[0][1].startswith("gfx942")


def test_the_locked_line_is_the_default(tmp_path, monkeypatch, capsys):
    proj = Project(tmp_path, monkeypatch)  # locks megatron-lm 0.16.1; its series has no rocm: section yet
    assert main(["-C", str(proj.root), "doctor", "--json", "--arch", "gfx1100"]) == 0
    assert json.loads(capsys.readouterr().out)["components"] == []
    assert main(["-C", str(proj.root), "doctor", "--line", "v0.16"]) == 2
    assert "no rocm: section to check against" in capsys.readouterr().err
    data = yaml.safe_load((proj.series_dir / "series").read_text())
    data["rocm"] = yaml.safe_load(SERIES.read_text())["rocm"]
    (proj.series_dir / "series").write_text(yaml.safe_dump(data, sort_keys=False))
    assert main(["-C", str(proj.root), "doctor", "--json", "--arch", "gfx1100"]) == 1  # none of the 4 is installed
    out = json.loads(capsys.readouterr().out)
    assert out["series"] == str(proj.series_dir / "series") and len(out["components"]) == 4


def test_exit_codes_as_the_readme_says_for_a_planned_arch_and_an_unknown_one(tmp_path):
    """README: with none of the line's components installed, exit 1 even for an arch where none is
    required (gfx90a: ROCm TE does not build there); an arch rocmport does not know is exit 2."""
    root = _project(tmp_path)
    rc, data, err = _doctor(root, "--line", "v0.16", "--arch", "gfx90a", "--json")
    assert rc == 1, err
    assert not _rows(data)["transformer_engine"]["required"] and data["problems"][0].startswith(
        "none of the components of"
    )
    rc, _, err = _doctor(root, "--line", "v0.16", "--arch", "gfx1234")
    assert rc == 2 and err.strip().startswith("rocmport: error: --arch gfx1234: not a GPU arch rocmport knows (known: ")
    assert "gfx942" in err and "gfx90a" in err and len(err.strip().splitlines()) == 1
    site = tmp_path / "site"
    fake_dist(site, "flash_attn", "2.8.0.post2", "flash_attn", ["gfx90a"])  # one installed, none required: fine
    rc, data, err = _doctor(root, "--line", "v0.16", "--arch", "gfx90a", "--json", site=site)
    assert rc == 0 and data["problems"] == [], err


def test_offload_archs_reads_the_bundle_and_not_a_compressed_one(tmp_path):
    lib = tmp_path / "lib.so"
    lib.write_bytes(b"x" * (1 << 22) + _library(["gfx90a", "gfx1100"]))  # across a read boundary
    assert offload_archs(lib) == {"gfx90a", "gfx1100"}
    lib.write_bytes(b"CCOB" + os.urandom(256))
    assert offload_archs(lib) == set()


def test_verify_asks_doctor_which_functional_case(tmp_path, monkeypatch):
    here = for_verify(SERIES)
    assert not here.te_usable and here.components["transformer_engine"]["status"] == "missing"
    site = tmp_path / "site"
    fake_dist(site, "transformer_engine", "2.10.0", "transformer_engine", ["gfx942"])
    monkeypatch.syspath_prepend(str(site))
    with_te = for_verify(SERIES)
    assert with_te.te_usable and with_te.components["transformer_engine"] == {"version": "2.10.0", "status": "ok"}


def test_verify_takes_the_te_case_when_doctor_finds_te_usable(tmp_path, monkeypatch):
    from rocmport.verify.stages.functional import functional_options

    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "pretrain_gpt.py").write_text("")

    def case() -> str:
        opts, _ = functional_options(tree, SERIES.parent, None, None, 2, 2, None, False, 10)
        assert opts is not None
        return opts.case

    assert case() == "gpt3_mcore_tp2_pp2_uninstall_te"
    old = tmp_path / "old"
    fake_dist(
        old, "transformer_engine", "2.14.1", "transformer_engine", ["gfx942"]
    )  # importable, but outside v0.16's range
    monkeypatch.syspath_prepend(str(old))
    assert case() == "gpt3_mcore_tp2_pp2_uninstall_te"
    monkeypatch.undo()
    good = tmp_path / "good"
    fake_dist(good, "transformer_engine", "2.10.0", "transformer_engine", ["gfx942"])
    monkeypatch.syspath_prepend(str(good))
    assert case() == "gpt3_mcore_te_tp2_pp2"


@pytest.mark.torch
def test_verify_reports_the_component_versions_in_its_env(tmp_path, monkeypatch, capsys):
    from rocmport.port.worktree import ApplyState, write_state
    from tests.test_verify import minimal_tree

    tree = minimal_tree(tmp_path / "t")
    (tree / "megatron/core/__init__.py").write_text("import modelopt\n")  # stage 1 fails at once: no training launched
    (tree / ".git").mkdir(exist_ok=True)
    write_state(tree, ApplyState(status="done", series=str(SERIES)))  # as `rocmport apply` leaves it
    site = tmp_path / "site"
    fake_dist(site, "flash_attn", "2.8.0.post2", "flash_attn", ["gfx942"])
    monkeypatch.syspath_prepend(str(site))
    assert (
        main(["-C", str(tmp_path), "verify", "--tree", str(tree), "--json", "--no-unit-tests", "--no-functional"]) == 1
    )
    env = json.loads(capsys.readouterr().out)["env"]
    assert env["components"]["flash_attn"] == {"version": "2.8.0.post2", "status": "ok"}
    assert env["components"]["transformer_engine"] == {"version": None, "status": "missing"}


# One verdict per component across doctor's rows, no raw None in its text: on a machine without ROCm,
# with a ROCm directory laid out like /opt/rocm (ROCM_PATH, which doctor reads), and with a CUDA GPU.


def _agrees(data: dict) -> None:
    """The "on this arch" rows say what the component table says: TE's layers and FP8 only where the
    TE row is ok, the CK flash-attention build named for use only where flash_attn's row is ok, and no
    row whose use reads as usable while its why says it is not usable here."""
    ok = {c["name"]: c["status"] == "ok" for c in data["components"]}
    use = {r["topic"]: r["use"] for r in data["recommendations"]}
    assert (use.get("layers") == "--transformer-impl transformer_engine") == ok.get("transformer_engine", False), use
    if use.get("fp8", "").startswith("available"):
        assert ok["transformer_engine"], use["fp8"]
    if use.get("flash-attention") == "the CK build (default backend)":
        assert ok["flash_attn"]
    for r in data["recommendations"]:
        alternative = r["use"].startswith(("not ", "none", "--transformer-impl local", "--attention-backend unfused"))
        assert alternative or "not usable here" not in r["why"], r


def _no_none(text: str) -> None:
    assert not re.search(r"\bNone\b", text), text


def test_doctor_without_rocm_gives_one_verdict_per_component_and_no_none(tmp_path):
    root = _project(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "ROCM_PATH"}
    runs = [
        subprocess.run(
            [
                sys.executable,
                "-m",
                "rocmport",
                "-C",
                str(root),
                "doctor",
                "--line",
                "v0.16",
                "--arch",
                "gfx942",
                *json_,
            ],
            capture_output=True,
            text=True,
            env={**env, "COLUMNS": "300"},
            timeout=120,
        )
        for json_ in ([], ["--json"])
    ]
    text, data = runs[0].stderr + runs[0].stdout, json.loads(runs[1].stdout)
    _agrees(data)
    _no_none(text)
    use = {r["topic"]: r["use"] for r in data["recommendations"]}
    assert use["fp8"] == "not usable here yet: train in bf16/fp16"  # gfx942 could, with a TE that is not here
    assert use["flash-attention"] == "not usable here yet: install the CK build"
    if not os.path.isdir("/opt/rocm"):
        assert text.splitlines()[0].endswith("; ROCm: not found (ROCM_PATH unset, no /opt/rocm); RCCL: not found")
        assert data["rocm_path"] is None and data["rocm_version"] is None  # the JSON keeps its nulls


def test_doctor_with_a_rocm_directory_and_the_components_installed(tmp_path):
    root, site, rocm = _project(tmp_path), tmp_path / "site", tmp_path / "rocm-6.2.0"
    (rocm / ".info").mkdir(parents=True)
    (rocm / ".info" / "version").write_text("6.2.0-66\n")
    (rocm / "lib").mkdir()
    (rocm / "lib" / "librccl.so.1.0.60200").write_bytes(b"\x7fELF")
    fake_dist(site, "transformer_engine", "2.10.0", "transformer_engine", ["gfx942"])
    fake_dist(site, "flash_attn", "2.8.0.post2", "flash_attn", ["gfx942"])
    env = {**os.environ, "ROCM_PATH": str(rocm), "PYTHONPATH": f"{site}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    args = [sys.executable, "-m", "rocmport", "-C", str(root), "doctor", "--line", "v0.16", "--arch", "gfx942"]
    proc = subprocess.run(args, capture_output=True, text=True, env=env, timeout=120)
    text = proc.stderr + proc.stdout  # the header (and warnings) on stderr, the tables on stdout
    data = json.loads(subprocess.run([*args, "--json"], capture_output=True, text=True, env=env, timeout=120).stdout)
    _agrees(data)
    _no_none(text)
    assert f"; ROCm 6.2.0-66 at {rocm}; RCCL {rocm}/lib/librccl.so.1.0.60200" in text.splitlines()[0]
    use = {r["topic"]: r["use"] for r in data["recommendations"]}
    assert use["fp8"] == "available (ROCm TE)" and use["flash-attention"] == "the CK build (default backend)"
    assert data["rocm_version"] == "6.2.0-66"
    # rocm-core's header where .info/version is absent
    (rocm / ".info" / "version").unlink()
    (rocm / "include" / "rocm-core").mkdir(parents=True)
    (rocm / "include" / "rocm-core" / "rocm_version.h").write_text(
        "#define ROCM_VERSION_MAJOR 6\n#define ROCM_VERSION_MINOR 3\n#define ROCM_VERSION_PATCH 1\n"
    )
    data = json.loads(subprocess.run([*args, "--json"], capture_output=True, text=True, env=env, timeout=120).stdout)
    assert data["rocm_version"] == "6.3.1"


def test_doctor_on_a_cuda_gpu_names_it_and_no_none(tmp_path, monkeypatch, capsys):
    """torch with CUDA and one H100 (its properties as torch 2.11+cu130 gives them): the header says
    CUDA, not a ROCm build; the rows agree; nothing prints None."""
    import torch

    props = type("Props", (), {"major": 9, "minor": 0, "gcnArchName": "NVIDIA H100 80GB HBM3"})()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.delenv("ROCM_PATH", raising=False)
    monkeypatch.setenv("COLUMNS", "300")
    root = _project(tmp_path)
    assert main(["-C", str(root), "doctor", "--line", "v0.16"]) == 1  # none of the components installed
    out, err = capsys.readouterr()
    _no_none(out + err)
    assert err.splitlines()[0].startswith(f"torch {torch.__version__} (CUDA 13.0: not a ROCm build); ")
    assert "sm_90" in out and "NVIDIA H100 80GB HBM3: not an AMD GPU" in out
    main(["-C", str(root), "doctor", "--line", "v0.16", "--json"])
    data = json.loads(capsys.readouterr().out)
    _agrees(data)
    assert data["devices"] == [{"index": 0, "name": "NVIDIA H100 80GB HBM3", "arch": "sm_90"}]
