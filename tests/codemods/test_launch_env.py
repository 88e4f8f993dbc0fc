"""launch-env: before/after, and validate_args with tp > 1 on ROCm vs CUDA."""

from rocmport.launch_env import LAUNCH_ENV
import pytest

from tests.helpers.codemods import (
    VALIDATE_ARGS,
    assert_codemod,
    rewrite,
    rewrite_with_reports,
    run_tree,
    validate_args_probe,
    validate_args_tree,
)

REL = "megatron/training/arguments.py"
PRELUDE = (
    '    """Validate arguments."""\n'
    "    from megatron.core._rocm import apply_launch_env\n"
    "    apply_launch_env(args)  # rocmport: on ROCm, AMD launcher defaults (setdefault)\n"
)


def test_exact_before_after():
    after = VALIDATE_ARGS.replace('    """Validate arguments."""\n', PRELUDE)
    assert_codemod("launch-env", VALIDATE_ARGS, after, REL, sites=1)
    _, _, reports = rewrite_with_reports("launch-env", VALIDATE_ARGS, REL)
    assert [(r.kind, r.line) for r in reports] == [("site", 8)]


def test_only_megatron_training_validate_args():
    assert rewrite("launch-env", VALIDATE_ARGS, "megatron/training/yaml_arguments.py") == (VALIDATE_ARGS, 0)


@pytest.mark.torch
def test_tp2_on_rocm_gets_the_launcher_defaults_and_passes(tmp_path):
    after, _ = rewrite("launch-env", VALIDATE_ARGS, REL)
    proc = run_tree(tmp_path, validate_args_tree(after), validate_args_probe(), hip="6.4.43482")
    lines = proc.stdout.splitlines()
    expected = " ".join(f"{k}={v}" for k, v, _ in LAUNCH_ENV)
    assert lines[0].startswith("ROCm: launcher environment defaults set") and expected in lines[0], proc.stderr
    assert lines[1] == "ok " + expected


@pytest.mark.torch
def test_the_users_values_win_and_only_missing_ones_are_reported(tmp_path):
    after, _ = rewrite("launch-env", VALIDATE_ARGS, REL)
    proc = run_tree(
        tmp_path,
        validate_args_tree(after),
        validate_args_probe({"GPU_MAX_HW_QUEUES": "4", "CUDA_DEVICE_MAX_CONNECTIONS": "1"}),
        hip="6.4.43482",
    )
    first, second = proc.stdout.splitlines()[:2]
    assert (
        "GPU_MAX_HW_QUEUES" not in first
        and "CUDA_DEVICE_MAX_CONNECTIONS" not in first
        and "HSA_NO_SCRATCH_RECLAIM=1" in first
    )
    assert "GPU_MAX_HW_QUEUES=4" in second and "CUDA_DEVICE_MAX_CONNECTIONS=1" in second, proc.stderr


@pytest.mark.torch
def test_fsdp_keeps_cuda_device_max_connections_unset(tmp_path):
    """FSDP asserts the variable is not 1: the default is not set there (the rest is)."""
    after, _ = rewrite("launch-env", VALIDATE_ARGS, REL)
    proc = run_tree(
        tmp_path, validate_args_tree(after), validate_args_probe(args={"use_torch_fsdp2": True}), hip="6.4.43482"
    )
    second = proc.stdout.splitlines()[1]
    assert (
        second.startswith("ok ")
        and "CUDA_DEVICE_MAX_CONNECTIONS" not in second
        and "HSA_NO_SCRATCH_RECLAIM=1" in second
    ), proc.stderr


@pytest.mark.torch
def test_nothing_set_on_rank_1_printed_but_still_set(tmp_path):
    after, _ = rewrite("launch-env", VALIDATE_ARGS, REL)
    proc = run_tree(tmp_path, validate_args_tree(after), validate_args_probe(args={"rank": 1}), hip="6.4.43482")
    assert proc.stdout.splitlines()[0].startswith("ok CUDA_DEVICE_MAX_CONNECTIONS=1"), proc.stderr


@pytest.mark.torch
def test_cuda_is_upstream(tmp_path):
    """CUDA: nothing set, tp > 1 stops at upstream's assertion exactly as the unported code does."""
    after, _ = rewrite("launch-env", VALIDATE_ARGS, REL)
    ported = run_tree(tmp_path / "p", validate_args_tree(after), validate_args_probe())
    upstream = run_tree(tmp_path / "u", validate_args_tree(VALIDATE_ARGS), validate_args_probe())
    assert ported.stdout == upstream.stdout
    assert ported.stdout.startswith("AssertionError Using tensor model parallelism"), ported.stderr
    # and so does HIP without the port
    assert (
        run_tree(tmp_path / "h", validate_args_tree(VALIDATE_ARGS), validate_args_probe(), hip="6.4.43482").stdout
        == upstream.stdout
    )


@pytest.mark.torch  # the generated helper imports torch (is_hip)
def test_the_helper_renders_rocmports_one_launcher_list():
    """The generated helper carries rocmport/launch_env.py's lists, the ones `rocmport env`, verify and
    the container recipe use: one source."""
    from rocmport.codemods.runner import helper_text
    from rocmport.launch_env import DETERMINISTIC_ENV

    namespace: dict = {}
    exec(compile(helper_text(["launch-env", "deterministic-env"]), "megatron/core/_rocm.py", "exec"), namespace)
    assert namespace["LAUNCH_ENV"] == LAUNCH_ENV and namespace["DETERMINISTIC_ENV"] == DETERMINISTIC_ENV


def test_the_fsdp_switches_are_written_into_the_helper_as_they_were_by_hand():
    """The switches come from rocmport/launch_env.py now; the port's _rocm.py keeps the bytes it had when
    the piece spelled them itself (every port's tree hash is compared across checkouts)."""
    from rocmport.codemods.runner import helper_text

    line = '\n_FSDP_FLAGS = ("use_torch_fsdp2", "use_megatron_fsdp", "use_custom_fsdp")\n'
    assert line in helper_text(["launch-env"])


@pytest.mark.torch  # the generated helper imports torch (is_hip)
def test_the_port_leaves_one_queue_unset_under_exactly_verify_s_fsdp_flags():
    """One list of FSDP switches: under each one the port's generated helper (on HIP) leaves
    CUDA_DEVICE_MAX_CONNECTIONS unset, verify's plan of a case with its option leaves the launch
    profile's 1 out too, and neither side knows a switch the other does not."""
    from types import SimpleNamespace

    from rocmport.codemods.runner import helper_text
    from rocmport.verify.stages import case_plan

    namespace: dict = {}
    exec(compile(helper_text(["launch-env"]), "megatron/core/_rocm.py", "exec"), namespace)
    namespace["is_hip"] = lambda: True  # apply_launch_env sets nothing on CUDA
    helpers = set(namespace["_FSDP_FLAGS"])
    verifys = {flag.removeprefix("--").replace("-", "_") for flag in case_plan.FSDP_FLAGS}
    assert helpers and verifys
    for dest in sorted(helpers | verifys):
        env: dict = {}
        namespace["apply_launch_env"](SimpleNamespace(rank=1, **{dest: True}), env)
        unset_by_the_port = "CUDA_DEVICE_MAX_CONNECTIONS" not in env and "GPU_MAX_HW_QUEUES" in env
        option = "--" + dest.replace("_", "-")
        unset_by_verify = [v for v, _ in case_plan.fsdp_launch_env({"MODEL_ARGS": {option: True}})]
        assert (unset_by_the_port, unset_by_verify) == (True, ["CUDA_DEVICE_MAX_CONNECTIONS"]), dest
