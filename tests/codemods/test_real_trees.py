"""Codemods on real upstream code: the megatron-core 0.16.1 sdist from the package index (runs in
CI, cached between runs) and, when mirrors are given, every release line of Megatron-LM and Bridge."""

from __future__ import annotations

import os
import py_compile
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from rocmport.codemods import compute_layers, registry
from rocmport.codemods.feature_probes import module_name
from rocmport.nvidia_only import CPU_PROXY, scan_unguarded_imports
from rocmport.machine.python import unmet_python
from rocmport.verify.orchestration.firewall import firewall_env, write_bootstrap
from tests.helpers.real import MLM, REAL_CACHE as CACHE, needs_mlm_mirror


def sdist_tree(dest: Path) -> Path:
    CACHE.mkdir(parents=True, exist_ok=True)
    sdist = CACHE / "megatron_core-0.16.1.tar.gz"
    if not sdist.exists():
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "-q",
                "--no-deps",
                "--no-binary",
                ":all:",
                "megatron-core==0.16.1",
                "-d",
                str(CACHE),
            ],
            check=True,
        )
    with tarfile.open(sdist) as tar:
        tar.extractall(dest, filter="data")
    return dest / "megatron_core-0.16.1"


def write_layers(tree: Path, result) -> None:
    for layer in result.layers:
        for rel, text in layer.files.items():
            (tree / rel).write_text(text)


def import_check(tree: Path, modules: list[str]) -> subprocess.CompletedProcess:
    """Import ``modules`` from ``tree`` in a fresh interpreter behind verify's import firewall: no
    cpu-proxy package is importable there, even where one is installed (PyPI's CUDA torch brings the
    nvidia-* and cuda-bindings wheels)."""
    boot = write_bootstrap(tree.parent / f"{tree.name}-firewall")
    code = (
        "import importlib, importlib.util, sys\n"
        f"blocked = {list(CPU_PROXY)!r}\n"
        "present = [m for m in blocked if importlib.util.find_spec(m) is not None]\n"
        "assert not present, f'NVIDIA-only packages importable: {present}'\n"
        f"for m in {modules!r}:\n"
        "    importlib.import_module(m)\n"
        "print('imported', len(sys.modules))\n"
    )
    return subprocess.run(
        [sys.executable, "-W", "ignore", "-c", code],
        cwd=tree,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": f"{boot}{os.pathsep}{tree}", **firewall_env("cpu-proxy")},
    )


@pytest.mark.torch
@pytest.mark.network
def test_megatron_core_sdist(tmp_path):
    tree = sdist_tree(tmp_path)
    start = time.monotonic()
    result = compute_layers(tree, list(registry), cache_dir=tmp_path / "cache")
    cold = time.monotonic() - start
    assert result.failures == []
    sites = {layer.name: sum(layer.sites.values()) for layer in result.layers}
    # megatron/core at 0.16.1 has torch.cuda.amp sites in tensor_parallel/layers.py and no hard
    # modelopt/resiliency or unguarded module-level fused-kernel imports (those live in megatron/training,
    # legacy, post_training); its kernel imports: inside core/utils.py's drain_embedding_wgrad_compute,
    # and tensor_parallel/layers.py's guarded one (a HIP branch: the torch fallback, issue 28).
    assert sites["apex-to-torch"] == 4
    assert sites["fused-kernel-fallbacks"] == 2 and sites["guard-nvidia-only-imports"] == 0
    # te-version-gates: the no-TE guard in megatron/core/utils.py and the vendored megatron_fsdp/utils.py,
    # plus 20 argument/class probes in extensions/transformer_engine.py (docs/te-version-gates.md), and
    # the call-site drift of issue 17: general_gemm's workspace (1) and the save_original_input gates of
    # attention.py, multi_latent_attention.py and shared_experts.py (2 gates each), and fp4_utils.py's
    # NVFP4BlockScaling gate
    assert sites["attention-backend-env"] == 1 and sites["te-version-gates"] == 2 + 20 + 1 + 6 + 1
    assert sites["device-probes"] == 2 and sites["flash-attention-hooks"] == 2  # affinity+energy; FA3 flag+fa version
    # cuda_graphs.py, and inference_layers.py's two NVLS (Hopper-only) gates; grouped_gemm_util.py
    assert sites["capability-gates"] == 1 + 2 and sites["grouped-gemm"] == 1
    # issue 17 in megatron/core: the async-checkpoint writer, the NCCL allocator (training's sites are not in the sdist)
    assert sites["async-checkpoint-spawn"] == 1 and sites["nccl-allocator-rccl"] == 1
    assert (
        sites["launch-env"]
        == sites["deterministic-env"]
        == sites["tp-comm-overlap"]
        == sites["dataloader-mp-context"]
        == 0
    )
    write_layers(tree, result)
    for path in tree.rglob("*.py"):
        py_compile.compile(str(path), doraise=True, cfile=str(tmp_path / "x.pyc"))
    assert scan_unguarded_imports(tree, "rocm") == []
    proc = import_check(tree, ["megatron.core", "megatron.core.models.gpt", "megatron.core._rocm"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    # ROCm simulated on the real ported code: the backend setter keeps ROCm's NVTE values and the
    # TE gate answers without TE; with torch.version.hip = None both behave as upstream.
    sim = (
        "import os, sys, types, torch\n"
        "from torch.utils import cpp_extension\n"
        "torch.version.hip = sys.argv[1] if sys.argv[1] != 'None' else None\n"
        "cpp_extension.IS_HIP_EXTENSION = torch.version.hip is not None\n"
        "cpp_extension.CUDA_HOME = None\n"
        "from megatron.core.models.common.language_module.language_module import LanguageModule\n"
        "from megatron.core.transformer.enums import AttnBackend\n"
        "from megatron.core.utils import is_te_min_version\n"
        "os.environ.update(NVTE_FLASH_ATTN='0', NVTE_FUSED_ATTN='1')\n"
        "try:\n"
        "    LanguageModule._set_attention_backend(types.SimpleNamespace(config=types.SimpleNamespace(attention_backend=AttnBackend.auto)))\n"
        "    print('auto', os.environ['NVTE_FLASH_ATTN'], os.environ['NVTE_FUSED_ATTN'], os.environ['NVTE_UNFUSED_ATTN'])\n"
        "except AssertionError:\n"
        "    print('auto AssertionError')\n"
        "print('te', is_te_min_version('2.7'))\n"
        "from megatron.core._rocm import nvidia_arch_major\n"
        "torch.cuda.get_device_capability = lambda *a: (12, 0)  # an RDNA4 GPU under HIP, or a CUDA GPU\n"
        "print('arch', nvidia_arch_major())\n"
    )
    rocm = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", sim, "6.4.43482"],
        cwd=tree,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(tree)},
        timeout=300,
    )
    assert rocm.stdout.split("\n")[:3] == ["auto 0 1 1", "te False", "arch 9"], rocm.stderr[-2000:]
    cuda = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", sim, "None"],
        cwd=tree,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(tree)},
        timeout=300,
    )
    # Without TE, upstream's is_te_min_version raises TypeError (None >= Version); the port answers False.
    assert cuda.stdout.split("\n")[:3] == ["auto AssertionError", "te False", "arch 12"], cuda.stderr[-2000:]
    again = compute_layers(tree, list(registry), cache_dir=tmp_path / "cache")
    assert again.changed_files() == set()
    print(f"codemods over the 0.16.1 sdist: {result.files_total} files, {result.files_parsed} parsed, {cold:.2f}s cold")


LINES = ["core_v0.15.3", "core_v0.16.1", "core_v0.17.1", "core_v0.18.2", "core_v0.19.0"]

# The ROCm run-time gaps (issue 17) at each release: (codemod, site-message regex, file) -> sites.
# A site that does not exist at a release (the NVLS gate before v0.16, moved to torch_symm_triton at
# v0.17; the data loader in megatron/legacy at v0.15) has no row there.
ARGS, SAMPLERS = "megatron/training/arguments.py", "megatron/training/datasets/data_samplers.py"
TE_EXT = "megatron/core/extensions/transformer_engine.py"
GAP_SITES_ALL = {
    ("launch-env", "", ARGS): 1,
    ("deterministic-env", "", ARGS): 1,
    ("tp-comm-overlap", "", ARGS): 1,
    ("async-checkpoint-spawn", "", "megatron/core/dist_checkpointing/strategies/async_utils.py"): 1,
    ("nccl-allocator-rccl", "", "megatron/core/nccl_allocator.py"): 1,
    ("te-version-gates", "general_gemm", TE_EXT): 1,
    ("te-version-gates", "NVFP4BlockScaling", ARGS): 1,
    (
        "te-version-gates",
        "save_original_input",
        "megatron/core/transformer/moe/shared_experts.py",
    ): None,  # one per gate (1-2)
    ("capability-gates", "nvidia_capability", ARGS): 1,
    ("fused-kernel-fallbacks", "in a function", "megatron/core/utils.py"): 1,
    (
        "fused-kernel-fallbacks",
        "WgradGemmFallback, _grad_accum_fusion_available",
        "megatron/core/tensor_parallel/layers.py",
    ): 1,
}
GAP_SITES = {
    "core_v0.15.3": {("dataloader-mp-context", "", "megatron/legacy/data/data_samplers.py"): 1},
    "core_v0.16.1": {
        ("dataloader-mp-context", "", SAMPLERS): 1,
        ("capability-gates", "nvidia_hopper_or_newer", "megatron/core/tensor_parallel/inference_layers.py"): 2,
    },
    **{
        tag: {
            ("dataloader-mp-context", "", SAMPLERS): 1,
            (
                "capability-gates",
                "nvidia_hopper_or_newer",
                "megatron/core/inference/communication/torch_symm_triton/utils.py",
            ): 1,
        }
        for tag in ("core_v0.17.1", "core_v0.18.2", "core_v0.19.0")
    },
}


def gap_sites(result, tag: str) -> dict:
    """For each expected (codemod, message, file) of ``tag``: how many sites the codemod reported."""
    import re

    reports = [r for layer in result.layers for r in layer.all_reports() if r.kind == "site"]
    found = {}
    for key in {**GAP_SITES_ALL, **GAP_SITES[tag]}:
        codemod, message, path = key
        found[key] = sum(
            1 for r in reports if r.codemod == codemod and r.path == path and re.search(message, r.message)
        )
    return found


@pytest.mark.mirror
@needs_mlm_mirror
@pytest.mark.parametrize("tag", LINES)
def test_megatron_lm_release_lines(tmp_path, tag, capsys):
    tree = tmp_path / tag
    tree.mkdir()
    archive = subprocess.run(["git", "-C", MLM, "archive", tag], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    before = len(scan_unguarded_imports(tree, "rocm"))
    start = time.monotonic()
    result = compute_layers(tree, list(registry), cache_dir=tmp_path / "cache")
    seconds = time.monotonic() - start
    assert result.failures == []
    write_layers(tree, result)
    after = scan_unguarded_imports(tree, "rocm")
    # Left unguarded on purpose: the modules upstream's feature probes decide by (has_nvidia_modelopt
    # is whether megatron.post_training imports), each reported with those probes. Nothing else.
    guard = next(layer for layer in result.layers if layer.name == "guard-nvidia-only-imports")
    left = {r.path for r in guard.all_reports() if r.kind == "skip" and "behind feature probes" in r.message}
    assert left, "upstream's modelopt probes decide by megatron/post_training on every line"
    assert {a[0] for a in after if not a[0].startswith(("tests/", "examples/", "tools/"))} == left
    assert compute_layers(tree, list(registry), cache_dir=tmp_path / "cache").changed_files() == set()
    sites = {layer.name: sum(layer.sites.values()) for layer in result.layers}
    assert sites["guard-nvidia-only-imports"] > 0
    # every run-time gap codemod rewrote its sites where the release has them, and nowhere else
    found = gap_sites(result, tag)
    expected = {**GAP_SITES_ALL, **GAP_SITES[tag]}
    assert {k: v for k, v in found.items() if expected[k] is not None} == {
        k: v for k, v in expected.items() if v is not None
    }
    assert all(found[k] >= 1 for k, v in expected.items() if v is None), found
    for name in (
        "launch-env",
        "deterministic-env",
        "tp-comm-overlap",
        "async-checkpoint-spawn",
        "dataloader-mp-context",
        "nccl-allocator-rccl",
    ):
        assert sites[name] == 1, (name, sites[name])
    # Every training/post_training/legacy module that failed upstream only for want of an
    # NVIDIA-only package now imports (ordinary deps: six regex pydantic einops triton).
    modules = ["megatron.core", "megatron.training", "pretrain_gpt"] + sorted(
        ".".join(p.relative_to(tree).with_suffix("").parts)
        for sub in ("megatron/post_training", "megatron/legacy")
        for p in (tree / sub).rglob("*.py")
        if p.name != "__init__.py" and "tests" not in p.parts
    )
    upstream = probe_imports(tmp_path / "upstream", tag, modules)
    ported = probe_imports(tree, None, modules)
    nvidia_only = [m for m, err in upstream.items() if err and err.split("'")[1].split(".")[0] in CPU_PROXY]
    too_new = unmet_python(tree) is not None  # v0.17+ declare Python >= 3.12; v0.18+ use typing.override
    newer_python = {m for m, err in ported.items() if err and too_new and "from 'typing'" in err}
    still = {m: ported[m] for m in nvidia_only if ported[m] and m not in newer_python}
    # Only what the probes decide by still fails, for modelopt, as the probes need it to: the files the
    # guard left, and the modules of their package that import one of them at the top.
    left_modules = {module_name(p) for p in left}
    assert left_modules <= set(still), (left_modules, still)
    assert all(
        m.startswith("megatron.post_training.") and "No module named 'modelopt" in e for m, e in still.items()
    ), still
    assert {"megatron.training", "pretrain_gpt"}.isdisjoint(m for m, e in ported.items() if e and m not in newer_python)
    with capsys.disabled():
        print(
            f"\n{tag}: run-time gap sites "
            + "; ".join(f"{c} {m or '*'} {p}: {n}" for (c, m, p), n in sorted(found.items()))
        )
        print(
            f"\n{tag}: {result.files_total} files, {result.files_parsed} parsed, {seconds:.2f}s; sites {sites}; "
            f"unguarded NVIDIA-only imports {before} -> {len(after)}; modules failing upstream for NVIDIA-only "
            f"packages {len(nvidia_only)} -> {len(newer_python & set(nvidia_only))} (needing a newer Python: {len(newer_python)}); "
            f"other import failures {sum(1 for m, e in ported.items() if e and m not in newer_python)}"
        )


def probe_imports(tree: Path, tag: str | None, modules: list[str]) -> dict[str, str | None]:
    """{module: None if it imports, else 'ExcType: message'}, each in a fresh interpreter state."""
    import json

    if tag:
        tree.mkdir(exist_ok=True)
        archive = subprocess.run(["git", "-C", MLM, "archive", tag], capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    code = (
        "import importlib, json, sys, warnings\nwarnings.simplefilter('ignore')\nout = {}\n"
        f"for m in {modules!r}:\n"
        "    try:\n        importlib.import_module(m); out[m] = None\n"
        "    except BaseException as e:\n        out[m] = f'{type(e).__name__}: {e}'\n"
        "print(json.dumps(out))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tree,
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "PYTHONPATH": str(tree)},
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])
