"""Stage 4's CUDA-path twin of an FP8 case (case_run._twin): where the golden cannot decide (none, or
recorded on another machine, whose kernels an FP8 cast turns into other codes), the same ported tree
and arguments run on the CUDA path with NVIDIA's TE layer and only ROCm TE's arithmetic deltas, and
its losses must be the ROCm run's. Real runs of a small pretrain_gpt.py through stage 4 (its casts
through the proxy's own FP8 encoder), the twin's environment as verify builds it, and the label."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from rocmport.verify.runtime import hip_sim, protocol
from rocmport.verify.runtime import te_flavour
from tests.helpers.canned_case import CASE, CONFIG, proxy_case_kwargs
from tests.test_functional_stage import FP8_PRETRAIN, make_tree, proxy_env

# FP8_PRETRAIN's check, then a loss curve that carries one FP8 cast of the run's own encoding (the
# proxy's encoder, counted as TE's CPU kernels count theirs): FNUZ and OCP give other curves, as they
# do in a real run. FAKE_HIP_BUG scales the curve on the HIP path only: a port mistake there.
TWIN_PRETRAIN = FP8_PRETRAIN.replace(
    "for i in range(1, iters + 1):",
    textwrap.dedent("""\
    import torch
    from rocmport.verify.runtime import te_fp8

    fmt = (te_fp8.FNUZ if te_fp8.family() == "fnuz" else te_fp8.OCP)["e4m3"]
    values = torch.linspace(0.01, 300.0, 97)
    cast = te_fp8.decode(te_fp8.encode(values, fmt), fmt)
    te_fp8.CASTS[fmt.name] = te_fp8.CASTS.get(fmt.name, 0) + 1
    shift += float((cast - values).abs().sum()) * 1e-3
    if os.environ.get("ROCMPORT_HIP_SIM") and os.environ.get("FAKE_HIP_BUG"):
        shift += 1e-3
    """)
    + "for i in range(1, iters + 1):",
    1,
)
VERSION = "2.12.0"


def fp8_twin_tree(root: Path) -> Path:
    from rocmport.codemods.runner import helper_text

    tree = make_tree(root, TWIN_PRETRAIN)
    cfg = tree / "tests" / "functional_tests" / "test_cases" / "gpt" / CASE / "model_config.yaml"
    cfg.write_text(CONFIG.replace("MODEL_ARGS:\n", "MODEL_ARGS:\n  --fp8-format: hybrid\n  --fp8-recipe: delayed\n", 1))
    (tree / "megatron" / "core" / "_rocm.py").write_text(helper_text(["fp8-arch-check"]))
    return tree


def _envs(tmp_path: Path, tree: Path) -> tuple[dict, dict]:
    """The ROCm run's environment (HIP simulation, rocm flavour on gfx942) and its CUDA-path twin's."""
    rocm = te_flavour.choose("rocm", VERSION, "gfx942", hip_sim.DEFAULT_VERSION)
    hip = proxy_env(tmp_path / "hip", tree, **rocm.env())
    twin = proxy_env(tmp_path / "twin", tree, hip=None, **te_flavour.cuda_twin(rocm).env())
    return hip, twin


def _kwargs(series_dir: Path | None, record: bool = False) -> dict:
    """The canned case's arguments as an FP8 case on a simulated gfx942: 4 iterations, no resume."""
    from rocmport.verify.stages.case_plan import ProxyTE

    te = ProxyTE("rocm", "fnuz", "gfx942")
    return proxy_case_kwargs(iters=4, series_dir=series_dir, record=record, resume=False, te=te, rocm=True)


def test_the_twin_keeps_only_the_deltas_that_change_arithmetic():
    rocm = te_flavour.choose("rocm", VERSION, "gfx942", hip_sim.DEFAULT_VERSION)
    assert "baked-attention-env" in {d.name for d in rocm.deltas} and rocm.fp8 == "fnuz"
    twin = te_flavour.cuda_twin(rocm)
    assert (twin.name, [d.name for d in twin.deltas], twin.fp8) == ("rocm", ["fp8-fnuz-on-gfx942"], "fnuz")
    env = twin.env()
    # NVIDIA's version string (no .dev0+rocm tag), none of the API deltas' variables
    assert env[protocol.TE_VERSION.name] is None and env[protocol.TE_DELTAS.name] == "fp8-fnuz-on-gfx942"
    assert "NVTE_FUSED_ATTN" not in env
    # gfx950 casts OCP as NVIDIA does: its twin is NVIDIA's layer as released
    gfx950 = te_flavour.cuda_twin(te_flavour.choose("rocm", VERSION, "gfx950", hip_sim.DEFAULT_VERSION))
    assert (gfx950.name, gfx950.deltas, gfx950.fp8) == ("nvidia", (), "ocp")
    # the one declared delta that changes what TE computes; a new one must say which it is
    assert [d.name for d in te_flavour.DELTAS if d.arithmetic] == ["fp8-fnuz-on-gfx942"]


def test_verifys_twin_environment_is_the_cuda_path_with_the_arithmetic_deltas(tmp_path):
    from rocmport.verify.orchestration import firewall
    from rocmport.verify.orchestration.contract import VerifyOptions
    from rocmport.verify.orchestration.run import _cuda_twin_env
    from rocmport.verify.orchestration.te_layer import TELayer

    rocm = te_flavour.choose("rocm", VERSION, "gfx942", hip_sim.DEFAULT_VERSION)
    layer = TELayer(VERSION, tmp_path / "te", "NVIDIA's Python layer", "test", flavour=rocm)
    opts = VerifyOptions(tree=tmp_path, te=layer)
    boot = firewall.write_bootstrap(tmp_path / "boot")
    env = _cuda_twin_env(opts, "cpu-proxy", "cpu-proxy", "gloo", hip_sim.DEFAULT_VERSION, boot)
    assert env is not None
    assert protocol.HIP_SIM.name not in env and protocol.HIP_SIM_ARCH.name not in env and "ROCM_HOME" not in env
    assert env[protocol.TE_FLAVOUR.name] == "rocm" and env[protocol.TE_DELTAS.name] == "fp8-fnuz-on-gfx942"
    assert env[protocol.TE_FP8.name] == "fnuz" and protocol.TE_VERSION.name not in env
    assert protocol.PORT_SITES.name not in env  # the twin's sites are not the ROCm run's
    # no twin without the HIP simulation, or under NVIDIA's flavour
    assert _cuda_twin_env(opts, "cpu-proxy", "cpu-proxy", "gloo", None, boot) is None
    nvidia = VerifyOptions(tree=tmp_path, te=TELayer(VERSION, tmp_path / "te", "x", "y"))
    assert _cuda_twin_env(nvidia, "cpu-proxy", "cpu-proxy", "gloo", hip_sim.DEFAULT_VERSION, boot) is None


@pytest.mark.torch
@pytest.mark.slow
def test_a_drifted_fp8_golden_gives_way_to_a_twin_with_the_same_losses(tmp_path):
    """A golden recorded here, then moved as another machine's kernels move an FP8 curve (3e-4): without
    the twin the case fails on the drift; with it, the twin's losses equal the ROCm run's and decide."""
    from rocmport.verify.stages.functional import golden_path, run_case

    tree = fp8_twin_tree(tmp_path / "port")
    hip, twin = _envs(tmp_path, tree)
    series = tmp_path / "series"
    (series / "goldens").mkdir(parents=True)
    recorded = run_case(tree, hip, **_kwargs(series, record=True))
    assert recorded.result.status == "pass", recorded.result.reason
    golden = golden_path(series, CASE, "cpu-proxy-fp8-fnuz")
    data = json.loads(golden.read_text())
    data["losses"] = [x * (1 + 3e-4) for x in data["losses"]]
    golden.write_text(json.dumps(data))

    alone = run_case(tree, hip, **_kwargs(series))
    assert alone.result.status == "fail" and "losses drift from the golden by" in alone.result.reason
    assert alone.run is not None and alone.run.cuda_twin is None

    out = run_case(tree, hip, **_kwargs(series), cuda_twin_env=twin)
    assert out.result.status == "pass", out.result.reason
    assert out.run is not None and out.run.cuda_twin is not None
    assert out.run.cuda_twin.matches and out.run.cuda_twin.max_rel_drift == 0.0
    assert out.run.cuda_twin.losses == out.run.losses
    assert "its CUDA-path twin" in out.result.reason and "the golden's drift is not the HIP path's" in out.result.reason
    assert out.run.golden is not None and out.run.golden.max_rel_drift > 2e-4  # still reported
    assert out.run.to_dict()["cuda_twin"]["te"].endswith("(fp8-fnuz-on-gfx942)")


@pytest.mark.torch
@pytest.mark.slow
def test_a_hip_only_arithmetic_mistake_is_a_port_regression_through_the_twin(tmp_path, monkeypatch):
    """The same case with a mistake on the HIP path only: no golden to compare with, the twin runs, its
    losses differ, and the case is a port-regression without the unported tree's run."""
    from rocmport.verify.stages.functional import run_case
    from rocmport.verify.stages.functional.case_labels import label_case, twin_differs

    tree = fp8_twin_tree(tmp_path / "port")
    hip, twin = _envs(tmp_path, tree)
    good = run_case(tree, hip, **_kwargs(None), cuda_twin_env=twin)
    assert good.result.status == "pass" and good.run is not None and good.run.cuda_twin is not None, good.result.reason
    assert good.run.cuda_twin.matches
    hip["FAKE_HIP_BUG"] = twin["FAKE_HIP_BUG"] = "1"
    bad = run_case(tree, hip, **_kwargs(None), cuda_twin_env=twin)
    assert bad.result.status == "fail" and bad.run is not None and bad.run.cuda_twin is not None
    assert not bad.run.cuda_twin.matches and bad.run.cuda_twin.max_rel_drift > 40 * bad.run.cuda_twin.tolerance
    assert "losses differ from the port's own CUDA path with the same arithmetic" in bad.result.reason
    assert twin_differs(bad.failure)
    label, why = label_case(bad, None)
    assert label == "port-regression" and "its own CUDA path" in why
