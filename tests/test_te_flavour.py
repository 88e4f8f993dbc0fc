"""verify --te-flavour: the declared ROCm TE deltas (each with its source and versions), which apply
where, and, with TE's real Python layer from the package index, each delta present under rocm and
absent under nvidia as Megatron would meet it (tests/helpers/te_flavour_probe.py)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from rocmport.errors import BadInput
from rocmport.verify.runtime import te_flavour
from rocmport.verify.orchestration import te_layer
from rocmport.verify.runtime import te_rocm
from tests.helpers import te_probe
from tests.helpers.real import REPO

DOCS = REPO / "docs" / "rocm-te-flavour.md"


def test_every_delta_names_what_it_changes_its_source_and_the_versions_it_holds_for():
    assert len(te_flavour.DELTAS) >= 10
    for d in te_flavour.DELTAS:
        assert re.fullmatch(r"[a-z0-9-]+", d.name)
        assert len(d.changes) > 30, d.name
        # a ROCm TE file at a commit, or the Primus patch that works around it
        assert re.search(r"(ROCm/TransformerEngine \S+\.py @[0-9a-f]{8})|(AMD-AGI/Primus \S+)", d.source), d.name
        SpecifierSet(d.versions)  # a real version specifier
        assert d.name in te_rocm.HOOKS, f"{d.name}: declared but not implemented in te_rocm"
    assert set(te_rocm.HOOKS) == {d.name for d in te_flavour.DELTAS}, "an implemented delta that is not declared"


def test_which_deltas_hold_by_version_and_gpu():
    names = lambda v, arch: {d.name for d in te_flavour.applicable(v, arch)}  # noqa: E731
    assert "fp8-fnuz-on-gfx942" in names("2.12.0", "gfx942")
    assert "fp8-fnuz-on-gfx942" not in names("2.12.0", "gfx950")  # gfx950's FP8 is OCP
    assert "get-workspace-without-workspace-parameter" not in names("2.9.0", "gfx942")  # NVIDIA's 2.9 has both
    assert "get-workspace-without-workspace-parameter" in names("2.10.0", "gfx942")
    assert "fp8-support-by-gfx" not in names("2.8.0", "gfx942")


def test_the_flavour_defaults_to_rocm_under_the_hip_simulation_and_refuses_rocm_without_it():
    assert te_flavour.parse(None, hip_on=True) == "rocm"
    assert te_flavour.parse(None, hip_on=False) == "nvidia"
    assert te_flavour.parse("nvidia", hip_on=True) == "nvidia"
    with pytest.raises(BadInput, match="--te-flavour rocm: ROCm TE runs on a ROCm build of torch"):
        te_flavour.parse("rocm", hip_on=False)
    with pytest.raises(BadInput, match="choose one of nvidia, rocm"):
        te_flavour.parse("amd", hip_on=True)


def test_the_reported_version_is_a_pre_release_with_a_rocm_tag_that_sorts_below_the_release():
    reported = te_flavour.reported_version("2.12.0", "7.1.25424-4179531dcd")
    assert reported == "2.12.0.dev0+rocm7.1"
    assert Version(reported) < Version("2.12.0") and Version(reported).local == "rocm7.1"


def test_the_report_lists_the_deltas_applied_with_their_sources():
    flavour = te_flavour.choose("rocm", "2.12.0", "gfx942", "7.1")
    data = flavour.to_dict()
    assert data["name"] == "rocm" and data["fp8"] == "fnuz" and data["version_reported"] == "2.12.0.dev0+rocm7.1"
    assert {d["name"] for d in data["deltas"]} == {d.name for d in te_flavour.applicable("2.12.0", "gfx942")}
    assert all(d["source"] and d["versions"] for d in data["deltas"])
    env = flavour.env()
    assert env["NVTE_FLASH_ATTN"] == "0" and env["NVTE_FUSED_ATTN"] == "1"
    nvidia = te_flavour.choose("nvidia", "2.12.0", None, None)
    assert nvidia.to_dict()["deltas"] == [] and "NVTE_FUSED_ATTN" not in nvidia.env()
    assert te_flavour.choose("rocm", "2.12.0", "gfx950", "7.1").fp8 == "ocp"


def test_the_docs_page_carries_the_declared_list():
    assert te_flavour.render_markdown() in DOCS.read_text(), (
        "docs/rocm-te-flavour.md's table differs from te_flavour.DELTAS: "
        "paste `python -c 'from rocmport.verify.runtime import te_flavour; print(te_flavour.render_markdown())'`"
    )


def test_te_auto_on_a_tree_it_cannot_place_is_refused_naming_why():
    wheels = [
        te_layer.WheelFile(Version(v), f"transformer_engine-{v}-py3-none-any.whl", f"/files/{v}", "0" * 64)
        for v in ("2.12.0", "2.20.2")
    ]
    with pytest.raises(BadInput, match=r"--te auto: verify cannot place this tree in a release line"):
        te_layer.choose("auto", None, wheels)
    assert str(te_layer.choose("auto", ">=2.9.0a0,<2.18", wheels).version) == "2.12.0"


def test_the_cpu_extension_takes_the_attention_backends_from_te_s_own_source(tmp_path, monkeypatch):
    """2.20's fused_attn.py names No_Backend, F16_arbitrary_seqlen and FP8 (no F16_max512_seqlen) and
    asserts the extension has exactly those: the CPU extension's enum follows the source it runs."""
    source = tmp_path / "transformer_engine" / "pytorch" / "cpp_extensions" / "fused_attn.py"
    source.parent.mkdir(parents=True)
    source.write_text(
        "No_Backend = int(NVTE_Fused_Attn_Backend.NVTE_No_Backend)\n"
        "F16_arbitrary_seqlen = int(NVTE_Fused_Attn_Backend.NVTE_F16_arbitrary_seqlen)\n"
        "FP8 = int(NVTE_Fused_Attn_Backend.NVTE_FP8)\n"
    )
    monkeypatch.setenv("ROCMPORT_TE_PATH", str(tmp_path))
    monkeypatch.delenv(te_flavour.ENV, raising=False)
    assert te_flavour.fused_attn_backends() == {"NVTE_No_Backend": -1, "NVTE_F16_arbitrary_seqlen": 1, "NVTE_FP8": 2}
    monkeypatch.setenv(te_flavour.ENV, "rocm")
    monkeypatch.setenv(te_flavour.DELTAS_ENV, "fused-attn-backends-ck-aotriton,cudnn-version-99")
    assert te_flavour.fused_attn_backends() == {"NVTE_No_Backend": -1, "NVTE_AOTriton": 0, "NVTE_CK": 1}
    assert te_flavour.cudnn_version_encoded() == 990000


def test_the_fused_attention_rewrite_takes_both_forms_of_the_declaration():
    as_dict = (
        "FusedAttnBackend = {\n"
        '    "F16_max512_seqlen": NVTE_Fused_Attn_Backend.NVTE_F16_max512_seqlen,\n'
        '    "F16_arbitrary_seqlen": NVTE_Fused_Attn_Backend.NVTE_F16_arbitrary_seqlen,\n'
        '    "FP8": NVTE_Fused_Attn_Backend.NVTE_FP8,\n'
        '    "No_Backend": NVTE_Fused_Attn_Backend.NVTE_No_Backend,\n'
        "}\n"
    )
    assert te_rocm._rewrite_fused_attn(as_dict) == (
        "FusedAttnBackend = {\n"
        '    "AOTriton": NVTE_Fused_Attn_Backend.NVTE_AOTriton,\n'
        '    "CK": NVTE_Fused_Attn_Backend.NVTE_CK,\n'
        '    "No_Backend": NVTE_Fused_Attn_Backend.NVTE_No_Backend,\n'
        "}\n"
    )
    as_enum = (
        "class FusedAttnBackend(IntEnum):\n"
        "    No_Backend = int(NVTE_Fused_Attn_Backend.NVTE_No_Backend)\n"
        "    F16_arbitrary_seqlen = int(NVTE_Fused_Attn_Backend.NVTE_F16_arbitrary_seqlen)\n"
        "    FP8 = int(NVTE_Fused_Attn_Backend.NVTE_FP8)\n"
    )
    assert "AOTriton = int(NVTE_Fused_Attn_Backend.NVTE_AOTriton)\n    CK = int(" in te_rocm._rewrite_fused_attn(
        as_enum
    )
    assert "F16_arbitrary_seqlen" not in te_rocm._rewrite_fused_attn(as_enum)
    with pytest.raises(te_rocm.DeltaNotApplicable, match="fused-attn-backends-ck-aotriton"):
        te_rocm._rewrite_fused_attn("x = 1\n")


def test_the_fnuz_delta_scales_fp8_master_weights_to_240_as_rocm_te_does():
    """NVIDIA's tensor/utils.py hard-codes E4M3's 448 in its cast of master weights to FP8 weights (current
    and block scaling); ROCm TE's reads 240.0 if is_fp8_fnuz() else 448.0: on gfx942 both become 240."""
    nvidia = (
        "    if fp8_dtype == tex.DType.kFloat8E4M3:\n"
        "        max_fp8 = 448.0\n"
        "    elif fp8_dtype == tex.DType.kFloat8E5M2:\n"
        "        max_fp8 = 57344.0\n"
    )
    rocm = te_rocm._fnuz_master_weights(nvidia + "\n" + nvidia)
    assert rocm.count("        max_fp8 = 240.0  # rocm TE on gfx942") == 2 and "max_fp8 = 448.0" not in rocm
    assert rocm.count("max_fp8 = 57344.0") == 2  # E5M2's maximum is the same in both encodings' pairs here
    with pytest.raises(te_rocm.DeltaNotApplicable, match="fp8-fnuz-on-gfx942"):
        te_rocm._fnuz_master_weights("x = 1\n")
    assert ("transformer_engine.pytorch.tensor.utils", "source", te_rocm._fnuz_master_weights) in te_rocm.HOOKS[
        "fp8-fnuz-on-gfx942"
    ]


def test_module_hooks_rewrite_the_source_then_change_the_module_recording_each_delta(tmp_path, monkeypatch):
    """module_hooks.ModuleHooks (the one finder for TE's Python layer): a hooked module is found by the
    finders behind it, its source hooks rewrite the text that runs, then its after hooks change the
    module, in order; te_rocm records each delta once it applied; other modules load untouched."""
    from rocmport.verify.runtime import module_hooks

    pkg = tmp_path / "hooked_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "mod.py").write_text("VALUE = 'nvidia'\n")
    (pkg / "other.py").write_text("VALUE = 'nvidia'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(te_rocm, "APPLIED", [])
    hooks = module_hooks.ModuleHooks(
        {
            "hooked_pkg.mod": [
                ("after", te_rocm._recorded("second", "hooked_pkg.mod", lambda m: setattr(m, "SEEN", m.VALUE))),
                ("source", te_rocm._recorded("first", "hooked_pkg.mod", lambda s: s.replace("nvidia", "rocm"))),
            ]
        }
    )
    monkeypatch.setattr(sys, "meta_path", [hooks, *sys.meta_path])
    for name in ("hooked_pkg", "hooked_pkg.mod", "hooked_pkg.other"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    import hooked_pkg.mod
    import hooked_pkg.other

    assert hooked_pkg.mod.VALUE == "rocm" and hooked_pkg.mod.SEEN == "rocm"
    assert hooked_pkg.mod.__file__ == str(pkg / "mod.py")
    assert hooked_pkg.other.VALUE == "nvidia"
    assert te_rocm.APPLIED == ["first (hooked_pkg.mod)", "second (hooked_pkg.mod)"]
    for name in ("hooked_pkg", "hooked_pkg.mod", "hooked_pkg.other"):
        sys.modules.pop(name, None)


# ---- TE's real Python layer, imported under each flavour ----


def _probe(tmp: Path, version: str, flavour: str, arch: str | None, extra: dict[str, str] | None = None) -> dict:
    layer = te_probe.real_layer(version)
    hip_version = te_probe.HIP_VERSION if arch else None
    layer = te_layer.TELayer(
        layer.version,
        layer.path,
        layer.python_layer,
        layer.source,
        te_flavour.choose(flavour, version, arch, hip_version),
    )
    boot = tmp / f"boot-{version}-{flavour}-{arch}-{len(extra or {})}"
    env = te_probe.proxy_env(
        layer, boot, hip=hip_version, extra={**({"ROCMPORT_HIP_SIM_ARCH": arch} if arch else {}), **(extra or {})}
    )
    proc = subprocess.run(
        [sys.executable, str(REPO / "tests" / "helpers" / "te_flavour_probe.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.network
@pytest.mark.torch
@pytest.mark.slow
@pytest.mark.parametrize("version", ["2.12.0", "2.20.2"])
def test_each_delta_is_present_under_rocm_and_absent_under_nvidia(tmp_path, real_index, version):
    rocm = _probe(tmp_path, version, "rocm", "gfx942")
    nvidia = _probe(tmp_path, version, "nvidia", "gfx942")
    assert rocm["version"] == f"{version}.dev0+rocm7.1" and nvidia["version"] == version
    assert rocm["fused_attn_backends"] == ["AOTriton", "CK", "No_Backend"]
    assert rocm["tex_backends"] == ["NVTE_AOTriton", "NVTE_CK", "NVTE_No_Backend"]
    assert "F16_arbitrary_seqlen" in nvidia["fused_attn_backends"]
    assert rocm["cudnn"] == [99, 0, 0] and nvidia["cudnn"] == [0, 0, 0]
    assert all(rocm["keep_fp8_cache"].values()) and not any(nvidia["keep_fp8_cache"].values())
    assert rocm["linear_accepts_keyword"] is True
    assert "unexpected keyword argument 'keep_fp8_weight_transpose_cache'" in nvidia["linear_accepts_keyword"]
    assert rocm["get_workspace"] and not nvidia["get_workspace"]  # NVIDIA removed it in 2.10
    assert rocm["fp8"] == [True, ""]
    assert rocm["block_scaling"] == [False, "FP8 block scaled gemm not yet supported for ROCm"]
    assert rocm["mxfp8"] == [False, "MXFP8 support is not enabled."]
    assert rocm["e4m3_max"] == 240 and rocm["fnuz"] and nvidia["e4m3_max"] == 448 and not nvidia["fnuz"]
    # --fp8-param-gather's master weights cast into current-scaling FP8 weights: ROCm TE's FNUZ maximum
    assert rocm["master_weight_e4m3_max"] == 240.0
    control = _probe(tmp_path, version, "nvidia", None, {"ROCMPORT_CUDA_SIM_ARCH": "sm_90"})  # NVIDIA's, an H100
    assert control["master_weight_e4m3_max"] == 448.0
    assert rocm["formats_round_trip"] is True and nvidia["formats_round_trip"] is True  # checkpoint resume
    assert rocm["env"] == {"NVTE_FLASH_ATTN": "0", "NVTE_FUSED_ATTN": "1"}
    assert nvidia["applied"] == []
    applied = {a.split(" ")[0] for a in rocm["applied"]}
    hooked = {name for name, hooks in te_rocm.HOOKS.items() if hooks}
    assert applied == hooked & {d.name for d in te_flavour.applicable(version, "gfx942")}


@pytest.mark.network
@pytest.mark.torch
@pytest.mark.slow
def test_fp8_weights_dequantize_in_the_flavour_s_encoding_through_te_s_own_float8tensor(tmp_path, real_index):
    """TE 2.14+ dequantizes a Float8Tensor whose data is on the CPU by reading its bits as NVIDIA's OCP dtypes,
    a fallback a GPU run never takes; the proxy's device tensors are CPU tensors, so under the rocm flavour on
    gfx942 (FNUZ bits) every weight came back doubled and E4M3's maximum as NaN, and Megatron's --fp8-param-gather
    made NaN master weights from them. To TE's dequantize a tensor on the simulated device is not on the CPU
    (proxy_shim), so TE asks tex.dequantize, which decodes in the flavour's encoding; to TE asking through its own
    Float8Tensor.is_cpu it is not either, while to others asking that property (Megatron's checkpoint writer
    asserts it of a staged tensor) it is where it really is."""
    version = "2.17.1"  # v0.19's line; the fallback is in TE's float8_tensor_storage.py from 2.14
    rocm = _probe(tmp_path, version, "rocm", "gfx942")
    control = _probe(tmp_path, version, "nvidia", None, {"ROCMPORT_CUDA_SIM_ARCH": "sm_90"})  # NVIDIA's, an H100
    assert rocm["fnuz"] and not control["fnuz"]
    for answer in (rocm["dequantized_weight"], control["dequantized_weight"]):
        assert isinstance(answer, dict), answer
        assert answer["nan"] == 0 and answer["max_error"] <= 1 / 16, answer
        assert answer["staged_is_cpu"] is True, answer
        assert answer["te_asks_is_cpu"] is False and answer["te_asks_data_is_cpu"] is False, answer
        # TE 2.17's Float8Tensor has an is_cuda of its own (asking its _data from TE's file): TE asking sees the
        # simulated device, Megatron asking sees the CPU, as of a plain tensor (before: True)
        assert answer["te_asks_is_cuda"] is True and answer["megatron_asks_is_cuda"] is False, answer
        assert answer["megatron_asks_plain_is_cuda"] is False, answer


@pytest.mark.network
@pytest.mark.torch
@pytest.mark.slow
def test_a_te_2_12_fp8_weight_is_staged_for_the_checkpoint_writer_as_a_gpu_stages_it(tmp_path, real_index):
    """v0.16's native FP8 cases (TE 2.12) failed their async save: the writer's `assert tensor.is_cpu` of the
    staged weight raised an empty AssertionError ("Worker failure: "). Megatron's staging `.to("cpu")` returned
    the Float8Tensor itself (already on the CPU), and its is_cpu, asked by Megatron, came back through TE's
    __torch_function__ as if TE asked: False. On a GPU the staging is a copy through TE's _to_copy (2.12: the
    dequantized values in a plain tensor); the proxy makes that copy, and answers is_cpu where it really is."""
    answer = _probe(tmp_path, "2.12.0", "rocm", "gfx942")["dequantized_weight"]
    assert isinstance(answer, dict), answer
    assert answer["megatron_asks_is_cpu"] is True and answer["te_asks_is_cpu"] is False, answer
    # is_cuda likewise, through TE 2.12's __torch_function__ (before: Megatron asking got True)
    assert answer["megatron_asks_is_cuda"] is False and answer["te_asks_is_cuda"] is True, answer
    assert answer["staged_type"] == "Tensor" and answer["staged_max_error"] == 0, answer


@pytest.mark.network
@pytest.mark.torch
@pytest.mark.slow
def test_gfx950_runs_mxfp8_only_with_the_variable_and_keeps_ocp_fp8(tmp_path, real_index):
    without = _probe(tmp_path, "2.12.0", "rocm", "gfx950")
    assert without["mxfp8"] == [False, "MXFP8 support is not enabled."]
    assert without["e4m3_max"] == 448 and not without["fnuz"]
    with_env = _probe(tmp_path, "2.12.0", "rocm", "gfx950", {"NVTE_ROCM_ENABLE_MXFP8": "1"})
    assert with_env["mxfp8"] == [True, ""]
    on_942 = _probe(tmp_path, "2.12.0", "rocm", "gfx942", {"NVTE_ROCM_ENABLE_MXFP8": "1"})
    assert on_942["mxfp8"] == [False, "Device arch gfx95x or newer is required for MXFP8 execution."]


def _admitted_versions() -> list[str]:
    """Every TE release on the index that a Megatron-LM line's component matrix admits."""
    from rocmport.patches.series import load_series

    ranges = []
    for series in sorted((REPO / "patchsets" / "megatron-lm").glob("*/series")):
        te = load_series(series).rocm.components.get("transformer_engine")
        ranges.append(SpecifierSet(str(te.versions)))
    try:
        wheels = te_layer.list_wheels()
    except Exception as exc:  # noqa: BLE001 - no index here: nothing to parametrize over
        pytest.skip(f"the package index: {exc}")
    return [str(w.version) for w in wheels if any(r.contains(w.version, prereleases=True) for r in ranges)]


@pytest.mark.network
@pytest.mark.torch
@pytest.mark.slow
def test_every_release_a_line_admits_imports_under_both_flavours_with_the_extension_s_enum_in_sync(
    tmp_path, real_index
):
    versions = _admitted_versions()
    assert "2.9.0" in versions and "2.17.1" in versions and "2.20.2" not in versions
    for version in versions:
        for flavour in ("nvidia", "rocm"):
            seen = _probe(tmp_path, version, flavour, "gfx942")
            assert {f"NVTE_{n}" for n in seen["fused_attn_backends"]} == set(seen["tex_backends"]), (version, flavour)
