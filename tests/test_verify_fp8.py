"""verify --fp8-recipe / --te-flavour: the options refused where they cannot apply (exit 2, one line),
and stage 2's worker running the tree's own FP8 argument validation before it builds anything."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.real import REPO


def _verify(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    tree = tmp_path / "tree"
    (tree / "megatron" / "core").mkdir(parents=True, exist_ok=True)
    (tree / "megatron" / "core" / "__init__.py").write_text("")
    return subprocess.run(
        [sys.executable, "-m", "rocmport", "-C", str(tmp_path), "verify", "--tree", str(tree), *args, "--dry-run"],
        capture_output=True,
        text=True,
        env={**os.environ, "ROCMPORT_CACHE_DIR": str(tmp_path / "cache")},
        timeout=120,
    )


def test_fp8_without_te_is_refused(tmp_path):
    proc = _verify(tmp_path, "--fp8-recipe", "delayed")
    assert proc.returncode == 2, proc.stderr
    assert "--fp8-recipe: FP8 runs through Transformer Engine; pass --te VERSION|auto" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_the_rocm_flavour_without_the_hip_simulation_is_refused(tmp_path):
    proc = _verify(tmp_path, "--no-hip-sim", "--te-flavour", "rocm")
    assert proc.returncode == 2, proc.stderr
    assert "--te-flavour rocm: ROCm TE runs on a ROCm build of torch" in proc.stderr


def test_te_auto_on_a_tree_verify_cannot_place_is_refused(tmp_path):
    proc = _verify(tmp_path, "--te", "auto")
    assert proc.returncode == 2, proc.stderr
    assert "--te auto: verify cannot place this tree in a release line" in proc.stderr


def _worker_check(tmp_path: Path, helper: str | None) -> subprocess.CompletedProcess:
    root = tmp_path / "tree"
    (root / "megatron" / "core").mkdir(parents=True, exist_ok=True)
    (root / "megatron" / "__init__.py").write_text("")
    (root / "megatron" / "core" / "__init__.py").write_text("")
    if helper is not None:
        (root / "megatron" / "core" / "_rocm.py").write_text(helper)
    code = "from rocmport.verify.runtime.gpt_worker import check_fp8_args, fp8_setting\ncheck_fp8_args(*fp8_setting())\nprint('ok')"
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(root), str(REPO)]),
            "ROCMPORT_VERIFY_FP8": "hybrid:mxfp8",
        },
        timeout=60,
        cwd=tmp_path,
    )


def test_stage_2_runs_the_tree_s_own_fp8_argument_validation(tmp_path):
    helper = (
        "def check_fp8_for_arch(args):\n"
        "    raise ValueError(f'--fp8-format {args.fp8} --fp8-recipe {args.fp8_recipe}: gfx942 cannot run it')\n"
    )
    proc = _worker_check(tmp_path / "port", helper)
    assert proc.returncode != 0
    assert "ValueError: --fp8-format hybrid --fp8-recipe mxfp8: gfx942 cannot run it" in proc.stderr
    # the unported tree has no such check: nothing is refused before TE decides
    assert _worker_check(tmp_path / "unported", None).stdout.strip() == "ok"


@pytest.mark.parametrize("value, expected", [("hybrid:delayed", ("hybrid", "delayed")), ("e4m3:", ("e4m3", "delayed"))])
def test_the_fp8_setting_reaches_the_worker_as_format_and_recipe(monkeypatch, value, expected):
    from rocmport.verify.runtime import gpt_worker

    monkeypatch.setenv(gpt_worker.FP8_ENV, value)
    assert gpt_worker.fp8_setting() == expected
    monkeypatch.delenv(gpt_worker.FP8_ENV)
    assert gpt_worker.fp8_setting() is None


def test_fp8_casts_in_an_encoding_other_than_the_flavours_are_named():
    from rocmport.verify.runtime.te_flavour import fp8_casts_differ

    assert fp8_casts_differ({"e4m3fnuz": 3, "e5m2fnuz": 2}, "fnuz") is None
    assert fp8_casts_differ({"e4m3fn": 3, "e5m2": 1}, "ocp") is None
    wrong = fp8_casts_differ({"e4m3fn": 3, "e5m2fnuz": 1}, "fnuz")
    assert wrong == "FP8 casts in e4m3fn ×3, not the FNUZ encodings (e4m3fnuz, e5m2fnuz) this flavour and GPU use"
    assert fp8_casts_differ({}, "ocp") == "no FP8 cast ran (the FP8 path was not taken)"


@pytest.mark.network
@pytest.mark.torch
@pytest.mark.slow
def test_fp8_training_on_the_proxy_casts_fnuz_on_gfx942_and_ocp_on_the_cuda_control(tmp_path, real_index):
    """CI's FP8 training on the proxy (no mirror: the package-index source, megatron-core 0.16.1, ported):
    stage 2 with TE's Python layer and --fp8-recipe delayed, tp2 against tp1 from the same weights. On a
    simulated gfx942 under the rocm flavour every cast is FNUZ (an OCP cast fails it); the CUDA control
    (NVIDIA's flavour, a simulated H100) casts OCP. The loss falls and tp2 stays within the FP8 bound."""
    import json

    from rocmport.cli import main
    from tests.helpers.real import project_with

    root = project_with(tmp_path / "project", {"megatron-lm": "v0.16"})
    assert main(["-C", str(root), "sync", "--ref", "v0.16", "--source", "pypi", "--no-bridge"]) == 0
    assert main(["-C", str(root), "apply"]) == 0
    common = ["--stages", "2", "--tp", "2", "--pp", "1", "--iters", "4", "--te", "auto", "--no-moe"]
    runs = {
        "fnuz": ["--hip-arch", "gfx942", "--te-flavour", "rocm"],
        "ocp": ["--no-hip-sim", "--te-flavour", "nvidia"],
    }
    for encoding, flavour in runs.items():
        report = tmp_path / f"{encoding}.json"
        rc = main(["-C", str(root), "verify", *common, *flavour, "--fp8-recipe", "delayed", "--report", str(report)])
        data = json.loads(report.read_text())
        stage = next(s for s in data["stages"] if s["name"] == "gpt-training")
        assert rc == 0 and stage["status"] == "pass", stage
        training = data["training"]
        assert data["te"]["flavour"]["fp8"] == encoding
        casts = training["fp8_casts"]
        assert casts and set(casts) <= {"fnuz": {"e4m3fnuz", "e5m2fnuz"}, "ocp": {"e4m3fn", "e5m2"}}[encoding], casts
        assert training["losses"][-1] < training["losses"][0] and training["max_abs_diff"] <= training["tolerance"]
