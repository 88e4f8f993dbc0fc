"""verify: firewall, environment, bad input, reports, the proxy shim's limits, env and doctor."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from rocmport.cli import main
from rocmport.verify.orchestration import environment
from rocmport.verify.orchestration import firewall
from rocmport.verify.orchestration import report
from rocmport.verify.runtime import hip_sim
from rocmport.verify.orchestration.launcher import free_port
from rocmport.verify.stages.gpt_training import StageResult
from tests.helpers.gloo_ranks import LEAVE_WITHOUT_FINALIZING


def fake_package(root: Path, name: str) -> None:
    (root / name / "sub").mkdir(parents=True)
    (root / name / "__init__.py").write_text("X = 1\n")
    (root / name / "sub" / "__init__.py").write_text("")


def test_firewall_emulates_absence(tmp_path):
    site = tmp_path / "site"
    for pkg in ("modelopt", "apex", "einops_like"):
        fake_package(site, pkg)
    boot = firewall.write_bootstrap(tmp_path / "boot")
    code = (
        "import importlib.util as u\n"
        "print(u.find_spec('modelopt'), u.find_spec('apex'), u.find_spec('einops_like') is not None)\n"
        "for m in ('modelopt', 'modelopt.sub', 'apex.sub'):\n"
        "    try:\n        __import__(m); print('imported', m)\n"
        "    except ModuleNotFoundError as e:\n        print('absent', e.name)\n"
    )
    env = environment.child_env(site, boot, firewall.firewall_env("cpu-proxy"))
    env["PYTHONPATH"] = f"{boot}:{site}"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True).stdout.split("\n")
    assert out[0] == "None None True"
    assert out[1:4] == ["absent modelopt", "absent modelopt", "absent apex"]
    # The rocm profile keeps apex (ROCm builds exist) and still hides modelopt.
    env.update(firewall.firewall_env("rocm"))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True).stdout.split("\n")
    assert out[0].startswith("None ModuleSpec(name='apex'")


def minimal_tree(root: Path, random_py: str = "") -> Path:
    for rel, text in {
        "megatron/__init__.py": "",
        "megatron/core/__init__.py": "",
        "megatron/core/tensor_parallel/__init__.py": "",
        "megatron/core/tensor_parallel/random.py": random_py,
    }.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


@pytest.mark.torch
@pytest.mark.parametrize(
    "args, message",
    [
        (["--tp", "2", "--pp", "2", "--nproc", "6"], "--nproc 6 is not a multiple of tp×pp = 4"),
        (["--tp", "3"], "--tp 3: the verify model has 4 heads"),
        (["--tp", "0", "--dry-run"], "Invalid value for '--tp': 0 is not in the range 1<=x<=65536"),
        (["--pp", "0", "--dry-run", "--nproc", "4"], "Invalid value for '--pp': 0 is not in the range 1<=x<=65536"),
    ],
)
def test_bad_parallel_sizes(tmp_path, capsys, args, message):
    tree = minimal_tree(tmp_path / "t")
    assert main(["verify", "--tree", str(tree), *args]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    "args, message",
    [
        (["--tp", "3", "--pp", "2"], "--tp 3: the verify model has 4 heads; use a tp that divides 4"),
        (["--pp", "3"], "--pp 3: the verify model has 4 layers"),
        (["--nproc", "5"], "--nproc 5 is not a multiple of tp×pp = 4"),
        (["--dp", "1", "--nproc", "8"], "--dp 1 and --nproc 8 disagree: tp 2 × pp 2 × dp 1 = 4 processes"),
    ],
)
@pytest.mark.parametrize("where", ["work tree", "--tree"])
def test_a_bad_parallel_layout_is_answered_from_the_options_alone(tmp_path, args, message, where):
    """The real command line, in a project with no work tree, and with a tree given: the layout's
    rules are told first (before any tree is looked for, the environment probed or torch
    imported: that took 25 s on v0.19's tree), exit 2, nothing written."""
    project = tmp_path / "project"
    project.mkdir()
    tree = ["--tree", str(minimal_tree(tmp_path / "t"))] if where == "--tree" else []
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    probe = (
        "import sys, runpy; sys.argv = ['rocmport', *sys.argv[1:]]; runpy.run_module('rocmport', run_name='__main__')"
    )
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", probe, "-C", str(project), "verify", *tree, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [ln for ln in proc.stderr.splitlines() if not ln.startswith("import time:")]
    assert len(lines) == 1 and lines[0].startswith(f"rocmport: error: {message}"), lines
    imported = {ln.split("|")[-1].strip() for ln in proc.stderr.splitlines() if ln.startswith("import time:")}
    assert (
        "torch" not in imported and "rocmport.verify.orchestration.environment" in imported
    )  # verify's modules loaded, torch not
    assert not any(project.iterdir())  # nothing written


def test_missing_tree_and_not_megatron(tmp_path, capsys):
    assert main(["-C", str(tmp_path), "verify"]) == 2
    assert "run `rocmport apply` first or pass --tree" in capsys.readouterr().err
    assert main(["verify", "--tree", str(tmp_path)]) == 2
    assert "not a Megatron-LM tree" in capsys.readouterr().err


def test_interpreter_too_old(tmp_path, capsys):
    """Like Megatron-LM v0.17+ (>=3.12) on 3.11: exit 2, one line, saying how to get that Python."""
    nxt = f"3.{sys.version_info.minor + 1}"
    tree = minimal_tree(tmp_path / "t")
    (tree / "pyproject.toml").write_text(f'[project]\nname = "megatron-core"\nrequires-python = ">={nxt}"\n')
    before = sorted(p.name for p in tmp_path.rglob("*"))
    assert main(["verify", "--tree", str(tree)]) == 2
    err = capsys.readouterr().err.strip()
    assert f"requires Python >={nxt} but rocmport runs on Python {platform.python_version()}" in err
    assert f"make a Python {nxt} environment" in err and f"python{nxt} -m venv" in err and "pip install torch" in err
    assert "on ROCm" in err and len(err.splitlines()) == 1
    assert sorted(p.name for p in tmp_path.rglob("*")) == before  # nothing written


def test_verify_without_torch_is_bad_input_naming_the_fix(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises ImportError, as where none is installed
    tree = minimal_tree(tmp_path / "t")
    assert main(["verify", "--tree", str(tree)]) == 2
    err = capsys.readouterr().err
    assert "verify needs torch" in err and "pip install torch" in err and "never be replaced" in err


@pytest.mark.torch
def test_missing_shim_hook_is_unsupported_not_failed(tmp_path, capsys):
    # A tree whose RNG internals differ from what the proxy shim knows.
    tree = minimal_tree(tmp_path / "t", "def model_parallel_cuda_manual_seed(seed):\n    pass\n")
    rc = main(["-C", str(tmp_path), "verify", "--tree", str(tree), "--json", "--junit", str(tmp_path / "j.xml")])
    data = json.loads(capsys.readouterr().out)
    assert rc == 0, data
    assert data["mode"] == "cpu-proxy" and data["backend"] == "gloo" and data["world_size"] == 4
    imports, training, unit, functional, bridge, variants = data["stages"]
    assert imports["status"] == "pass"
    assert imports["reason"] == (
        "1 module imports behind the firewall (megatron.core); "
        "the tree has no megatron/training (a package-index source): not tested"
    )
    assert training["status"] == "unsupported-in-proxy"
    assert "megatron.core.tensor_parallel.random._get_cuda_rng_state" in training["reason"]
    # Stages that do not apply to this tree are listed, with the reason, never silently absent.
    assert (unit["status"], unit["reason"]) == (
        "skipped",
        "the tree has no tests/unit_tests (a package-index source ships megatron/core only)",
    )
    assert functional["status"] == "skipped" and "no pretrain_gpt.py" in functional["reason"]
    assert bridge["status"] == "skipped" and "--tree given" in bridge["reason"]
    # stage 6's variants go through megatron.training's parse_args: not applicable either, with or
    # without --te (not "pass --te", which would not make it run)
    assert (variants["status"], variants["reason"]) == (
        "skipped",
        "the tree has no megatron/training (a package-index source ships megatron/core only)",
    )
    # "skipped" as before in the JSON; what the tree cannot have (a package-index source) is not
    # applicable, apart from a stage the run left out, and the verdict says how to get the rest.
    assert [s["applicable"] for s in data["stages"]] == [True, True, False, False, True, False]
    assert data["verdict"] == (
        f"tree {tree} (CPU proxy, not a GPU result): 1 of 3 applicable stages pass; unsupported on the CPU proxy: gpt-training (proxy shim "
        "hook missing: megatron.core.tensor_parallel.random._get_cu…); not run here: bridge (--tree given); "
        "not applicable to the package-index source (megatron/core only): unit-tests, functional, variants "
        "(a git source has what they need: rocmport sync --ref REF --source git)"
    )
    assert data["hip_sim"]["version"] == hip_sim.DEFAULT_VERSION and data["hip_sim"]["arch"] == "gfx942"
    suite = ET.parse(tmp_path / "j.xml").getroot().find("testsuite")
    assert suite.get("tests") == "6" and suite.get("skipped") == "5" and suite.get("failures") == "0"
    # Without --report the report is written all the same: build/verify/<tree's name, no line>-<UTC time>.json, and last.json.
    written = json.loads((tmp_path / "build" / "verify" / "last.json").read_text())["report"]
    assert Path(written).parent == tmp_path / "build" / "verify" and Path(written).name.startswith("t-20")
    assert json.loads(Path(written).read_text()) == data and data["line"] is None and data["commit"] is None


@pytest.mark.torch
def test_import_failure_names_chain(tmp_path, capsys):
    tree = minimal_tree(tmp_path / "t")
    (tree / "megatron/core/__init__.py").write_text("from megatron.core import inner\n")
    (tree / "megatron/core/inner.py").write_text("import modelopt.torch.opt\n")
    assert main(["-C", str(tmp_path), "verify", "--tree", str(tree), "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    imports, training, *rest = data["stages"]
    assert imports["status"] == "fail" and training["status"] == "skipped" and "stage 1" in training["reason"]
    assert "NVIDIA-only package modelopt" in imports["reason"] and "megatron/core/inner.py:1" in imports["reason"]


def test_verify_s_processes_get_the_launch_profile_of_the_device_s_arch():
    """#29 item 3: verify uses the profile of the device (`rocmport env --arch`), the user's values winning."""
    from rocmport.launch_env import launch_env
    from rocmport.machine.launch_profile import verify_env

    mi300 = verify_env("gfx942:sramecc+:xnack-", environ={})
    assert launch_env().items() <= mi300.items() and mi300["HSA_KERNARG_POOL_SIZE"] == "12582912"
    assert verify_env("gfx950", environ={})["NVTE_ROCM_ENABLE_MXFP8"] == "1" and "NVTE_ROCM_ENABLE_MXFP8" not in mi300
    assert "NCCL_SOCKET_IFNAME" not in mi300 and "NCCL_IB_HCA" not in mi300  # no fabric part: one node
    assert "HSA_NO_SCRATCH_RECLAIM" not in verify_env("gfx942", environ={"HSA_NO_SCRATCH_RECLAIM": "0"})  # yours wins
    assert verify_env(None, environ={}) == {}  # the CUDA path
    assert verify_env("gfx9999", environ={}) == launch_env()  # an arch without a profile: the base part


def test_report_schema_junit_and_plot(tmp_path):
    r = {
        "mode": "cpu-proxy",
        "backend": "gloo",
        "world_size": 4,
        "tp": 2,
        "pp": 2,
        "dp": 1,
        "tree": "t",
        "env": {},
        "stages": [
            StageResult("imports", "pass", "ok", 1.0).to_dict(),
            StageResult("gpt-training", "fail", "loss did not fall", 2.0).to_dict(),
        ],
        "training": {},
    }
    report.write_json(r, tmp_path / "r.json")
    assert json.loads((tmp_path / "r.json").read_text())["stages"][1]["status"] == "fail"
    suite = ET.fromstring(
        report.junit_xml(
            "cpu-proxy",
            [StageResult("imports", "pass", "ok", 1.0), StageResult("gpt-training", "fail", "loss did not fall", 2.0)],
        )
    ).find("testsuite")
    assert (
        suite.get("failures") == "1"
        and suite.find("testcase[@name='gpt-training']/failure").get("message") == "loss did not fall"
    )
    plot = report.loss_plot([5.0, 4.0, 3.0])
    assert plot.splitlines()[0].endswith("*  ") and "(3 iterations)" in plot


@pytest.mark.torch
def test_env_and_doctor(capsys):
    assert main(["env", "--json", "--no-fabric"]) == 0
    names = [e["name"] for e in json.loads(capsys.readouterr().out)]
    assert names[:2] == ["CUDA_DEVICE_MAX_CONNECTIONS", "GPU_MAX_HW_QUEUES"] and "NCCL_ALGO" not in names
    assert main(["env", "--deterministic", "--no-fabric"]) == 0
    out = capsys.readouterr().out
    # 7 launcher + 2 deterministic + TORCH_COMPILE_DISABLE (launcher-only)
    assert "export NCCL_ALGO=Ring" in out and "export NCCL_CHECKS_DISABLE=1" in out and out.count("# ") == 10
    # This repository is a port project locked at a line whose matrix requires ROCm TE, which this machine lacks.
    assert main(["-C", str(Path(__file__).resolve().parents[1]), "doctor", "--json"]) == 1
    d = json.loads(capsys.readouterr().out)
    assert {c["name"] for c in d["components"]} >= {"apex", "transformer_engine", "flash_attn"}
    assert d["devices"] == [] and d["hip"] is None and d["problems"][0] == "transformer_engine: not installed"
    assert d["problems"][1:] == [
        f"none of the components of {Path(__file__).resolve().parents[1] / 'patchsets/megatron-lm/v0.16/series'} "
        "is installed here (transformer_engine, flash_attn, apex, grouped_gemm)"
    ]


RNG_HOOKS = "def _get_cuda_rng_state():\n    pass\ndef _set_cuda_rng_state(s):\n    pass\nclass CudaRNGStatesTracker:\n    pass\n"
# Megatron-LM v0.19's DDP (core/distributed/param_and_grad_buffer.py, start_grad_sync), in miniature.
GRAD_SYNC_V019 = """
import torch
def start_grad_sync(params):
    current_stream = torch.cuda.current_stream()
    waited = set()
    for param in params:
        event = getattr(param, "_cudagraph_wgrad_ready_event", None)
        if event is not None and id(event) not in waited:
            current_stream.wait_event(event)
            waited.add(id(event))
    return len(waited)
"""


@pytest.mark.torch
@pytest.mark.parametrize("shim", [False, True])
def test_proxy_answers_current_stream_for_v019_grad_sync(tmp_path, shim):
    """v0.19's grad sync asks torch.cuda.current_stream() unconditionally: no CUDA here raises; the
    proxy answers with the CPU stream, whose waits return at once."""
    tree = minimal_tree(tmp_path / "t", RNG_HOOKS)
    (tree / "megatron/core/distributed").mkdir(parents=True)
    (tree / "megatron/core/distributed/__init__.py").write_text("")
    (tree / "megatron/core/distributed/param_and_grad_buffer.py").write_text(GRAD_SYNC_V019)
    code = (
        "import torch\n"
        + ("from rocmport.verify.runtime import proxy_shim\nproxy_shim.install()\n" if shim else "")
        + "from megatron.core.distributed.param_and_grad_buffer import start_grad_sync\n"
        "p, q = torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(2))\n"
        "p._cudagraph_wgrad_ready_event = q._cudagraph_wgrad_ready_event = torch.Event('cpu')\n"
        "try:\n    print('waited', start_grad_sync([p, q, torch.nn.Parameter(torch.ones(1))]))\n"
        "except (RuntimeError, AssertionError) as exc:\n    print('no cuda:', type(exc).__name__)\n"
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tree), str(Path(__file__).parents[1])]),
        "CUDA_VISIBLE_DEVICES": "",
    }
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    last = out.stdout.strip().splitlines()[-1:]
    # Without the shim: a CPU build of torch asserts it has no CUDA, a CUDA build finds no driver.
    assert last == ["waited 1"] if shim else last in (["no cuda: AssertionError"], ["no cuda: RuntimeError"]), (
        out.stderr[-2000:]
    )


# Megatron-LM v0.19's pipeline_parallel/utils.py ScheduleNode.stream_acquire_context, in miniature: a
# node's stream is the current one unless it was given a side stream.
STREAM_CONTEXT_V019 = """
import torch
def run(stream=None):
    stream = stream or torch.cuda.current_stream()
    event = torch.cuda.Event()
    event.wait(stream)
    with torch.cuda.stream(stream):
        out = torch.ones(2) * 2
    event.record(stream)
    return out.sum().item()
"""


@pytest.mark.torch
def test_proxy_enters_the_current_stream_as_a_context(tmp_path):
    """v0.19's schedule nodes run their work in `with torch.cuda.stream(stream)`, the current stream when
    no side stream was given. The proxy answered current_stream with torch's CPU stream, which is no
    context manager: v0.19's stage 3 failed 'Stream' object does not support the context manager
    protocol (labelled upstream-known on both trees). On the CPU every stream is the one in-order queue."""
    (tmp_path / "node.py").write_text(STREAM_CONTEXT_V019)
    code = (
        "import torch\nfrom rocmport.verify.runtime import proxy_shim\n"
        "proxy_shim.install(megatron=False)\nproxy_shim._in_order_streams()\n"
        "from node import run\nprint('ran', run(), run(torch.cuda.Stream()))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(Path(__file__).parents[1])])}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert out.stdout.strip().splitlines()[-1:] == ["ran 4.0 4.0"], out.stderr[-2000:]


PER_VIEW_GROUPS = (
    """
import json, sys
import torch, torch.distributed as dist
from torch.distributed import distributed_c10d as c10d
if sys.argv[1] == "proxy":
    from rocmport.verify.runtime.proxy_shim import _name_groups_by_members
    _name_groups_by_members()
dist.init_process_group("gloo")
r = dist.get_rank()
view = [r % 2, r % 2 + 2]  # each rank's own pipeline, as upstream's test helper makes it
# The rendezvous names new_group would use, at the same creation count on every rank (plain gloo
# would connect under them right away, and may hang or cross-connect the pairs doing so).
names = [c10d._process_group_name([0, 1, 2, 3], False), c10d._process_group_name(view, False)]
result = {"rank": r, "names": names}
if sys.argv[1] == "proxy":
    everyone, mine = dist.new_group([0, 1, 2, 3]), dist.new_group(view)
    t, u = torch.tensor([float(r)]), torch.tensor([1.0])
    dist.all_reduce(t, group=mine)
    dist.all_reduce(u, group=everyone)
    result.update(sum=t.item(), everyone=u.item(), groups=[everyone.group_name, mine.group_name])
open(f"rank{r}.json", "w").write(json.dumps(result))  # files: ranks' prints interleave
dist.destroy_process_group()
"""
    + LEAVE_WITHOUT_FINALIZING
)


def _torchrun_script(tmp_path: Path, script: str, nproc: int, mode: str) -> None:
    """Run `script` as groups.py on `nproc` local ranks (argument: `mode`); each rank writes rankN.json."""
    (tmp_path / "groups.py").write_text(script)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).parents[1])}
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            str(nproc),
            "--master-port",
            str(free_port()),
            "groups.py",
            mode,
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    # the ranks' own last words first: torchrun's summary after them fills the tail
    said = [line for line in out.stderr.splitlines() if "terminate called" in line or "what():" in line]
    assert out.returncode == 0, "\n".join(said + [out.stderr[-2000:]])


def _gloo_rank_script(shim: str, body: str) -> str:
    """A rank's script for _torchrun_script: in `proxy` mode the shim pieces ``shim`` (lines run with
    proxy_shim imported), then gloo, then ``body`` (which sets ``result``'s fields) with its exception kept
    in ``result["error"]``; each rank writes rankN.json with the proxy's redirects."""

    def indent(text: str, pad: str) -> str:
        return "".join(pad + line + "\n" for line in textwrap.dedent(text).strip().splitlines())

    return (
        "import json, sys\nimport torch, torch.distributed as dist\n"
        'if sys.argv[1] == "proxy":\n    from rocmport.verify.runtime import proxy_shim\n'
        + indent(shim, "    ")
        + 'dist.init_process_group("gloo")\nr = dist.get_rank()\nresult = {"rank": r}\ntry:\n'
        + indent(body, "    ")
        + 'except Exception as exc:\n    result["error"] = f"{type(exc).__name__}: {exc}"\n'
        + 'if sys.argv[1] == "proxy":\n    result["redirects"] = sorted(proxy_shim.REDIRECTS)\n'
        + 'open(f"rank{r}.json", "w").write(json.dumps(result))\ndist.destroy_process_group()\n'
        + LEAVE_WITHOUT_FINALIZING
    )


NCCL_SUBGROUPS = _gloo_rank_script(
    """\
proxy_shim._subgroups_on_gloo()  # what install_for_upstream_code installs for the subgroups
""",
    """\
# As upstream main's HyperCommGrid(..., backend="nccl") and its tests ask for groups.
pair = dist.new_group([0, 1], backend="nccl")
mine, _ = dist.new_subgroups_by_enumeration([[0], [1]], backend="nccl")
t = torch.tensor([float(r + 1)])
dist.all_reduce(t, group=pair)
result.update(sum=t.item(), backends=[dist.get_backend(pair), dist.get_backend(mine)])
""",
)


@pytest.mark.torch
@pytest.mark.slow
@pytest.mark.parametrize("mode", ["plain", "proxy"])
def test_proxy_puts_subgroups_asked_for_on_nccl_on_gloo(tmp_path, mode):
    """Without a GPU torch cannot build a subgroup on nccl; the proxy gives it gloo, as it does the
    default group, and counts each swap."""
    _torchrun_script(tmp_path, NCCL_SUBGROUPS, 2, mode)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    if mode == "plain":
        assert all("error" in r and "sum" not in r for r in ranks), ranks
        return
    assert [r.get("sum") for r in ranks] == [3.0, 3.0], ranks
    assert all(r["backends"] == ["gloo", "gloo"] for r in ranks), ranks
    assert all(any(k.startswith("new_group(backend=nccl) -> gloo") for k in r["redirects"]) for r in ranks), ranks


NCCL_OPTIONS = _gloo_rank_script(
    """\
proxy_shim._subgroups_on_gloo()  # what install_for_upstream_code installs for the subgroups
""",
    """\
# As megatron's parallel_state.get_nccl_options builds them (torch-FSDP2's high-priority dp_cp group).
opts = dist.ProcessGroupNCCL.Options(is_high_priority_stream=True)
opts.config.max_ctas = 32
pair = dist.new_group([0, 1], pg_options=opts)
t = torch.tensor([float(r + 1)])
dist.all_reduce(t, group=pair)
result.update(sum=t.item(), backend=dist.get_backend(pair))
""",
)


@pytest.mark.torch
@pytest.mark.slow
@pytest.mark.parametrize("mode", ["plain", "proxy"])
def test_proxy_takes_nccl_group_options_and_gives_gloo_none(tmp_path, mode):
    """megatron builds ProcessGroupNCCL.Options for the groups it streams at high priority (every
    --use-torch-fsdp2 case: dp_cp). A CPU build of torch has no ProcessGroupNCCL (the v0.16 sweep's fsdp2
    case stopped on both trees with its AttributeError, labelled upstream-known) and gloo takes no NCCL
    options: the proxy stands in for the class where torch lacks it, drops the options, and counts it."""
    _torchrun_script(tmp_path, NCCL_OPTIONS, 2, mode)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    if mode == "plain":
        if hasattr(__import__("torch").distributed, "ProcessGroupNCCL"):
            return  # a CUDA build of torch has the class; what gloo does with its options is the proxy's case
        assert all("ProcessGroupNCCL" in r.get("error", "") for r in ranks), ranks
        return
    assert [r.get("sum") for r in ranks] == [3.0, 3.0], ranks
    assert all(r["backend"] == "gloo" for r in ranks), ranks
    assert all(any(k.startswith("new_group(pg_options=NCCL) -> none for gloo") for k in r["redirects"]) for r in ranks)


FSDP2_ON_A_CUDA_MESH = _gloo_rank_script(
    """\
proxy_shim.install(megatron=False)
proxy_shim._subgroups_on_gloo()
proxy_shim._meshes_on_the_cpu()  # what install_for_upstream_code installs for device meshes
""",
    """\
from torch.distributed import DeviceMesh
from torch.distributed.fsdp import fully_shard
torch.manual_seed(0)
model = torch.nn.Linear(4, 4)
# as megatron's TorchFullyShardedDataParallel shards a module for --use-torch-fsdp2
fully_shard(model, mesh=DeviceMesh.from_group(dist.group.WORLD, "cuda"))
loss = model(torch.full((2, 4), float(r + 1))).sum()
loss.backward()
result.update(loss=loss.item(), grad=model.weight.grad.full_tensor().sum().item())
""",
)


@pytest.mark.torch
@pytest.mark.slow
@pytest.mark.parametrize("mode", ["plain", "proxy"])
def test_proxy_makes_a_mesh_asked_for_on_cuda_on_the_cpu(tmp_path, mode):
    """torch-FSDP2 over megatron's `DeviceMesh.from_group(group, "cuda")`: without a GPU it cannot take its
    device from the mesh (the v0.16 fsdp2 cases stopped there); on the proxy the mesh is the CPU's, the
    module shards over gloo and trains (its gradient reduced across the ranks), counted."""
    _torchrun_script(tmp_path, FSDP2_ON_A_CUDA_MESH, 2, mode)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    if mode == "plain":
        assert all("error" in r and "loss" not in r for r in ranks), ranks
        return
    assert all("error" not in r for r in ranks), ranks
    assert ranks[0]["grad"] == ranks[1]["grad"] != 0, ranks  # one gradient: reduced over both ranks
    assert all(any(k.startswith("DeviceMesh('cuda') -> cpu") for k in r["redirects"]) for r in ranks), ranks


DEVICE_OF_CURRENT_DEVICE = _gloo_rank_script(
    """\
proxy_shim.install(megatron=False)
""",
    """\
# As Megatron-FSDP names its device (core_v0.16.1 mcore_fsdp_adapter.py and megatron_fsdp.py __init__).
device = torch.device(f"cuda:{torch.cuda.current_device()}")
buffer = torch.full((4,), float(r + 1), device=device)
dist.all_reduce(buffer)
same = device == torch.device(f"cuda:{torch.cuda.current_device()}")  # megatron_fsdp.py checks it so
result.update(device=str(device), buffer_device=str(buffer.device), sum=buffer.sum().item(), same=same)
""",
)


@pytest.mark.torch
@pytest.mark.slow
@pytest.mark.parametrize("mode", ["plain", "proxy"])
def test_proxy_makes_the_device_named_by_the_current_device_the_cpu(tmp_path, mode):
    """Megatron-FSDP names its device torch.device(f"cuda:{torch.cuda.current_device()}"); the proxy answers
    current_device 'cpu', and 'cuda:cpu' is no device string to torch (the v0.16 sweep's fsdp_dtensor case
    stopped there on both trees, labelled proxy-artifact). On the proxy it is the CPU, counted; without the
    proxy a CPU build of torch has no current device at all."""
    _torchrun_script(tmp_path, DEVICE_OF_CURRENT_DEVICE, 2, mode)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    if mode == "plain":
        if __import__("torch").cuda.is_available():
            return  # a GPU has a current device: what the proxy stands in for
        assert all("error" in r and "sum" not in r for r in ranks), ranks
        return
    assert all("error" not in r for r in ranks), ranks
    assert [(r["device"], r["buffer_device"], r["sum"], r["same"]) for r in ranks] == [("cpu", "cpu", 12.0, True)] * 2
    assert all(any(k.startswith("torch.device('cuda:cpu') -> cpu") for k in r["redirects"]) for r in ranks), ranks


DCP_SAVE_ON_THE_DEVICES_STREAM = _gloo_rank_script(
    """\
# what pretrain_gpt.py's ranks get (without megatron): the streams, and a device that exists
proxy_shim.install(megatron=False)
proxy_shim._in_order_streams()
proxy_shim.install_device_answers(False)
""",
    """\
import torch.distributed.checkpoint as dcp
# As Megatron's fsdp_dtensor save writes (torch's FileSystemWriter, one thread): where torch.cuda.is_available(),
# its loader stages the tensors on torch.cuda.current_stream() and synchronizes it before writing.
state = {f"w{r}": torch.full((4,), float(r + 1)), "shared": torch.arange(4.0)}
back = {f"w{r}": torch.zeros(4), "shared": torch.zeros(4)}
try:
    dcp.save(state, checkpoint_id=sys.argv[2])
    dcp.load(back, checkpoint_id=sys.argv[2])
except BaseException as exc:  # torch's CheckpointException is no Exception
    raise RuntimeError(f"{type(exc).__name__}: {exc}") from None
result.update(cuda=torch.cuda.is_available(), mine=back[f"w{r}"].tolist(), shared=back["shared"].tolist())
""",
)


@pytest.mark.torch
@pytest.mark.slow
@pytest.mark.parametrize("mode", ["plain", "proxy"])
def test_proxy_lets_torchs_checkpoint_writer_synchronize_the_current_stream(tmp_path, mode):
    """torch's distributed checkpoint writer synchronizes torch.cuda.current_stream() where CUDA is available;
    on the proxy (a device exists) that is torch's CPU stream stand-in, which had no synchronize: v0.16's
    gpt3_mcore_te_tp2_zp_z3_resume_fsdp_dtensor stopped at its first save on both trees. Plain (no device:
    the serial loader) and proxy both write and read the checkpoint back; the proxy counts the synchronize."""
    _torchrun_script(
        tmp_path, DCP_SAVE_ON_THE_DEVICES_STREAM.replace("sys.argv[2]", repr(str(tmp_path / "ckpt"))), 2, mode
    )
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert all("error" not in r for r in ranks), ranks
    assert [(r["mine"], r["shared"]) for r in ranks] == [([float(i + 1)] * 4, [0.0, 1.0, 2.0, 3.0]) for i in range(2)]
    if mode == "proxy":
        assert all(r["cuda"] for r in ranks), ranks  # the device answers: the loader that synchronizes
        assert all(any(k.startswith("cpu.Stream.synchronize") for k in r["redirects"]) for r in ranks), ranks


@pytest.mark.torch
@pytest.mark.slow
@pytest.mark.parametrize("mode", ["plain", "proxy"])
def test_proxy_gives_per_view_subgroups_their_own_rendezvous(tmp_path, mode):
    """torch names a group by its creation count and gloo connects it at creation under that name:
    per-rank views ([0, 2] on ranks 0 and 2, [1, 3] on 1 and 3, same count) share one rendezvous on
    plain gloo. The proxy names them by their members too; groups made alike keep one name."""
    _torchrun_script(tmp_path, PER_VIEW_GROUPS, 4, mode)
    ranks = {d["rank"]: d for d in (json.loads(f.read_text()) for f in tmp_path.glob("rank*.json"))}
    assert sorted(ranks) == [0, 1, 2, 3]
    assert len({d["names"][0] for d in ranks.values()}) == 1  # a group every rank makes alike: one name
    assert ranks[0]["names"][1] == ranks[2]["names"][1] and ranks[1]["names"][1] == ranks[3]["names"][1]
    if mode == "plain":  # the clash: two different groups under one rendezvous name
        assert ranks[0]["names"][1] == ranks[1]["names"][1]
    else:
        assert ranks[0]["names"][1] != ranks[1]["names"][1]
        assert {r: d["sum"] for r, d in ranks.items()} == {0: 2.0, 1: 4.0, 2: 2.0, 3: 4.0}
        assert all(d["everyone"] == 4.0 for d in ranks.values())
        assert len({d["groups"][0] for d in ranks.values()}) == 1 and ranks[0]["groups"][1] != ranks[1]["groups"][1]


def a_v019_report():
    """A report shaped like v0.19's CPU-proxy run: stage 3 failed by one unverified test and one test
    file that did not run, 5 labelled tests that do not block, stages 4 and 5 not run here."""
    from rocmport.machine.probe import Environment
    from rocmport.verify.runtime.hip_sim import HipSim
    from rocmport.verify.orchestration.launcher import Launcher
    from rocmport.verify.analyses.port_sites import Coverage
    from rocmport.verify.orchestration.result import ReportEnv, VerifyReport
    from rocmport.verify.stages.unit_tests.results import UnitTestsRun

    hang = "tests/unit_tests/transformer/test_attention.py::TestParallelAttention::test_gpu_forward"
    labels = {
        hang: "unverified",
        "tests/unit_tests/test_utils.py": "not-run",
        **{f"tests/unit_tests/test_x.py::test_{i}": "upstream-known" for i in range(3)},
        **{f"tests/unit_tests/test_te.py::test_{i}": "needs-nvidia-only" for i in range(2)},
    }
    unit = StageResult(
        "unit-tests",
        "fail",
        "40 passed, 3 skipped, 6 failed (...) in 6 of 7 files on 8 ranks",
        2100.0,
        UnitTestsRun(
            labels=labels,
            label_reasons={
                hang: "it hung in the suite and failed when rerun alone; the unported tree failed it without hanging",
                "tests/unit_tests/test_utils.py": "none of its 12 tests ran: its restart budget ran out: 7 hangs in this file, 6 restarts per file",
                **{k: "fails the same way on the unported tree" for k in labels if "test_x" in k or "test_te" in k},
            },
            failures={hang: "hung: no result after 45 s on rank 3"},
            on_baseline={hang: "failed", "tests/unit_tests/test_utils.py": "ran: 12 passed"},
        ),
    )
    return VerifyReport(
        mode="cpu-proxy",
        backend="gloo",
        world_size=4,
        tp=2,
        pp=2,
        dp=1,
        tree="/p/build/megatron-lm",
        hip_sim=HipSim("7.1", "gfx942", "AMD Instinct MI300X"),
        env=ReportEnv(Environment(python="3.12", torch="2.13", hip="7.1", cuda=None, device_count=0)),
        launcher=Launcher(),
        stages=[
            StageResult("imports", "pass", "3 modules import behind the firewall", 30.0),
            StageResult("gpt-training", "pass", "loss 4.8 -> 4.1 in 10 iterations", 60.0),
            unit,
            StageResult(
                "functional",
                "skipped",
                "the tree has no pretrain_gpt.py (a package-index source ships megatron/core only)",
            ),
            StageResult(
                "bridge",
                "skipped",
                "--tree given (stage 5 runs with the project's own work trees; --bridge to ask for it)",
            ),
        ],
        port_sites={
            "te-version-gates": Coverage(
                exercised=0,
                total=28,
                rewrites=28,
                unreached={
                    "megatron/core/extensions/transformer_engine.py:40 is_te_min_version": "module never imported: TE absent",
                    "megatron/core/utils.py:12 is_te_min_version": "imported, the branch did not run",
                },
            )
        },
        line="v0.19",
        commit="abc123",
        started="2026-11-26T01:30:00Z",
    )


def test_each_stage_s_report_data_writes_its_own_entries_and_reads_back_typed():
    """run_verify keeps a stage's StageRun.data under its name; the JSON gets the entries the data
    writes (else the stage's absent_entries: stage 2's "training" is {} when it gave none), and the
    renderers read it back typed (data_of: another type reads as None)."""
    from rocmport.verify.analyses.port_sites import Coverage
    from rocmport.verify.stages import bridge, functional, gpt_training

    training = gpt_training.Training([4.8, 3.6], [4.8, 3.6], 0.0, True)
    run4 = functional.FunctionalRun("gpt3_mcore_tp1_pp1", "torchrun ...", [10.6, 10.4], 2)
    bridge_run = bridge.BridgeReport(bridge.BridgeTraining([1.0], True), {"x": Coverage(0, 1, 1)})
    report = a_v019_report()
    empty = report.to_dict()
    assert empty["training"] == {} and "functional" not in empty and "bridge_training" not in empty
    report.data.update({gpt_training.NAME: training, functional.NAME: run4, bridge.NAME: bridge_run})
    out = report.to_dict()
    assert out["training"] == training.to_dict() and out["functional"] == run4.to_dict()
    assert out["bridge_training"] == {"losses": [1.0], "tied_embeddings_equal": True}
    assert out["bridge_port_sites"] == {"x": Coverage(0, 1, 1).to_dict()}
    assert report.data_of(gpt_training.NAME, gpt_training.Training) is training
    assert report.data_of(gpt_training.NAME, functional.FunctionalRun) is None


def test_the_summary_starts_with_one_verdict_line_then_the_table_then_what_blocks(capsys):
    from rocmport.commands.verify import _print_summary

    _print_summary(a_v019_report(), "build/verify/v0.19-20261126T013000Z.json")
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0] == (
        "v0.19 port (CPU proxy, not a GPU result): 2 of 5 stages pass; blocking: unit-tests (1 unverified test, "
        "1 test file not run); not run here: functional (the tree has no pretrain_gpt.py), bridge (--tree given)"
    )
    table = next(i for i, ln in enumerate(lines) if "gpt-training" in ln)
    blocking = lines.index("blocking:")
    assert table < blocking
    text = "\n".join(lines[blocking:])
    assert (
        "  unit-tests: unverified: tests/unit_tests/transformer/test_attention.py::TestParallelAttention::test_gpu_forward\n"
        "      why it blocks: the unported tree did not fail it the same way, so it cannot be called upstream's own failure"
    ) in text
    assert (
        "      what happened: it hung in the suite and failed when rerun alone; the unported tree failed it without hanging"
        in text
    )
    assert "      the unported tree: failed\n" in text
    assert (
        "  unit-tests: not-run: tests/unit_tests/test_utils.py\n      why it blocks: a selected test file whose tests did not all run "
        "is never counted as passed\n      what happened: none of its 12 tests ran: its restart budget ran out: 7 hangs"
    ) in text
    # The labelled tests that do not block: one count, not 5 entries of 4 lines each.
    assert (
        "+5 more labelled tests that do not block (3 upstream-known, 2 needs-nvidia-only): each with why in the report, "
        "build/verify/v0.19-20261126T013000Z.json"
    ) in lines
    assert "test_x.py" not in out and "test_te.py" not in out
    assert (
        "  te-version-gates: 0 of 28 rewritten sites ran; e.g. megatron/core/extensions/transformer_engine.py:40 is_te_min_version "
        "did not: module never imported: TE absent (+1 more in the report)"
    ) in lines


def test_the_verdict_of_a_run_where_everything_passes_and_of_a_failed_stage():
    from rocmport.verify.orchestration import summary

    r = a_v019_report()
    r.stages[2] = StageResult("unit-tests", "pass", "40 passed", 1.0)
    r.stages[1] = StageResult(
        "gpt-training", "unsupported-in-proxy", "proxy shim hook missing: x._get_cuda_rng_state", 1.0
    )
    assert summary.verdict(r) == (
        "v0.19 port (CPU proxy, not a GPU result): 2 of 5 stages pass; unsupported on the CPU proxy: "
        "gpt-training (proxy shim hook missing: x._get_cuda_rng_state); not run here: functional "
        "(the tree has no pretrain_gpt.py), bridge (--tree given)"
    )
    r.stages[0] = StageResult(
        "imports", "fail", "megatron.core: ModuleNotFoundError: No module named 'modelopt'; import chain: a -> b", 1.0
    )
    r.line, r.mode = None, "gpu"
    r.env.machine.hip, r.env.machine.cuda = "7.1.25424", None  # a ROCm GPU: the result is what it says
    assert r.to_dict()["verdict"] == summary.verdict(r)
    assert summary.verdict(r).startswith(
        "tree /p/build/megatron-lm: 1 of 5 stages pass; blocking: imports (megatron.core: "
        "ModuleNotFoundError: No module named 'modelopt')"
    )
    # an NVIDIA GPU (an H100 with torch 2.11+cu130 ran stages 1-2 so): the CUDA path, said in the verdict
    r.env.machine.hip, r.env.machine.cuda = None, "13.0"
    assert summary.verdict(r).startswith(
        "tree /p/build/megatron-lm (NVIDIA GPU, CUDA 13.0: the port's CUDA path, not a ROCm result): 1 of 5 stages pass"
    )
    assert summary.blocking_lines(r) == ["imports: stage failed", f"    {r.stages[0].reason}"]


@pytest.fixture
def canned_run(monkeypatch):
    """verify's command with its run replaced by a report (the writing and printing are real)."""
    import rocmport.commands.verify as cmd

    made = {}

    def use(r):
        made["report"] = r
        monkeypatch.setattr(cmd, "prepare", lambda *a, **k: None)
        monkeypatch.setattr(cmd, "run_verify", lambda opts: made["report"])
        return r

    return use


def test_the_report_is_always_written_and_status_shows_the_last_verify(tmp_path, capsys, canned_run):
    r = canned_run(a_v019_report())
    project = tmp_path / "project"
    project.mkdir()  # -C names an existing project (#41)
    assert main(["-C", str(project), "verify"]) == 1  # unit-tests failed
    out, err = capsys.readouterr()
    path = project / "build" / "verify" / "v0.19-20261126T013000Z.json"
    assert json.loads(path.read_text()) == r.to_dict()
    assert f"report: {path}" in err.splitlines() and f"in the report, {path}" in out
    last = json.loads((project / "build" / "verify" / "last.json").read_text())
    assert last["report"] == str(path) and last["verdict"] == out.splitlines()[0]
    # --report PATH still works; last.json follows it.
    assert main(["-C", str(project), "verify", "--report", str(tmp_path / "mine.json")]) == 1
    assert json.loads((tmp_path / "mine.json").read_text())["commit"] == "abc123"
    assert json.loads((project / "build" / "verify" / "last.json").read_text())["report"] == str(tmp_path / "mine.json")
    capsys.readouterr()
    assert main(["-C", str(project), "status"]) == 0
    err = capsys.readouterr().err
    assert f"last verify: 2026-11-26T01:30:00Z UTC, v0.19 port at abc123; report {tmp_path / 'mine.json'}" in err
    assert "  v0.19 port (CPU proxy, not a GPU result): 2 of 5 stages pass; blocking: unit-tests" in err
    assert main(["-C", str(project), "status", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)["last_verify"]
    assert (data["started"], data["commit"], data["line"], data["failed"]) == (
        "2026-11-26T01:30:00Z",
        "abc123",
        "v0.19",
        ["unit-tests"],
    )
    assert data["verdict"].startswith("v0.19 port (CPU proxy, not a GPU result): 2 of 5 stages pass")
    (tmp_path / "elsewhere").mkdir()
    assert main(["-C", str(tmp_path / "elsewhere"), "status", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["last_verify"] is None


def test_last_json_names_the_report_absolutely_from_a_relative_project(tmp_path, capsys, canned_run, monkeypatch):
    canned_run(a_v019_report())
    monkeypatch.chdir(tmp_path)
    (tmp_path / "project").mkdir()  # -C names an existing project (#41)
    assert main(["-C", "project", "verify", "--report", "r.json"]) == 1
    assert json.loads((tmp_path / "project" / "build" / "verify" / "last.json").read_text())["report"] == str(
        tmp_path / "r.json"
    )


def test_a_report_path_that_cannot_be_written_loses_nothing_else(tmp_path, capsys, canned_run):
    r = a_v019_report()
    r.stages[2] = StageResult("unit-tests", "pass", "40 passed", 1.0)
    canned_run(r)
    (tmp_path / "a-file").write_text("")
    (tmp_path / "project").mkdir()  # -C names an existing project (#41)
    bad = tmp_path / "a-file" / "report.json"  # under a file: the OS says no
    assert (
        main(["-C", str(tmp_path / "project"), "verify", "--report", str(bad), "--junit", str(tmp_path / "j.xml")]) == 1
    )
    out, err = capsys.readouterr()
    assert out.splitlines()[0].startswith(
        "v0.19 port (CPU proxy, not a GPU result): 3 of 5 stages pass"
    )  # the summary printed
    assert [ln for ln in err.splitlines() if "error" in ln] == [
        f"rocmport: error: the report could not be written to {bad}: {tmp_path / 'a-file'} is a file, not a directory"
    ]
    assert ET.parse(tmp_path / "j.xml").getroot().find("testsuite").get("tests") == "5"  # the JUnit written
    assert json.loads((tmp_path / "project" / "build" / "verify" / "last.json").read_text())["report"] is None
    # The JUnit path failing instead: the report and the summary are still there.
    assert (
        main(["-C", str(tmp_path / "project"), "verify", "--report", str(tmp_path / "r.json"), "--junit", str(bad)])
        == 1
    )
    out, err = capsys.readouterr()
    assert json.loads((tmp_path / "r.json").read_text())["line"] == "v0.19" and out.startswith("v0.19 port")
    assert (
        f"rocmport: error: the JUnit XML could not be written to {bad}: {tmp_path / 'a-file'} is a file, not a directory"
        in err.splitlines()
    )
    # All written: exit 0.
    assert main(["-C", str(tmp_path / "project"), "verify", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["verdict"].startswith("v0.19 port")


COALESCED_ALL_GATHER = r"""
import json, sys, threading
from datetime import timedelta
import torch, torch.distributed as dist
if sys.argv[1] == "proxy":
    from rocmport.verify.runtime import proxy_shim
    proxy_shim._coalesced_all_gather_by_dtype()  # what install() installs
store, out = dist.HashStore(), {}


def rank(r, method, n=2):
    # two ranks of one gloo group, each a thread: the ProcessGroup Megatron's _coalescing_manager calls
    prefixed = dist.PrefixStore(method, store)
    pg = dist.ProcessGroup(prefixed, r, n)
    pg._set_default_backend(dist.ProcessGroup.BackendType.GLOO)
    pg._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO,
                         dist.ProcessGroupGloo(prefixed, r, n, timedelta(seconds=30)))
    # a bucket group's buckets, as the distributed optimizer gathers them with --fp8-param-gather: the FP8
    # weights' uint8 bytes and the bf16 parameters, each rank holding its shard in place
    fp8 = torch.zeros(8, dtype=torch.uint8)
    fp8[4 * r : 4 * r + 4] = torch.tensor([0x3C, 0xB4, 0x01, 0x7F], dtype=torch.uint8) + r
    bf16 = torch.zeros(4, dtype=torch.bfloat16)
    bf16[2 * r : 2 * r + 2] = torch.tensor([0.5, -2.0]) * (r + 1)
    opts = dist.distributed_c10d.AllgatherOptions()
    getattr(pg, method)([fp8, bf16], [fp8[4 * r : 4 * r + 4], bf16[2 * r : 2 * r + 2]], opts).wait()
    out[f"{method} {r}"] = [fp8.tolist(), bf16.float().tolist()]


for method in ("allgather_into_tensor_coalesced", "all_gather_single_coalesced"):
    threads = [threading.Thread(target=rank, args=(r, method)) for r in range(2)]
    [t.start() for t in threads]
    [t.join() for t in threads]
if sys.argv[1] == "proxy":
    out["redirects"] = sorted(proxy_shim.REDIRECTS)
print(json.dumps(out))
"""


@pytest.mark.torch
@pytest.mark.parametrize("mode", ["plain", "proxy"])
def test_proxy_gathers_a_coalesced_all_gather_of_mixed_dtypes_in_each_dtype(tmp_path, mode):
    """gloo's coalesced all-gather flattens its inputs into one buffer: a uint8 and a bf16 shard gathered in one
    call come back as each other's bytes. Megatron's distributed optimizer gathers the FP8 weights' uint8 bucket
    and the bf16 one so with --fp8-param-gather (v0.19's FP8 case: NaN at iteration 2, FNUZ's 0x80 among the
    bytes). The proxy gathers each dtype in its own call, as NCCL does."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1]), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", COALESCED_ALL_GATHER, mode], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    want = [[0x3C, 0xB4, 0x01, 0x7F, 0x3D, 0xB5, 0x02, 0x80], [0.5, -2.0, 1.0, -4.0]]
    for method in ("allgather_into_tensor_coalesced", "all_gather_single_coalesced"):
        for r in range(2):
            if mode == "plain":  # gloo's own: the uint8 output holds other bytes than were gathered
                assert got[f"{method} {r}"][0] != want[0], got
            else:
                assert got[f"{method} {r}"] == want, got
    if mode == "proxy":
        assert any(k.startswith("ProcessGroup.") and "mixed dtypes" in k for k in got["redirects"]), got


ISEND_THEN_FREE = r"""
import gc, json, sys, threading, time
from datetime import timedelta
import torch, torch.distributed as dist
if sys.argv[1] == "proxy":
    from rocmport.verify.runtime import proxy_shim
    proxy_shim._p2p_buffers_held_until_released()  # what install() installs
store, out, outputs = dist.HashStore(), {}, []
N = 128 * 2 * 64  # one micro-batch's activations on the proxy (seq 128, micro-batch 2, hidden 64)


def rank(r, n=2):
    pg = dist.ProcessGroup(store, r, n)
    pg._set_default_backend(dist.ProcessGroup.BackendType.GLOO)
    pg._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO,
                         dist.ProcessGroupGloo(store, r, n, timedelta(seconds=30)))
    if r == 0:  # the interleaved schedule's stage: isend its output, free its memory, wait later
        output = torch.full((N,), 1.5)
        outputs.append(output)  # kept for its grad_fn, as the schedule keeps it
        send = pg.send([output], 1, 0)
        output.data = torch.empty((1,))  # schedules.deallocate_output_tensor
        others = [torch.full((N,), -7.0) for _ in range(4)]  # the next allocations
        send.wait()
    else:  # the next stage posts its recv later
        time.sleep(0.5)
        got = torch.zeros(N)
        pg.recv([got], 0, 0).wait()
        out["received 1.5"] = int((got == 1.5).sum())


threads = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
[t.start() for t in threads]
[t.join() for t in threads]
gc.collect()
if sys.argv[1] == "proxy":
    out["redirects"] = sorted(proxy_shim.REDIRECTS)
print(json.dumps(out))
"""


@pytest.mark.torch
@pytest.mark.parametrize("mode", ["plain", "proxy"])
def test_proxy_holds_an_isend_s_memory_until_its_request_is_let_go(mode):
    """Megatron's interleaved schedule (--overlap-p2p-communication) isends a stage's output and frees its
    memory before the send is done (deallocate_output_tensor); on a GPU the caching allocator does not reuse
    the block before NCCL's stream is done with it. gloo sends from the freed memory once the receiver posts
    its recv: the next stage got allocator bookkeeping and other tensors' bytes (every
    gpt3_mcore_te_tp1_pp4_vp1* case: NaN loss at iteration 2). The proxy holds the memory until the
    request is let go."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1]), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", ISEND_THEN_FREE, mode], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    if mode == "plain":  # gloo with the CPU allocator: the receiver gets other bytes than were sent
        assert got["received 1.5"] < 128 * 2 * 64, got
    else:
        assert got["received 1.5"] == 128 * 2 * 64, got
        assert got["redirects"] == [
            "ProcessGroup.send @ <outside megatron> (its tensor's memory freed while in flight: held until the"
            " request was let go)"
        ], got


# What Megatron's EP-overlap schedule does with a MoE node's inputs after its forward (v0.16's
# ScheduleNode._forward with free_input): keep them alive for the node's stream, then free them.
FREE_INPUT_AFTER_FORWARD = """
import torch

def run(stream):
    x = torch.ones(4, requires_grad=True)
    y = (x * 2).detach()
    total = float(y.sum())
    y.record_stream(stream)
    y.untyped_storage().resize_(0)
    return total, y.untyped_storage().nbytes()
"""


@pytest.mark.torch
def test_proxy_lets_a_cpu_tensor_record_the_stream_that_frees_it(tmp_path):
    """`--overlap-moe-expert-parallel-comm`'s schedule nodes free their inputs after the forward with
    `input.record_stream(stream)`, the stream being the proxy's (torch's CPU stream, or _Stream for a
    side stream). torch has no CPU record_stream and cannot parse either stream: v0.16's
    delay-wgrad-compute reach variant failed `RuntimeError: unknown parameter type` there. On the CPU
    nothing runs out of order: the call returns, counted, and the storage is freed as on a GPU."""
    (tmp_path / "node.py").write_text(FREE_INPUT_AFTER_FORWARD)
    code = (
        "import torch\nfrom rocmport.verify.runtime import proxy_shim\n"
        "proxy_shim.install(megatron=False)\nproxy_shim._in_order_streams()\n"
        "from node import run\n"
        "print('ran', run(torch.cuda.current_stream()), run(torch.cuda.Stream()),"
        " sum(n for k, n in proxy_shim.REDIRECTS.items() if k.startswith('Tensor.record_stream on the CPU')))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(Path(__file__).parents[1])])}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert out.stdout.strip().splitlines()[-1:] == ["ran (8.0, 0) (8.0, 0) 2"], out.stderr[-2000:]


COALESCING_WITH_A_DEVICE = (
    r"""
import json, os, sys
import torch, torch.distributed as dist
dist.init_process_group("gloo")
if sys.argv[1] == "proxy":
    from rocmport.verify.runtime import proxy_shim
    proxy_shim._coalesced_all_gather_by_dtype()  # what install() installs
    proxy_shim._coalescing_without_device()
r = dist.get_rank()
data, scales = torch.full((2,), float(r + 1)), torch.full((1,), 10 + r, dtype=torch.uint8)
data_out, scales_out = torch.empty(4), torch.empty(2, dtype=torch.uint8)
try:  # as TE's MXFP8 all-gather: its scales and its data in one coalesced group, the device given
    with torch.distributed._coalescing_manager(group=dist.group.WORLD, device=torch.device("cpu"), async_ops=True) as cm:
        dist.all_gather_into_tensor(scales_out, scales)
        dist.all_gather_into_tensor(data_out, data)
    cm.wait()
    got = [scales_out.tolist(), data_out.tolist()]
except RuntimeError as exc:
    got = str(exc)
if r == 0:
    print(json.dumps({"got": got, "redirects": sorted(getattr(sys.modules.get("rocmport.verify.runtime.proxy_shim"), "REDIRECTS", {}))}))
dist.destroy_process_group()
"""
    + LEAVE_WITHOUT_FINALIZING
)


@pytest.mark.torch
@pytest.mark.parametrize("mode", ["plain", "proxy"])
def test_proxy_runs_a_coalescing_manager_given_a_device_on_gloo(tmp_path, mode):
    """TE's FP8 all-gathers open torch's _coalescing_manager with the device, which gloo refuses
    ('does not implement startCoalescing'); the proxy drops the device and torch issues the same gathers
    through its coalesced fast path."""
    script = tmp_path / "coalesce.py"
    script.write_text(COALESCING_WITH_A_DEVICE)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1]), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", str(script), mode],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    if mode == "plain":
        assert "does not implement startCoalescing" in got["got"], got
    else:
        assert got["got"] == [[10, 11], [1.0, 1.0, 2.0, 2.0]], got
        assert any("_coalescing_manager(device=...)" in k for k in got["redirects"]), got
