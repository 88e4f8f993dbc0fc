"""verify --te: choosing TE's Python layer, fetching it from a package index, and running TE's own
modules on the CPU proxy under torchrun (the real wheel from the package index: network tests)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from packaging.version import Version

from rocmport.errors import BadInput
from rocmport.nvidia_only import blocked
from rocmport.verify.orchestration import te_layer
from tests.helpers.pypi import Index
from tests.helpers import te_probe
from tests.helpers.real import REPO

WHEELS = [
    te_layer.WheelFile(Version(v), f"transformer_engine-{v}-py3-none-any.whl", f"/files/{v}", "0" * 64)
    for v in ("2.8.0", "2.9.0", "2.12.0", "2.13.0")
]


def test_none_auto_and_an_exact_version():
    assert te_layer.choose("none", ">=2.9.0a0,<2.13", WHEELS) is None
    assert str(te_layer.choose("auto", ">=2.9.0a0,<2.13", WHEELS).version) == "2.12.0"
    with pytest.raises(BadInput, match="--te auto: verify cannot place this tree in a release line"):
        te_layer.choose("auto", None, WHEELS)  # it would take 2.13.0, which no line admits
    assert str(te_layer.choose("2.9.0", ">=2.9.0a0,<2.13", WHEELS).version) == "2.9.0"


def test_a_version_the_index_lacks_is_bad_input_listing_what_exists():
    with pytest.raises(
        BadInput,
        match=r"--te 2\.10\.0: the package index has no Transformer Engine 2\.10\.0 Python wheel; "
        r"it has: 2\.8\.0, 2\.9\.0, 2\.12\.0, 2\.13\.0",
    ):
        te_layer.choose("2.10.0", None, WHEELS)
    with pytest.raises(BadInput, match="give a Transformer Engine version, auto or none"):
        te_layer.choose("latest", None, WHEELS)
    with pytest.raises(BadInput, match=r"no Transformer Engine wheel in this line's range >=3\.0"):
        te_layer.choose("auto", ">=3.0", WHEELS)


def _wheel(tmp_path: Path, version: str, members: dict[str, str] | None = None) -> Path:
    path = tmp_path / f"transformer_engine-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for name, text in (
            members
            or {
                "transformer_engine/__init__.py": f"__version__ = '{version}'\n",
                f"transformer_engine-{version}.dist-info/METADATA": f"Name: transformer_engine\nVersion: {version}\n",
            }
        ).items():
            zf.writestr(name, text)
    return path


def test_the_wheel_is_fetched_verified_and_unpacked_once(tmp_path, monkeypatch):
    files = tmp_path / "files"
    files.mkdir()
    with Index(files) as index:
        for v in ("2.9.0", "2.12.0"):
            index.add("transformer-engine", _wheel(files, v))
        index.files["transformer-engine"].append(
            {"filename": "transformer_engine-2.11.0.tar.gz", "url": "/files/x", "hashes": {"sha256": "0" * 64}}
        )  # an sdist is not a Python layer
        monkeypatch.setenv("ROCMPORT_INDEX_URL", index.url)
        wheels = te_layer.list_wheels()
        assert [str(w.version) for w in wheels] == ["2.9.0", "2.12.0"]
        layer = te_layer.fetch(tmp_path / "cache", te_layer.choose("auto", ">=2.9.0a0,<2.13", wheels))
        assert layer.path == tmp_path / "cache" / "te" / "2.12.0"
        assert (layer.path / "transformer_engine" / "__init__.py").read_text() == "__version__ = '2.12.0'\n"
        assert layer.to_dict() == {
            "version": "2.12.0",
            "python_layer": "NVIDIA's Python layer",
            "source": "transformer_engine-2.12.0-py3-none-any.whl from the package index",
            "note": "ROCm TE differences not simulated",
            "flavour": {"name": "nvidia", "version_reported": None, "fp8": "ocp", "deltas": []},
        }
        te_layer.fetch(tmp_path / "cache", wheels[-1])
        assert index.hits["transformer_engine-2.12.0-py3-none-any.whl"] == 1


def test_a_wheel_whose_hash_differs_is_discarded(tmp_path, monkeypatch):
    from rocmport.errors import RocmportError

    files = tmp_path / "files"
    files.mkdir()
    with Index(files) as index:
        index.add("transformer-engine", _wheel(files, "2.9.0"), sha256="f" * 64)
        monkeypatch.setenv("ROCMPORT_INDEX_URL", index.url)
        with pytest.raises(RocmportError, match="does not match the index's"):
            te_layer.fetch(tmp_path / "cache", te_layer.list_wheels()[0])
    assert not (tmp_path / "cache" / "te" / "2.9.0").exists()


def test_a_member_escaping_the_unpack_directory_is_refused(tmp_path, monkeypatch):
    files = tmp_path / "files"
    files.mkdir()
    with Index(files) as index:
        index.add("transformer-engine", _wheel(files, "2.9.0", {"../../evil.py": "x = 1\n"}))
        monkeypatch.setenv("ROCMPORT_INDEX_URL", index.url)
        with pytest.raises(BadInput, match="escapes the unpack directory"):
            te_layer.fetch(tmp_path / "cache", te_layer.list_wheels()[0])
    assert not (tmp_path / "evil.py").exists() and not (tmp_path / "cache" / "evil.py").exists()


def test_verify_te_with_a_version_the_index_lacks_exits_2_listing_versions(tmp_path):
    tree = tmp_path / "tree"
    (tree / "megatron" / "core").mkdir(parents=True)
    (tree / "megatron" / "core" / "__init__.py").write_text("")
    files = tmp_path / "files"
    files.mkdir()
    with Index(files) as index:
        for v in ("2.9.0", "2.12.0"):
            index.add("transformer-engine", _wheel(files, v))
        env = {**os.environ, "ROCMPORT_INDEX_URL": index.url, "ROCMPORT_CACHE_DIR": str(tmp_path / "cache")}
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "rocmport",
                "-C",
                str(tmp_path),
                "verify",
                "--tree",
                str(tree),
                "--te",
                "2.10.0",
                "--dry-run",
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
    assert proc.returncode == 2, proc.stderr
    assert (
        "--te 2.10.0: the package index has no Transformer Engine 2.10.0 Python wheel; it has: 2.9.0, 2.12.0"
        in proc.stderr
    )
    # one line of error, no traceback: anything else on stderr is a progress line ("... ")
    assert [ln for ln in proc.stderr.strip().splitlines() if not ln.startswith("... ")] == [
        ln for ln in proc.stderr.strip().splitlines() if ln.startswith("rocmport: error: --te 2.10.0")
    ]


def test_the_firewall_lets_te_through_and_keeps_flash_attention_out():
    shut = te_layer.unblocked(blocked("cpu-proxy"))
    assert "transformer_engine" not in shut and "transformer_engine_torch" not in shut
    assert "flash_attn" in shut and "apex" in shut


# ---- TE's own Python layer on the proxy (the real wheel from the package index) ----


def _tp2(
    layer: te_layer.TELayer, tmp_path: Path, *extra: str, env: dict[str, str] | None = None, hip: bool = True
) -> list[dict]:
    out = tmp_path / "out.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            "2",
            str(REPO / "tests" / "helpers" / "te_tp_worker.py"),
            str(out),
            *extra,
        ],
        env=te_probe.proxy_env(layer, tmp_path / "boot", hip=te_probe.HIP_VERSION if hip else None, extra=env),
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert proc.returncode == 0 and out.is_file(), proc.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.network
@pytest.mark.torch
@pytest.mark.slow
@pytest.mark.parametrize("version", ["2.9.0", "2.17.1"])
def test_te_modules_at_tp2_match_torch_on_the_full_weights(tmp_path, real_index, version):
    """TE's Linear (column, row), LayerNormLinear, LayerNormMLP and DotProductAttention from the
    real Python layer, tp2 over gloo: forward, input and weight gradients within 1e-4 of plain torch."""
    ranks = _tp2(te_probe.real_layer(version), tmp_path)
    for rank in ranks:
        assert rank["te_version"] == version
        for module in ("Linear(column)", "Linear(row)", "LayerNormLinear", "LayerNormMLP", "DotProductAttention"):
            assert rank[module] <= 1e-4, (module, rank)
        assert rank["kernels"]["generic_gemm"] > 0 and rank["kernels"]["layernorm_fwd"] > 0


# FP8's bound on the tp2 module check: the worst difference relative to the reference's largest
# magnitude, forward and gradients, HYBRID (E4M3 forward, E5M2 gradients: 2 mantissa bits, 2^-3
# relative rounding). Measured 0.045-0.118 on one rank (2.12.0: delayed and current FNUZ, MXFP8 OCP).
FP8_BOUND = 0.2


@pytest.mark.network
@pytest.mark.torch
@pytest.mark.slow
@pytest.mark.parametrize(
    "flavour,recipe,env,hip",
    [
        ("rocm", "delayed", {"ROCMPORT_HIP_SIM_ARCH": "gfx942"}, True),  # FNUZ
        ("rocm", "current", {"ROCMPORT_HIP_SIM_ARCH": "gfx942"}, True),  # FNUZ
        ("rocm", "mxfp8", {"ROCMPORT_HIP_SIM_ARCH": "gfx950", "NVTE_ROCM_ENABLE_MXFP8": "1"}, True),  # OCP
        ("nvidia", "delayed", {"ROCMPORT_CUDA_SIM_ARCH": "sm_90"}, False),  # the CUDA control, OCP
    ],
)
def test_te_modules_under_fp8_at_tp2_stay_within_the_fp8_bound(tmp_path, real_index, flavour, recipe, env, hip):
    """TE's own modules under fp8_autocast, two steps (delayed scaling's second step uses the scales
    the first step's amaxes gave), tp2 against fp32 torch on the full weights: within FP8_BOUND, and
    not exactly fp32 (the casts ran)."""
    from dataclasses import replace

    from rocmport.verify.runtime import te_flavour

    layer = te_probe.real_layer("2.12.0")
    arch = env.get("ROCMPORT_HIP_SIM_ARCH")
    layer = replace(layer, flavour=te_flavour.choose(flavour, "2.12.0", arch, te_probe.HIP_VERSION if hip else None))
    ranks = _tp2(layer, tmp_path, f"fp8:{recipe}", env=env, hip=hip)
    for rank in ranks:
        assert "unsupported" not in rank, rank
        for module in ("Linear(column)", "Linear(row)", "LayerNormLinear", "LayerNormMLP"):
            assert 1e-4 < rank[module] <= FP8_BOUND, (module, rank)
        assert rank["kernels"]["generic_gemm(fp8)"] > 0 and rank["kernels"]["quantize"] > 0
        # the casts wrote the flavour's encodings: FNUZ on gfx942 under rocm (an OCP cast fails this), else OCP
        encodings = {"fnuz": {"e4m3fnuz", "e5m2fnuz"}, "ocp": {"e4m3fn", "e5m2"}}[layer.flavour.fp8]
        assert rank["casts"] and set(rank["casts"]) <= encodings, (layer.flavour.fp8, rank["casts"])
        assert layer.flavour.fp8 == ("fnuz" if arch == "gfx942" else "ocp")
        if recipe == "delayed":
            assert rank["kernels"]["fused_amax_and_scale_update_after_reduction"] > 0


@pytest.mark.network
@pytest.mark.torch
@pytest.mark.slow
def test_fp8_block_scaling_reaches_a_kernel_the_proxy_lacks_and_names_it(tmp_path, real_index):
    """Float8BlockScaling on the CUDA path (an H100: NVIDIA's TE runs it there): its casts are not
    in the CPU layer, and the run says which kernel, counting nothing as a pass."""
    ranks = _tp2(
        te_probe.real_layer("2.12.0"), tmp_path, "fp8:block", env={"ROCMPORT_CUDA_SIM_ARCH": "sm_90"}, hip=False
    )
    for rank in ranks:
        assert rank["unsupported"].startswith("unsupported-in-proxy: transformer_engine_torch.quantize"), rank
        assert "Linear(column)" not in rank  # nothing counted as a pass


def test_stage_4_names_the_te_kernel_the_proxy_lacks_as_unsupported(tmp_path):
    """pretrain_gpt.py's workers die on te_cpu's refusal: the stage is unsupported-in-proxy naming the
    kernel, never a plain failure (and, on the GPU path, no such relabelling)."""
    import subprocess as sp

    from rocmport.verify.stages.functional import _failure

    stderr = (
        "[rank0]: rocmport.verify.runtime.te_cpu.UnsupportedInProxy: unsupported-in-proxy: transformer_engine_torch.fused_attn_fwd "
        "has no CPU reference implementation\n"
    )
    res = _failure(sp.CompletedProcess([], 1, "", stderr), tmp_path, True, None, "pretrain_gpt.py", 1.0, {})
    assert res.status == "unsupported-in-proxy" and "transformer_engine_torch.fused_attn_fwd" in res.reason
    assert (
        _failure(sp.CompletedProcess([], 1, "", stderr), tmp_path, False, None, "pretrain_gpt.py", 1.0, {}).status
        == "fail"
    )


PADDING_PROBE = """
import json, sys
import torch
from transformer_engine.pytorch import Fp8Padding, Fp8Unpadding

torch.manual_seed(0)
x = torch.randn(7, 3, requires_grad=True)
w = torch.randn(7, 3)
out, padded = Fp8Padding(2, align_size=16)(x, [2, 5])
y = Fp8Unpadding(2, align_size=16)(out, [2, 5])
(y * w).sum().backward()
rows = out.detach()
print(json.dumps({
    "padded": padded,
    "shape": list(rows.shape),
    "heads_are_x": bool(torch.equal(rows[:2], x[:2].detach()) and torch.equal(rows[16:21], x[2:].detach())),
    "pads_zero": bool(torch.count_nonzero(rows[2:16]) == 0 and torch.count_nonzero(rows[21:]) == 0),
    "round_trip": bool(torch.equal(y.detach(), x.detach())),
    "grad_is_w": bool(torch.equal(x.grad, w)),
}))
"""


@pytest.mark.network
@pytest.mark.torch
@pytest.mark.parametrize("version", ["2.12.0", "2.17.1"])
def test_te_fp8_padding_and_unpadding_run_forward_and_backward_on_the_cpu_kernels(tmp_path, real_index, version):
    """TE's own Fp8Padding / Fp8Unpadding (an FP8 MoE's grouped GEMM input, each expert's rows padded to
    16): the rows kept, the padding zero, the round trip exact, the gradient unpadded back to each row."""
    layer = te_probe.real_layer(version)
    proc = subprocess.run(
        [sys.executable, "-c", PADDING_PROBE],
        env=te_probe.proxy_env(layer, tmp_path / "boot", hip=None),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got == {
        "padded": [16, 16],
        "shape": [32, 3],
        "heads_are_x": True,
        "pads_zero": True,
        "round_trip": True,
        "grad_is_w": True,
    }
