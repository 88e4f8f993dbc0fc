"""verify: firewall, environment, bad input, reports, the proxy shim's limits, env and doctor."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from rocmport.cli import main
from rocmport.verify import environment, firewall, hip_sim, report
from rocmport.verify.launcher import free_port
from rocmport.verify.stages import StageResult


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
    for rel, text in {"megatron/__init__.py": "", "megatron/core/__init__.py": "",
                      "megatron/core/tensor_parallel/__init__.py": "", "megatron/core/tensor_parallel/random.py": random_py}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


@pytest.mark.torch
@pytest.mark.parametrize("args, message", [
    (["--tp", "2", "--pp", "2", "--nproc", "6"], "--nproc 6 is not a multiple of tp×pp = 4"),
    (["--tp", "3"], "--tp 3: the verify model has 4 heads"),
    (["--tp", "0", "--dry-run"], "--tp and --pp must be >= 1"),
    (["--pp", "0", "--dry-run", "--nproc", "4"], "--tp and --pp must be >= 1"),
])
def test_bad_parallel_sizes(tmp_path, capsys, args, message):
    tree = minimal_tree(tmp_path / "t")
    assert main(["verify", "--tree", str(tree), *args]) == 2
    assert message in capsys.readouterr().err


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
    rc = main(["verify", "--tree", str(tree), "--json", "--junit", str(tmp_path / "j.xml")])
    data = json.loads(capsys.readouterr().out)
    assert rc == 0, data
    assert data["mode"] == "cpu-proxy" and data["backend"] == "gloo" and data["world_size"] == 4
    imports, training, unit, functional, bridge = data["stages"]
    assert imports["status"] == "pass"
    assert training["status"] == "unsupported-in-proxy"
    assert "megatron.core.tensor_parallel.random._get_cuda_rng_state" in training["reason"]
    # Stages that do not apply to this tree are listed, with the reason, never silently absent.
    assert (unit["status"], unit["reason"]) == ("skipped", "the tree has no tests/unit_tests (a package-index source ships megatron/core only)")
    assert functional["status"] == "skipped" and "no pretrain_gpt.py" in functional["reason"]
    assert bridge["status"] == "skipped" and "--tree given" in bridge["reason"]
    assert data["hip_sim"]["version"] == hip_sim.DEFAULT_VERSION and data["hip_sim"]["arch"] == "gfx942"
    suite = ET.parse(tmp_path / "j.xml").getroot().find("testsuite")
    assert suite.get("tests") == "5" and suite.get("skipped") == "4" and suite.get("failures") == "0"


@pytest.mark.torch
def test_import_failure_names_chain(tmp_path, capsys):
    tree = minimal_tree(tmp_path / "t")
    (tree / "megatron/core/__init__.py").write_text("from megatron.core import inner\n")
    (tree / "megatron/core/inner.py").write_text("import modelopt.torch.opt\n")
    assert main(["verify", "--tree", str(tree), "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    imports, training, *rest = data["stages"]
    assert imports["status"] == "fail" and training["status"] == "skipped" and "stage 1" in training["reason"]
    assert "NVIDIA-only package modelopt" in imports["reason"] and "megatron/core/inner.py:1" in imports["reason"]


def test_launch_env_applied_only_on_rocm():
    from rocmport.launch_env import launch_env

    rocm = environment.Environment("3.11", "2.8", "6.4.1", None, 8, ["AMD Instinct MI300X"] * 8)
    cuda = environment.Environment("3.11", "2.8", None, "12.8", 8, ["H100"] * 8)
    assert environment.launcher_env_for(rocm) == launch_env() and launch_env()["HSA_NO_SCRATCH_RECLAIM"] == "1"
    assert environment.launcher_env_for(cuda) == {}


def test_report_schema_junit_and_plot(tmp_path):
    r = {"mode": "cpu-proxy", "backend": "gloo", "world_size": 4, "tp": 2, "pp": 2, "dp": 1, "tree": "t", "env": {},
         "stages": [StageResult("imports", "pass", "ok", 1.0).to_dict(), StageResult("gpt-training", "fail", "loss did not fall", 2.0).to_dict()],
         "training": {}}
    report.write_json(r, tmp_path / "r.json")
    assert json.loads((tmp_path / "r.json").read_text())["stages"][1]["status"] == "fail"
    suite = ET.fromstring(report.junit_xml(r)).find("testsuite")
    assert suite.get("failures") == "1" and suite.find("testcase[@name='gpt-training']/failure").get("message") == "loss did not fall"
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
    assert d["devices"] == [] and d["hip"] is None and d["problems"] == ["transformer_engine: not installed"]


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
    code = ("import torch\n"
            + ("from rocmport.verify import proxy_shim\nproxy_shim.install()\n" if shim else "")
            + "from megatron.core.distributed.param_and_grad_buffer import start_grad_sync\n"
            "p, q = torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(2))\n"
            "p._cudagraph_wgrad_ready_event = q._cudagraph_wgrad_ready_event = torch.Event('cpu')\n"
            "try:\n    print('waited', start_grad_sync([p, q, torch.nn.Parameter(torch.ones(1))]))\n"
            "except (RuntimeError, AssertionError) as exc:\n    print('no cuda:', type(exc).__name__)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), str(Path(__file__).parents[1])]), "CUDA_VISIBLE_DEVICES": ""}
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    last = out.stdout.strip().splitlines()[-1:]
    # Without the shim: a CPU build of torch asserts it has no CUDA, a CUDA build finds no driver.
    assert last == ["waited 1"] if shim else last in (["no cuda: AssertionError"], ["no cuda: RuntimeError"]), out.stderr[-2000:]


PER_VIEW_GROUPS = """
import json, sys
import torch, torch.distributed as dist
from torch.distributed import distributed_c10d as c10d
if sys.argv[1] == "proxy":
    from rocmport.verify.proxy_shim import _name_groups_by_members
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


def _torchrun_script(tmp_path: Path, script: str, nproc: int, mode: str) -> None:
    """Run `script` as groups.py on `nproc` local ranks (argument: `mode`); each rank writes rankN.json."""
    (tmp_path / "groups.py").write_text(script)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).parents[1])}
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master-port",
                          str(free_port()), "groups.py", mode], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]


NCCL_SUBGROUPS = r"""
import json, sys
import torch, torch.distributed as dist
if sys.argv[1] == "proxy":
    from rocmport.verify import proxy_shim
    proxy_shim._subgroups_on_gloo()  # what install_for_upstream_code installs for the subgroups
dist.init_process_group("gloo")
r = dist.get_rank()
result = {"rank": r}
try:
    # As upstream main's HyperCommGrid(..., backend="nccl") and its tests ask for groups.
    pair = dist.new_group([0, 1], backend="nccl")
    mine, _ = dist.new_subgroups_by_enumeration([[0], [1]], backend="nccl")
    t = torch.tensor([float(r + 1)])
    dist.all_reduce(t, group=pair)
    result.update(sum=t.item(), backends=[dist.get_backend(pair), dist.get_backend(mine)])
except Exception as exc:
    result["error"] = f"{type(exc).__name__}: {exc}"
if sys.argv[1] == "proxy":
    result["redirects"] = sorted(proxy_shim.REDIRECTS)
open(f"rank{r}.json", "w").write(json.dumps(result))
dist.destroy_process_group()
"""


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
