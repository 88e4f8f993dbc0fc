"""Upstream's GPT cases planned for the CPU proxy (rocmport/verify/stages/case_plan.py): every case a plan or
one specific reason; the shrink rule keeps each case's pipeline structure; the ranks follow the case."""

from __future__ import annotations

import os
import subprocess
import tarfile
from pathlib import Path

import pytest
import yaml

from rocmport.verify.stages import case_plan as cp
from rocmport.verify.stages.functional.case_args import build_args

BASE = {
    "--num-layers": 12,
    "--hidden-size": 512,
    "--num-attention-heads": 8,
    "--seq-length": 1024,
    "--max-position-embeddings": 1024,
    "--micro-batch-size": 4,
    "--global-batch-size": 32,
    "--transformer-impl": "transformer_engine",
    "--tensor-model-parallel-size": 2,
    "--pipeline-model-parallel-size": 2,
}


def case(**extra) -> dict:
    args = {**BASE, **{k: v for k, v in extra.items() if k.startswith("--")}}
    out = {"MODEL_ARGS": {k: v for k, v in args.items() if v is not None}, "TEST_TYPE": "regular"}
    out.update({k: v for k, v in extra.items() if not k.startswith("--")})
    return out


def runnable(config: dict, name: str = "c") -> cp.CasePlan:
    p = cp.plan_case(name, config)
    assert isinstance(p, cp.CasePlan), p
    return p


def stages_of(p: cp.CasePlan) -> list[int]:
    """Layers per pipeline stage (the embedding and loss counted where the case accounts for them)
    as megatron would split the planned arguments."""
    a, pp = {**p.case_args, **p.args}, p.layout.pp
    extra = sum(bool(a.get(f"--account-for-{x}-in-pipeline-split")) for x in ("embedding", "loss"))
    layers = a["--num-layers"] + extra
    first = a.get("--decoder-first-pipeline-num-layers")
    last = a.get("--decoder-last-pipeline-num-layers")
    if not (first or last):
        assert layers % (pp * p.layout.vp) == 0, (layers, pp, p.layout.vp)
        return [layers // pp] * pp
    middle = pp - (1 if first else 0) - (1 if last else 0)
    rest = layers - (first or 0) - (last or 0)
    assert middle == 0 or rest % middle == 0
    per = rest // middle if middle else 0
    return ([first] if first else []) + [per] * middle + ([last] if last else [])


def test_the_default_case_keeps_todays_proxy_size():
    p = runnable(case())
    assert p.layout == cp.Layout(tp=2, pp=2, dp=1)
    assert p.layout.world == 4
    assert p.args["--num-layers"] == 4 and p.args["--hidden-size"] == 64
    assert p.args["--global-batch-size"] == 8  # micro 2 × dp 1 × 4 micro-batches, as the stage had it


def test_uneven_first_and_last_stages_keep_a_layer_for_every_middle_stage():
    # The proxy's old fixed 4 layers left the two middle stages of pp4 with none ("0 middle layers
    # remaining but 2 middle PP stages available"): the plan keeps the case's structure instead.
    p = runnable(
        case(
            **{
                "--tensor-model-parallel-size": 1,
                "--pipeline-model-parallel-size": 4,
                "--decoder-first-pipeline-num-layers": 2,
                "--decoder-last-pipeline-num-layers": 2,
            }
        )
    )
    per_stage = stages_of(p)
    assert len(per_stage) == 4 and min(per_stage) >= 1, per_stage
    assert per_stage == [1, 2, 2, 1]  # 2:4:4:2 at its smallest scale
    assert p.layout.world == 4


def test_virtual_pipeline_keeps_its_chunks_per_stage():
    p = runnable(
        case(
            **{
                "--tensor-model-parallel-size": 1,
                "--pipeline-model-parallel-size": 4,
                "--num-layers-per-virtual-pipeline-stage": 1,
            }
        )
    )
    assert p.layout.vp == 3  # 12 layers / (4 stages × 1 layer per chunk)
    assert p.args["--num-layers"] == 12 and p.args["--num-layers-per-virtual-pipeline-stage"] == 1
    # The interleaved schedule gets 2 × pp micro-batches, every chunk has work.
    assert p.args["--global-batch-size"] // p.args["--micro-batch-size"] == 8
    assert "virtual-pipeline" in p.features


def test_micro_batches_per_step_fit_the_cases_virtual_pipeline_groups():
    """gpt3_mcore_te_tp1_pp4_vp1_tunable_overlap groups 5 micro-batches per virtual stage (40 / 4 = 10
    per step upstream); megatron refuses a step whose remainder M mod N is neither 0 nor at least pp, so
    the proxy's 8 micro-batches (8 mod 5 = 3 < 4) stopped the case before iteration 1, on both trees."""
    p = runnable(
        case(
            **{
                "--tensor-model-parallel-size": 1,
                "--pipeline-model-parallel-size": 4,
                "--num-layers-per-virtual-pipeline-stage": 1,
                "--microbatch-group-size-per-virtual-pipeline-stage": 5,
            }
        )
    )
    m = p.args["--global-batch-size"] // p.args["--micro-batch-size"]
    assert m >= 8 and (m % 5 == 0 or m % 5 >= 4), m
    assert m == 9  # the fewest that fit: 9 mod 5 = 4, a remainder of at least pp
    assert any("--microbatch-group-size-per-virtual-pipeline-stage 5" in n for n in p.notes), p.notes


def test_the_distributed_optimizer_gets_two_data_parallel_ranks_to_shard_over():
    p = runnable(case(**{"--use-distributed-optimizer": True, "--overlap-param-gather": True}))
    assert p.layout.dp == 2 and p.layout.world == 8
    assert {"distributed-optimizer", "overlap-param-gather"} <= set(p.features)
    assert any("shards" in n for n in p.notes)


def test_a_layout_over_the_proxys_ranks_drops_the_extra_data_parallel_rank_first():
    p = runnable(
        case(
            **{
                "--tensor-model-parallel-size": 4,
                "--pipeline-model-parallel-size": 2,
                "--use-distributed-optimizer": True,
            }
        )
    )
    assert p.layout.dp == 1 and p.layout.world == 8
    assert any("dp2 would need 16 ranks" in n for n in p.notes), p.notes


def test_a_layout_that_needs_more_than_eight_ranks_is_unsupported_naming_them():
    p = cp.plan_case("c", case(**{"--tensor-model-parallel-size": 4, "--pipeline-model-parallel-size": 4}))
    assert isinstance(p, cp.Unsupported) and p.kind == "not-on-proxy"
    assert "needs 16 ranks" in p.reason and "at most 8" in p.reason


def test_expert_parallelism_raises_data_parallel_to_what_the_expert_groups_need():
    p = runnable(
        case(
            **{
                "--tensor-model-parallel-size": 1,
                "--pipeline-model-parallel-size": 1,
                "--num-experts": 8,
                "--expert-model-parallel-size": 4,
                "--expert-tensor-parallel-size": 1,
            }
        )
    )
    assert p.layout.ep == 4 and p.layout.dp == 4 and p.layout.world == 4
    assert "expert-parallel" in p.features and "moe" in p.features


def test_expert_tensor_parallel_is_ignored_where_the_case_has_no_experts():
    p = runnable(case())
    assert p.layout.etp == 1 and "expert-tensor-parallel" not in p.features


@pytest.mark.parametrize(
    "extra, kind, words",
    [
        ({"--attention-backend": "flash", "--context-parallel-size": 2}, "gpu-only", "flash-attn"),
        ({"--attention-backend": "fused"}, "gpu-only", "cuDNN"),
        ({"--fp8-format": "hybrid"}, "not-on-proxy", "needs --te"),
        ({"--experimental-attention-variant": "gated_delta_net"}, "not-on-proxy", "flash-linear-attention"),
        ({"--export-kd-teacher-load": "/x"}, "needs-nvidia-only", "nvidia-modelopt"),
        ({"--defer-embedding-wgrad-compute": True}, "gpu-only", "fused_weight_gradient_mlp_cuda"),
        ({"TEST_TYPE": "frozen-start"}, "not-on-proxy", "stored checkpoint"),
        ({"TEST_TYPE": "checkpoint-consistency"}, "not-on-proxy", "stored checkpoint"),
        ({"MODE": "inference"}, "not-training", "MODE inference"),
    ],
)
def test_each_unsupported_case_names_what_the_proxy_lacks(extra, kind, words):
    p = cp.plan_case("c", case(**extra))
    assert isinstance(p, cp.Unsupported), p
    assert p.kind == kind and words in p.reason, p


def test_tp_comm_overlap_is_dropped_with_its_options_and_the_plan_says_why(tmp_path):
    """--tp-comm-overlap (TE's userbuffers, CUDA IPC) is a GPU-only schedule of the same math: the case runs
    without it and its --tp-comm-* options, on every line alike, and its plan says so."""
    from rocmport.verify.stages.functional.case_args import build_args

    config = case(
        **{
            "--sequence-parallel": True,
            "--tp-comm-overlap": True,
            "--tp-comm-overlap-cfg": "tests/functional_tests/test_cases/gpt/c/tp_comm_overlap_cfg.yaml",
        }
    )
    p = runnable(config)
    assert p.layout.tp == 2 and p.layout.sequence_parallel  # the rest of the case as it was
    assert p.dropped == (("--tp-comm-overlap --tp-comm-overlap-cfg", cp.PROXY_DROPPED[0][2]),)
    assert "userbuffers" in p.dropped[0][1] and "not the arithmetic" in p.dropped[0][1]
    assert any(n.startswith("--tp-comm-overlap --tp-comm-overlap-cfg dropped: TE's userbuffers") for n in p.notes)
    argv = build_args(config, iters=4, proxy=True, data_path=None, work=tmp_path, plan=p)
    assert not [a for a in argv if a.startswith("--tp-comm")] and "--sequence-parallel" in argv
    # a case without it: nothing dropped, nothing said
    assert runnable(case()).dropped == ()
    # what only the option reaches stays a GPU-only feature for reach, quoting the case
    d = tmp_path / cp.CASES / "overlap"
    d.mkdir(parents=True)
    (d / "model_config.yaml").write_text(yaml.safe_dump(config))
    assert cp.gpu_only_reasons(tmp_path)["--tp-comm-overlap"].endswith("(e.g. case overlap)")


def test_fp8_weights_keep_the_cases_bf16_for_their_master_weights_and_the_plan_says_why(tmp_path):
    """--fp8-param-gather (FP8 weights, the optimizer's fp32 master weights cast into them) needs the master weights
    Megatron makes only for half-precision parameters: such a case keeps its --bf16 on the proxy, declared; any other
    case trains in fp32 as before."""
    from rocmport.verify.stages.functional.case_args import build_args

    native = case(
        **{
            "--bf16": True,
            "--fp8-format": "hybrid",
            "--fp8-recipe": "tensorwise",
            "--fp8-param-gather": True,
            "--use-distributed-optimizer": True,
        }
    )
    p = cp.plan_case("c", native, te=GFX942)
    assert isinstance(p, cp.CasePlan) and p.fp8 is not None and p.fp8.recipe == "tensorwise"
    assert p.kept == (("--bf16", cp.PROXY_KEEPS_PRECISION[0][1]),)
    assert "master weights" in p.kept[0][1] and "FusedAdam without master_weights" in p.kept[0][1]
    assert any(n.startswith("--bf16 kept: --fp8-param-gather keeps the weights in FP8") for n in p.notes)
    assert not any("--bf16 → fp32" in n for n in p.notes)
    argv = build_args(native, iters=4, proxy=True, data_path=None, work=tmp_path, plan=p)
    assert "--bf16" in argv and "--fp8-param-gather" in argv
    # without a plan (build_args sizes the case itself) the same rule
    assert "--bf16" in build_args(native, iters=4, proxy=True, data_path=None, work=tmp_path)
    # an FP8 case without FP8 weights, and a bf16 case without FP8: fp32 on the proxy, as before
    for other in (
        case(**{"--bf16": True, "--fp8-format": "hybrid"}),
        case(**{"--bf16": True}),
    ):
        q = cp.plan_case("c", other, te=GFX942)
        assert isinstance(q, cp.CasePlan) and q.kept == ()
        assert any(n.startswith("--bf16 → fp32") for n in q.notes)
        assert "--bf16" not in build_args(other, iters=4, proxy=True, data_path=None, work=tmp_path, plan=q)
    # fp16 the same way; a case without half precision has nothing to keep
    fp16 = case(
        **{"--fp16": True, "--fp8-format": "e4m3", "--fp8-param-gather": True, "--use-distributed-optimizer": True}
    )
    assert [k for k, _ in cp.plan_case("c", fp16, te=GFX942).kept] == ["--fp16"]
    no_half = case(**{"--fp8-format": "e4m3", "--fp8-param-gather": True, "--use-distributed-optimizer": True})
    assert cp.plan_case("c", no_half, te=GFX942).kept == ()


def test_distributed_optimizer_cases_keep_their_half_precision_and_the_plan_says_why(tmp_path):
    """The distributed optimizer's fp32 path (views of the model's own parameters, no fp32 main copies) is another
    path than a bf16 case tests, and it cannot resume from a dp-reshardable checkpoint on any device (measured on
    both trees of v0.16): such a case keeps its --bf16 or --fp16, declared; without the distributed optimizer, fp32."""
    from rocmport.verify.stages.functional.case_args import build_args

    why = dict(cp.PROXY_KEEPS_PRECISION)["--use-distributed-optimizer"]
    for half in ("--bf16", "--fp16"):
        dist = case(**{half: True, "--use-distributed-optimizer": True, "--overlap-param-gather": True})
        p = cp.plan_case("c", dist)
        assert isinstance(p, cp.CasePlan) and p.kept == ((half, why),)
        assert "a view of a leaf Variable that requires grad" in why and "float16 branch" in why
        assert any(n.startswith(f"{half} kept: the distributed optimizer keeps fp32 main copies") for n in p.notes)
        assert half in build_args(dist, iters=4, proxy=True, data_path=None, work=tmp_path, plan=p)
    plain = case(**{"--bf16": True, "--overlap-grad-reduce": True})
    q = cp.plan_case("c", plain)
    assert isinstance(q, cp.CasePlan) and q.kept == ()
    assert "--bf16" not in build_args(plain, iters=4, proxy=True, data_path=None, work=tmp_path, plan=q)
    # a distributed-optimizer case without half precision has nothing to keep
    assert cp.plan_case("c", case(**{"--use-distributed-optimizer": True})).kept == ()


def test_an_fp16_case_kept_in_fp16_starts_its_loss_scale_where_every_proxy_iteration_steps(tmp_path):
    """fp16's dynamic loss scale starts at 2^32 and skips iterations while it falls (upstream's H100 run skips 17):
    the proxy's 10 iterations logged no loss, and its checkpoint at 5 came before the optimizer's first step
    (gpt3_mcore_tp1_pp1_resume_torch_dist_dist_optimizer_overlap_grad_reduce_param_gather: KeyError 'exp_avg' in
    upstream's get_parameter_state_dp_zero). A case the proxy keeps in fp16 starts at 2^12, declared; bf16, fp32 and a case's own scale not."""
    from rocmport.verify.stages.functional.case_args import build_args

    fp16 = case(**{"--fp16": True, "--use-distributed-optimizer": True, "--dist-ckpt-optim-fully-reshardable": True})
    p = runnable(fp16)
    assert p.args["--initial-loss-scale"] == 4096
    assert [o for o, _ in p.set_args] == ["--initial-loss-scale 4096"] and "KeyError 'exp_avg'" in p.set_args[0][1]
    built = build_args(fp16, iters=10, proxy=True, data_path=None, work=tmp_path, plan=p)
    assert built[built.index("--initial-loss-scale") + 1] == "4096" and "--fp16" in built
    assert any(n.startswith("--initial-loss-scale 4096: fp16's dynamic loss scale") for n in p.notes)
    for other in (
        case(**{"--bf16": True, "--use-distributed-optimizer": True}),  # bf16 has no loss scale
        case(**{"--fp16": True}),  # trains in fp32 on the proxy
        case(**{"--fp16": True, "--use-distributed-optimizer": True, "--loss-scale": 1024}),  # its own, static
        case(**{"--fp16": True, "--use-distributed-optimizer": True, "--initial-loss-scale": 65536}),
    ):
        q = runnable(other)
        assert q.set_args == () and "--initial-loss-scale" not in q.args, other
    own_config = case(**{"--fp16": True, "--use-distributed-optimizer": True, "--initial-loss-scale": 65536})
    built = build_args(own_config, iters=10, proxy=True, data_path=None, work=tmp_path, plan=runnable(own_config))
    assert built[built.index("--initial-loss-scale") + 1] == "65536"


# upstream v0.16.1's gpt3_weekly_dgx_h100_mcore_tp2_pp2_fp8_tp_pp ENV_VARS (abridged): from before --attention-backend
STALE_ENV = {"CUDA_DEVICE_MAX_CONNECTIONS": 1, "NVTE_FUSED_ATTN": 0}


@pytest.mark.parametrize(
    "env, backend, unset",
    [
        (STALE_ENV, None, ["NVTE_FUSED_ATTN"]),  # auto expects 1: upstream asserts
        ({"NVTE_FLASH_ATTN": 0, "NVTE_FUSED_ATTN": 0}, None, ["NVTE_FLASH_ATTN", "NVTE_FUSED_ATTN"]),
        (STALE_ENV, "unfused", []),  # unfused expects NVTE_FUSED_ATTN 0: nothing to unset
        ({"NVTE_FUSED_ATTN": 1}, None, []),  # what auto expects
        ({"NVTE_UNFUSED_ATTN": 0}, None, []),  # the proxy's only attention: not unset, the run meets the assertion
        ({"NVTE_FUSED_ATTN": 1}, "unfused", []),  # asks for a GPU kernel: not unset either
    ],
)
def test_the_cuda_path_unsets_a_stale_attention_variable_upstreams_check_refuses(env, backend, unset):
    config = case(ENV_VARS=env, **({"--attention-backend": backend} if backend else {}))
    cuda = runnable_on(config, cuda=True)
    assert [v for v, _ in cuda.env_unset] == unset
    for var, why in cuda.env_unset:
        assert why.startswith(f"{var}=0 (the case's ENV_VARS) unset on the CUDA path: upstream's ")
        assert "_set_attention_backend asserts" in why and f"--attention-backend {backend or 'auto'}" in why
        assert why in cuda.notes
    # on HIP the port's attention-backend-env takes the case's variables: they stay
    assert runnable_on(config, cuda=False).env_unset == ()


@pytest.mark.parametrize("flag", ["--use-megatron-fsdp", "--use-torch-fsdp2", "--use-custom-fsdp"])
def test_an_fsdp_case_runs_without_the_launch_profiles_cuda_device_max_connections(flag):
    """verify's launch profile (`rocmport env`: AMD's launcher default) sets CUDA_DEVICE_MAX_CONNECTIONS=1
    for every run; upstream's validate_args asserts it is not 1 under FSDP, and upstream's CI launch gives
    such a case none (the port's launch-env leaves it unset too): the plan unsets it, on every path."""
    for cuda in (False, True):
        p = runnable_on(case(**{flag: True}), cuda=cuda)
        assert [v for v, _ in p.launch_env_unset] == ["CUDA_DEVICE_MAX_CONNECTIONS"]
        why = p.launch_env_unset[0][1]
        assert why.startswith(f"{flag}: upstream's validate_args asserts CUDA_DEVICE_MAX_CONNECTIONS is not 1")
        assert "'FSDP always requires CUDA_DEVICE_MAX_CONNECTIONS value large than one'" in why
        assert "verify's launch profile" in why and why in p.notes
    # the case's own value is the case's: it stays (v0.16's gpt3_mcore_te_tp2_pp1_fsdp2_resume_torch_dist sets 8)
    assert runnable_on(case(**{flag: True}, ENV_VARS={"CUDA_DEVICE_MAX_CONNECTIONS": 8}), False).launch_env_unset == ()
    assert runnable_on(case(), False).launch_env_unset == ()  # no FSDP: tp > 1 needs the 1


def runnable_on(config: dict, cuda: bool) -> cp.CasePlan:
    p = cp.plan_case("c", config, cuda=cuda)
    assert isinstance(p, cp.CasePlan), p
    return p


def test_unfused_attention_and_context_parallel_alone_are_planned():
    p = runnable(case(**{"--attention-backend": "unfused"}))
    assert p.layout.world == 4


def test_a_repeated_flag_takes_its_last_value_as_upstreams_runner_does(tmp_path):
    d = tmp_path / cp.CASES / "dup"
    d.mkdir(parents=True)
    text = yaml.safe_dump(case()).replace(
        "MODEL_ARGS:\n", "MODEL_ARGS:\n  --pipeline-model-parallel-size: 4\n", 1
    )  # first 4, then the mapping's own 2: the last one wins
    (d / "model_config.yaml").write_text(text)
    plans = cp.plan_tree(tmp_path)
    assert isinstance(plans["dup"], cp.CasePlan) and plans["dup"].layout.pp == 2


def test_a_case_file_that_is_not_yaml_is_planned_as_unsupported_naming_the_file(tmp_path):
    d = tmp_path / cp.CASES / "broken"
    d.mkdir(parents=True)
    (d / "model_config.yaml").write_text("MODEL_ARGS: [unclosed\n")
    plans = cp.plan_tree(tmp_path)
    assert isinstance(plans["broken"], cp.Unsupported)
    assert "broken/model_config.yaml" in plans["broken"].reason


def test_a_case_seeded_by_its_repeat_gets_the_first_repeat_as_upstreams_launcher_gives_it(tmp_path):
    """run_ci_test.sh exports REPEAT=1..N_REPEAT and _run_training.sh envsubsts the YAML with it
    (gpt3_mcore_reruns_resume_check_grads: --seed ${REPEAT}); verify runs the first repeat."""
    config = case(**{"--seed": "${REPEAT}", "--tensorboard-dir": "$TENSORBOARD_PATH/tb"})
    p = runnable(config)
    args = build_args(config, iters=4, proxy=True, data_path=None, work=tmp_path, plan=p)
    pairs = dict(zip(args, args[1:]))
    assert pairs["--seed"] == "1" and pairs["--tensorboard-dir"] == f"{tmp_path / 'tensorboard'}/tb"
    assert not [a for a in args if "$" in a]


@pytest.mark.parametrize("value", ["${WANDB_SAVE_PATH}", "$DATA_BLEND", "x/${N_REPEAT}/y"])
def test_a_variable_verify_has_no_value_for_is_unsupported_naming_the_flag_and_the_variable(value):
    p = cp.plan_case("c", case(**{"--wandb-save-dir": value}))
    assert isinstance(p, cp.Unsupported) and p.kind == "not-on-proxy", p
    var = value.split("$")[1].strip("{}").split("}")[0]
    assert p.reason.startswith(f"--wandb-save-dir {value}: ${var} is set by upstream CI's launcher"), p.reason


# --- every line's own cases (the mirror) --------------------------------------------------------

MIRROR = os.environ.get("ROCMPORT_TEST_MLM_MIRROR")
LINES = ["core_v0.15.3", "core_v0.16.1", "core_v0.17.1", "core_v0.18.2", "core_v0.19.0", "main"]


def cases_at(ref: str, tree: Path) -> None:
    """The mirror's GPT functional cases at ``ref``, extracted under ``tree``."""
    archive = tree.parent / "cases.tar"
    with archive.open("wb") as out:
        subprocess.run(["git", f"--git-dir={MIRROR}", "archive", ref, str(cp.CASES)], stdout=out, check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(tree, filter="data")


@pytest.mark.mirror
@pytest.mark.skipif(not MIRROR, reason="set ROCMPORT_TEST_MLM_MIRROR to a Megatron-LM mirror")
@pytest.mark.parametrize("ref", LINES)
def test_every_case_of_every_line_is_a_plan_or_a_specific_reason(ref, tmp_path):
    cases_at(ref, tmp_path / "tree")
    plans = cp.plan_tree(tmp_path / "tree")
    assert len(plans) > 100, len(plans)
    summary = cp.PlanSummary.of(plans)
    for name, p in plans.items():
        if isinstance(p, cp.Unsupported):
            assert "not valid YAML" not in p.reason and "does not parse" not in p.reason, (name, p.reason)
            continue
        assert p.layout.world <= cp.MAX_RANKS, (name, p.layout)
        assert min(stages_of(p)) >= 1, (name, p.args)
        assert p.args["--hidden-size"] == 64
        # every CI variable resolved, as upstream's launcher resolves it (no `${REPEAT}` left for argparse)
        config = cp.load_config(tmp_path / "tree", name)
        args = build_args(config, iters=4, proxy=True, data_path=None, work=tmp_path / "work", plan=p)
        assert not [a for a in args if "$" in a], (name, [a for a in args if "$" in a])
    # Most of upstream's GPT training cases run on the proxy; the rest each have their reason.
    training = len(plans) - len(summary.unsupported.get("not-training", []))
    assert len(summary.runnable) >= 0.6 * training, (len(summary.runnable), training)


# --- FP8 cases: per TE flavour and simulated GPU ---------------------------------------------------

GFX942 = cp.ProxyTE("rocm", "fnuz", "gfx942")
GFX950 = cp.ProxyTE("rocm", "ocp", "gfx950")
CUDA_CONTROL = cp.ProxyTE("nvidia", "ocp", None)
FP8_RECIPES = {  # each recipe as upstream's FP8 cases spell it (the delayed ones name no recipe)
    "delayed": {"--fp8-format": "hybrid", "--fp8-amax-history-len": 1024, "--fp8-amax-compute-algo": "max"},
    "tensorwise": {"--fp8-format": "hybrid", "--fp8-recipe": "tensorwise", "--fp8-param-gather": True},
    "mxfp8": {"--fp8-format": "hybrid", "--fp8-recipe": "mxfp8"},
    "blockwise": {"--fp8-format": "e4m3", "--fp8-recipe": "blockwise"},
}
# (recipe, TE) -> runs in this encoding on this device | refused with this text | unsupported with these words
EXPECTED_FP8 = [
    ("delayed", GFX942, ("runs", "fnuz", "gfx942")),
    ("tensorwise", GFX942, ("runs", "fnuz", "gfx942")),
    ("mxfp8", GFX942, ("refused", "--fp8-recipe mxfp8: gfx942 cannot run")),
    ("blockwise", GFX942, ("refused", "--fp8-recipe blockwise: gfx942 cannot run")),
    ("delayed", GFX950, ("runs", "ocp", "gfx950")),
    ("tensorwise", GFX950, ("runs", "ocp", "gfx950")),
    ("mxfp8", GFX950, ("runs", "ocp", "gfx950")),
    ("blockwise", GFX950, ("refused", "--fp8-recipe blockwise: gfx950 cannot run")),
    ("delayed", CUDA_CONTROL, ("runs", "ocp", "sm_90")),
    ("tensorwise", CUDA_CONTROL, ("runs", "ocp", "sm_90")),
    ("mxfp8", CUDA_CONTROL, ("unsupported", "Blackwell")),
    ("blockwise", CUDA_CONTROL, ("unsupported", "no CPU kernel")),
    ("delayed", cp.ProxyTE("rocm", "ocp", "gfx90a"), ("refused", "--fp8-recipe delayed: gfx90a cannot run")),
    (
        "mxfp8",
        cp.ProxyTE("nvidia", "ocp", "gfx950"),
        ("refused", "--fp8-recipe mxfp8: the installed Transformer Engine cannot run it on gfx950"),
    ),
]


@pytest.mark.parametrize("recipe, te, expected", EXPECTED_FP8, ids=lambda v: getattr(v, "arch", None) or str(v)[:12])
def test_an_fp8_case_is_planned_by_its_recipe_the_te_flavour_and_the_simulated_gpu(recipe, te, expected):
    p = cp.plan_case("c", case(**FP8_RECIPES[recipe]), te=te)
    if expected[0] == "unsupported":
        assert isinstance(p, cp.Unsupported) and p.kind == "not-on-proxy" and expected[1] in p.reason, p
        assert f"--fp8-recipe {recipe}" in p.reason
        return
    assert isinstance(p, cp.CasePlan) and p.fp8 is not None, p
    assert (p.fp8.format, p.fp8.recipe) == (FP8_RECIPES[recipe]["--fp8-format"], recipe)
    assert "fp8" in p.features
    if expected[0] == "refused":  # the port's argument validation must refuse it: nothing trains, nothing resumes
        assert p.fp8.refusal == expected[1] and not p.resume, p.fp8
        return
    assert p.fp8.refusal is None and (p.fp8.encoding, p.fp8.device) == expected[1:] and p.resume
    # the CUDA control's ranks see an H100 (NVIDIA's TE runs FP8 from compute capability 8.9); nothing else is added
    assert dict(p.fp8.env) == ({"ROCMPORT_CUDA_SIM_ARCH": "sm_90"} if te.arch is None else {})
    assert ("NVTE_ROCM_ENABLE_MXFP8=1" in " ".join(p.notes)) == (recipe == "mxfp8")


@pytest.mark.parametrize("recipe", list(FP8_RECIPES))
def test_without_te_an_fp8_case_says_it_needs_te(recipe):
    p = cp.plan_case("c", case(**FP8_RECIPES[recipe]))
    assert isinstance(p, cp.Unsupported) and p.kind == "not-on-proxy", p
    assert p.reason.startswith(f"--fp8-format {FP8_RECIPES[recipe]['--fp8-format']} --fp8-recipe {recipe}: ")
    assert "TE's FP8 path" in p.reason and "needs --te" in p.reason


def test_a_recipe_without_a_format_trains_without_fp8_as_megatron_does():
    p = runnable(case(**{"--fp8-recipe": "mxfp8"}))
    assert p.fp8 is None and "fp8" not in p.features


def test_context_parallel_with_te_s_attention_is_not_on_the_proxy():
    # upstream's only MXFP8 case is tp4×cp2: TE's unfused attention, the proxy's, refuses cp > 1
    mx = case(**FP8_RECIPES["mxfp8"], **{"--tensor-model-parallel-size": 4, "--pipeline-model-parallel-size": 1})
    mx["MODEL_ARGS"]["--context-parallel-size"] = 2
    p = cp.plan_case("c", mx, te=GFX950)
    assert isinstance(p, cp.Unsupported) and "context parallelism (cp2) with TE's attention" in p.reason, p
    local = dict(mx, MODEL_ARGS={**mx["MODEL_ARGS"], "--fp8-format": None, "--transformer-impl": "local"})
    assert isinstance(cp.plan_case("c", local, te=GFX950), cp.CasePlan)  # not TE's attention: not this reason
    # on gfx942 the port refuses MXFP8 in argument validation, before any attention: planned as that refusal
    refused = cp.plan_case("c", mx, te=GFX942)
    assert isinstance(refused, cp.CasePlan) and refused.fp8.refusal == "--fp8-recipe mxfp8: gfx942 cannot run"


@pytest.mark.torch
def test_the_plans_fp8_table_and_refusal_are_the_ports_own(monkeypatch):
    """The recipes the plan expects each AMD GPU to run are the port's fp8-arch-check table, and the
    text it expects a refusal to hold is in the port's own message (found as refusal_in finds it)."""
    from types import SimpleNamespace

    from rocmport.codemods.runtime import fp8_arch_check

    assert cp.ROCM_FP8_RECIPES == fp8_arch_check.FP8_RECIPES_BY_ARCH
    monkeypatch.setattr(fp8_arch_check, "is_hip", lambda: True)
    monkeypatch.setattr(fp8_arch_check, "_te_fp8_answer", lambda recipe: None)
    for recipe, te, expected in EXPECTED_FP8:
        if expected[0] != "refused" or te.flavour != "rocm":
            continue
        monkeypatch.setattr(fp8_arch_check, "device_arch", lambda arch=te.arch: arch)
        fp8 = cp.plan_case("c", case(**FP8_RECIPES[recipe]), te=te).fp8
        with pytest.raises(ValueError) as refused:
            fp8_arch_check.check_fp8_for_arch(SimpleNamespace(fp8=fp8.format, fp8_recipe=recipe), environ={})
        message = str(refused.value)
        assert cp.refusal_in(fp8, f"[rank0]: ValueError: {message}\n") == message, (message, fp8.refusal)
        # a traceback's source line holding the text is not the refusal
        assert cp.refusal_in(fp8, f'[rank0]:     raise ValueError(f"{fp8.refusal}")\n') is None


# upstream v0.16.1's FP8 GPT cases, as the proxy plans them with the rocm flavour on a simulated gfx942
V016_FP8_ON_GFX942 = {
    "gpt3_weekly_dgx_h100_mcore_tp1_pp1_fp8_no_model_parallel": "runs",
    "gpt3_weekly_dgx_h100_mcore_nondet_tp1_pp1_fp8_no_model_parallel": "runs",
    "gpt3_weekly_dgx_h100_mcore_tp1_pp2_fp8_pp": "runs",
    "gpt3_weekly_dgx_h100_mcore_tp2_pp2_fp8_tp_pp": "runs",
    "gpt3_weekly_dgx_h100_mcore_tp2_pp2_fp8_tp_pp_sp": "runs",
    "gpt3_weekly_dgx_h100_mcore_tp2_pp2_native_fp8_tp_pp_sp": "runs",
    "gpt3_weekly_dgx_h100_mcore_tp4_pp2_fp8_tp_pp": "runs",
    "gpt3_weekly_dgx_h100_mcore_tp4_cp2_current_scaling_native_fp8_tp_fsdp": "runs",
    "gpt3_weekly_dgx_b200_mcore_tp4_cp2_current_scaling_native_fp8_tp_fsdp": "runs",
    "gpt3_weekly_dgx_b200_mcore_tp4_cp2_mxfp8_tp_sp_cp": "refused",
    "gpt3_weekly_dgx_b200_mcore_tp4_cp2_native_fp8_tp_sp_cp_tp_overlap": "context parallelism",
    "gpt3_weekly_dgx_h100_mcore_tp4_cp2_native_fp8_tp_sp_cp_tp_overlap": "context parallelism",
    "gpt3_weekly_dgx_b200_mcore_tp4_cp2_current_scaling_native_fp8_tp_sp_cp_tp_overlap": "context parallelism",
    "gpt3_weekly_dgx_h100_mcore_tp4_cp2_current_scaling_native_fp8_tp_sp_cp_tp_overlap": "context parallelism",
    "gpt3_weekly_dgx_b200_mcore_tp2_pp2_current_scaling_native_fp8_tp_pp_sp_tp_overlap": "runs",
    "gpt3_weekly_dgx_h100_mcore_tp2_pp2_current_scaling_native_fp8_tp_pp_sp_tp_overlap": "runs",
    "gpt_dynamic_inference_tp1_pp1_583m_cuda_graphs_fp8_logitsmatch": "MODE inference",
    "gpt_dynamic_inference_tp1_pp1_583m_cuda_graphs_logitsmatch_decode_graphs_only": "MODE inference",
    "gpt_static_inference_tp1_pp1_583m_fp8_cudagraphs": "MODE inference",
}


@pytest.mark.mirror
@pytest.mark.skipif(not MIRROR, reason="set ROCMPORT_TEST_MLM_MIRROR to a Megatron-LM mirror")
def test_v016_fp8_cases_per_flavour_and_gpu(tmp_path):
    archive = tmp_path / "cases.tar"
    with archive.open("wb") as out:
        subprocess.run(["git", f"--git-dir={MIRROR}", "archive", "core_v0.16.1", str(cp.CASES)], stdout=out, check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(tmp_path / "tree", filter="data")
    fp8 = {
        n
        for n in cp.training_cases(tmp_path / "tree")
        if "--fp8-format" in (cp.load_config(tmp_path / "tree", n).get("MODEL_ARGS") or {})
    }
    assert fp8 == set(V016_FP8_ON_GFX942)
    on = {te: cp.plan_tree(tmp_path / "tree", te=te) for te in (None, GFX942, GFX950, CUDA_CONTROL)}
    for name, outcome in V016_FP8_ON_GFX942.items():
        p = on[GFX942][name]
        if outcome == "refused":  # MXFP8: the port's check on gfx942; runs nowhere else on the proxy (cp2 with TE)
            assert p.fp8.refusal == "--fp8-recipe mxfp8: gfx942 cannot run" and p.layout.world == 8, (name, p)
            assert "context parallelism" in on[GFX950][name].reason and "Blackwell" in on[CUDA_CONTROL][name].reason
            continue
        if outcome != "runs":
            assert isinstance(p, cp.Unsupported) and outcome in p.reason, (name, p)
            continue
        assert isinstance(p, cp.CasePlan) and p.fp8 and p.fp8.encoding == "fnuz" and not p.fp8.refusal, (name, p)
        assert isinstance(on[None][name], cp.Unsupported) and "needs --te" in on[None][name].reason
        assert on[GFX950][name].fp8.encoding == "ocp" and on[CUDA_CONTROL][name].fp8.device == "sm_90"


# upstream v0.19.0's FP8 GPT cases: the one the proxy runs (without --tp-comm-overlap), and why not the rest
V019_FP8 = {
    "gpt3_weekly_mcore_tp2_pp2_current_scaling_native_fp8_tp_pp_sp_tp_overlap": "runs",
    "gpt3_weekly_mcore_tp4_cp2_current_scaling_native_fp8_tp_sp_cp_tp_overlap": "context parallelism",
    "gpt_dynamic_inference_tp1_pp1_583m_cuda_graphs_fp8_logitsmatch": "MODE inference",
    "gpt_dynamic_inference_tp1_pp1_583m_cuda_graphs_logitsmatch_decode_graphs_only": "MODE inference",
    "gpt_static_inference_tp1_pp1_583m_fp8_cudagraphs": "MODE inference",
}


@pytest.mark.mirror
@pytest.mark.skipif(not MIRROR, reason="set ROCMPORT_TEST_MLM_MIRROR to a Megatron-LM mirror")
def test_v019_has_an_fp8_case_the_proxy_runs_on_each_gpu_and_the_cuda_control(tmp_path):
    archive = tmp_path / "cases.tar"
    with archive.open("wb") as out:
        subprocess.run(["git", f"--git-dir={MIRROR}", "archive", "core_v0.19.0", str(cp.CASES)], stdout=out, check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(tmp_path / "tree", filter="data")
    tree = tmp_path / "tree"
    fp8 = {n for n in cp.training_cases(tree) if "--fp8-format" in (cp.load_config(tree, n).get("MODEL_ARGS") or {})}
    assert fp8 == set(V019_FP8)
    on = {te: cp.plan_tree(tree, te=te, cuda=te is CUDA_CONTROL) for te in (GFX942, GFX950, CUDA_CONTROL)}
    for name, outcome in V019_FP8.items():
        if outcome != "runs":
            assert all(isinstance(on[te][name], cp.Unsupported) and outcome in on[te][name].reason for te in on)
            continue
        plans = [on[te][name] for te in (GFX942, GFX950, CUDA_CONTROL)]
        assert all(isinstance(p, cp.CasePlan) and p.fp8 and not p.fp8.refusal for p in plans), plans
        assert [(p.fp8.recipe, p.fp8.encoding, p.fp8.device) for p in plans] == [
            ("tensorwise", "fnuz", "gfx942"),
            ("tensorwise", "ocp", "gfx950"),
            ("tensorwise", "ocp", "sm_90"),
        ]
        # tp2×pp2 with sequence parallelism, the distributed optimizer over dp2; the userbuffers overlap dropped
        assert plans[0].layout.describe() == "tp2×pp2×dp2 +sp (8 ranks)"
        assert plans[0].dropped[0][0] == "--tp-comm-overlap --tp-comm-overlap-cfg"
        assert all(p.env_unset == () for p in plans)  # its ENV_VARS name no attention variable
        # --fp8-param-gather: its --bf16 kept for the master weights, on every GPU and the CUDA control
        assert all([k for k, _ in p.kept] == ["--bf16"] for p in plans)


@pytest.mark.mirror
@pytest.mark.skipif(not MIRROR, reason="set ROCMPORT_TEST_MLM_MIRROR to a Megatron-LM mirror")
def test_v016_fp8_cases_stale_attention_variable_is_unset_on_the_cuda_control_only(tmp_path):
    archive = tmp_path / "cases.tar"
    with archive.open("wb") as out:
        subprocess.run(["git", f"--git-dir={MIRROR}", "archive", "core_v0.16.1", str(cp.CASES)], stdout=out, check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(tmp_path / "tree", filter="data")
    name = "gpt3_weekly_dgx_h100_mcore_tp2_pp2_fp8_tp_pp"
    config = cp.load_config(tmp_path / "tree", name)
    assert str(config["ENV_VARS"]["NVTE_FUSED_ATTN"]) == "0" and "--attention-backend" not in config["MODEL_ARGS"]
    control = cp.plan_case(name, config, te=CUDA_CONTROL, cuda=True)
    assert [v for v, _ in control.env_unset] == ["NVTE_FUSED_ATTN"]
    assert cp.plan_case(name, config, te=GFX942).env_unset == ()


# --- upstream's own checks (AFTER_SCRIPT) ------------------------------------------------------------

# Shaped like upstream's gpt3_mcore_reruns_persistent_1 (core_v0.16.1 to main).
PERSISTENT_AFTER_SCRIPT = """\
check_log() { if [[ -z $(grep -r $1 "$2" $LOG_DIR) ]]; then exit 1; else echo OK; fi }
check_log -F "Result validation enabled"
check_log -F "Injecting error type Persistent error"
EXIT_CODE=0
"""


def test_a_case_with_upstreams_checks_is_planned_as_decided_by_them():
    config = yaml.safe_load(
        "MODEL_ARGS:\n  --num-layers: 4\n  --rerun-mode: validate_results\n"
        "AFTER_SCRIPT: |\n"
        + "".join(f"  {line}\n" for line in PERSISTENT_AFTER_SCRIPT.splitlines())
        + "TEST_TYPE: regular\n"
    )
    p = runnable(config)
    assert p.after_script is not None and p.after_script.exit_zero
    assert [c.pattern for c in p.after_script.checks] == [
        "Result validation enabled",
        "Injecting error type Persistent error",
    ]
    assert cp.UPSTREAM_CHECKS in p.features
    assert any("decided by upstream's AFTER_SCRIPT checks (2 checks" in n for n in p.notes)
    assert runnable(case()).after_script is None


def test_an_after_script_statement_verify_does_not_read_makes_the_case_unsupported_naming_it():
    p = cp.plan_case("c", case(AFTER_SCRIPT=PERSISTENT_AFTER_SCRIPT + "python check_more.py\n"))
    assert isinstance(p, cp.Unsupported) and p.kind == "not-on-proxy"
    assert "AFTER_SCRIPT" in p.reason and "'python check_more.py'" in p.reason


def test_an_after_script_in_a_case_of_several_runs_is_unsupported():
    p = cp.plan_case("c", case(AFTER_SCRIPT=PERSISTENT_AFTER_SCRIPT, TEST_TYPE="ckpt-resume"))
    assert isinstance(p, cp.Unsupported) and "TEST_TYPE ckpt-resume" in p.reason


@pytest.mark.mirror
@pytest.mark.skipif(not MIRROR, reason="set ROCMPORT_TEST_MLM_MIRROR to a Megatron-LM mirror")
@pytest.mark.parametrize("ref", ["core_v0.16.1", "core_v0.19.0", "main"])
def test_every_regular_case_with_an_after_script_is_decided_by_its_checks(ref, tmp_path):
    cases_at(ref, tmp_path / "tree")
    with_script = {}
    for name in cp.training_cases(tmp_path / "tree"):
        config = cp.load_config(tmp_path / "tree", name)
        if config.get("AFTER_SCRIPT") is not None:
            with_script[name] = (config, cp.plan_case(name, config))
    assert len(with_script) >= 7, sorted(with_script)
    for name, (config, p) in with_script.items():
        if config.get("TEST_TYPE") == "frozen-start":
            assert isinstance(p, cp.Unsupported) and "frozen-start" in p.reason, (name, p)
            continue
        assert isinstance(p, cp.CasePlan) and p.after_script is not None, (name, p)
        assert p.after_script.exit_zero and p.after_script.checks, name
