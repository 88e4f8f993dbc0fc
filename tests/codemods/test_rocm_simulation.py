"""The ROCm simulation on the real ported trees (issue 17): sync + apply each Megatron-LM line from a
local mirror, then run the rewritten functions under a simulated HIP build of torch and under CUDA
(tests/helpers/rocm_sim.py), beside the unported tree. Lines that need a newer Python than this one
(v0.17+ declare >= 3.12) run with the interpreter named by ROCMPORT_TEST_PY312 (a venv with torch)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rocmport.cli import main
from rocmport.launch_env import DETERMINISTIC_ENV, LAUNCH_ENV
from rocmport.machine.python import unmet_python
from tests.helpers.real import MLM, needs_mlm_mirror, project_with

SIM = Path(__file__).resolve().parents[1] / "helpers" / "rocm_sim.py"
LINES = [
    ("v0.15", "core_v0.15.3"),
    ("v0.16", "core_v0.16.1"),
    ("v0.17", "core_v0.17.1"),
    ("v0.18", "core_v0.18.2"),
    ("v0.19", "core_v0.19.0"),
]
ENV_NAMES = [n for n, _, _ in LAUNCH_ENV + DETERMINISTIC_ENV]

pytestmark = [pytest.mark.mirror, needs_mlm_mirror]


def simulate(python: str, tree: Path, hip: str | None, runtime: str | None = None) -> dict:
    argv = [python, "-W", "ignore", str(SIM), str(hip)] + ([runtime] if runtime else [])
    proc = subprocess.run(
        argv,
        cwd=tree,
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "PYTHONPATH": str(tree), "ROCM_SIM_ENV_NAMES": ",".join(ENV_NAMES)},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("line, tag", LINES)
def test_rocm_simulation_on_the_ported_line(tmp_path, monkeypatch, capsys, line, tag):
    monkeypatch.setenv("ROCMPORT_CACHE_DIR", str(tmp_path / "cache"))
    root = project_with(tmp_path / "project", {"megatron-lm": line})
    assert main(["-C", str(root), "sync", "--ref", line, "--remote", f"megatron-lm={MLM}", "--no-bridge"]) == 0
    assert main(["-C", str(root), "apply"]) == 0
    tree = root / "build" / "megatron-lm"
    # The committed coverage data (docs/coverage/sites.json, behind docs/rocm-port-coverage.md) counts
    # what this port's codemods rewrote at this release.
    report = json.loads((root / "build" / "megatron-lm.report.json").read_text())
    recorded = json.loads((Path(__file__).resolve().parents[2] / "docs" / "coverage" / "sites.json").read_text())[line]
    assert {layer["name"]: layer["sites"] for layer in report["codemods"]} == {k: len(v) for k, v in recorded.items()}
    upstream = tmp_path / "upstream"
    upstream.mkdir()
    archive = subprocess.run(["git", "-C", MLM, "archive", tag], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(upstream)], input=archive, check=True)
    python = sys.executable
    if unmet_python(tree) is not None:
        python = os.environ.get("ROCMPORT_TEST_PY312", "")
        if not python:
            pytest.skip(f"{tag} needs Python >= 3.12: set ROCMPORT_TEST_PY312 to an interpreter with torch")

    hip = simulate(python, tree, "6.4.43482")
    cuda = simulate(python, tree, None)
    before_cuda = simulate(python, upstream, None)
    before_hip = simulate(python, upstream, "6.4.43482")

    # 1 + 7 + 2: launcher defaults, deterministic extras, --tp-comm-overlap off without userbuffers
    validated = hip["validate_args: tp2, --deterministic-mode, --tp-comm-overlap"]
    assert validated["env"] == dict(sorted((n, v) for n, v, _ in LAUNCH_ENV + DETERMINISTIC_ENV)), validated
    assert validated["tp_comm_overlap"] is False
    assert any(w.startswith("ROCm: --tp-comm-overlap disabled") for w in validated["warnings"])
    assert any(
        w.startswith("ROCm --deterministic-mode: set NCCL_ALGO=Ring ROCBLAS_DEFAULT_ATOMICS_MODE=0")
        for w in validated["warnings"]
    )
    assert before_hip["validate_args: tp2, --deterministic-mode, --tp-comm-overlap"].startswith(
        "AssertionError: Using tensor model parallelism"
    )
    # 3: the async-checkpoint writer is spawned; patch 0001 decides by the runtime's HIP version
    assert hip["async checkpoint: TemporalAsyncCaller writer process"] == {
        "exitcode": 0,
        "process": "SpawnProcess",
        "wrote": True,
    }
    assert hip["patch 0001: preload_tensors non_blocking"] == {"non_blocking": False}
    assert simulate(python, tree, "6.3.42131", runtime="7.1")["patch 0001: preload_tensors non_blocking"] == {
        "non_blocking": True
    }
    assert before_hip["patch 0001: preload_tensors non_blocking"] == {
        "non_blocking": True
    }  # upstream: pinned + fork on HIP 6.4
    # 4: data-loader workers spawned, same batches
    assert hip["data loader: workers' start method"] == {"batches": [[0, 1], [4, 9]], "context": "spawn"}
    # 5: RCCL for the NCCL allocator
    assert hip["nccl allocator: link flags"] == {"extra_ldflags": ["-lrccl"]}
    # 8: no NVLS multimem kernels on HIP; the GroupedGEMM capability check passes
    assert hip["NVLS (Hopper-only multimem) gate"] == ({"nvls": None} if line == "v0.15" else {"nvls": False})
    assert before_hip["NVLS (Hopper-only multimem) gate"] == ({"nvls": None} if line == "v0.15" else {"nvls": True})
    assert hip["GroupedGEMM capability check"] == {"validated": True}
    # 9: drain_embedding_wgrad_compute without apex's kernel
    assert hip["drain_embedding_wgrad_compute without apex"] == {"main_grad_matches": True}
    assert before_hip["drain_embedding_wgrad_compute without apex"].startswith("ModuleNotFoundError")
    # 11 (issue 29): the unified-memory allocator links the HIP runtime (upstream: -lcudart, which ROCm
    # lacks); v0.15 builds it at first use on HIP (patch 0002), upstream at import.
    uvm = hip["unified memory allocator: link flags"]
    assert uvm["extra_ldflags"][-1] == "-lamdhip64" and "-lcudart" not in uvm["extra_ldflags"] and uvm["builds"] == 1, (
        uvm
    )
    assert before_hip["unified memory allocator: link flags"]["extra_ldflags"] == ["-lcudart"]
    assert uvm["at_import"] is False
    assert before_hip["unified memory allocator: link flags"]["at_import"] is (line == "v0.15")
    # 12 (issue 29): an FP8 recipe the simulated MI300X (gfx942) cannot run stops in validate_args.
    assert hip["FP8 recipe the device cannot run: --fp8-recipe mxfp8"] == (
        "ValueError: --fp8-format hybrid --fp8-recipe mxfp8: gfx942 cannot run the mxfp8 recipe (MXFP8 needs gfx950; gfx942 has "
        "the FNUZ FP8 formats); use --fp8-recipe delayed or tensorwise"
    )
    assert not str(before_hip["FP8 recipe the device cannot run: --fp8-recipe mxfp8"]).startswith(
        "ValueError: --fp8-format"
    )
    # CUDA: every rewritten function decides as upstream does; the one difference is the fallback
    # where apex's kernel is really absent (upstream fails at the import).
    assert cuda["drain_embedding_wgrad_compute without apex"] == {"main_grad_matches": True}
    same = [k for k in before_cuda if k != "drain_embedding_wgrad_compute without apex"]
    assert {k: cuda[k] for k in same} == {k: before_cuda[k] for k in same}
    with capsys.disabled():
        print(
            f"\n{line}: HIP {json.dumps(hip, sort_keys=True)}\n{line}: upstream under HIP {json.dumps(before_hip, sort_keys=True)}"
        )
