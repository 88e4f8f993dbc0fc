"""Stage 1 runs every guard guard-nvidia-only-imports wrote: it imports each file holding one (an
example, an upstream test file) behind the firewall, the guarded packages and TE blocked, never as
__main__; the report counts the sites as run, names the file, and says what stopped an import."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rocmport.cli import main
from tests.helpers.patches import BASE_FILES, Project

MEGATRON = {
    "megatron/__init__.py": "",
    "megatron/core/__init__.py": "",
}

# An example script: its guard, then a main that must not run when stage 1 imports it.
EXAMPLE = """\
import os
import sys

import modelopt.torch.quantization as mtq

QUANT_CFG = {"fp8": mtq}

if __name__ == "__main__":
    open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "MAIN_RAN"), "w").write("main ran")
    sys.exit(3)
"""

# An upstream test file: a guarded TE import, then a dependency this environment lacks.
TEST_FILE = """\
import pytest
from transformer_engine.pytorch.fp8 import check_fp8_support

import rocmport_absent_dependency_xyz

from nvidia_resiliency_ext.checkpointing.local import base_manager


def test_never_runs():
    raise AssertionError("stage 1 imports test files; it never runs their tests")
"""

# An upstream test file that skips itself where the package is absent, before its guard (test_local.py).
# Shaped like v0.19's generalized_tensor_parallel tests (`if not HAVE_GTP: pytest.skip(...)`). (A
# pytest.importorskip of the guarded package itself leaves no guard to run: the codemod leaves it.)
SKIPPING_TEST_FILE = """\
import pytest

if not False:
    pytest.skip("nvrx is required", allow_module_level=True)

from nvidia_resiliency_ext.checkpointing.local import base_manager
"""

# A library module upstream imports only behind a feature probe: the codemod leaves its modelopt import.
PROBED = "import modelopt.torch.opt as mto\n\n\ndef restore():\n    return mto\n"
PROBE = (
    "try:\n    from megatron.post_training.checkpointing import restore\n    has_modelopt = True\n"
    "except ImportError:\n    has_modelopt = False\n"
)
# An example whose guard runs, then whose import reaches the probe-only module.
EXAMPLE_PROBED = """\
import modelopt.torch.export as mtex

from megatron.post_training.checkpointing import restore
"""


# A legacy model module (v0.16's megatron/legacy/model/vision/*.py): a module-level apex import, which
# apex-to-torch guards with its fallback; only a pretrain_vision_* script imports such a file.
LEGACY_APEX = """\
import apex
import torch


class Head(torch.nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.norm = apex.parallel.SyncBatchNorm(dim)
"""


def ported(tmp_path: Path, monkeypatch, files: dict[str, str], extra_codemods: tuple[dict, ...] = ()) -> Project:
    """A real apply of guard-nvidia-only-imports (with the v0.16 recipe's TE option) over ``files``."""
    proj = Project(tmp_path, monkeypatch)
    proj.pin(proj.upstream_commit({**BASE_FILES, **MEGATRON, **files}, "upstream with NVIDIA-only imports"))
    proj.refresh_mirror()
    proj.write_series(
        {},
        codemods=[
            {
                "name": "guard-nvidia-only-imports",
                "options": {"packages": {"transformer_engine": "transformer-engine"}},
            },
            *extra_codemods,
        ],
    )
    assert main(["-C", str(proj.root), "apply"]) == 0
    return proj


def stage_1(proj: Project, capsys) -> tuple[int, dict]:
    capsys.readouterr()
    code = main(["-C", str(proj.root), "verify", "--tree", str(proj.tree), "--stages", "1", "--json"])
    return code, json.loads(capsys.readouterr().out)


@pytest.mark.torch
def test_a_guard_in_a_file_no_stage_imports_runs_in_stage_1_and_its_main_does_not(tmp_path, monkeypatch, capsys):
    proj = ported(tmp_path, monkeypatch, {"examples/post_training/quantize.py": EXAMPLE})
    assert "MissingPackage(" in (proj.tree / "examples/post_training/quantize.py").read_text()
    code, data = stage_1(proj, capsys)
    imports = data["stages"][0]
    assert code == 0 and imports["status"] == "pass", imports
    cov = data["port_sites"]["guard-nvidia-only-imports"]
    assert (cov["exercised"], cov["total"]) == (1, 1)
    (key,) = cov["ran"]
    assert key.startswith("examples/post_training/quantize.py:") and cov["ran"][key] == ["imports"]
    assert cov["ran_by"][key] == ["imports: examples/post_training/quantize.py"]
    assert imports["guarded_imports"]["files"]["examples/post_training/quantize.py"] == {
        "sites": 1,
        "ran": 1,
        "verdict": "imported",
    }
    assert "1 of 1 guarded imports ran with their package absent" in imports["reason"]
    assert not (proj.tree / "examples/post_training/MAIN_RAN").exists()  # imported, never run as __main__


@pytest.mark.torch
def test_apex_to_torch_s_module_level_apex_fallback_runs_in_stage_1(tmp_path, monkeypatch, capsys):
    """A module-level apex import apex-to-torch guarded, in a file no stage imports: stage 1 imports
    the file without apex and the fallback runs (its site counted as run by the import)."""
    rel = "megatron/legacy/model/vision/head.py"
    files = {
        "megatron/legacy/__init__.py": "",
        "megatron/legacy/model/__init__.py": "",
        "megatron/legacy/model/vision/__init__.py": "",
        rel: LEGACY_APEX,
    }
    proj = ported(tmp_path, monkeypatch, files, ({"name": "apex-to-torch"},))
    assert "apex_fallback('apex')" in (proj.tree / rel).read_text()
    code, data = stage_1(proj, capsys)
    imports = data["stages"][0]
    assert code == 0 and imports["status"] == "pass", imports
    assert imports["guarded_imports"]["files"][rel] == {"sites": 1, "ran": 1, "verdict": "imported"}
    cov = data["port_sites"]["apex-to-torch"]
    (key,) = [k for k in cov["ran"] if k.startswith(f"{rel}:")]
    assert cov["ran_by"][key] == [f"imports: {rel}"]


@pytest.mark.torch
def test_a_file_stopping_on_a_missing_dependency_after_its_guard_is_not_a_port_failure(tmp_path, monkeypatch, capsys):
    """Its TE guard ran (TE blocked for this probe even where --te lets it through); the import then
    stops on a package that is simply not installed: the stage passes, the file says what stopped it,
    and the guard after that point names it as why it did not run. The test itself never runs."""
    rel, skipping = "tests/unit_tests/test_local.py", "tests/unit_tests/test_replication.py"
    proj = ported(tmp_path, monkeypatch, {rel: TEST_FILE, skipping: SKIPPING_TEST_FILE})
    code, data = stage_1(proj, capsys)
    imports = data["stages"][0]
    assert code == 0 and imports["status"] == "pass", imports
    found = imports["guarded_imports"]["files"][rel]
    assert (found["sites"], found["ran"], found["verdict"]) == (2, 1, "missing-dependency")
    assert found["stopped"].startswith("rocmport_absent_dependency_xyz is not installed here (not NVIDIA-only) at ")
    cov = data["port_sites"]["guard-nvidia-only-imports"]
    assert cov["exercised"] == 1 and all(k.startswith(f"{rel}:") for k in cov["ran"])
    whys = {key.partition(":")[0]: why for key, why in cov["unreached"].items()}
    assert whys[rel].startswith(
        f"stage 1 imported {rel} with the guarded packages absent; it stopped before this site: "
    )
    assert "rocmport_absent_dependency_xyz" in whys[rel]
    assert "1 stopped on a dependency not installed here" in imports["reason"]
    # A module-level skip before the guard: the guard cannot run where pytest skips the file.
    found = imports["guarded_imports"]["files"][skipping]
    assert (found["sites"], found["ran"], found["verdict"]) == (1, 0, "skips-itself")
    assert found["stopped"].startswith(f"the file skips itself at module level at {skipping}:4 (nvrx is required)")
    assert whys[skipping].endswith(found["stopped"])


@pytest.mark.torch
def test_an_unguarded_nvidia_only_import_fails_stage_1_only_where_the_codemod_should_have_guarded_it(
    tmp_path, monkeypatch, capsys
):
    """An example reaching a probe-only library module (left unguarded by the codemod on purpose) is
    reported as outside its scope and passes; the same import put back unguarded into the example
    after apply (what the codemod exists to prevent) fails the stage naming file and line."""
    files = {
        "megatron/post_training/__init__.py": "",
        "megatron/post_training/checkpointing.py": PROBED,
        "megatron/training/__init__.py": "",
        "megatron/training/checkpointing.py": PROBE,
        "examples/export.py": EXAMPLE_PROBED,
    }
    proj = ported(tmp_path, monkeypatch, files)
    assert (proj.tree / "megatron/post_training/checkpointing.py").read_text() == PROBED  # left alone
    code, data = stage_1(proj, capsys)
    imports = data["stages"][0]
    assert code == 0 and imports["status"] == "pass", imports
    found = imports["guarded_imports"]["files"]["examples/export.py"]
    assert (found["ran"], found["verdict"]) == (1, "unguarded-by-design")
    assert "megatron/post_training/checkpointing.py:1" in found["stopped"]
    assert "only behind feature probes (megatron/training/checkpointing.py)" in found["stopped"]

    example = proj.tree / "examples/export.py"
    before, sep, after = example.read_text().partition("\nfrom megatron.post_training")
    example.write_text(before + "\nimport modelopt.torch.opt as mto" + sep + after)  # after the guard
    line = before.count("\n") + 2
    code, data = stage_1(proj, capsys)
    imports = data["stages"][0]
    assert code == 1 and imports["status"] == "fail"
    assert imports["reason"] == (
        f"unguarded module-level import of modelopt at examples/export.py:{line}, which "
        "guard-nvidia-only-imports guards: a port bug (imported for its guards: examples/export.py)"
    )
