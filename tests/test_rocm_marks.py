"""AMD's ROCm known failures (issue 29 item 2): every mark its fork puts on upstream's unit tests is in
each line's series where the test exists, and verify applies them by platform and GPU architecture:
on a ROCm GPU and in the HIP simulation (the arch-conditional ones only on their arch, real or
simulated with --hip-arch), never on the CUDA path.

The mirror test reads AMD's marks from its 0.15 port as NVIDIA's mirror holds it
(refs/pull/3318/head) and each line's release tree:
    ROCMPORT_TEST_MLM_MIRROR=/path/to/Megatron-LM.git python -m pytest -q -m mirror tests/test_rocm_marks.py"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from rocmport.cli import main
from rocmport.errors import BadInput
from rocmport.patches.series import load_series
from rocmport.patches.verify_settings import parse_settings
from rocmport.machine import probe
from rocmport.verify.orchestration import run
from rocmport.verify.runtime import hip_sim
from rocmport.verify.stages.unit_tests.labels import label
from rocmport.verify.stages.unit_tests.results import SuiteRun

ROOT = Path(__file__).resolve().parents[1]
MLM = os.environ.get("ROCMPORT_TEST_MLM_MIRROR")
AMD = "refs/pull/3318/head"
RELEASES = {
    "v0.15": "core_v0.15.3",
    "v0.16": "core_v0.16.1",
    "v0.17": "core_v0.17.1",
    "v0.18": "core_v0.18.2",
    "v0.19": "core_v0.19.0",
}
MARKS = ("failing_on_rocm", "failing_on_rocm_mi250", "failing_on_upstream")
FP8_BLOCK = "tests/unit_tests/transformer/test_transformer_block.py::TestParallelTransformerBlock::test_gpu_forward_full_checkpoint_fp8"
MLA_THD = "tests/unit_tests/transformer/test_multi_latent_attention.py::TestParallelMLAAttention::test_gpu_forward_thd"


def settings(line: str):
    path = ROOT / "patchsets" / "megatron-lm" / line / "series"
    return parse_settings(load_series(path).verify, str(path))


def git(*args: str) -> str:
    return subprocess.run(["git", f"--git-dir={MLM}", *args], capture_output=True, text=True, check=True).stdout


def marked_tests(ref: str) -> dict[str, set[str]]:
    """{test id (file::Class::test): the fork's marks on it} read from the decorators at ``ref``."""
    out: dict[str, set[str]] = {}
    for hit in git(
        "grep", "-l", "-E", r"pytest\.mark\.(failing_on_rocm|failing_on_upstream)", ref, "--", "tests/unit_tests"
    ).split():
        path = hit.split(":", 1)[1]
        tree = ast.parse(git("show", f"{ref}:{path}"))
        for cls, fn in _functions(tree):
            names = {
                d.attr
                for d in (dec.func if isinstance(dec, ast.Call) else dec for dec in fn.decorator_list)
                if isinstance(d, ast.Attribute)
            }
            if names & set(MARKS):
                out[f"{path}::{cls + '::' if cls else ''}{fn.name}"] = names & set(MARKS)
    return out


def _functions(tree: ast.Module):
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            yield None, node
        elif isinstance(node, ast.ClassDef):
            yield from ((node.name, f) for f in node.body if isinstance(f, ast.FunctionDef))


def exists(tag: str, test_id: str) -> bool:
    path, node = test_id.split("::", 1)
    try:
        tree = ast.parse(git("show", f"{tag}:{path}"))
    except subprocess.CalledProcessError:
        return False
    return any(f"{cls + '::' if cls else ''}{fn.name}" == node for cls, fn in _functions(tree))


@pytest.mark.mirror
@pytest.mark.skipif(not MLM, reason="set ROCMPORT_TEST_MLM_MIRROR to a local Megatron-LM mirror")
def test_every_amd_mark_is_in_each_line_where_the_test_exists():
    marks = marked_tests(AMD)
    # What the issue names: six MLA tests, async save, GLU MLP, the MI250-only transformer-block tests.
    assert sum(1 for t in marks if "test_multi_latent_attention.py" in t) == 6
    assert marks[FP8_BLOCK] == {"failing_on_rocm_mi250"}
    seen_absent = 0
    for line, tag in RELEASES.items():
        cfg = settings(line)
        for test_id, names in marks.items():
            if not exists(tag, test_id):
                seen_absent += 1
                assert test_id not in cfg.rocm_known_failures, (line, test_id)
                continue
            if names & {"failing_on_rocm", "failing_on_upstream"}:
                reason = cfg.rocm_known_failures.get(test_id, "")
                assert AMD in reason and any(n in reason for n in names), (line, test_id, reason)
            if "failing_on_rocm_mi250" in names:
                reason = cfg.rocm_arch_known_failures.get("gfx90a", {}).get(test_id, "")
                assert AMD in reason and "failing_on_rocm_mi250" in reason, (line, test_id, reason)
    assert seen_absent  # retro's test and the v0.15 async-save test are gone later: not listed there


def test_each_line_lists_the_issues_marks_with_reason_and_source():
    for line in RELEASES:
        cfg = settings(line)
        assert AMD in cfg.rocm_known_failures[MLA_THD]
        assert "failing_on_rocm_mi250" in cfg.rocm_arch_known_failures["gfx90a"][FP8_BLOCK]
        # An arch mark is not a mark for every arch.
        assert FP8_BLOCK not in cfg.rocm_known_failures


@pytest.mark.parametrize("line", sorted(RELEASES))
def test_marks_applied_by_platform_and_arch(line):
    cfg = settings(line)
    sim_mi250, _ = cfg.known_for("cpu-proxy", hip=False, hip_sim=True, arch="gfx90a")
    sim_mi300, skipped = cfg.known_for("cpu-proxy", hip=False, hip_sim=True, arch="gfx942")
    cuda, cuda_skipped = cfg.known_for("cpu-proxy", hip=False, hip_sim=False, arch=None)
    gpu_mi250, _ = cfg.known_for("gpu", hip=True, arch="gfx90a")
    cuda_gpu, _ = cfg.known_for("gpu", hip=False, arch=None)
    assert FP8_BLOCK in sim_mi250 and FP8_BLOCK in gpu_mi250
    assert FP8_BLOCK not in sim_mi300 and "gfx90a" in skipped["rocm_arch_known_failures.gfx90a"]
    assert MLA_THD in sim_mi250 and MLA_THD in sim_mi300 and MLA_THD in gpu_mi250
    for control in (cuda, cuda_gpu):
        assert FP8_BLOCK not in control and MLA_THD not in control
    assert set(cuda_skipped) >= {"rocm_known_failures", "rocm_arch_known_failures.gfx90a"}
    # As stage 3 labels them: known-failure on the simulated MI250, port-regression on another arch and the CUDA path.
    port = {"outcomes": {f"{FP8_BLOCK}": "failed"}}
    base = {"outcomes": {f"{FP8_BLOCK}": "passed"}}
    assert label(SuiteRun.from_dict(port), SuiteRun.from_dict(base), sim_mi250)[0] == {FP8_BLOCK: "known-failure"}
    assert label(SuiteRun.from_dict(port), SuiteRun.from_dict(base), sim_mi300)[0] == {FP8_BLOCK: "port-regression"}
    assert label(SuiteRun.from_dict(port), SuiteRun.from_dict(base), cuda)[0] == {FP8_BLOCK: "port-regression"}


def test_arch_lists_are_validated(tmp_path):
    series = tmp_path / "series"
    body = (
        "upstream: megatron-lm\nline: v0.16\nversions: '>=0.16.0rc0,<0.17.0rc0'\npatches: []\ncodemods: []\n"
        "verify:\n  rocm_arch_known_failures: {ARCH: {tests/unit_tests/test_x.py::test_y: REASON}}\n"
    )
    series.write_text(body.replace("ARCH", "gfx90a").replace("REASON", "MI250 only"))
    cfg = parse_settings(load_series(series).verify, str(series))
    assert cfg.rocm_arch_known_failures == {"gfx90a": {"tests/unit_tests/test_x.py::test_y": "MI250 only"}}
    for arch, reason in (("mi250", "why"), ("gfx90a", "[1]")):
        series.write_text(body.replace("ARCH", arch).replace("REASON", reason))
        with pytest.raises(BadInput, match=r"verify.rocm_arch_known_failures' must map GPU architectures"):
            parse_settings(load_series(series).verify, str(series))


def test_device_arch_is_the_simulated_or_the_gpus():
    env = probe.Environment(python="3.11", torch="2.13", hip=None, cuda=None, device_count=0)
    assert run.device_arch("cpu-proxy", env, "gfx90a") == "gfx90a"
    assert run.device_arch("cpu-proxy", env, None) is None  # the CUDA path of the proxy
    assert run.device_arch("gpu", env, None) is None  # a CUDA GPU


@pytest.mark.torch
def test_simulated_arch_reaches_the_workers(tmp_path):
    from tests.test_hip_sim import run_probe

    seen = json.loads(run_probe(tmp_path, hip_sim.child_env(hip_sim.DEFAULT_VERSION, "gfx90a")).stdout)
    assert seen["device"][:4] == ["AMD Instinct MI250X/MI250", "gfx90a:sramecc+:xnack-", 9, 0]
    seen = json.loads(run_probe(tmp_path, hip_sim.child_env(hip_sim.DEFAULT_VERSION)).stdout)
    assert seen["device"][1] == "gfx942:sramecc+:xnack-"
    assert hip_sim.summary("7.1", "gfx90a") == hip_sim.HipSim("7.1", "gfx90a", "AMD Instinct MI250X/MI250")


def test_hip_arch_option_refuses_an_unknown_arch(tmp_path, capsys):
    assert main(["-C", str(tmp_path), "verify", "--hip-arch", "gfx1030", "--dry-run"]) == 2
    assert re.search(r"--hip-arch.*gfx1030", capsys.readouterr().err)
    with pytest.raises(BadInput, match="--hip-arch 'sm_90'"):
        hip_sim.parse_arch("sm_90")
