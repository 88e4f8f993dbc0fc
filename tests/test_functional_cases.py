"""verify stage 4 over many of upstream's GPT cases (`--cases reach|all|NAME,...`): each case run and
reported on its own, a failing case run again on the unported tree (a real git checkout of the base
commit) and labelled, only a port-regression failing the stage; the selection's fallback while the
line has no reach record. The trees are canned: a pretrain_gpt.py that prints Megatron's loss lines
and, for a case whose MODEL_ARGS ask it (--fake-break), calls into megatron/core/thing.py."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest

from rocmport.cli import main
from rocmport.port import worktree as wt
from rocmport.verify.stages.functional import functional_options
from rocmport.verify.stages.functional.selection import NO_REACH_RECORD
from tests.helpers.canned_case import CASE, CONFIG
from tests.helpers.sync import g
from tests.helpers.upstream_cases import case_repo, stage_four

GOOD = CASE
BREAKS = "gpt3_mcore_tp1_pp1_breaks_uninstall_te"
GPU_ONLY = "gpt3_mcore_te_tp1_pp1_cuda_graphs"
INFERENCE = "gpt3_mcore_tp1_pp1_inference"

# Megatron's training log line per iteration; a case with --fake-break calls megatron.core.thing.step().
# --fake-log TEXT: a line megatron's logging prints after iteration 1; --fake-exit N: the run stops after
# iteration N with exit 16, as megatron's rerun state machine does (EXIT_CODE_RESUME_TO_DISAMBIGUATE).
PRETRAIN = textwrap.dedent("""\
    import sys
    iters = int(sys.argv[sys.argv.index("--train-iters") + 1])
    def arg(name):
        return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else None
    if "--fake-break" in sys.argv:
        from megatron.core import thing
        thing.step()
    for i in range(1, iters + 1):
        print(f" [2026-11-27 07:00:00] iteration {i:8d}/{iters:8d} | consumed samples: {8 * i:10d} | "
              f"lm loss: {10.9 - 0.25 * i:.6E} | loss scale: 1.0 |", flush=True)
        if i == 1 and arg("--fake-log"):
            print(arg("--fake-log"), flush=True)
        if arg("--fake-exit") and i == int(arg("--fake-exit")):
            sys.exit(16)
    """)
# Upstream asserts the attention variables unset (language_module.check_and_set_env_variable), which
# verify's HIP simulation sets as AMD's images do: the unported tree's runs leave them out.
THING_OK = "import os\n\n\ndef step():\n    assert 'NVTE_FUSED_ATTN' not in os.environ, 'NVTE_FUSED_ATTN set'\n"
THING_UPSTREAM_BUG = "def step():\n    raise RuntimeError('the schedule lost a micro-batch')\n"


def make_tree(root: Path, cases: dict[str, str]) -> Path:
    """A Megatron-LM-shaped tree with ``cases`` (name -> model_config.yaml), committed as the base."""
    files = {
        "pretrain_gpt.py": PRETRAIN,
        "megatron/__init__.py": "",
        "megatron/core/__init__.py": "",
        "megatron/core/thing.py": THING_OK,
        "megatron/core/tensor_parallel/__init__.py": "",
        "megatron/core/tensor_parallel/random.py": (
            "def _get_cuda_rng_state():\n    pass\n\n\ndef _set_cuda_rng_state(state):\n    pass\n\n\n"
            "class CudaRNGStatesTracker:\n    pass\n"
        ),
    }
    case_repo(root, cases, "upstream", files)
    return root


def port(tree: Path, thing: str) -> str:
    """Commit the 'port' of megatron/core/thing.py over the base; the state names the base commit."""
    base = g(tree, "rev-parse", "HEAD")
    (tree / "megatron" / "core" / "thing.py").write_text(thing)
    g(tree, "commit", "-qam", "port")
    wt.write_state(tree, wt.ApplyState(status="done", base=base))
    return base


def verify_json(tmp_path: Path, capsys, tree: Path, *args: str) -> tuple[int, dict, str]:
    rc = main(
        [
            "-C",
            str(tmp_path),
            "verify",
            "--tree",
            str(tree),
            "--stages",
            "4",
            "--iters",
            "4",
            "--no-resume",
            "--json",
            *args,
        ]
    )
    out, err = capsys.readouterr()
    return rc, json.loads(out), err


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ROCMPORT_CACHE_DIR", str(tmp_path / "cache"))  # the unported tree's runs are cached there


# --- selection, without a launch -------------------------------------------------------------------


def test_an_unknown_name_is_exit_2_naming_it_and_near_matches(tmp_path, capsys):
    tree = make_tree(tmp_path / "t", {GOOD: CONFIG, BREAKS: CONFIG})
    rc = main(
        [
            "verify",
            "--tree",
            str(tree),
            "--stages",
            "4",
            "--cases",
            f"{GOOD},gpt3_mcore_tp1_pp1_uninstal_te",
            "--dry-run",
        ]
    )
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert "--cases 'gpt3_mcore_tp1_pp1_uninstal_te'" in err and f"near: {GOOD}" in err


def test_cases_names_plan_a_launch_each_and_case_is_its_alias(tmp_path, capsys):
    tree = make_tree(tmp_path / "t", {GOOD: CONFIG, BREAKS: CONFIG})
    assert main(["verify", "--tree", str(tree), "--stages", "4", "--cases", f"{GOOD},{BREAKS}", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert out.count("pretrain_gpt.py") == 2
    assert main(["verify", "--tree", str(tree), "--stages", "4", "--case", GOOD, "--dry-run"]) == 0
    assert capsys.readouterr().out.count("pretrain_gpt.py") == 1
    assert "--case" not in subprocess.run(
        [sys.executable, "-m", "rocmport", "verify", "--help"], capture_output=True, text=True
    ).stdout.replace("--cases", "")


def test_reach_falls_back_to_the_default_case_and_says_so(tmp_path):
    tree = make_tree(tmp_path / "t", {GOOD: CONFIG, BREAKS: CONFIG})
    opts, _ = functional_options(tree, None, None, None, 1, 1, None, False, 4, option="--cases")
    assert opts is not None and opts.cases == (GOOD,) and opts.selection == "reach"
    assert opts.note == NO_REACH_RECORD == "no reach record for this line: today's default case"


def test_reach_takes_the_lines_record_through_the_seam(tmp_path, monkeypatch):
    """rocmport.verify.analyses.reach.reach_cases(series_dir, tree) -> (cases, a line): the set it records."""
    tree = make_tree(tmp_path / "t", {GOOD: CONFIG, BREAKS: CONFIG})
    seen = []

    def reach_cases(series_dir, t, golden=()):
        seen.append((series_dir, t))
        return [BREAKS, "gpt3_gone"], "reach record: 2 cases, 14 of 20 sites"

    fake = types.ModuleType("rocmport.verify.analyses.reach")
    fake.reach_cases = reach_cases  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "rocmport.verify.analyses.reach", fake)
    import rocmport.verify.analyses as analyses

    monkeypatch.setattr(analyses, "reach", fake, raising=False)
    opts, _ = functional_options(tree, tmp_path / "series", None, "reach", 1, 1, None, False, 4, option="--cases")
    assert opts is not None and opts.cases == (BREAKS,) and seen == [(tmp_path / "series", tree)]
    assert opts.note == "reach record: 2 cases, 14 of 20 sites (1 recorded cases not in this tree: gpt3_gone)"


# --- runs (a torchrun each; the unported tree's in a git worktree of the base commit) ------------


@pytest.mark.torch
@pytest.mark.slow
def test_two_named_cases_run_and_are_reported_each(tmp_path, capsys):
    tree = make_tree(tmp_path / "t", {GOOD: CONFIG, BREAKS: CONFIG})
    rc, report, err = verify_json(tmp_path, capsys, tree, "--cases", f"{GOOD},{BREAKS}")
    assert rc == 0, err
    cases = report["functional"]["cases"]
    assert [(c["case"], c["status"]) for c in cases] == [(GOOD, "pass"), (BREAKS, "pass")]
    assert all(c["losses"] == [10.65, 10.4, 10.15, 9.9] for c in cases)
    assert stage_four(report)["reason"] == "2 cases: 2 pass"
    assert report["functional"]["case"] == GOOD and report["functional"]["version"] == 2  # version 1's keys stay
    assert "stage 4 case 1/2: " + GOOD in err and "stage 4 case 2/2: " + BREAKS in err


@pytest.mark.torch
@pytest.mark.slow
def test_a_case_that_fails_only_on_the_port_is_a_port_regression_and_fails_the_stage(tmp_path, capsys):
    broken = CONFIG.replace("MODEL_ARGS:\n", "MODEL_ARGS:\n  --fake-break: true\n", 1)
    tree = make_tree(tmp_path / "t", {GOOD: CONFIG, BREAKS: broken})
    base = port(tree, THING_UPSTREAM_BUG)  # the port broke thing.step; upstream's returns
    rc, report, err = verify_json(tmp_path, capsys, tree, "--cases", f"{GOOD},{BREAKS}")
    assert rc == 1, err
    entry = report["functional"]["cases"][1]
    assert entry["status"] == "fail" and entry["label"] == "port-regression", entry
    assert entry["baseline"]["status"] == "pass" and entry["baseline"]["commit"] == base
    assert entry["failure"] == {
        "phase": "run",
        "message": "RuntimeError: the schedule lost a micro-batch",
        "site": "megatron/core/thing.py (step)",
    }
    assert stage_four(report)["status"] == "fail" and stage_four(report)["reason"] == (
        f"2 cases: 1 pass, 1 port-regression; blocking: {BREAKS}"
    )
    # the summary names the blocking case, why it blocks and what the unported tree did (its run now cached)
    args = ["--stages", "4", "--iters", "4", "--no-resume", "--cases", BREAKS, "--no-html"]
    assert main(["-C", str(tmp_path), "verify", "--tree", str(tree), *args]) == 1
    out = capsys.readouterr().out
    assert f"functional: port-regression: {BREAKS}" in out and "the port broke it" in out
    assert "the unported tree: pass: " in out


@pytest.mark.torch
@pytest.mark.slow
def test_a_case_that_fails_the_same_way_on_both_trees_is_upstream_known_and_passes(tmp_path, capsys):
    broken = CONFIG.replace("MODEL_ARGS:\n", "MODEL_ARGS:\n  --fake-break: true\n", 1)
    tree = make_tree(tmp_path / "t", {BREAKS: broken})
    (tree / "megatron" / "core" / "thing.py").write_text(THING_UPSTREAM_BUG)
    g(tree, "commit", "-qam", "upstream's bug")
    # the port moves the failing line (a codemod's import above it): the same place is the same function
    base = port(tree, "# rocmport: a guarded import\n\n" + THING_UPSTREAM_BUG)
    rc, report, err = verify_json(tmp_path, capsys, tree, "--cases", BREAKS)
    assert rc == 0, err
    entry = report["functional"]["cases"][0]
    assert entry["label"] == "upstream-known" and entry["baseline"]["commit"] == base, entry
    assert stage_four(report)["status"] == "pass"
    assert stage_four(report)["reason"].startswith("upstream-known: pretrain_gpt.py (after 0 of 4 iterations) exited 1")
    # the unported tree's run is cached: the next verify does not run it again
    rc, again, err = verify_json(tmp_path, capsys, tree, "--cases", BREAKS)
    assert rc == 0 and again["functional"]["cases"][0]["baseline"]["cached"] is True


@pytest.mark.torch
@pytest.mark.slow
def test_all_lists_the_cases_the_proxy_cannot_run_with_kind_and_reason(tmp_path, capsys):
    cases = {
        GOOD: CONFIG,
        GPU_ONLY: CONFIG.replace("MODEL_ARGS:\n", "MODEL_ARGS:\n  --enable-cuda-graph: true\n", 1),
        INFERENCE: "MODE: inference\n" + CONFIG,
    }
    tree = make_tree(tmp_path / "t", cases)
    rc, report, err = verify_json(tmp_path, capsys, tree, "--cases", "all", "--junit", str(tmp_path / "j.xml"))
    assert rc == 0, err
    import xml.etree.ElementTree as ET

    suite = ET.parse(tmp_path / "j.xml").getroot().find("testsuite[@name='upstream.functional_cases']")
    assert suite is not None and (suite.get("tests"), suite.get("failures"), suite.get("skipped")) == ("3", "0", "2")
    skipped = {c.get("name"): c.find("skipped").get("message") for c in suite if c.find("skipped") is not None}
    assert skipped[GPU_ONLY].startswith("unsupported-in-proxy: ") and GOOD not in skipped
    by = {c["case"]: c for c in report["functional"]["cases"]}
    assert list(by) == sorted(cases) and by[GOOD]["status"] == "pass"
    assert (by[GPU_ONLY]["status"], by[GPU_ONLY]["kind"]) == ("unsupported-in-proxy", "gpu-only")
    assert "--enable-cuda-graph: CUDA graph capture" in by[GPU_ONLY]["reason"]
    assert (by[INFERENCE]["kind"], by[INFERENCE]["reason"]) == (
        "not-training",
        f"{INFERENCE} (not-training): MODE inference: not a pretraining case (stage 4 runs training)",
    )
    assert stage_four(report)["reason"] == "1 case: 1 pass; 2 unsupported (1 gpu-only, 1 not-training)"
    assert report["functional"]["selection"] == "all"


# --- the comparison, on canned logs ------------------------------------------------------------------

# A failure where the shim acted: its mode redirected the call (device='cuda' made cpu) that raised.
SHIM_TRACE = textwrap.dedent("""\
    [rank1]: Traceback (most recent call last):
    [rank1]:   File "{tree}/megatron/core/optimizer/other.py", line 9, in elsewhere
    [rank0]: Traceback (most recent call last):
    [rank0]:   File "{tree}/pretrain_gpt.py", line 3, in <module>
    [rank0]:   File "{tree}/megatron/core/optimizer/distrib_optimizer.py", line {line}, in _set_main_param_and_optimizer_states
    [rank0]:   File "/opt/rocmport/rocmport/verify/runtime/proxy_shim.py", line 115, in __torch_function__
    [rank0]: RuntimeError: Trying to create tensor with negative dimension -1 ({tree}/x at 0x7f00aa)
    [rank1]: RuntimeError: something else
    """)
# The same place handing a call on unchanged (the shim's pass-through), raising upstream's own failure.
PASS_THROUGH_TRACE = SHIM_TRACE.replace(
    "line 115, in __torch_function__\n",
    "line 115, in __torch_function__\n"
    '    [rank0]:   File "/opt/rocmport/rocmport/verify/runtime/proxy_shim.py", line 124, in passed_through_unchanged\n',
).replace(
    "Trying to create tensor with negative dimension -1",
    "a view of a leaf Variable that requires grad is being used in an in-place operation",
)


def test_failures_compare_by_place_and_message_and_name_the_proxy_mechanism(tmp_path):
    from rocmport.verify.stages.functional import CaseOutcome, failure_of
    from rocmport.verify.stages.functional.case_labels import BaselineRun, label_case
    from rocmport.verify.orchestration.stage_result import FAIL, StageResult, UNSUPPORTED

    port_tree, base_tree = tmp_path / "port", tmp_path / "base"
    pf = failure_of(SHIM_TRACE.format(tree=port_tree, line=1210), port_tree, "resume")
    bf = failure_of(SHIM_TRACE.format(tree=base_tree, line=1187), base_tree, "resume")
    assert pf == bf  # tree paths, addresses and line numbers aside, the same failure
    assert pf.site == "megatron/core/optimizer/distrib_optimizer.py (_set_main_param_and_optimizer_states)"
    assert pf.shim == "__torch_function__ (proxy_shim.py:115)" and "<tree>/x at 0x#" in pf.message
    out = CaseOutcome("c", StageResult("functional", FAIL, "x"), None, pf)
    base = BaselineRun("a" * 40, FAIL, "y", 1.0, failure=bf)
    lab, why = label_case(out, base)
    assert lab == "proxy-artifact" and "TorchFunctionMode" in why and "proxy_shim.py:115" in why
    # through the shim's pass-through only: not the shim (the leaf-view failure is upstream's, on a GPU too)
    passed = [failure_of(PASS_THROUGH_TRACE.format(tree=t, line=1210), t, "resume") for t in (port_tree, base_tree)]
    assert passed[0].shim is None and passed[0].site == pf.site
    lab, why = label_case(
        CaseOutcome("c", StageResult("functional", FAIL, "x"), None, passed[0]),
        BaselineRun("a" * 40, FAIL, "y", 1.0, failure=passed[1]),
    )
    assert lab == "upstream-known" and "leaf Variable" in why and "shim" not in why
    elsewhere = failure_of(
        SHIM_TRACE.format(tree=base_tree, line=1).replace("_set_main", "_get_main"), base_tree, "resume"
    )
    assert label_case(out, BaselineRun("a" * 40, FAIL, "y", 1.0, failure=elsewhere))[0] == "unverified"
    cannot = BaselineRun("a" * 40, UNSUPPORTED, "pretrain_gpt.py cannot run on CPU: no CUDA home", 1.0)
    lab, why = label_case(out, cannot)
    assert lab == "unverified" and "cannot run it here (unsupported-in-proxy: pretrain_gpt.py cannot run on CPU" in why
    assert label_case(out, None)[0] == "unverified"


def test_a_rank_that_dies_without_an_exception_is_named_by_its_signal(tmp_path):
    """torchrun's summary, not its '=====' rule, is the reason when a rank is killed (8 ranks with TE on
    a 23 GB machine); killed the same way on both trees it is the proxy's artifact, named."""
    from rocmport.verify.stages.functional import CaseOutcome, failure_of
    from rocmport.verify.stages.functional.case_labels import BaselineRun, label_case
    from rocmport.verify.stages.functional.case_run import _failure
    from rocmport.verify.orchestration.stage_result import FAIL, StageResult

    stderr = textwrap.dedent("""\
        W1127 16:58:01 torch/distributed/elastic/multiprocessing/api.py:900] Sending process 4242 closing signal SIGTERM
        torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
        ============================================================
        pretrain_gpt.py FAILED
        ------------------------------------------------------------
        Root Cause (first observed failure):
        [0]:
          time      : 2026-11-27_16:58:01
          rank      : 5 (local_rank: 5)
          exitcode  : -9 (pid: 4247)
          error_file: <N/A>
          traceback : Signal 9 (SIGKILL) received by PID 4247
        ============================================================
        """)
    res = _failure(subprocess.CompletedProcess([], 1, "", stderr), tmp_path, True, None, "pretrain_gpt.py", 1.0, None)
    assert res.reason == "pretrain_gpt.py exited 1: a rank died of signal 9 (SIGKILL)"
    pf = failure_of(stderr, tmp_path, "run")
    assert pf.message == "a rank died of signal 9 (SIGKILL)"
    out = CaseOutcome("c", StageResult("functional", FAIL, res.reason), None, pf)
    lab, why = label_case(out, BaselineRun("a" * 40, FAIL, "y", 1.0, failure=failure_of(stderr, tmp_path / "b", "run")))
    assert lab == "proxy-artifact" and "OOM killer" in why
    # torchrun's SIGTERM to the survivors is no root cause; a signal is no message to compare two trees by
    sigterm = stderr.replace("Signal 9 (SIGKILL)", "Signal 15 (SIGTERM)")
    pf = failure_of(sigterm, tmp_path, "run")
    assert pf.message == "a rank died of signal 15 (SIGTERM)"
    out = CaseOutcome("c", StageResult("functional", FAIL, "x"), None, pf)
    lab, why = label_case(
        out, BaselineRun("a" * 40, FAIL, "y", 1.0, failure=failure_of(sigterm, tmp_path / "b", "run"))
    )
    assert lab == "unverified" and "nothing to compare" in why
    both = sigterm + stderr.replace("rank      : 5", "rank      : 2")
    assert failure_of(both, tmp_path, "run").message == "a rank died of signal 9 (SIGKILL)"
    # the real run's: one rank exits 17 (megatron's rerun state machine), torchrun SIGTERMs the rest
    rerun = sigterm + RERUN_EXIT.format(code=17)
    assert failure_of(rerun, tmp_path, "run").message.startswith(
        "a rank exited 17 without a Python exception (megatron's rerun state machine, EXIT_CODE_FAILED_ON_RESULT_VALIDATION"
    )
    # the rerun state machine's own account (megatron's log lines, as its logger writes them) names what failed
    told = (
        "[rank2]:ERROR:megatron.core.rerun_state_machine:Unexpected result nan on rank 2 at iteration #3 "
        "invocation #1 (message='found NaN in local grad norm for bucket #0 in backward pass before data-parallel "
        "communication collective')\n"
        "[rank2]:ERROR:megatron.core.rerun_state_machine:Rank 2, node h, device 0, iteration #3: First rerun: "
        "unexpected result is reproducible within the tolerance (nan = nan). Need to rerun on a different GPU to "
        "verify correctness.!\n"
    )
    assert "): Unexpected result nan on rank 2 at iteration #3" in failure_of(rerun, tmp_path, "run", told).message
    # as a real run writes them: megatron's log lines among the ranks' output, torchrun's summary on stderr
    proc = subprocess.CompletedProcess([], 1, told, rerun)
    message = _failure(proc, tmp_path, True, None, "pretrain_gpt.py", 1.0, None).reason
    assert message.endswith(
        "(megatron's rerun state machine, EXIT_CODE_FAILED_ON_RESULT_VALIDATION): "
        "Unexpected result nan on rank 2 at iteration #3 invocation #1 (message='found "
        "NaN in local grad norm for bucket #0 in backward pass before data-parallel communication collective'); "
        "First rerun: unexpected result is reproducible within the tolerance (nan = nan)"
    ), message


RERUN_EXIT = textwrap.dedent("""\
    torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
    ============================================================
    pretrain_gpt.py FAILED
    ------------------------------------------------------------
    Root Cause (first observed failure):
    [0]:
      time      : 2026-11-28_00:57:01
      rank      : 6 (local_rank: 6)
      exitcode  : {code} (pid: 4251)
      error_file: <N/A>
      traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
    ============================================================
    """)
NO_NVRX = textwrap.dedent("""\
    [rank0]: Traceback (most recent call last):
    [rank0]:   File "{tree}/megatron/core/dist_checkpointing/strategies/torch.py", line 80, in get_async_strategy
    [rank0]: ModuleNotFoundError: No module named 'nvidia_resiliency_ext'
    """)


def test_an_unverified_case_stopped_on_a_nan_loss_blocks_the_stage(tmp_path):
    """v0.19's FP8 case on the proxy stopped at iteration 2 on a NaN loss (a rank exits 16, Megatron's rerun
    state machine) while the unported tree stopped earlier (nvidia_resiliency_ext): labelled unverified, which
    let stage 4 pass on numerics that are the port's or the proxy's own emulation's. It blocks now; an
    unverified failure of another kind still does not."""
    from rocmport.verify.stages.functional import CaseOutcome, failure_of
    from rocmport.verify.stages.functional.case_labels import NUMERICS_BLOCK, BaselineRun, label_case
    from rocmport.verify.stages.functional.cases import CaseEntry, FunctionalCases, verdict
    from rocmport.verify.orchestration.stage_result import FAIL, PASS, StageResult

    base_tree = tmp_path / "base"
    base = BaselineRun("a" * 40, FAIL, "y", 20.0, failure=failure_of(NO_NVRX.format(tree=base_tree), base_tree, "run"))
    for code, blocks in (("16", True), ("17", True), ("1", False)):
        pf = failure_of(RERUN_EXIT.format(code=code), tmp_path, "run")
        assert pf.message.startswith(f"a rank exited {code} without a Python exception")
        label, why = label_case(CaseOutcome("c", StageResult("functional", FAIL, "x"), None, pf), base)
        assert label == "unverified" and (NUMERICS_BLOCK in why) is blocks, why
        entry = CaseEntry("c", FAIL, "pretrain_gpt.py (after 1 of 6 iterations) exited 1", failure=pf, baseline=base)
        entry.label, entry.label_reason = label, why
        assert entry.blocks is blocks
        status, reason = verdict(FunctionalCases("named", None, [entry]))
        assert status == (FAIL if blocks else PASS), reason
        assert reason.startswith("unverified: pretrain_gpt.py (after 1 of 6 iterations)")


def test_reach_picks_first_the_recorded_case_with_a_golden_for_the_runs_device_kind(tmp_path):
    """The real reach record through stage 4's options: the case with a golden for this run's device
    kind (cpu-proxy-te<version> with --te) first; a case whose recorded run failed not at all."""
    from rocmport.verify.analyses import reach

    tree = make_tree(tmp_path / "t", {GOOD: CONFIG, BREAKS: CONFIG, GPU_ONLY: CONFIG})
    series = tmp_path / "series"
    (series / "goldens").mkdir(parents=True)
    cases = {
        GOOD: reach.Entry(frozenset({"s1", "s2"}), 100.0, outcome="pass"),
        BREAKS: reach.Entry(frozenset({"s1", "s2", "s3"}), 10.0, outcome="fail"),  # most sites per second, fails
        GPU_ONLY: reach.Entry(frozenset({"s1", "s4"}), 20.0, outcome="pass"),
    }
    reach.write_record(series, reach.ReachRecord("v0.16", "c0ffee", reach.recipe_digest(series), "2.12.0", cases))
    # the run's TE layer (its version and its flavour's FP8 encoding are read)
    te = types.SimpleNamespace(version="2.12.0", flavour=types.SimpleNamespace(fp8="ocp"))
    opts, _ = functional_options(tree, series, None, "reach", 1, 1, None, False, 4, te=te, option="--cases")
    assert opts is not None and opts.cases == (GPU_ONLY, GOOD)  # no golden: the cover, without the failing case
    (series / "goldens" / f"{GOOD}.cpu-proxy-te2.12.0.json").write_text("{}")
    (series / "goldens" / f"{GPU_ONLY}.cpu-proxy.json").write_text("{}")  # another device kind's
    opts, _ = functional_options(tree, series, None, "reach", 1, 1, None, False, 4, te=te, option="--cases")
    assert opts is not None and opts.cases == (GOOD, GPU_ONLY)
    assert opts.note and f"{GOOD} first: it has a golden for this run's device kind" in opts.note
    assert f"1 recorded case did not pass when recorded ({BREAKS}: fail): not selected" in opts.note


def test_reach_does_not_pick_first_an_fp8_case_for_its_golden(tmp_path):
    """An FP8 case's golden is keyed by its casts' encoding (cpu-proxy-te<v>-fp8-fnuz under the rocm
    flavour on gfx942, -fp8-ocp otherwise) and drifted 2.5e-4 and 4e-4 on another machine of the
    same kind (a case without FP8: 1.5e-7): reach's golden-first pick does not take it, whichever
    encoding the run casts to; the cover orders the cases (seen failing when it was read: the FP8
    case stood first and ended unverified on the other machine)."""
    from rocmport.verify.analyses import reach

    tree = make_tree(tmp_path / "t", {GOOD: CONFIG, GPU_ONLY: CONFIG})
    series = tmp_path / "series"
    (series / "goldens").mkdir(parents=True)
    cases = {
        GOOD: reach.Entry(frozenset({"s1", "s2"}), 100.0, outcome="pass"),  # the FP8 case, say
        GPU_ONLY: reach.Entry(frozenset({"s1", "s4", "s5"}), 20.0, outcome="pass"),
    }
    reach.write_record(series, reach.ReachRecord("v0.19", "c0ffee", reach.recipe_digest(series), "2.17.1", cases))
    (series / "goldens" / f"{GOOD}.cpu-proxy-te2.17.1-fp8-fnuz.json").write_text("{}")

    def picked(encoding: str) -> tuple[str, ...]:
        te = types.SimpleNamespace(version="2.17.1", flavour=types.SimpleNamespace(fp8=encoding))
        opts, _ = functional_options(tree, series, None, "reach", 1, 1, None, False, 4, te=te, option="--cases")
        assert opts is not None
        return opts.cases

    assert picked("fnuz") == (GPU_ONLY, GOOD)
    assert picked("ocp") == (GPU_ONLY, GOOD)


@pytest.mark.torch
def test_the_unported_trees_cached_run_is_not_reused_for_a_run_in_another_environment(tmp_path):
    """The unported tree's run is cached by the run's args, torch, TE...; an FSDP case that ran under
    the launch profile's CUDA_DEVICE_MAX_CONNECTIONS=1 (stopping at upstream's assertion) must not stand
    in for the same case run without it (the plan unsets it now): what verify unset is in the key."""
    from rocmport.verify.orchestration.stage_result import FAIL, StageResult
    from rocmport.verify.stages.functional.case_labels import run_baseline
    from rocmport.verify.stages.functional.case_run import CaseOutcome
    from rocmport.verify.stages.functional.details import FunctionalRun

    tree = make_tree(tmp_path / "t", {GOOD: CONFIG})
    base = port(tree, THING_UPSTREAM_BUG)
    ran: list[str] = []

    def run(checkout: Path, env: dict) -> CaseOutcome:
        ran.append(str(checkout))
        return CaseOutcome(GOOD, StageResult("functional", FAIL, f"stopped, run {len(ran)}"))

    def outcome(proxy_env: dict) -> CaseOutcome:
        return CaseOutcome(
            GOOD,
            StageResult("functional", FAIL, "x"),
            FunctionalRun(GOOD, "torchrun pretrain_gpt.py --a 1", [], 4, proxy_env),
        )

    before = outcome({"TORCHDYNAMO_DISABLE=1": "why"})
    after = outcome({"TORCHDYNAMO_DISABLE=1": "why", "CUDA_DEVICE_MAX_CONNECTIONS unset (it was 1)": "why"})
    env = {"PYTHONPATH": str(tree)}  # the runs' environment: the tree first on the path
    first = run_baseline(tree, base, before, env, tmp_path / "cache", run)
    assert not first.cached and run_baseline(tree, base, before, env, tmp_path / "cache", run).cached
    again = run_baseline(tree, base, after, env, tmp_path / "cache", run)
    assert not again.cached and again.reason == "stopped, run 2" and len(ran) == 2
    # a case decided by upstream's checks: a run cached before verify decided them is no baseline for one that does
    assert after.run is not None
    after.run.upstream_checks = {"exit_status_decides": False, "checks": [{"check": "check_log -F 'x'"}]}
    checked = run_baseline(tree, base, after, env, tmp_path / "cache", run)
    assert not checked.cached and len(ran) == 3
    assert run_baseline(tree, base, after, env, tmp_path / "cache", run).cached


@pytest.mark.torch
def test_the_unported_trees_cached_run_is_not_reused_under_another_proxy_shim(tmp_path, monkeypatch):
    """The proxy's ranks run verify's runtime code beside the tree: the virtual-pipeline cases' NaN (gloo
    sending a stage's output freed in flight) was the shim's, and after the shim held that memory the
    port's run was still labelled against the unported tree's cached NaN. A changed runtime source is a
    new key; the same sources elsewhere are the same key."""
    import shutil

    from rocmport.verify import runtime
    from rocmport.verify.orchestration.stage_result import FAIL, StageResult
    from rocmport.verify.stages.functional import case_labels
    from rocmport.verify.stages.functional.case_run import CaseOutcome
    from rocmport.verify.stages.functional.details import FunctionalRun

    tree = make_tree(tmp_path / "t", {GOOD: CONFIG})
    base = port(tree, THING_UPSTREAM_BUG)
    ran: list[str] = []

    def run(checkout: Path, env: dict) -> CaseOutcome:
        ran.append(str(checkout))
        return CaseOutcome(GOOD, StageResult("functional", FAIL, f"stopped, run {len(ran)}"))

    failed = CaseOutcome(
        GOOD, StageResult("functional", FAIL, "x"), FunctionalRun(GOOD, "torchrun pretrain_gpt.py --a 1", [], 4, {})
    )
    env = {"PYTHONPATH": str(tree)}
    assert not case_labels.run_baseline(tree, base, failed, env, tmp_path / "cache", run).cached
    copy = tmp_path / "runtime"
    shutil.copytree(runtime.SOURCES, copy, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(runtime, "SOURCES", copy)
    assert case_labels.run_baseline(tree, base, failed, env, tmp_path / "cache", run).cached  # same sources
    shim = copy / "proxy_shim.py"
    shim.write_text(shim.read_text() + "\n# a fix\n")
    again = case_labels.run_baseline(tree, base, failed, env, tmp_path / "cache", run)
    assert not again.cached and again.reason == "stopped, run 2" and len(ran) == 2


def test_reach_without_te_keeps_the_records_local_cases_or_todays_default(tmp_path, monkeypatch):
    """A record made with TE's layer picks TE cases; a run without TE must not select them (they
    would stop at TE's import): the record's local cases run, or today's default case."""
    te_case = "gpt3_mcore_te_tp1_pp1"
    tree = make_tree(tmp_path / "t", {GOOD: CONFIG, te_case: CONFIG.replace("  --transformer-impl: local\n", "")})
    picked: list[list[str]] = []
    fake = types.ModuleType("rocmport.verify.analyses.reach")
    fake.reach_cases = lambda series_dir, t, golden=(): (picked[-1], "reach record")  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "rocmport.verify.analyses.reach", fake)
    import rocmport.verify.analyses as analyses

    monkeypatch.setattr(analyses, "reach", fake, raising=False)
    picked.append([te_case])
    opts, _ = functional_options(tree, tmp_path / "series", None, "reach", 1, 1, None, False, 4, option="--cases")
    assert opts is not None and opts.cases == (GOOD,) and opts.defaulted
    assert (
        opts.note
        == f"the reach record's cases ({te_case}) need Transformer Engine, not usable here (--te): today's default case"
    )
    picked.append([te_case, GOOD])
    opts, _ = functional_options(tree, tmp_path / "series", None, "reach", 1, 1, None, False, 4, option="--cases")
    assert opts is not None and opts.cases == (GOOD,) and not opts.defaulted
    assert opts.note == f"reach record (without Transformer Engine here, not: {te_case})"


# --- upstream's AFTER_SCRIPT checks decide the cases that carry them ---------------------------------

CHECKED = "gpt3_mcore_tp1_pp1_reruns_uninstall_te"
PORTED_OK = "# rocmport: a guarded import\n\n" + THING_OK  # a port that changes nothing the case runs
CHECK_LOG = 'check_log() { if [[ -z $(grep -r $1 "$2" $LOG_DIR) ]]; then exit 1; else echo OK; fi }'


def checked_case(log: str, *checks: str, exit_after: int | None = None, exit_zero: bool = True) -> str:
    """CONFIG with upstream's check idioms (as in gpt3_mcore_reruns_persistent_1) and the canned run's own line."""
    args = f"  --fake-log: '{log}'\n" + (f"  --fake-exit: {exit_after}\n" if exit_after else "")
    script = [CHECK_LOG, *checks, *(["EXIT_CODE=0"] if exit_zero else [])]
    return (
        CONFIG.replace("MODEL_ARGS:\n", "MODEL_ARGS:\n" + args, 1)
        + "AFTER_SCRIPT: |\n"
        + "".join(f"  {line}\n" for line in script)
    )


@pytest.mark.torch
@pytest.mark.slow
def test_a_run_that_stops_on_purpose_passes_by_upstreams_checks_with_nothing_to_resume(tmp_path, capsys):
    config = checked_case(
        "Saving a checkpoint and exiting now. Please resume the job",
        'check_log -F "Saving a checkpoint and exiting now"',
        'check_log -E "exiting (now|later)\\. Please"',
        exit_after=2,
    )
    tree = make_tree(tmp_path / "t", {CHECKED: config})
    port(tree, PORTED_OK)
    rc, report, err = verify_json(tmp_path, capsys, tree, "--cases", CHECKED, "--resume")
    assert rc == 0, err
    entry = report["functional"]["cases"][0]
    assert entry["status"] == "pass", entry
    assert entry["upstream_checks"]["exit_status_decides"] is False
    assert [c["passed"] for c in entry["upstream_checks"]["checks"]] == [True, True]
    assert "upstream's checks pass on the run's log (2 of 2)" in entry["reason"]
    assert "stopped after 2 of 4 iterations, exit" in entry["reason"]
    assert "stopped at iteration 2" in entry["resume"]["skipped"]
    # without EXIT_CODE=0 the exit status decides, as upstream's launcher has it
    tree2 = make_tree(tmp_path / "t2", {CHECKED: config.replace("  EXIT_CODE=0\n", "")})
    port(tree2, PORTED_OK)
    rc, report, err = verify_json(tmp_path, capsys, tree2, "--cases", CHECKED)
    assert report["functional"]["cases"][0]["status"] == "fail"


@pytest.mark.torch
@pytest.mark.slow
def test_a_check_failing_on_both_trees_is_labelled_naming_it_and_the_proxys_own_is_a_proxy_artifact(tmp_path, capsys):
    stale = checked_case(
        "Overwriting rerun_state_machine.current_iteration from 0 to 1...",
        'check_log -F "Setting rerun_state_machine.current_iteration to 0..."',
    )
    # megatron's rerun state machine prints torch.cuda.current_device(), which the proxy answers 'cpu'
    device = checked_case(
        "ERROR:megatron.core.rerun_state_machine:Rank 0, node vm, device cpu, iteration #2: Possible error!!",
        'check_log -E "Rank [0-9]+, node [a-z]+, device [0-9]+, iteration"',
    )
    tree = make_tree(tmp_path / "t", {CHECKED: stale, CHECKED + "_device": device})
    base = port(tree, PORTED_OK)
    rc, report, err = verify_json(tmp_path, capsys, tree, "--cases", f"{CHECKED},{CHECKED}_device")
    assert rc == 0, err
    first, second = report["functional"]["cases"]
    assert first["status"] == "fail" and first["label"] == "upstream-known", first
    assert first["failure"]["phase"] == "check"
    assert "check_log -F 'Setting rerun_state_machine.current_iteration to" in first["reason"]
    assert first["baseline"]["commit"] == base and first["baseline"]["status"] == "fail"
    # the label's reason names the check as the YAML has it (its figures are the YAML's, not a run's)
    assert "check_log -F 'Setting rerun_state_machine.current_iteration to 0...'" in first["label_reason"]
    assert second["label"] == "proxy-artifact", second
    assert "current_device" in second["label_reason"] and "answered 'cpu'" in second["label_reason"]
    assert second["upstream_checks"]["checks"][0]["proxy_cause"].startswith("the CPU proxy's shim answers")


def test_dry_run_says_a_case_is_decided_by_upstreams_checks(tmp_path, capsys):
    config = checked_case("x", 'check_log -F "Result validation enabled"')
    tree = make_tree(tmp_path / "t", {CHECKED: config, GOOD: CONFIG})
    assert main(["verify", "--tree", str(tree), "--stages", "4", "--cases", f"{CHECKED},{GOOD}", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert out.count("# decided by upstream's AFTER_SCRIPT checks (1 check of the run's log, EXIT_CODE=0") == 1
    assert "check_log -F 'Result validation enabled'" in out


# What the v0.16 sweep's resumed run of gpt3_mcore_te_tp1_pp4_vp1_..._overlap_optimizer left: exit 0, a
# DataLoader warning's source line last on stderr, iterations 6 and 7 of 6-10 in the log.
EXIT_0_SHORT_STDERR = textwrap.dedent("""\
    /venv/lib/python3.11/site-packages/torch/utils/data/dataloader.py:1118: UserWarning: This DataLoader will create 1 worker processes
      super().__init__(loader)
    """)
EXIT_0_SHORT_STDOUT = "".join(
    f" [2026-11-28 02:50:0{i}] iteration        {i}/      10 | consumed samples: {32 * i} | lm loss: 6.{i}00000E+00 |\n"
    for i in (6, 7)
)


def test_a_run_that_exits_0_short_of_its_iterations_says_which_it_logged(tmp_path):
    """A run that exits 0 without logging every wanted iteration fails by that, naming the iterations it did
    log, never by a stray stderr line (the sweep's reason was "exited 0:   super().__init__(loader)"); the two
    trees' failures compare by those words."""
    from rocmport.verify.orchestration.launcher import Launcher
    from rocmport.verify.stages.functional.case_args import ResumeSupport
    from rocmport.verify.stages.functional.case_log import loss_steps, short_of_iterations
    from rocmport.verify.stages.functional.case_run import CaseSetup, _stopped

    assert short_of_iterations([6, 7], range(6, 11)) == "exited 0 having logged iterations 6-7 of 6-10"
    assert short_of_iterations([], range(6, 11)) == "exited 0 having logged none of 6-10"
    assert short_of_iterations([6, 8, 9], range(6, 11)) == "exited 0 having logged iterations 6, 8-9 of 6-10"
    assert (
        short_of_iterations([1, 2, 3], range(6, 11))
        == "exited 0 having logged none of 6-10 (and iterations 1-3, outside them)"
    )
    setup = CaseSetup(
        tmp_path,
        {},
        "c",
        {},
        None,
        8,
        10,
        True,
        None,
        Launcher(),
        True,
        None,
        False,
        ResumeSupport(True, True, True, False),
    )
    proc = subprocess.CompletedProcess([], 0, EXIT_0_SHORT_STDOUT, EXIT_0_SHORT_STDERR)
    logged = loss_steps(EXIT_0_SHORT_STDOUT)
    out = _stopped(setup, proc, "the run resumed from iteration 5", "resume", 0.0, None, logged, range(6, 11))
    assert out.result.status == "fail"
    assert out.result.reason == "the run resumed from iteration 5 exited 0 having logged iterations 6-7 of 6-10"
    assert out.failure is not None and out.failure.phase == "resume"
    assert out.failure.message == "exited 0 having logged iterations 6-7 of 6-10"
    # the uninterrupted run the same way, over 1-10; a run that exits non-zero keeps its exception
    first = _stopped(
        setup,
        subprocess.CompletedProcess([], 0, "", EXIT_0_SHORT_STDERR),
        "pretrain_gpt.py",
        "run",
        0.0,
        None,
        {},
        range(1, 11),
    )
    assert first.result.reason == "pretrain_gpt.py exited 0 having logged none of 1-10"
    crashed = subprocess.CompletedProcess([], 1, "", "[rank0]: ValueError: boom\n")
    assert (
        _stopped(setup, crashed, "x", "run", 0.0, None, {}, range(1, 11)).result.reason
        == "x exited 1: ValueError: boom"
    )


def test_the_resumed_run_loads_from_a_directory_whose_tracker_names_the_half_way_iteration(tmp_path):
    """Upstream's load_checkpoint reads the checkpoint tracker again for the legacy format's distributed-optimizer
    state and takes its iteration, whatever --ckpt-step says: the v0.16 sweep's resumed run of
    gpt3_mcore_te_tp1_pp4_vp1_..._overlap_optimizer (--ckpt-format torch) loaded iteration 10 beside --ckpt-step 5
    and exited 0 without training. The resumed run loads from a directory whose tracker names iteration 5,
    the uninterrupted run's iteration-5 checkpoint in it, and nothing of iteration 10."""
    from rocmport.verify.stages.functional.case_run import TRACKER, checkpoint_at

    saved = tmp_path / "ckpt"
    for it in (5, 10):
        (saved / f"iter_{it:07d}" / "mp_rank_00_000").mkdir(parents=True)
        (saved / f"iter_{it:07d}" / "mp_rank_00_000" / "distrib_optim.pt").write_text(f"state at {it}")
    (saved / TRACKER).write_text("10")
    at = checkpoint_at(saved, 5, tmp_path / "ckpt-at-5")
    assert at == tmp_path / "ckpt-at-5"
    assert (at / TRACKER).read_text().strip() == "5"
    assert (at / "iter_0000005" / "mp_rank_00_000" / "distrib_optim.pt").read_text() == "state at 5"
    assert sorted(p.name for p in at.iterdir()) == ["iter_0000005", TRACKER]
    assert (saved / TRACKER).read_text() == "10"  # the uninterrupted run's directory as it was
    # no iteration-5 checkpoint: the uninterrupted run's directory, whose load then fails naming it
    assert checkpoint_at(saved, 7, tmp_path / "ckpt-at-7") == saved and not (tmp_path / "ckpt-at-7").exists()
