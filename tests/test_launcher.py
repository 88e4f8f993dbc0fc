"""verify's launchers: the exact command lines for one node, torchrun's c10d rendezvous across
nodes and Slurm's srun; two torchrun "nodes" rendezvousing for real on this machine; the Slurm
task wrapper deriving torch.distributed's environment from Slurm's."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rocmport.cli import main
from rocmport.errors import BadInput
from rocmport.verify.orchestration.launcher import Launcher, free_port
from rocmport.verify.runtime.slurm_task import first_host, torch_env
from tests.helpers.gloo_ranks import LEAVE_WITHOUT_FINALIZING

PY = sys.executable
WORKER = ["-m", "rocmport.verify.runtime.gpt_worker", "--tp", "2"]


def test_single_node_torchrun():
    assert Launcher().command(4, WORKER, "gpt-training", port=29555) == [
        PY,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node=4",
        "--master_addr=127.0.0.1",
        "--master_port=29555",
        *WORKER,
    ]


def test_multi_node_torchrun_elastic_rendezvous():
    launcher = Launcher(nnodes=2, node_rank=1, rdzv_endpoint="node001:29500")
    assert launcher.command(8, WORKER, "gpt-training") == [
        PY,
        "-m",
        "torch.distributed.run",
        "--nnodes=2",
        "--node_rank=1",
        "--nproc_per_node=4",
        "--rdzv_backend=c10d",
        "--rdzv_endpoint=node001:29500",
        "--rdzv_id=rocmport-verify-gpt-training",
        *WORKER,
    ]
    # One rendezvous per stage; the tp1/pp1 reference (one process) and single-node stages stay here.
    assert "--rdzv_id=rocmport-verify-functional" in launcher.command(8, ["pretrain_gpt.py"], "functional")
    assert launcher.command(1, WORKER, "gpt-reference", port=1234)[3:6] == [
        "--nproc_per_node=1",
        "--master_addr=127.0.0.1",
        "--master_port=1234",
    ]
    assert launcher.command(8, ["-m", "pytest"], "unit-tests", port=1234, single_node=True)[3] == "--nproc_per_node=8"
    assert not launcher.runs_stage(single_node=True) and launcher.runs_stage(single_node=False)
    assert Launcher(nnodes=2, rdzv_endpoint="h:1").runs_stage(single_node=True)


def test_slurm_srun_one_task_per_gpu():
    assert Launcher(kind="slurm", nnodes=2, gpus=True).command(
        16, ["pretrain_gpt.py", "--x"], "functional", port=29400
    ) == [
        "srun",
        "--nodes=2",
        "--ntasks-per-node=8",
        "--ntasks=16",
        "--gpus-per-node=8",
        "--kill-on-bad-exit=1",
        "--export=ALL",
        PY,
        "-m",
        "rocmport.verify.runtime.slurm_task",
        "--master-port=29400",
        "pretrain_gpt.py",
        "--x",
    ]
    # CPU proxy under Slurm asks for no GPUs; a single-node stage takes one node of the allocation.
    cmd = Launcher(kind="slurm", nnodes=2).command(8, ["-m", "pytest"], "unit-tests", port=1, single_node=True)
    assert cmd[:4] == ["srun", "--nodes=1", "--ntasks-per-node=8", "--ntasks=8"] and not any(
        c.startswith("--gpus") for c in cmd
    )


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"nnodes": 2}, "--rdzv-endpoint"),
        ({"nnodes": 2, "rdzv_endpoint": "node001"}, "HOST:PORT"),
        ({"nnodes": 2, "node_rank": 2, "rdzv_endpoint": "h:1"}, "node-rank"),
        ({"kind": "slurm", "node_rank": 1, "nnodes": 2}, "srun starts every node"),
        ({"kind": "mpirun"}, "--launcher"),
    ],
)
def test_bad_launch_settings(kwargs, message):
    with pytest.raises(BadInput, match=message):
        Launcher(**kwargs)


def test_world_must_split_over_nodes():
    with pytest.raises(BadInput, match="does not split over --nnodes 3"):
        Launcher(nnodes=3, rdzv_endpoint="h:1").command(4, WORKER, "gpt-training")


def fixture_tree(root: Path) -> Path:
    """A tree shaped like Megatron-LM's for verify's plan: megatron/core, pretrain_gpt.py, a unit
    test directory and upstream's no-TE tp2/pp2 functional case."""
    (root / "megatron" / "core").mkdir(parents=True)
    (root / "pretrain_gpt.py").write_text("")
    (root / "tests" / "unit_tests" / "models").mkdir(parents=True)
    case = root / "tests" / "functional_tests" / "test_cases" / "gpt" / "gpt3_mcore_tp2_pp2_uninstall_te"
    case.mkdir(parents=True)
    (case / "model_config.yaml").write_text(
        textwrap.dedent("""\
        ENV_VARS:
          CUDA_DEVICE_MAX_CONNECTIONS: 1
        MODEL_ARGS:
          --num-layers: 12
          --hidden-size: 512
          --tensor-model-parallel-size: 2
          --pipeline-model-parallel-size: 2
          --data-path: ${DATA_PATH}/my-gpt3_00_text_document
          --transformer-impl: local
          --fp16: true
        """)
    )
    return root


@pytest.mark.torch
def test_verify_dry_run_renders_every_stage(tmp_path, capsys):
    tree = fixture_tree(tmp_path / "tree")
    rc = main(
        [
            "-C",
            str(tmp_path),
            "verify",
            "--tree",
            str(tree),
            "--dry-run",
            "--json",
            "--nnodes",
            "2",
            "--node-rank",
            "0",
            "--rdzv-endpoint",
            "10.0.0.1:29500",
            "--iters",
            "3",
        ]
    )
    assert rc == 0
    plan = {step["stage"]: step["command"] for step in json.loads(capsys.readouterr().out)}
    assert list(plan) == [
        "imports",
        "gpt-training (reference)",
        "gpt-training (run)",
        "unit-tests",
        "unit-tests (baseline: the files of what the port did not pass, unless cached or none)",
        "functional",
    ]
    assert (
        "--rdzv_endpoint=10.0.0.1:29500" in plan["gpt-training (run)"]
        and "--nproc_per_node=2" in plan["gpt-training (run)"]
    )
    functional = plan["functional"]
    assert functional[functional.index("--rdzv_endpoint=10.0.0.1:29500") + 2] == "pretrain_gpt.py"
    assert (
        "--mock-data" in functional and "--data-path" not in functional and "--fp16" not in functional
    )  # CPU proxy here
    assert functional[functional.index("--train-iters") + 1] == "3"
    assert (
        plan["unit-tests"][3] == "--nproc_per_node=8" and "rocmport.verify.runtime.pytest_plugin" in plan["unit-tests"]
    )


@pytest.mark.torch
def test_bridge_stage_by_default_only_when_the_lock_pins_bridge(tmp_path, capsys):
    """A refresh to a release with no companion Bridge (upstream main) unpins it: the old Bridge tree
    left under build/ is not verified against the new Megatron-LM by default."""
    from rocmport.upstream.lock import Lock, Pin

    fixture_tree(tmp_path / "build" / "megatron-lm")
    (tmp_path / "build" / "megatron-bridge").mkdir()
    pin = Pin(
        "https://github.com/NVIDIA/Megatron-LM.git",
        "git",
        "v0.19",
        "core_v0.19.0",
        "a" * 40,
        "2026-01-01T00:00:00+00:00",
    )

    def stages(pins: dict) -> list[str]:
        Lock(upstreams=pins).save(tmp_path / "upstream.lock")
        assert main(["-C", str(tmp_path), "verify", "--dry-run", "--json", "--no-unit-tests", "--no-functional"]) == 0
        return [step["stage"] for step in json.loads(capsys.readouterr().out)]

    assert stages({"megatron-lm": pin})[-1] != "bridge"
    assert stages({"megatron-lm": pin, "megatron-bridge": pin})[-1] == "bridge"


@pytest.mark.torch
def test_verify_rejects_bad_launch_flags(tmp_path, capsys):
    tree = fixture_tree(tmp_path / "tree")
    assert main(["-C", str(tmp_path), "verify", "--tree", str(tree), "--dry-run", "--nnodes", "2"]) == 2
    assert "--rdzv-endpoint" in capsys.readouterr().err


ALLREDUCE = (
    """\
import os, sys, torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank())])
dist.all_reduce(t)
print(f"RESULT rank={dist.get_rank()} world={dist.get_world_size()} local={os.environ['LOCAL_RANK']} sum={int(t.item())}")
dist.destroy_process_group()
"""
    + LEAVE_WITHOUT_FINALIZING
)


@pytest.mark.torch
@pytest.mark.slow
def test_two_torchrun_nodes_rendezvous_on_this_machine(tmp_path):
    """Both "nodes" run the command their Launcher renders; c10d joins them into one world of 4."""
    (tmp_path / "allreduce.py").write_text(ALLREDUCE)
    endpoint = f"127.0.0.1:{free_port()}"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen(
            Launcher(nnodes=2, node_rank=r, rdzv_endpoint=endpoint, rdzv_id=f"t{tmp_path.name}").command(
                4, ["allreduce.py"], "probe"
            ),
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in (0, 1)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1][-2000:] for o in outs]
    # Anywhere in a line: a launcher may prefix workers' lines ("[rank1]: ...").
    lines = sorted(m.group(0) for o in outs for m in re.finditer(r"RESULT rank=\d+ world=\d+ local=\d+ sum=\d+", o[0]))
    assert [ln.split()[1] for ln in lines] == ["rank=0", "rank=1", "rank=2", "rank=3"], outs
    assert all("world=4" in ln and "sum=6" in ln for ln in lines)
    # Two processes per node, each node's local ranks 0 and 1.
    assert sorted(ln.split()[3] for ln in lines) == ["local=0", "local=0", "local=1", "local=1"]


@pytest.mark.parametrize(
    "nodelist, host",
    [
        ("node[001-004,007]", "node001"),
        ("gpu-a,gpu-b", "gpu-a"),
        ("gpu-[1-2]-ib", "gpu-1-ib"),
        ("single", "single"),
        ("rack[3]", "rack3"),
    ],
)
def test_slurm_first_host(nodelist, host):
    assert first_host(nodelist) == host


def test_slurm_environment_mapping():
    env = torch_env(
        {
            "SLURM_PROCID": "9",
            "SLURM_NTASKS": "16",
            "SLURM_LOCALID": "1",
            "SLURM_NODEID": "1",
            "SLURM_NNODES": "2",
            "SLURM_NTASKS_PER_NODE": "8(x2)",
            "SLURM_JOB_NODELIST": "mi300-[07-08]",
        },
        29400,
    )
    assert env == {
        "RANK": "9",
        "WORLD_SIZE": "16",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "8",
        "GROUP_RANK": "1",
        "MASTER_ADDR": "mi300-07",
        "MASTER_PORT": "29400",
    }


@pytest.mark.torch
def test_slurm_task_runs_target_with_torch_env(tmp_path):
    """One real task, as srun would start it: rank variables from Slurm's, then the script runs."""
    (tmp_path / "allreduce.py").write_text(ALLREDUCE)
    env = {
        **os.environ,
        "SLURM_PROCID": "0",
        "SLURM_NTASKS": "1",
        "SLURM_LOCALID": "0",
        "SLURM_JOB_NODELIST": "127.0.0.1",
        "OMP_NUM_THREADS": "1",
    }
    out = subprocess.run(
        [PY, "-m", "rocmport.verify.runtime.slurm_task", f"--master-port={free_port()}", "allreduce.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "RESULT rank=0 world=1 local=0 sum=0" in out.stdout
    env.pop("SLURM_PROCID")
    bad = subprocess.run(
        [PY, "-m", "rocmport.verify.runtime.slurm_task", "--master-port=1", "allreduce.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode != 0 and "SLURM_PROCID is not set" in bad.stderr
