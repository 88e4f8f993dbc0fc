"""async-save-strategy: before/after, and --async-save's strategy on ROCm (with and without
nvidia-resiliency-ext) vs CUDA, on a validate_args shaped like v0.17's."""

import pytest

from rocmport.codemods.helper import helper_text
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
# v0.17+ (arguments.py at core_v0.17.1 l.1443): without --async-save the strategy is mcore; with it,
# the option's default (nvrx) stands.
VALIDATE_ARGS_V017 = VALIDATE_ARGS.replace(
    "    return args\n", ('    if not args.async_save:\n        args.async_strategy = "mcore"\n\n    return args\n')
)
# The module upstream's get_async_strategy("nvrx") imports first.
NVRX = {
    "nvidia_resiliency_ext/__init__.py": "",
    "nvidia_resiliency_ext/checkpointing/__init__.py": "",
    "nvidia_resiliency_ext/checkpointing/async_ckpt/__init__.py": "",
    "nvidia_resiliency_ext/checkpointing/async_ckpt/core.py": "class AsyncCallsQueue: pass\n",
}
ENV = {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}


def probe(args: dict) -> str:
    return validate_args_probe(ENV, args) + 'print("async_strategy", args.async_strategy)\n'


def outcome(proc) -> tuple[str, list[str]]:
    """(the strategy validate_args left, the warnings it gave)."""
    lines = proc.stdout.splitlines()
    assert lines and lines[0].startswith("ok"), proc.stderr
    return lines[-1].split()[-1], [ln for ln in lines if ln.startswith("warning")]


def test_exact_before_after():
    after = VALIDATE_ARGS_V017.replace(
        '    """Validate arguments."""\n',
        (
            '    """Validate arguments."""\n'
            "    from megatron.core._rocm import use_available_async_strategy\n"
            "    use_available_async_strategy(args)  # rocmport: on ROCm, mcore where nvidia-resiliency-ext is absent\n"
        ),
    )
    assert_codemod("async-save-strategy", VALIDATE_ARGS_V017, after, REL, sites=1)


def test_lines_without_the_option_are_left_alone():
    """v0.15/v0.16: validate_args never sees args.async_strategy; nothing to switch."""
    assert rewrite("async-save-strategy", VALIDATE_ARGS, REL) == (VALIDATE_ARGS, 0)


@pytest.mark.torch
def test_rocm_without_nvrx_writes_with_mcore_and_says_why(tmp_path):
    after, _ = rewrite("async-save-strategy", VALIDATE_ARGS_V017, REL)
    proc = run_tree(
        tmp_path, validate_args_tree(after), probe({"async_save": True, "async_strategy": "nvrx"}), hip="6.4.43482"
    )
    strategy, warned = outcome(proc)
    assert strategy == "mcore"
    assert warned == [
        "warning ROCm: --async-strategy nvrx needs nvidia-resiliency-ext, which is NVIDIA-only and not installed: "
        "async checkpoints are written by Megatron-Core's own writer (--async-strategy mcore)."
    ]


@pytest.mark.torch
@pytest.mark.parametrize(
    "given, expected",
    [
        ({"async_save": True, "async_strategy": "nvrx"}, "nvrx"),  # NVRx installed: kept
        ({"async_save": True, "async_strategy": "mcore"}, "mcore"),
        ({"async_save": False, "async_strategy": "nvrx"}, "mcore"),
    ],
)  # upstream's own rule
def test_rocm_leaves_a_usable_strategy_alone(tmp_path, given, expected):
    after, _ = rewrite("async-save-strategy", VALIDATE_ARGS_V017, REL)
    proc = run_tree(tmp_path, {**validate_args_tree(after), **NVRX}, probe(given), hip="6.4.43482")
    assert outcome(proc) == (expected, [])


@pytest.mark.torch
def test_cuda_is_upstream(tmp_path):
    """CUDA keeps nvrx without the package (upstream stops at the first save, naming it)."""
    after, _ = rewrite("async-save-strategy", VALIDATE_ARGS_V017, REL)
    given = probe({"async_save": True, "async_strategy": "nvrx"})
    ported = run_tree(tmp_path / "p", validate_args_tree(after), given)
    upstream = run_tree(tmp_path / "u", validate_args_tree(VALIDATE_ARGS_V017), given)
    assert ported.stdout == upstream.stdout and outcome(ported) == ("nvrx", []), ported.stderr


# --- the torch_dcp / fsdp_dtensor async save (save_checkpoint, v0.17+) ---------------------------

CKPT = "megatron/training/checkpointing.py"
# Shaped like save_checkpoint's `--ckpt-format torch_dcp|fsdp_dtensor` branch with --async-save at
# core_v0.19.0 (l.849-885) and main: the saver comes from the strategy's modules, the plan cache is
# asked for with enable_cache=, and the finalize step takes the plan's result as its arguments
# (training/async_utils.py get_save_and_finalize_callbacks).
SAVE_V019 = """\
from megatron.core.dist_checkpointing.strategies.torch import get_async_strategy


def save_checkpoint(args, state_dict, checkpoint_name):
    if args.async_save:
        planner = None
        coordinator_rank = 0
        _, async_modules = get_async_strategy(args.async_strategy)
        FileSystemWriterAsync = async_modules['FileSystemWriterAsync']
        save_state_dict_async_plan = async_modules['save_state_dict_async_plan']
        fs_storage_writer = FileSystemWriterAsync(checkpoint_name)

        save_state_dict_ret = save_state_dict_async_plan(
            state_dict,
            fs_storage_writer,
            None,
            coordinator_rank,
            planner=planner,
            enable_cache=args.ckpt_assume_constant_structure,
        )
        async_modules['save_state_dict_async_finalize'](*save_state_dict_ret)
"""
IMPORT = "from megatron.core._rocm import call_async_save_plan\n"
PORTED_V019 = SAVE_V019.replace("get_async_strategy\n", "get_async_strategy\n" + IMPORT, 1).replace(
    "save_state_dict_ret = save_state_dict_async_plan(\n            state_dict,\n",
    "save_state_dict_ret = call_async_save_plan(\n            save_state_dict_async_plan,\n            state_dict,\n",
)
# v0.17 and v0.18 write the same call on one line.
SAVE_V017 = SAVE_V019.replace(
    """save_state_dict_async_plan(
            state_dict,
            fs_storage_writer,
            None,
            coordinator_rank,
            planner=planner,
            enable_cache=args.ckpt_assume_constant_structure,
        )""",
    "save_state_dict_async_plan(state_dict, fs_storage_writer, None, coordinator_rank, planner=planner, "
    "enable_cache=args.ckpt_assume_constant_structure)",
)


def test_the_dcp_async_save_calls_its_saver_through_the_helper():
    assert_codemod("async-save-strategy", SAVE_V019, PORTED_V019, CKPT, sites=1)
    _, _, reports = rewrite_with_reports("async-save-strategy", SAVE_V019, CKPT)
    assert [(r.kind, r.line, r.message) for r in reports] == [
        (
            "site",
            13,
            "save_state_dict_async_plan(..., enable_cache=...) -> call_async_save_plan(save_state_dict_async_plan, ...): "
            "keywords the strategy's saver takes, its result in nvidia-resiliency-ext's shape",
        )
    ]


def test_the_one_line_call_of_v017():
    after = SAVE_V017.replace("get_async_strategy\n", "get_async_strategy\n" + IMPORT, 1).replace(
        "= save_state_dict_async_plan(state_dict,", "= call_async_save_plan(save_state_dict_async_plan, state_dict,"
    )
    assert_codemod("async-save-strategy", SAVE_V017, after, CKPT, sites=1)


@pytest.mark.parametrize(
    "source",
    [
        # a saver that is not the strategy's
        SAVE_V019.replace("async_modules['save_state_dict_async_plan']", "make_saver()"),
        # the strategy's other module
        SAVE_V019.replace(
            "save_state_dict_async_plan = async_modules['save_state_dict_async_plan']",
            "save_state_dict_async_plan = async_modules['save_state_dict_async_finalize']",
        ),
        # no keyword to keep from a saver (torch.py's strategy builds its keywords per strategy)
        SAVE_V019.replace("            enable_cache=args.ckpt_assume_constant_structure,\n", ""),
    ],
    ids=["other-saver", "other-module", "no-enable-cache"],
)
def test_other_calls_are_left_alone(source):
    assert rewrite("async-save-strategy", source, CKPT) == (source, 0)


# Megatron-Core's saver and finalize (dist_checkpointing/strategies/state_dict_saver.py: the
# parameters and result of core_v0.17.1..main), nvidia-resiliency-ext's (enable_cache, the finalize
# arguments as its result), and get_async_strategy choosing between them.
MCORE_SAVER = """\
def save_state_dict_async_plan(state_dict, storage_writer, process_group=None, coordinator_rank=0,
                               planner=None, cached_ckpt_structure=None, loaded_all_plans=None):
    print("plan mcore", cached_ckpt_structure)
    return (storage_writer, "metadata", "dist_wrapper"), "central plan", "local plan", False, False


def save_state_dict_async_finalize(storage_writer, global_metadata, dist_wrapper):
    print("finalize", storage_writer, global_metadata, dist_wrapper)
"""
NVRX_SAVER = MCORE_SAVER.replace(
    "cached_ckpt_structure=None, loaded_all_plans=None", "enable_cache=False, metadata_cache=None"
).replace(
    '"plan mcore", cached_ckpt_structure)\n    return (storage_writer, "metadata", "dist_wrapper"), "central plan", "local plan", False, False',
    '"plan nvrx", enable_cache)\n    return storage_writer, "metadata", "dist_wrapper"',
)
STRATEGIES = {
    "megatron/core/dist_checkpointing/__init__.py": "",
    "megatron/core/dist_checkpointing/strategies/__init__.py": "",
    "megatron/core/dist_checkpointing/strategies/state_dict_saver.py": MCORE_SAVER,
    "megatron/core/dist_checkpointing/strategies/torch.py": """\
        import importlib

        SAVERS = {
            "mcore": "megatron.core.dist_checkpointing.strategies.state_dict_saver",
            "nvrx": "nvidia_resiliency_ext.checkpointing.async_ckpt.state_dict_saver",
        }


        def get_async_strategy(async_strategy):
            saver = importlib.import_module(SAVERS[async_strategy])
            return async_strategy, {
                "FileSystemWriterAsync": str,
                "save_state_dict_async_plan": saver.save_state_dict_async_plan,
                "save_state_dict_async_finalize": saver.save_state_dict_async_finalize,
            }
        """,
    "megatron/training/__init__.py": "",
    **NVRX,
    "nvidia_resiliency_ext/checkpointing/async_ckpt/state_dict_saver.py": NVRX_SAVER,
}


def save(strategy: str, cache: bool) -> str:
    return (
        "import types\n"
        "from megatron.training.checkpointing import save_checkpoint\n"
        f"args = types.SimpleNamespace(async_save=True, async_strategy={strategy!r}, "
        f"ckpt_assume_constant_structure={cache!r})\n"
        "save_checkpoint(args, {}, 'iter_0000002')\n"
    )


@pytest.mark.torch
@pytest.mark.parametrize("hip", ["6.4.43482", None])
def test_mcore_saver_plans_and_finalizes(tmp_path, hip):
    """With Megatron-Core's own saver (the strategy ROCm takes without nvidia-resiliency-ext, or
    one chose): upstream stops at the plan (no enable_cache); the port plans without the keyword
    and finalizes with the plan's finalize arguments."""
    upstream = run_tree(tmp_path / "u", {**STRATEGIES, CKPT: SAVE_V019}, save("mcore", False), hip=hip)
    assert "unexpected keyword argument 'enable_cache'" in upstream.stderr
    after, _ = rewrite("async-save-strategy", SAVE_V019, CKPT)
    proc = run_tree(tmp_path / "p", {**STRATEGIES, CKPT: after}, save("mcore", False), hip=hip)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["plan mcore None", "finalize iter_0000002 metadata dist_wrapper"]


@pytest.mark.torch
def test_mcore_saver_says_it_keeps_no_plan_cache(tmp_path):
    """--ckpt-assume-constant-structure asks for the plan cache: mcore's saver has none on this
    path; the save goes on without it, with a warning."""
    after, _ = rewrite("async-save-strategy", SAVE_V019, CKPT)
    proc = run_tree(tmp_path, {**STRATEGIES, CKPT: after}, save("mcore", True), hip="6.4.43482")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["plan mcore None", "finalize iter_0000002 metadata dist_wrapper"]
    assert "save_state_dict_async_plan takes no enable_cache: saving without it" in proc.stderr


@pytest.mark.torch
@pytest.mark.parametrize("cache", [False, True])
def test_nvrx_saver_is_called_as_upstream_calls_it(tmp_path, cache):
    after, _ = rewrite("async-save-strategy", SAVE_V019, CKPT)
    given = save("nvrx", cache)
    ported = run_tree(tmp_path / "p", {**STRATEGIES, CKPT: after}, given)
    upstream = run_tree(tmp_path / "u", {**STRATEGIES, CKPT: SAVE_V019}, given)
    assert ported.returncode == upstream.returncode == 0, ported.stderr + upstream.stderr
    assert ported.stdout == upstream.stdout
    assert ported.stdout.splitlines() == [f"plan nvrx {cache}", "finalize iter_0000002 metadata dist_wrapper"]


def test_helper_keeps_the_keywords_a_function_takes():
    """The helper itself, on plain functions: with the parameter, without it, with **kwargs."""
    ns: dict = {}
    exec(helper_text(["async-save-strategy"]), ns)
    call = ns["call_async_save_plan"]

    def with_cache(a, b, planner=None, enable_cache=False):
        return (a, b, planner, enable_cache)

    def without_cache(a, b, planner=None):
        return (a, b, planner)

    def open_ended(a, **kw):
        return (a, kw)

    assert call(with_cache, 1, 2, planner="p", enable_cache=True) == (1, 2, "p", True)
    assert call(without_cache, 1, 2, planner="p", enable_cache=False) == (1, 2, "p")
    assert call(open_ended, 1, planner="p", enable_cache=True) == (1, {"planner": "p", "enable_cache": True})
    with pytest.raises(TypeError):  # what the function cannot take positionally stays an error
        call(without_cache, 1, 2, 3, 4)
