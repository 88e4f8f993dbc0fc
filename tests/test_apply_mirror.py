"""sync + apply end to end on the real upstreams: local mirrors (skipped unless given) and the
real package index (runs in CI)."""

from __future__ import annotations

import importlib.util
import json
import time
from pathlib import Path

import pytest
import yaml

from rocmport.cli import main
from rocmport.port import manifests
from rocmport.port import worktree as wt
from rocmport.verify.stages.functional import TOLERANCE
from tests.helpers.real import BRIDGE, MLM, REPO, needs_mirrors, project_with
from tests.helpers.sync import g


def check_layered(root: Path, upstream: str, ref: str, n_patches: int) -> dict:
    tree = root / "build" / upstream
    report = json.loads((root / "build" / f"{upstream}.report.json").read_text())
    assert report["status"] == "done"
    assert g(tree, "rev-parse", "--abbrev-ref", "HEAD") == f"rocm/{ref}"
    base = g(tree, "rev-parse", f"rocmport/base/{ref}^{{commit}}")
    assert base == report["base"]
    layers = [c for c in report["codemods"] if c["files"]]
    manifest_layer = [f"manifests: ROCm dependency declarations {manifests.VERSION}"] if report["manifests"] else []
    assert len(report["patches"]) == n_patches
    # a patch whose files the source lacks (a package-index sdist has no megatron/training) makes no commit
    committed = sum(p["bucket"] != "not-applicable" for p in report["patches"])
    assert len(g(tree, "rev-list", f"{base}..HEAD").split()) == committed + len(layers) + len(manifest_layer)
    subjects = g(tree, "log", "--format=%s", f"{base}..HEAD").splitlines()[::-1]
    assert subjects[committed:] == [f"codemod: {c['name']} {c['version']}" for c in layers] + manifest_layer
    assert g(tree, "rev-parse", f"rocmport/port/{ref}^{{commit}}") == g(tree, "rev-parse", "HEAD") == report["result"]
    return report


def series_patch_count(line: str) -> int:
    """How many text patches the committed megatron-lm series of `line` applies (one commit each)."""
    series = yaml.safe_load((REPO / "patchsets" / "megatron-lm" / line / "series").read_text())
    return len(series["patches"])


def assert_noop(err: str, *upstreams: str) -> None:
    """A second apply of the same inputs took the no-op path for each upstream."""
    for name in upstreams:
        assert f"{name}: up to date (" in err and "nothing to do" in err, err


@pytest.mark.mirror
@needs_mirrors
@pytest.mark.parametrize(
    "line, ref, bridge_ref",
    [
        ("v0.15", "core_v0.15.3", "v0.2.2"),
        ("v0.16", "core_v0.16.1", "v0.3.1"),
        ("v0.17", "core_v0.17.1", "v0.4.2"),
        ("v0.18", "core_v0.18.2", "v0.5.1"),
        ("v0.19", "core_v0.19.0", "v0.6.0"),
    ],
)
def test_mirror_sync_apply_every_line(tmp_path, monkeypatch, capsys, line, ref, bridge_ref):
    monkeypatch.setenv("ROCMPORT_CACHE_DIR", str(tmp_path / "cache"))
    root = project_with(tmp_path / "project")
    assert (
        main(
            [
                "-C",
                str(root),
                "sync",
                "--ref",
                line,
                "--remote",
                f"megatron-lm={MLM}",
                "--remote",
                f"megatron-bridge={BRIDGE}",
            ]
        )
        == 0
    )
    start = time.monotonic()
    assert main(["-C", str(root), "apply"]) == 0
    cold = time.monotonic() - start
    report = check_layered(root, "megatron-lm", ref, series_patch_count(line))
    assert {p["bucket"] for p in report["patches"]} <= {"clean", "offset"}
    # One site count per codemod: apply's (its state, what apply's table, verify's coverage and status
    # read) is the count the docs' coverage page is generated from (docs/coverage/sites.json).
    state = wt.read_state(root / "build" / "megatron-lm")
    counted = {c["name"]: c.get("sites") or 0 for c in state.codemods}
    documented = json.loads((REPO / "docs" / "coverage" / "sites.json").read_text())[line]
    assert {n: c for n, c in counted.items() if c} == {n: len(s) for n, s in documented.items() if s}
    check_layered(root, "megatron-bridge", bridge_ref, 0)
    assert not (root / "build" / "megatron-bridge" / "docs").exists()
    heads = {u: g(root / "build" / u, "rev-parse", "HEAD") for u in ("megatron-lm", "megatron-bridge")}
    capsys.readouterr()
    start = time.monotonic()
    assert main(["-C", str(root), "apply"]) == 0
    warm = time.monotonic() - start
    assert_noop(capsys.readouterr().err, "megatron-lm", "megatron-bridge")  # its time: benchmarks/bench_apply.py
    assert heads == {u: g(root / "build" / u, "rev-parse", "HEAD") for u in heads}
    assert main(["-C", str(root), "patches", "check"]) == 0
    with capsys.disabled():
        print(f"\n{line}: apply cold {cold:.2f}s, no-op {warm:.3f}s, patch bucket {report['patches'][0]['bucket']}")


@pytest.mark.torch
@pytest.mark.network
def test_pypi_sync_apply(tmp_path, real_index, capsys):
    """`sync --source pypi` + `apply` on the real megatron-core 0.16.1 sdist (cached between runs)."""
    root = project_with(tmp_path / "project")
    assert main(["-C", str(root), "sync", "--ref", "v0.16", "--source", "pypi", "--no-bridge"]) == 0
    assert main(["-C", str(root), "apply"]) == 0
    report = check_layered(root, "megatron-lm", "0.16.1", series_patch_count("v0.16"))
    assert report["patches"][0]["bucket"] == "clean"
    text = (
        root / "build" / "megatron-lm" / "megatron/core/dist_checkpointing/strategies/filesystem_async.py"
    ).read_text()
    assert "HIP < 7.1" in text
    capsys.readouterr()
    assert main(["-C", str(root), "apply"]) == 0
    assert_noop(capsys.readouterr().err, "megatron-lm")  # its time: benchmarks/bench_apply.py
    # The patch in action, on the ported tree: HIP < 7.1 copies synchronously; CUDA and HIP >= 7.1
    # keep the pinned non-blocking copy and its torch.cuda.synchronize() (which fails on this CPU).
    import subprocess
    import sys

    probe = (
        "import torch\n"
        "from megatron.core.dist_checkpointing.strategies.filesystem_async import FileSystemWriterAsync as W\n"
        "b = [('f', 'k', ([], [('item', torch.ones(2))]))]\n"
        "for hip in ('6.3.42131-fa1d09cbd', '7.1.0', None):\n"
        "    torch.version.hip = hip\n"
        "    try:\n"
        "        W.preload_tensors(b, True); print(hip, 'blocking')\n"
        "    except (AssertionError, RuntimeError):\n"
        "        print(hip, 'synchronize')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=root / "build" / "megatron-lm", capture_output=True, text=True, timeout=300
    )
    assert out.stdout.splitlines() == ["6.3.42131-fa1d09cbd blocking", "7.1.0 synchronize", "None synchronize"], (
        out.stderr[-2000:]
    )
    # verify stages 1-2 at tp2×pp2 on the ported sdist tree: the CPU proxy on gloo (runs in CI).
    verify_ported(root, tmp_path)


def verify_ported(root: Path, tmp_path: Path, *extra: str) -> dict:
    report_file, junit = tmp_path / "verify.json", tmp_path / "verify.xml"
    start = time.monotonic()
    rc = main(
        [
            "-C",
            str(root),
            "verify",
            "--tp",
            "2",
            "--pp",
            "2",
            "--report",
            str(report_file),
            "--junit",
            str(junit),
            *extra,
        ]
    )
    seconds = time.monotonic() - start
    data = json.loads(report_file.read_text())
    assert rc == 0, data["stages"]
    assert (
        data["mode"] == "cpu-proxy"
        and data["backend"] == "gloo"
        and (data["tp"], data["pp"], data["world_size"]) == (2, 2, 4)
    )
    hip = "--no-hip-sim" not in extra
    assert (data["hip_sim"] or {}).get("arch") == ("gfx942" if hip else None)
    bridge = "pass" if (root / "build" / "megatron-bridge").is_dir() else "skipped"
    # A git checkout has upstream's tests and pretrain_gpt.py (stages 3 and 4); the package-index
    # source ships megatron/core only: those stages are listed as skipped, saying why.
    full = (root / "build" / "megatron-lm" / "pretrain_gpt.py").is_file()
    upstream = "pass" if full else "skipped"
    assert [(s["name"], s["status"]) for s in data["stages"]] == [
        ("imports", "pass"),
        ("gpt-training", "pass"),
        ("unit-tests", upstream),
        ("functional", upstream),
        ("bridge", bridge),
        ("variants", "skipped"),  # stage 6 runs with --te only (and needs megatron/training)
    ]
    unit, functional = data["stages"][2], data["stages"][3]
    if full:
        assert unit["counts"]["passed"] > 0 and not {"port-regression", "unverified", "missing-dependency"} & set(
            unit["labels"].values()
        )
        assert not any(
            v == "error" for k, v in unit["outcomes"].items() if "::" not in k
        )  # every default file imported
        assert len(unit["tests"]) >= 7 and all(unit["why"].values())
        assert unit["peak"]["threads"] < 200, unit["peak"]
        resume = functional["resume"]
        assert resume["from_iteration"] == 5 and resume["loaded_iteration"] == 5 and resume["max_abs_diff"] <= 1e-5
        assert functional["golden"]["max_rel_drift"] <= TOLERANCE["cpu-proxy"], functional.get("golden")
        assert functional["redirects"]["cuda.is_available @ megatron/training/initialize.py:62"] == 8  # 4 ranks, 2 runs
        sites = data["port_sites"]
        assert all(c["exercised"] > 0 or c.get("explanation") for c in sites.values()), sites
        print(f"unit-tests: {unit['reason']} ({unit['seconds']}s); functional: {functional['reason']}")
        for name, c in sites.items():
            print(f"  port sites {name}: {c['exercised']}/{c['total']}")
    else:
        assert "megatron/core only" in unit["reason"] and "megatron/core only" in functional["reason"]
    if bridge == "pass":
        b = data["bridge_training"]
        assert b["losses"][-1] < b["losses"][0] and b["tied_embeddings_equal"]
    t = data["training"]
    assert (
        t["losses"][-1] < t["losses"][0]
        and t["tied_embeddings_equal"]
        and t["max_abs_diff"] <= t["tolerance"] <= 1e-5 * max(map(abs, t["reference_losses"]))
    )
    assert junit.read_text().startswith("<testsuites")
    print(
        f"verify tp2×pp2 proxy: {seconds:.1f}s, loss {t['losses'][0]:.3f} -> {t['losses'][-1]:.3f}, max |Δ| {t['max_abs_diff']:.2g}"
    )
    return data


@pytest.mark.mirror
@needs_mirrors
def test_mirror_v016_verify(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ROCMPORT_CACHE_DIR", str(tmp_path / "cache"))
    root = project_with(tmp_path / "project")
    assert (
        main(
            [
                "-C",
                str(root),
                "sync",
                "--ref",
                "v0.16",
                "--remote",
                f"megatron-lm={MLM}",
                "--remote",
                f"megatron-bridge={BRIDGE}",
            ]
        )
        == 0
    )
    assert main(["-C", str(root), "apply"]) == 0
    lacking = [m for m in ("pytest_mock", "mock", "pybind11") if importlib.util.find_spec(m) is None]
    if lacking:  # stages 3 and 4 would fail, rightly, with the pip command
        pytest.skip(f"the [verify] extra's {', '.join(lacking)} are not installed here (pip install -e '.[verify]')")
    with capsys.disabled():
        data = verify_ported(root, tmp_path)
        print(f"stage 1 imported {len(data['stages'][0]['modules'])} modules; stage 2 {data['stages'][1]['seconds']}s")
        # The CUDA path of the same tree (the HIP simulation's control): stage 4 passes there too.
        report = tmp_path / "cuda-path.json"
        assert (
            main(
                [
                    "-C",
                    str(root),
                    "verify",
                    "--tp",
                    "2",
                    "--pp",
                    "2",
                    "--no-hip-sim",
                    "--stages",
                    "1,2,4",
                    "--report",
                    str(report),
                ]
            )
            == 0
        )
        cuda = json.loads(report.read_text())
        assert cuda["hip_sim"] is None and [s["status"] for s in cuda["stages"]] == [
            "pass",
            "pass",
            "skipped",
            "pass",
            "skipped",
        ]
        assert cuda["functional"]["resume"]["max_abs_diff"] <= 1e-5


UVM_PROBE = """
import sys
import torch
import torch.utils.cpp_extension as ext
calls = []
def load_inline(*args, **kwargs):  # what a CUDA build of torch does with no visible GPU
    calls.append(kwargs.get("name"))
    raise IndexError("list index out of range")
ext.load_inline = load_inline
torch.version.hip = sys.argv[1] if sys.argv[1] != "none" else None
try:
    import megatron.core.inference.unified_memory as uvm
    print(uvm.has_unified_memory, len(calls))
except IndexError:
    print("IndexError", len(calls))
"""


@pytest.mark.torch
@pytest.mark.network
def test_v015_unified_memory_allocator_is_not_built_at_import(tmp_path, real_index):
    """v0.15's 0002 on the real megatron-core 0.15.3 sdist: `import megatron.core` no longer dies on the
    IndexError a CUDA torch raises without a GPU, and on HIP the CUDA-only allocator is never built."""
    import subprocess
    import sys

    root = project_with(tmp_path / "project")
    assert main(["-C", str(root), "sync", "--ref", "v0.15", "--source", "pypi", "--no-bridge"]) == 0
    assert main(["-C", str(root), "apply"]) == 0
    report = check_layered(root, "megatron-lm", "0.15.3", series_patch_count("v0.15"))
    buckets = {p["name"]: p["bucket"] for p in report["patches"]}
    # 0004 backports a megatron/training fix (coverage item E2): the sdist ships megatron/core only
    assert buckets.pop("0004-training-ddp-side-stream-waits-for-default-stream.patch") == "not-applicable"
    assert set(buckets.values()) == {"clean"}
    tree = root / "build" / "megatron-lm"
    base = tmp_path / "unported"
    g(tree, "worktree", "add", "-q", "--detach", str(base), "rocmport/base/0.15.3")

    def probe(where: Path, hip: str) -> str:
        out = subprocess.run(
            [sys.executable, "-c", UVM_PROBE, hip], cwd=where, capture_output=True, text=True, timeout=300
        )
        return out.stdout.strip().splitlines()[-1] if out.stdout.strip() else out.stderr[-2000:]

    assert probe(base, "none") == "IndexError 1"  # upstream: the import fails
    assert probe(tree, "none") == "False 1"  # ported: upstream's own fallback, unified memory off
    assert probe(tree, "6.4.43482-0f2d60242") == "False 0"  # ROCm: the CUDA-only allocator is never built
