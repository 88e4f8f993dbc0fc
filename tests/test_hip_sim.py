"""The HIP simulation as verify's worker processes see it: through the real bootstrap
(sitecustomize) in a real subprocess, and through `rocmport verify` itself (stage 1's probe)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rocmport.cli import main
from rocmport.errors import BadInput
from rocmport.launch_env import launch_env
from rocmport.verify.orchestration import environment
from rocmport.verify.orchestration import firewall
from rocmport.verify.runtime import hip_sim

# What a process sees: the build identity, the extension toolchain, the device, the environment.
PROBE = r"""
import json, os, sys, torch
from torch.utils import cpp_extension as ce
props = torch.cuda.get_device_properties(0)
print(json.dumps({
    "hip": torch.version.hip, "cuda": torch.version.cuda, "is_hip_extension": ce.IS_HIP_EXTENSION,
    "rocm_home": ce.ROCM_HOME, "cuda_home": ce.CUDA_HOME, "rocm_version": list(ce.ROCM_VERSION or []),
    "env": {k: os.environ.get(k) for k in ("ROCM_HOME", "CUDA_HOME", "NVTE_FLASH_ATTN", "NVTE_FUSED_ATTN", "HSA_NO_SCRATCH_RECLAIM")},
    "device": [props.name, props.gcnArchName, props.major, props.minor, props.total_memory],
    "capability": list(torch.cuda.get_device_capability()), "available": torch.cuda.is_available(),
}))
"""


def run_probe(
    tmp_path: Path, extra: dict, code: str = PROBE, python: str = sys.executable
) -> subprocess.CompletedProcess:
    boot = firewall.write_bootstrap(tmp_path / "boot")
    env = environment.child_env(
        tmp_path,
        boot,
        {**firewall.firewall_env("cpu-proxy"), "ROCMPORT_PROXY": "1", "CUDA_HOME": "/usr/local/cuda", **extra},
    )
    return subprocess.run([python, "-c", code], env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.torch
def test_worker_sees_a_rocm_build_and_an_mi300x(tmp_path):
    proc = run_probe(tmp_path, hip_sim.child_env(hip_sim.DEFAULT_VERSION))
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout)
    assert seen["hip"] == hip_sim.DEFAULT_VERSION and seen["cuda"] is None
    assert seen["is_hip_extension"] is True and seen["rocm_home"] == "/opt/rocm" and seen["cuda_home"] is None
    assert seen["rocm_version"] == [7, 1]
    assert seen["env"] == {
        "ROCM_HOME": "/opt/rocm",
        "CUDA_HOME": None,
        "NVTE_FLASH_ATTN": "0",
        "NVTE_FUSED_ATTN": "1",
        "HSA_NO_SCRATCH_RECLAIM": launch_env()["HSA_NO_SCRATCH_RECLAIM"],
    }
    assert seen["device"] == ["AMD Instinct MI300X", "gfx942:sramecc+:xnack-", 9, 4, 192 * 2**30]
    assert seen["capability"] == [9, 4]
    # Outside upstream's training script nothing runs on a device: the proxy says so.
    assert seen["available"] is False


@pytest.mark.torch
def test_rocm_6_4_and_the_cuda_path(tmp_path):
    seen = json.loads(run_probe(tmp_path, hip_sim.child_env("6.4.43482-0f2d60242")).stdout)
    assert seen["hip"] == "6.4.43482-0f2d60242" and seen["rocm_version"] == [6, 4]
    # --no-hip-sim: today's proxy, the CUDA build's own answers (a CPU build: no device at all).
    proc = run_probe(tmp_path, {}, code="import torch, os; print(torch.version.hip, os.environ['CUDA_HOME'])")
    assert proc.stdout.split() == ["None", "/usr/local/cuda"]


@pytest.mark.torch
def test_another_python_a_build_step_starts_is_left_alone(tmp_path):
    """megatron's dataset Makefile runs `python3 -m pybind11`: the python3 on PATH is verify's own
    interpreter (bootstrap/bin), and a Python that is not verify's gets the firewall only."""
    proc = run_probe(tmp_path, hip_sim.child_env("7.1"), code="import shutil, sys; print(shutil.which('python3'))")
    assert proc.stdout.strip() == str(tmp_path / "boot" / "bin" / "python3")
    env = environment.child_env(tmp_path, tmp_path / "boot", {**hip_sim.child_env("7.1"), "ROCMPORT_PROXY": "1"})
    wrapped = subprocess.run(
        [proc.stdout.strip(), "-c", "import sys, torch; print(sys.executable, torch.version.hip)"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert wrapped.stdout.split() == [sys.executable, "None"]  # this Python, without the simulation (a build step)
    config = subprocess.run(
        [str(tmp_path / "boot" / "bin" / "python3-config"), "--extension-suffix"], capture_output=True, text=True
    )
    import sysconfig

    assert config.stdout.strip() == sysconfig.get_config_var("EXT_SUFFIX")
    other = Path("/usr/bin/python3")
    if other.exists() and other.resolve() != Path(sys.executable).resolve():
        proc = run_probe(tmp_path, hip_sim.child_env("7.1"), code="print('ok')", python=str(other))
        assert proc.returncode == 0 and proc.stdout.strip() == "ok" and "sitecustomize" not in proc.stderr


@pytest.mark.torch
def test_bad_hip_version_is_exit_2(tmp_path, capsys):
    with pytest.raises(BadInput, match="not a ROCm version"):
        hip_sim.parse_version("seven")
    (tmp_path / "megatron" / "core").mkdir(parents=True)
    assert main(["verify", "--tree", str(tmp_path), "--hip-version", "7.x"]) == 2
    assert "--hip-version '7.x': not a ROCm version" in capsys.readouterr().err


def test_simulation_break_names_a_site_outside_the_tree(tmp_path):
    tree = tmp_path / "tree"
    stderr = (
        "Traceback (most recent call last):\n"
        f'  File "{tree}/pretrain_gpt.py", line 3, in <module>\n    build()\n'
        '  File "/venv/lib/python3.11/site-packages/torch/utils/cpp_extension.py", line 2400, in _join_rocm_home\n'
        "    raise OSError('Building PyTorch extensions using ROCm and Windows is not supported.')\n"
        "OSError: ROCM_HOME /opt/rocm has no hipcc\n"
    )
    site = hip_sim.simulation_break(stderr, tree)
    assert (
        site
        == "/venv/lib/python3.11/site-packages/torch/utils/cpp_extension.py:2400 (_join_rocm_home): OSError: ROCM_HOME /opt/rocm has no hipcc"
    )
    # The same error raised in the tree is the tree's own: the simulation never hides it.
    inside = stderr.replace("/venv/lib/python3.11/site-packages/torch/utils", f"{tree}/megatron")
    assert hip_sim.simulation_break(inside, tree) is None
    assert (
        hip_sim.simulation_break(
            stderr.replace("ROCM_HOME /opt/rocm has no hipcc", "disk full").replace("ROCm", "X"), tree
        )
        is None
    )


@pytest.mark.torch
def test_stage_1_process_sees_the_simulation(tmp_path, capsys):
    """Through `rocmport verify`: the tree's own import (stage 1's probe process) records what it saw."""
    tree = tmp_path / "t"
    (tree / "megatron" / "core").mkdir(parents=True)
    (tree / "megatron" / "__init__.py").write_text("")
    seen = tmp_path / "seen.json"
    (tree / "megatron" / "core" / "__init__.py").write_text(
        "import json, os, torch\nfrom torch.utils import cpp_extension as ce\n"
        f"json.dump([torch.version.hip, torch.version.cuda, ce.IS_HIP_EXTENSION, os.environ.get('NVTE_FUSED_ATTN')], open({str(seen)!r}, 'w'))\n"
    )
    assert (
        main(
            [
                "-C",
                str(tmp_path),
                "verify",
                "--tree",
                str(tree),
                "--stages",
                "1",
                "--json",
                "--hip-version",
                "6.4.43482-0f2d60242",
            ]
        )
        == 0
    )
    data = json.loads(capsys.readouterr().out)
    assert json.loads(seen.read_text()) == ["6.4.43482-0f2d60242", None, True, "1"]
    assert data["hip_sim"] == {"version": "6.4.43482-0f2d60242", "arch": "gfx942", "device": "AMD Instinct MI300X"}
    assert [s["status"] for s in data["stages"]] == ["pass", "skipped", "skipped", "skipped", "skipped", "skipped"]
    assert data["stages"][1]["reason"] == "not selected (--stages)"
    assert main(["-C", str(tmp_path), "verify", "--tree", str(tree), "--stages", "1", "--json", "--no-hip-sim"]) == 0
    data = json.loads(capsys.readouterr().out)
    # The CUDA path as the interpreter has it: a CPU build's cuda is None, PyPI's CUDA build's its version.
    import torch

    assert json.loads(seen.read_text()) == [None, torch.version.cuda, False, None] and data["hip_sim"] is None
