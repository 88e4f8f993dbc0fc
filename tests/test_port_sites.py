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


GATED = """from megatron.core._rocm import te_gate, is_hip


class TELinear:
    def __init__(self, config, parallel_mode, cp_comm_type):
        if config.delay_wgrad_compute:
            if te_gate(is_te_min_version("2.3.0"), "pytorch.Linear", "delay_wgrad_compute"):
                pass
        if is_te_min_version("0.8.0"):
            if config.tp_comm_overlap and parallel_mode != "duplicated":
                if te_gate(is_te_min_version("1.5.0"), "pytorch.Linear", "ub_overlap_ag"):
                    pass
        if cp_comm_type is None:
            pass
        elif cp_comm_type == "a2a+p2p":
            assert te_gate(is_te_min_version("1.12.0"), "pytorch.DotProductAttention", "cp_comm_type")
        else:
            te_gate(True, "x", "y")
        keep = config.fp8 and config.fp8_recipe != "delayed" and te_gate(True, "pytorch.Linear", "save")


if is_hip():
    HAVE = False


def supported():
    if not torch.cuda.is_available():
        return False
    if bad:
        raise ValueError("a bad input: not a condition")
    return is_hip()
"""


def test_each_site_says_the_condition_that_takes_it_and_an_unreached_one_gives_it_as_its_reason():
    """An unreached TE gate said only "a TE version gate on a TE code path" whichever flag takes it
    (--delay-wgrad-compute, --tp-comm-overlap, --cp-comm-type, FP8 with a non-delayed recipe): its
    reason names the condition now, as the source spells it, version checks left out."""
    calls = port_sites._calls(GATED, {"te_gate", "is_hip"})
    when = {(first, helper): cond for first, _, helper, _, cond in calls}
    assert when == {
        (7, "te_gate"): "config.delay_wgrad_compute",
        (11, "te_gate"): "config.tp_comm_overlap and parallel_mode != 'duplicated'",
        (16, "te_gate"): "cp_comm_type == 'a2a+p2p'",
        (18, "te_gate"): "not (cp_comm_type == 'a2a+p2p')",
        (19, "te_gate"): "config.fp8 and config.fp8_recipe != 'delayed'",
        (22, "is_hip"): "",
        (31, "is_hip"): "torch.cuda.is_available()",  # past the guard clause that returns
    }
    assert {scope for *_, scope, _ in calls} == {"TELinear.__init__", "<module>", "supported"}
    sites = [
        port_sites.Site("te-version-gates", "megatron/core/t.py", first, last, helper, scope, 1, cond)
        for first, last, helper, scope, cond in calls
    ]
    cov = port_sites.coverage(sites, set(), {"megatron/core/t.py"}, {"te-version-gates": 6}, te_version="2.12.0")
    unreached = cov["te-version-gates"].unreached
    assert unreached["megatron/core/t.py:7 te_gate"] == (
        "taken only when `config.delay_wgrad_compute`; a TE version gate on a TE code path: "
        "not taken by the cases and test files verify ran with TE 2.12.0"
    )
    assert unreached["megatron/core/t.py:22 is_hip"] == port_sites.NOT_RUN_DEFAULT  # module level, no condition


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
    assert set(calls) == {("megatron/core/a.py", 11), ("megatron/core/a.py", 16)}  # probe() and the module-level probe
    assert "megatron/core/a.py" in modules and "megatron/legacy/b.py" not in modules


@pytest.mark.torch
def test_each_site_that_ran_names_the_stages_that_ran_it(tmp_path):
    """Verify gives each stage its own records directory: the sites read back with the stages that
    ran them (in run order, not by name), and a flat directory's records still count, naming none."""
    tree, base = ported_tree(tmp_path / "t")
    boot = firewall.write_bootstrap(tmp_path / "boot")
    records = tmp_path / "sites"
    runs = {
        "imports": "from megatron.core import a",  # the module-level probe (a.py:16) only
        "gpt-training": "from megatron.core import a; a.probe()",  # it and probe() (a.py:11)
        # A caller's one flat directory: a.py:6 too (recorded on the call; no GPU here to answer it).
        "": "from megatron.core import a\ntry:\n    a.arch()\nexcept AssertionError:\n    pass",
    }
    for stage, code in runs.items():
        (records / stage).mkdir(parents=True, exist_ok=True)
        env = environment.child_env(tree, boot, {"ROCMPORT_PORT_SITES": str(records / stage)})
        proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
    calls, modules = port_sites.read_records(records, tree, ("imports", "gpt-training"))
    assert calls == {
        ("megatron/core/a.py", 6): [],
        ("megatron/core/a.py", 11): ["gpt-training"],
        ("megatron/core/a.py", 16): ["imports", "gpt-training"],
    }
    assert "megatron/core/a.py" in modules
    cov = port_sites.coverage(port_sites.find_sites(tree, base), calls, modules, {"capability-gates": 3})
    gates, probes = cov["capability-gates"].to_dict(), cov["device-probes"].to_dict()
    assert gates["ran"] == {
        "megatron/core/a.py:11 is_hip": ["gpt-training"],
        "megatron/core/a.py:6 nvidia_arch_major": [],
    }
    assert probes["ran"] == {"megatron/core/a.py:16 is_hip": ["imports", "gpt-training"]}
    assert (gates["exercised"], probes["exercised"]) == (2, 1)
    assert list(gates["unreached"]) == ["megatron/legacy/b.py:5 nvidia_arch_major"]


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
    assert cov["device-probes"] == {
        "exercised": 1,
        "total": 1,
        "rewrites": 1,
        "unreached": {},
        "ran": {"megatron/core/a.py:16 is_hip": ["imports"]},  # stage 1 imports a.py: its module-level probe
    }
    gates = cov["capability-gates"]
    assert (gates["exercised"], gates["total"], gates["rewrites"]) == (0, 3, 3)
    assert gates["unreached"] == {
        "megatron/core/a.py:11 is_hip": "its module was imported; its call in probe() did not run in the stages verify ran",
        "megatron/core/a.py:6 nvidia_arch_major": "its module was imported; its call in arch() did not run in the stages verify ran",
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


@pytest.mark.torch
def test_one_site_count_per_codemod_in_apply_verify_and_status(tmp_path, monkeypatch, capsys):
    """te-version-gates showed "7 files, 30 sites" in apply's table and "0 of 28 rewritten sites" in
    verify's coverage: 30 is the codemod's own count, 28 the rewritten sites that call a runtime
    helper (the other two, `is_te_min_version` answering False without TE, act by themselves). A real
    apply of a v0.16-shaped tree, then verify: the one count (apply's) is the count verify and the
    report give, and the helper-calling part is named as such."""
    import re

    from tests.codemods.test_te_version_gates import EXTENSIONS
    from tests.helpers.codemods import UTILS_V016
    from tests.helpers.patches import Project

    proj = Project(tmp_path, monkeypatch)
    proj.up_files = {
        "megatron/__init__.py": "",
        "megatron/core/__init__.py": "",
        "megatron/core/utils.py": UTILS_V016,
        "megatron/core/extensions/__init__.py": "",
        "megatron/core/extensions/transformer_engine.py": EXTENSIONS,
    }
    proj.pin(proj.upstream_commit(proj.up_files, "upstream 0.16.1 with TE gates"))
    proj.refresh_mirror()
    proj.write_series({}, codemods=["te-version-gates"])
    capsys.readouterr()
    assert main(["-C", str(proj.root), "apply"]) == 0
    table = capsys.readouterr().out
    applied = int(re.search(r"te-version-gates.*?(\d+) sites", table, re.S).group(1))
    assert main(["-C", str(proj.root), "verify", "--tree", str(proj.tree), "--stages", "1", "--json"]) in (0, 1)
    cov = json.loads(capsys.readouterr().out)["port_sites"]["te-version-gates"]
    assert cov["rewrites"] == applied and 0 < cov["total"] < applied  # some rewrites call no helper
    main(["-C", str(proj.root), "verify", "--tree", str(proj.tree), "--stages", "1"])
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("  te-version-gates:"))
    assert line.startswith(
        f"  te-version-gates: {applied} sites rewritten; {cov['exercised']} of their {cov['total']} runtime-helper calls ran"
    ), line
    assert main(["-C", str(proj.root), "status"]) == 0  # status shows the last verify's verdict, no other count
    assert not re.search(r"te-version-gates\D+\d+ (rewritten )?sites", capsys.readouterr().err)


def test_a_site_whose_function_says_what_takes_it_is_explained_by_that_flag_not_its_helper():
    """Measured on v0.16 (docs/reach.md): set_ideal_affinity_for_current_gpu's is_hip, validate_yaml's
    nvidia_capability and get_fp4_recipe's te_has were unreached with their helper's generic reason
    ("its call in ...() did not run", "a TE feature probe on a TE code path"), not the flag that calls them."""
    te = port_sites.te_why("2.12.0")
    sites = [
        port_sites.Site(
            "device-probes",
            "megatron/core/pipeline_parallel/utils.py",
            89,
            89,
            "is_hip",
            scope="set_ideal_affinity_for_current_gpu",
        ),
        port_sites.Site(
            "capability-gates",
            "megatron/training/yaml_arguments.py",
            261,
            261,
            "nvidia_capability",
            scope="validate_yaml",
            when="args.language_model.moe_grouped_gemm",
        ),
        port_sites.Site("te-version-gates", "megatron/core/fp4_utils.py", 97, 97, "te_has", scope="get_fp4_recipe"),
        # the same helper elsewhere keeps its helper's reason
        port_sites.Site("te-version-gates", "megatron/core/fp8_utils.py", 40, 40, "te_has", scope="get_fp8_recipe"),
    ]
    modules = {s.path for s in sites}
    cov = port_sites.coverage(
        sites, set(), modules, {"device-probes": 1, "capability-gates": 1, "te-version-gates": 2}, "2.12.0"
    )
    assert cov["device-probes"].unreached == {
        "megatron/core/pipeline_parallel/utils.py:89 is_hip": "only with --fine-grained-activation-offloading "
        "(training.py pins each rank's CPU affinity to its GPU then)"
    }
    assert cov["capability-gates"].unreached["megatron/training/yaml_arguments.py:261 nvidia_capability"] == (
        "taken only when `args.language_model.moe_grouped_gemm`; only with --yaml-cfg (initialize.py validates "
        "a YAML config's arguments there instead of validate_args)"
    )
    gates = cov["te-version-gates"].unreached
    assert gates["megatron/core/fp4_utils.py:97 te_has"].startswith("only with FP4 (--fp4-format")
    assert gates["megatron/core/fp8_utils.py:40 te_has"] == port_sites.NOT_RUN["te_has"].format(te=te)


def test_coverage_lines_say_each_reason_once_and_fold_the_codemods_with_nothing_to_count():
    """The te-version-gates line said Transformer Engine's absence three times in one line, and each
    codemod without a helper-calling site took a "0 of 0" line of its own."""
    from rocmport.verify.orchestration import summary
    from tests.test_verify import a_v019_report

    te = port_sites.te_why(None)
    unreached = {
        "megatron/core/extensions/transformer_engine.py:40 te_gate": port_sites._not_imported(
            "megatron/core/extensions/transformer_engine.py"
        ),
        "megatron/core/models/gpt/x.py:3 te_gate": port_sites.NOT_RUN["te_gate"].format(te=te),
        "megatron/core/models/gpt/x.py:9 te_accepts": port_sites.NOT_RUN["te_accepts"].format(te=te),
    }
    sites = []
    for key in unreached:
        where, helper = key.split()
        path, line = where.split(":")
        sites.append(port_sites.Site("te-version-gates", path, int(line), int(line), helper))
    cov = port_sites.coverage(
        sites,
        set(),
        {"megatron/core/models/gpt/x.py"},
        {"te-version-gates": 5, "apex-to-torch": 2, "grouped-gemm": 0, "device-probes": 0},
    )
    r = a_v019_report()
    r.port_sites = cov
    lines = summary.coverage_lines(r)
    assert lines[1] == (
        "  te-version-gates: 5 sites rewritten; 0 of their 3 runtime-helper calls ran (none ran: a TE call-site "
        "probe on a TE code path; a TE version gate on a TE code path; module never imported: Transformer Engine's "
        f"wrappers: {te})"
    )
    assert lines[1].count("not installed") == 1
    assert lines[2:] == [
        "  nothing to count: apex-to-torch (no rewritten site calls a runtime helper (its rewrites act by themselves)); "
        "grouped-gemm, device-probes (nothing to rewrite at this release)"
    ]
