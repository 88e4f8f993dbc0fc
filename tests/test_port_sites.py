"""Port coverage: the generated helper records the rewritten call sites that run (only when asked),
and verify maps them to the codemod commits that wrote them, with a reason for each unreached site."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rocmport.cli import main
from rocmport.codemods.runner import helper_text
from rocmport.port import worktree as wt
from rocmport.verify.orchestration import environment
from rocmport.verify.orchestration import firewall
from rocmport.verify.analyses import port_sites
from tests.helpers.sync import g

A_BEFORE = (
    "import torch\n\n\ndef arch():\n    return torch.cuda.get_device_capability()[0]\n\n\ndef probe():\n    return 1\n"
)
A_AFTER = (
    "import torch\nfrom megatron.core._rocm import nvidia_arch_major\n\n\n"
    "def arch():\n    return nvidia_arch_major()\n\n\n"
    "def probe():\n    from megatron.core._rocm import is_hip\n    if is_hip():\n        return 0\n    return 1\n"
)
DEVICE_PROBE = (
    "\nfrom megatron.core._rocm import is_hip as _rocmport_is_hip\nif _rocmport_is_hip():\n    HAVE_NVML = False\n"
)


def commit(root: Path, message: str) -> str:
    g(root, "add", "-A")
    g(root, "-c", "user.name=t", "-c", "user.email=t@e", "commit", "-qm", message)
    return g(root, "rev-parse", "HEAD")


def ported_tree(root: Path) -> tuple[Path, str]:
    """An upstream-shaped tree and its port: two codemod commits using the generated helper; a.py
    is imported by megatron.core (its module-level site runs, arch() only when called), legacy/b.py
    never is."""
    files = {
        "megatron/__init__.py": "",
        "megatron/core/__init__.py": "from megatron.core import a\n",
        "megatron/core/a.py": A_BEFORE,
        "megatron/legacy/__init__.py": "",
        "megatron/legacy/b.py": "import torch\n\n\ndef old():\n    return torch.cuda.get_device_capability()[0]\n",
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    g(root, "init", "-q", "-b", "main")
    base = commit(root, "upstream")
    (root / "megatron/core/_rocm.py").write_text(helper_text(["capability-gates", "device-probes"]))
    (root / "megatron/core/a.py").write_text(A_AFTER)
    (root / "megatron/legacy/b.py").write_text(
        "from megatron.core._rocm import nvidia_arch_major\n\n\ndef old():\n    return nvidia_arch_major()\n"
    )
    commit(root, "codemod: capability-gates 1")
    (root / "megatron/core/a.py").write_text(A_AFTER + DEVICE_PROBE)
    commit(root, "codemod: device-probes 1")
    wt.write_state(
        root,
        wt.ApplyState(
            status="done",
            base=base,
            codemods=[
                {"name": "capability-gates", "sites": 3},
                {"name": "device-probes", "sites": 1},
                {"name": "grouped-gemm", "sites": 0},
                {"name": "apex-to-torch", "sites": 2},
            ],
        ),
    )
    return root, base


def test_sites_are_the_helper_calls_each_codemod_commit_wrote(tmp_path):
    tree, base = ported_tree(tmp_path / "t")
    sites = {(s.codemod, s.path, s.line, s.helper) for s in port_sites.find_sites(tree, base)}
    assert sites == {
        ("capability-gates", "megatron/core/a.py", 6, "nvidia_arch_major"),
        ("capability-gates", "megatron/core/a.py", 11, "is_hip"),
        ("capability-gates", "megatron/legacy/b.py", 5, "nvidia_arch_major"),
        ("device-probes", "megatron/core/a.py", 16, "is_hip"),
    }


@pytest.mark.torch
def test_helper_records_only_when_asked(tmp_path):
    tree, _ = ported_tree(tmp_path / "t")
    code = "import megatron.core._rocm as r; print(hasattr(r.is_hip, '__wrapped__'))"
    boot = firewall.write_bootstrap(tmp_path / "boot")
    plain = subprocess.run(
        [sys.executable, "-c", code], env=environment.child_env(tree, boot, {}), capture_output=True, text=True
    )
    assert plain.stdout.strip() == "False"  # unset: the helpers are the plain functions
    out = tmp_path / "sites"
    out.mkdir()
    code = "from megatron.core import a; a.arch() if False else None; print(a.probe())"
    env = environment.child_env(tree, boot, {"ROCMPORT_PORT_SITES": str(out)})
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    calls, modules = port_sites.read_records(out, tree)
    assert calls == {("megatron/core/a.py", 11), ("megatron/core/a.py", 16)}  # probe() and the module-level probe
    assert "megatron/core/a.py" in modules and "megatron/legacy/b.py" not in modules


@pytest.mark.torch
def test_verify_reports_port_sites_per_codemod(tmp_path, capsys):
    tree, _ = ported_tree(tmp_path / "t")
    assert main(["-C", str(tmp_path), "verify", "--tree", str(tree), "--stages", "1", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["stages"][0]["status"] == "pass"
    cov = data["port_sites"]
    assert list(cov) == [
        "apex-to-torch",
        "capability-gates",
        "device-probes",
        "grouped-gemm",
    ]  # the JSON's keys are sorted
    assert cov["device-probes"] == {"exercised": 1, "total": 1, "rewrites": 1, "unreached": {}}
    gates = cov["capability-gates"]
    assert (gates["exercised"], gates["total"], gates["rewrites"]) == (0, 3, 3)
    assert gates["unreached"] == {
        "megatron/core/a.py:11 is_hip": port_sites.NOT_RUN_DEFAULT,
        "megatron/core/a.py:6 nvidia_arch_major": port_sites.NOT_RUN_DEFAULT,
        "megatron/legacy/b.py:5 nvidia_arch_major": "module never imported: legacy model code: "
        "pretrain_gpt.py's mcore path and the selected tests never import it",
    }
    assert gates["explanation"].startswith("none ran: ")
    assert (
        cov["grouped-gemm"]["total"] == 0 and cov["grouped-gemm"]["explanation"] == "nothing to rewrite at this release"
    )
    assert (
        cov["apex-to-torch"]["total"] == 0
        and "no rewritten site calls a runtime helper" in cov["apex-to-torch"]["explanation"]
    )
    assert main(["-C", str(tmp_path), "verify", "--tree", str(tree), "--stages", "1"]) == 0
    out = capsys.readouterr().out
    assert (
        "device-probes: 1 of 1 rewritten sites ran" in out
        and "capability-gates: 0 of 3 rewritten sites ran (none ran:" in out
    )
