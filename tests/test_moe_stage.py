"""Stage 2's MoE case with TE (#28): the launches it adds, how its losses are judged, and the proxy
shim's answer to megatron's all-to-all dispatcher (split sizes that stay CPU tensors on the proxy)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rocmport.verify.stages import gpt_training as stages
from rocmport.verify.orchestration.launcher import Launcher
from rocmport.verify.orchestration.te_layer import PYTHON_LAYER, TELayer
from tests.helpers.gloo_ranks import LEAVE_WITHOUT_FINALIZING

TE = TELayer("2.12.0", Path("/te"), PYTHON_LAYER, "a wheel")  # the run's TE choice, typed end to end

REPO = Path(__file__).resolve().parents[1]


def test_the_moe_pair_is_launched_with_te_where_expert_parallel_fits():
    cmds = stages.training_commands(Launcher(), 2, 2, 1, 10, Path("/t"), te=TE)
    assert list(cmds) == ["reference", "run", "moe-reference", "moe-run"]
    run = cmds["moe-run"]
    assert run[run.index("--moe") + 1] == "4" and run[run.index("--ep") + 1] == "2" and "--te" in run
    assert "--ep" not in cmds["moe-reference"]  # the reference holds every expert
    assert list(stages.training_commands(Launcher(), 2, 2, 1, 10, Path("/t"), te=None)) == ["reference", "run"]
    assert stages.moe_applies(1, 1, TE) == "expert parallel 2 needs tp × dp divisible by 2 (tp 1 × dp 1)"
    assert list(stages.training_commands(Launcher(), 1, 2, 1, 10, Path("/t"), te=TE)) == ["reference", "run"]
    # --no-moe: the dense pair alone, and the report says why the MoE case did not run
    assert list(stages.training_commands(Launcher(), 2, 2, 1, 10, Path("/t"), te=TE, moe=False)) == [
        "reference",
        "run",
    ]
    assert stages.moe_applies(2, 1, TE, moe=False) == "--no-moe"


def test_no_moe_reaches_the_launch_plan(tmp_path):
    """`verify --no-moe` is carried from the command line to stage 2's launches (the dry-run plan)."""
    from rocmport.verify.orchestration.contract import VerifyOptions
    from rocmport.verify.stages.gpt_training import STAGE, TrainingOptions

    opts = VerifyOptions(tree=tmp_path, te=TE)
    with_moe = STAGE.launches(opts, STAGE.check({"moe": True}, None), tmp_path)  # type: ignore[arg-type]
    without = STAGE.launches(opts, TrainingOptions(moe=False), tmp_path)
    assert len(with_moe) == 4 and len(without) == 2


def test_moe_losses_first_iteration_tight_then_within_the_routing_bound():
    ref = [4.8687, 4.4866, 4.3872, 4.2191, 4.0764, 3.9408]
    dense_tol = 1e-5 * 4.8687
    moe, problems = stages._moe_check(
        ref, [x + d for x, d in zip(ref, [1e-7, 0, 1e-5, 2e-5, 2e-4, 7e-3])], dense_tol, "gloo"
    )
    assert not problems and moe.first_abs_diff == pytest.approx(1e-7) and moe.max_abs_diff == pytest.approx(7e-3)
    # a misplaced expert shows on the first iteration, before routing could differ
    _, problems = stages._moe_check(ref, [ref[0] + 0.01, *ref[1:]], dense_tol, "gloo")
    assert problems and "MoE first iteration differs from tp1/pp1 by 0.01" in problems[0]
    _, problems = stages._moe_check(ref, [*ref[:-1], ref[-1] + 0.2], dense_tol, "gloo")
    assert problems == ["MoE losses differ from tp1/pp1 by 0.2 > 0.049"]
    _, problems = stages._moe_check(ref, [4.0, 4.1], dense_tol, "gloo")
    assert problems == ["MoE loss did not decrease (4.0000 -> 4.1000)"]


def test_stage_2_reports_the_moe_case_typed_and_its_json_keeps_its_keys(tmp_path, monkeypatch):
    """Stage 2 with TE: the MoE pair's check in the reason and `training.moe` (MoeRun, or MoeNotRun with
    why), whose JSON keeps the keys it had as a dict. The launches are replaced by their records."""
    dense = [4.8, 4.5, 4.3, 4.1]
    moe = [4.9, 4.6, 4.4, 4.2]

    def pair(cmds, key, *args):
        losses = moe if key else dense
        return None, {"losses": losses}, {"losses": losses, "tied_embeddings_equal": True, "redirects": {"x": 1}}

    monkeypatch.setattr(stages, "_pair", pair)
    result, training = stages.stage_training(tmp_path, {}, 2, 1, 1, 4, "gloo", te=TE)
    assert result.status == "pass", result.reason
    assert (
        "; MoE (4 experts, top-2, grouped GEMM through TE's GroupedLinear, ep2): loss 4.9000 -> 4.2000" in result.reason
    )
    assert isinstance(training.moe, stages.MoeRun) and training.moe.redirects == {"x": 1}
    assert training.to_dict()["moe"] == {
        "losses": moe,
        "reference_losses": moe,
        "first_abs_diff": 0.0,
        "max_abs_diff": 0.0,
        "tolerance": pytest.approx(1e-2 * 4.9),
        "first_tolerance": pytest.approx(1e-5 * 4.8),
        "experts": 4,
        "ep": 2,
        "redirects": {"x": 1},
    }
    result, training = stages.stage_training(tmp_path, {}, 2, 1, 1, 4, "gloo", te=TE, moe_case=False)
    assert training.moe == stages.MoeNotRun("--no-moe") and training.to_dict()["moe"] == {"not_run": "--no-moe"}
    assert "; MoE case not run: --no-moe" in result.reason


ALL_TO_ALL = (
    textwrap.dedent("""\
    import os, sys
    import torch
    import torch.distributed as dist
    if sys.argv[1] == "shim":
        from rocmport.verify.runtime import proxy_shim
        proxy_shim.install(megatron=False)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    # megatron's dispatcher: the split sizes are tensors (numpy on a GPU, where they come to the host)
    inp = torch.arange(3, dtype=torch.float32) + 10 * rank
    splits_in = torch.tensor([1, 2]) if rank == 0 else torch.tensor([2, 1])
    splits_out = torch.tensor([1, 2]) if rank == 0 else torch.tensor([2, 1])
    out = torch.empty(int(splits_out.sum()))
    dist.all_to_all_single(out, inp, splits_out, splits_in)
    # a file per rank: two ranks printing to one pipe can interleave ("OUTOUT 1 ...")
    with open(f"out{rank}.txt", "w") as fh:
        fh.write(f"OUT {rank} {out.tolist()}")
    dist.destroy_process_group()
    """)
    + LEAVE_WITHOUT_FINALIZING
)


@pytest.mark.torch
@pytest.mark.parametrize("mode", ["shim", "plain"])
def test_all_to_all_with_tensor_split_sizes_on_the_proxy(tmp_path, mode):
    """On a GPU megatron hands all_to_all_single numpy split sizes; on the proxy they stay CPU tensors,
    which torch refuses: the shim passes them as lists (plain torch shows the refusal it answers)."""
    script = tmp_path / "a2a.py"
    script.write_text(ALL_TO_ALL)
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", str(script), mode],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        cwd=tmp_path,
    )
    if mode == "plain":
        assert proc.returncode != 0 and "all_to_all_single(): incompatible function arguments" in proc.stderr
        return
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [(tmp_path / f"out{rank}.txt").read_text() for rank in (0, 1)]
    assert lines == ["OUT 0 [0.0, 10.0, 11.0]", "OUT 1 [1.0, 2.0, 12.0]"]


def test_a_launch_that_ran_out_of_a_machine_resource_is_retried_once_then_said_to_be_the_machine(tmp_path, monkeypatch):
    """A busy machine: stage 2's run failed with "RuntimeError: Resource temporarily unavailable"
    (no thread could start) and read as the port's failure."""
    monkeypatch.setattr(stages, "EXHAUSTION_RETRY_AFTER", 0.0)
    marker = tmp_path / "first"
    once = [
        sys.executable,
        "-c",
        f"import os, sys\nif not os.path.exists({str(marker)!r}):\n    open({str(marker)!r}, 'w').close()\n"
        "    sys.exit('RuntimeError: Resource temporarily unavailable')\n",
    ]
    assert stages.launch(once, dict(os.environ), tmp_path).returncode == 0 and marker.exists()
    always = [sys.executable, "-c", "import sys; sys.exit('[rank2]: RuntimeError: Resource temporarily unavailable')"]
    proc = stages.launch(always, dict(os.environ), tmp_path)
    assert proc.returncode != 0
    assert stages._failed("tp2/pp2/dp1 run", proc).startswith(
        "tp2/pp2/dp1 run failed twice because this machine ran out of a resource (Resource temporarily unavailable"
    )
    broken = subprocess.run([sys.executable, "-c", "raise ValueError('a bug')"], capture_output=True, text=True)
    assert stages._failed("tp2/pp2/dp1 run", broken) == "tp2/pp2/dp1 run failed: ValueError: a bug"
