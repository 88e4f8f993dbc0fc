"""The JSON of a verify report and of a refresh result keeps its keys and shape while the results are
typed down to the renderers (#32: `to_dict()` only at the JSON boundary). Each expected shape below was
recorded from a real run of the code before the typed results (2df8846); the runs here are real too:
a verify of a small tree, and refreshes of a real local upstream that stop on a conflict, that verify
and fail, and that are carried over unverified."""

from __future__ import annotations

import json
import re

import pytest

from rocmport.cli import main
from tests.helpers.refresh import LAYERS, Ported, edit_line
from tests.helpers.sync import commit, g

# Mappings whose keys are data (a module, a test id, a codemod, an upstream), not schema: one "*".
VARIABLE = {
    "env.components",
    "env.launcher_env",
    "port_sites",
    "bridge_port_sites",
    "port_sites.*.unreached",
    "port_sites.*.ran",
    "training.redirects",
    "upstreams",
    "old_lock.upstreams",
    "new_lock.upstreams",
    "verify.labels",
    "upstreams.*.dropped",
    "stages.failures",  # stage 1: per module that failed
    "verify.stages.failures",
    "stages.labels",  # stage 3: per test id
    "stages.label_reasons",
    "stages.outcomes",
    "stages.on_baseline",
    "stages.files",
    "stages.why",  # stage 3: per test file selected
    "stages.file_seconds",
    "cached",  # status: per upstream
    "lock.upstreams",
    "worktrees",
    "mismatches",  # status: per upstream whose work tree the lock does not describe
    "tags",  # the bot's record: per release
}


def shape(value, path: str = "") -> set[str]:
    """Every key path of ``value`` with its leaf type ("stages[].status: str"); lists as ``[]``; the keys
    of a mapping in VARIABLE (named without ``[]``) as ``*``."""
    here = {f"{path}: {type(value).__name__}"} if path else set()
    if isinstance(value, dict):
        generic = re.sub(r"\[\]", "", path) in VARIABLE
        out = set(here)
        for key, item in value.items():
            out |= shape(item, f"{path}.{'*' if generic else key}" if path else ("*" if generic else key))
        return out
    if isinstance(value, list):
        out = set(here)
        for item in value:
            out |= shape(item, f"{path}[]")
        return out
    return here


@pytest.mark.torch
def test_the_verify_report_of_a_real_run_keeps_its_json_shape(tmp_path, capsys):
    from tests.test_verify import minimal_tree

    tree = minimal_tree(tmp_path / "t", "def model_parallel_cuda_manual_seed(seed):\n    pass\n")
    main(["-C", str(tmp_path), "verify", "--tree", str(tree), "--json"])
    got = shape(json.loads(capsys.readouterr().out))
    assert got == VERIFY_SHAPE, (sorted(got - VERIFY_SHAPE), sorted(VERIFY_SHAPE - got))


@pytest.mark.torch
@pytest.mark.slow
def test_stage_3_s_entry_of_a_real_run_keeps_its_json_shape(tmp_path, capsys):
    """Stage 3's own keys (its typed UnitTestsRun's to_dict()), from a real run that labels a port
    regression and an upstream-known failure against the unported tree."""
    from rocmport.port import worktree as wt
    from tests.test_unit_stage import upstream_repo

    tree, base = upstream_repo(tmp_path / "up")
    g(tree, "checkout", "-q", base, "--", "megatron")
    wt.write_state(tree, wt.ApplyState(status="done", base=base))
    ops = tree / "megatron" / "core" / "mathops.py"
    ops.write_text(ops.read_text().replace("a + b\n\n\ndef mul", "a + b + 1\n\n\ndef mul"))  # a port bug
    argv = ["-C", str(tmp_path), "verify", "--tree", str(tree), "--stages", "unit-tests", "--unit-nproc", "2"]
    assert main([*argv, "--unit-test", "tests/unit_tests/test_ops.py", "--json"]) == 1
    stage = json.loads(capsys.readouterr().out)["stages"][2]
    assert stage["labels"]["tests/unit_tests/test_ops.py::test_add"] == "port-regression"
    got = shape(stage, "stages[]")
    assert got == UNIT_STAGE_SHAPE, (sorted(got - UNIT_STAGE_SHAPE), sorted(UNIT_STAGE_SHAPE - got))


def _refresh(port, capsys, *args) -> set[str]:
    capsys.readouterr()
    port.run("refresh", *args, "--json")
    printed = json.loads(capsys.readouterr().out)
    assert printed.pop("summary")  # the path of summary.md: --json's own, not the result's
    assert printed == port.summary  # summary.json is the same result
    return shape(printed)


def test_a_refresh_result_that_stops_on_a_conflict_keeps_its_json_shape(tmp_path, monkeypatch, capsys):
    port = Ported(tmp_path, monkeypatch)
    port.tag({"megatron/core/layers.py": edit_line(LAYERS, 30, "line 30 upstream")}, "core_v0.17.0", "0.17.0")
    got = _refresh(port, capsys, "--to", "v0.17", "--no-verify")
    assert got == REFRESH_CONFLICT_SHAPE, (sorted(got - REFRESH_CONFLICT_SHAPE), sorted(REFRESH_CONFLICT_SHAPE - got))


def test_a_refresh_result_carried_over_keeps_its_json_shape(tmp_path, monkeypatch, capsys):
    port = Ported(tmp_path, monkeypatch)
    port.tag({"megatron/core/layers.py": "x\n" + LAYERS}, "core_v0.17.0", "0.17.0")
    got = _refresh(port, capsys, "--to", "v0.17", "--no-verify")
    assert got == REFRESH_CARRIED_SHAPE, (sorted(got - REFRESH_CARRIED_SHAPE), sorted(REFRESH_CARRIED_SHAPE - got))


@pytest.mark.torch
def test_a_refresh_result_whose_verify_failed_keeps_its_json_shape(tmp_path, monkeypatch, capsys):
    port = Ported(tmp_path, monkeypatch)
    port.tag({"megatron/core/__init__.py": "import rocmport_test_no_such_package  # noqa\n"}, "core_v0.17.0", "0.17.0")
    got = _refresh(port, capsys, "--to", "v0.17", "--tp", "1", "--pp", "1")
    assert got == REFRESH_VERIFY_SHAPE, (sorted(got - REFRESH_VERIFY_SHAPE), sorted(REFRESH_VERIFY_SHAPE - got))


def test_the_status_of_a_ported_project_keeps_its_json_shape(tmp_path, monkeypatch, capsys):
    """`rocmport status --json` of a ported work tree: no last verify, one read back, one unreadable."""
    port = Ported(tmp_path, monkeypatch)
    last = port.root / "build" / "verify" / "last.json"
    for written, extra in (
        (None, {"last_verify: NoneType"}),
        (
            {
                "tree": "t",
                "line": "v0.16",
                "commit": "abc",
                "started": "2026-11-26T01:30:00Z",
                "verdict": "v",
                "report": "r.json",
                "stages": [{"name": "imports", "status": "fail"}],
            },
            STATUS_LAST_SHAPE,
        ),
        ("{", STATUS_BROKEN_SHAPE),
    ):
        if written is not None:
            last.parent.mkdir(parents=True, exist_ok=True)
            last.write_text(written if isinstance(written, str) else json.dumps(written))
        capsys.readouterr()
        assert main(["-C", str(port.root), "status", "--json"]) == 0
        got = shape(json.loads(capsys.readouterr().out))
        assert got == STATUS_SHAPE | extra, (sorted(got - STATUS_SHAPE - extra), sorted(STATUS_SHAPE | extra - got))


STATUS_SHAPE: set[str] = {
    "cache_dir: str",
    "cached.*: bool",
    "cached: dict",
    "lock.schema_version: int",
    "lock.upstreams.*.commit: str",
    "lock.upstreams.*.commit_date: str",
    "lock.upstreams.*.requested_ref: str",
    "lock.upstreams.*.resolved_ref: str",
    "lock.upstreams.*.source: str",
    "lock.upstreams.*.url: str",
    "lock.upstreams.*.version: str",
    "lock.upstreams.*: dict",
    "lock.upstreams: dict",
    "lock: dict",
    "lock_path: str",
    "mismatches: dict",
    "worktrees.*.apply_status: str",
    "worktrees.*.base: str",
    "worktrees.*.branch: str",
    "worktrees.*.clean: bool",
    "worktrees.*.head: str",
    "worktrees.*.path: str",
    "worktrees.*.series: str",
    "worktrees.*.series_hash: str",
    "worktrees.*: dict",
    "worktrees: dict",
}

STATUS_LAST_SHAPE: set[str] = {
    "last_verify.commit: str",
    "last_verify.failed: list",
    "last_verify.failed[]: str",
    "last_verify.line: str",
    "last_verify.path: str",
    "last_verify.report: str",
    "last_verify.started: str",
    "last_verify.tree: str",
    "last_verify.verdict: str",
    "last_verify: dict",
}

STATUS_BROKEN_SHAPE: set[str] = {
    "last_verify.error: str",
    "last_verify.path: str",
    "last_verify: dict",
}

VERIFY_SHAPE: set[str] = {
    "backend: str",
    "commit: NoneType",
    "dp: int",
    "env.components: dict",
    "env.cuda: NoneType",
    "env.device_count: int",
    "env.devices: list",
    "env.firewall_profile: str",
    "env.hip: NoneType",
    "env.launcher_env.*: str",
    "env.launcher_env: dict",
    "env.python: str",
    "env.torch: str",
    "env: dict",
    "hip_sim.arch: str",
    "hip_sim.device: str",
    "hip_sim.version: str",
    "hip_sim: dict",
    "launcher.kind: str",
    "launcher.nnodes: int",
    "launcher.node_rank: int",
    "launcher.rdzv_endpoint: NoneType",
    "launcher: dict",
    "line: NoneType",
    "mode: str",
    "port_sites: dict",
    "pp: int",
    "stages: list",
    "stages[].failures: dict",
    "stages[].modules: list",
    "stages[].modules[]: str",
    "stages[].applicable: bool",
    "stages[].name: str",
    "stages[].reason: str",
    "stages[].seconds: float",
    "stages[].status: str",
    "stages[]: dict",
    "started: str",
    "te: NoneType",
    "tp: int",
    "training: dict",
    "tree: str",
    "verdict: str",
    "world_size: int",
}


def lock_shape(key: str) -> set[str]:
    """The shape of an upstream.lock as a result carries it under ``key`` (old_lock, new_lock)."""
    fields = ["commit", "commit_date", "requested_ref", "resolved_ref", "source", "url", "version"]
    return {
        f"{key}.schema_version: int",
        *(f"{key}.upstreams.*.{name}: str" for name in fields),
        f"{key}.upstreams.*: dict",
        f"{key}.upstreams: dict",
        f"{key}: dict",
    }


# What every refresh result has, whatever its outcome; and a hop's per-upstream record, where it got that far.
REFRESH_BASE: set[str] = {
    *lock_shape("new_lock"),
    "notes: list",
    *lock_shape("old_lock"),
    "problems: list",
    "promoted: list",
    "range_diff: str",
    "seconds: float",
    "status: str",
    "to: str",
    "why: str",
}
REFRESH_UPSTREAMS: set[str] = {
    "upstreams.*.codemods: list",
    "upstreams.*.created: bool",
    "upstreams.*.dropped: dict",
    "upstreams.*.from.commit: str",
    "upstreams.*.from.ref: str",
    "upstreams.*.from: dict",
    "upstreams.*.from_series: str",
    "upstreams.*.patches: list",
    "upstreams.*.patches[].action: str",
    "upstreams.*.patches[].bucket: str",
    "upstreams.*.patches[].detail: str",
    "upstreams.*.patches[].evidence: str",
    "upstreams.*.patches[].name: str",
    "upstreams.*.patches[]: dict",
    "upstreams.*.series: str",
    "upstreams.*.to.commit: str",
    "upstreams.*.to.ref: str",
    "upstreams.*.to: dict",
    "upstreams.*: dict",
    "upstreams: dict",
}

REFRESH_CONFLICT_SHAPE: set[str] = {
    "conflict.detail: str",
    "conflict.files: list",
    "conflict.files[]: str",
    "conflict.hunks: list",
    "conflict.hunks[].file: str",
    "conflict.hunks[].line: int",
    "conflict.hunks[]: dict",
    "conflict.patch: str",
    "conflict.tree: str",
    "conflict.upstream: str",
    "conflict: dict",
    *REFRESH_BASE,
    "upstreams: dict",
    "verify: NoneType",
}

REFRESH_CARRIED_SHAPE: set[str] = {
    "conflict: NoneType",
    *REFRESH_BASE,
    "promoted[]: str",
    *REFRESH_UPSTREAMS,
    "verify: NoneType",
}

REFRESH_VERIFY_SHAPE: set[str] = {
    "conflict: NoneType",
    *REFRESH_BASE,
    *REFRESH_UPSTREAMS,
    "verify.failed: list",
    "verify.failed[]: str",
    "verify.labels.*: str",
    "verify.labels: dict",
    "verify.mode: str",
    "verify.stages: list",
    "verify.stages[].failures.*.chain: list",
    "verify.stages[].failures.*.chain[]: str",
    "verify.stages[].failures.*.error: str",
    "verify.stages[].failures.*.missing: str",
    "verify.stages[].failures.*: dict",
    "verify.stages[].failures: dict",
    "verify.stages[].modules: list",
    "verify.stages[].modules[]: str",
    "verify.stages[].applicable: bool",
    "verify.stages[].name: str",
    "verify.stages[].reason: str",
    "verify.stages[].seconds: float",
    "verify.stages[].status: str",
    "verify.stages[]: dict",
    "verify: dict",
}


def test_the_typed_stage_data_writes_the_keys_the_stages_wrote():
    """Stage 2's, 4's and 5's data as the stages wrote them at 2df8846 (stage 2's from a real v0.16
    CPU-proxy report; stage 4's and 5's from their code): optional keys only when set."""
    from rocmport.verify.stages.bridge import BridgeTraining
    from rocmport.verify.stages.functional import (
        FunctionalRun,
        GoldenComparison,
        ResumeCheck,
        ResumeSkipped,
        UpstreamGolden,
    )
    from rocmport.verify.stages.gpt_training import MoeNotRun, MoeRun, Training

    training = Training([4.8, 3.6], [4.8, 3.6], 4.8e-07, True, {"Tensor.cuda @ x.py:1": 1}, 3.7e-05)
    assert set(training.to_dict()) == {
        "losses",
        "max_abs_diff",
        "redirects",
        "reference_losses",
        "tied_embeddings_equal",
        "tolerance",
    }
    training.moe = MoeNotRun("why")
    assert training.to_dict()["moe"] == {"not_run": "why"}
    # the keys the MoE case's dict had before it was typed (926c5ea's _moe_check, and its redirects)
    training.moe = MoeRun([4.8, 3.6], [4.8, 3.6], 1e-7, 7e-3, 5e-2, 5e-5)
    assert set(training.to_dict()["moe"]) == {
        "losses",
        "reference_losses",
        "first_abs_diff",
        "max_abs_diff",
        "tolerance",
        "first_tolerance",
        "experts",
        "ep",
        "redirects",
    }
    assert set(BridgeTraining([1.0], True).to_dict()) == {"losses", "tied_embeddings_equal"}
    run = FunctionalRun("gpt3_mcore_tp1_pp1", "torchrun ...", [10.6, 10.4], 2)
    always = {"case", "command", "losses", "iters", "proxy_env", "chosen_args", "log_tail"}
    assert set(run.to_dict()) == always
    run.redirects, run.resume_log_tail = {}, []
    run.resume = ResumeCheck(3, 3, 0.0, 1e-5, True, [9.9], params_norm_max_abs_diff=0.0, averaged_iteration=5)
    run.golden = GoldenComparison("g.json", max_rel_drift=0.0, tolerance=0.05, hip_sim="7.1")
    run.upstream_golden_a100 = UpstreamGolden("a100.json", [(1, 10.9, 10.8)], "step 1: 10.9000 vs 10.8000")
    data = run.to_dict()
    assert set(data) == always | {"redirects", "resume_log_tail", "resume", "golden", "upstream_golden_a100"}
    # the keys each had as a dict before it was typed (926c5ea's stage_functional and upstream_golden)
    assert set(data["resume"]) == {
        "from_iteration",
        "loaded_iteration",
        "max_abs_diff",
        "tolerance",
        "async_save",
        "losses",
        "params_norm_max_abs_diff",
        "averaged_iteration",
    }
    assert set(data["golden"]) == {"path", "max_rel_drift", "tolerance", "hip_sim"}
    assert data["upstream_golden_a100"] == {
        "path": "a100.json",
        "steps": [{"step": 1, "a100": 10.9, "here": 10.8}],
        "summary": "step 1: 10.9000 vs 10.8000",
    }
    assert GoldenComparison("g.json", other_args="why").to_dict() == {"path": "g.json", "other_args": "why"}
    assert ResumeSkipped("why").to_dict() == {"skipped": "why"}


def _bot(port, capsys, *args) -> tuple[list[dict], dict]:
    """`bot --once --no-verify --json`: what it printed, and the record it left on disk."""
    capsys.readouterr()
    port.run("bot", "--once", "--no-verify", *args, "--json")
    printed = json.loads(capsys.readouterr().out)
    assert set(printed) == {"processed"}
    return printed["processed"], json.loads((port.root / ".rocmport" / "bot-state.json").read_text())


def test_the_bots_json_and_its_record_keep_their_shape(tmp_path, monkeypatch, capsys):
    """`bot --json` and .rocmport/bot-state.json for each kind of release the bot handles: built
    (not-verified), built earlier and pushed now, built and pushed in one run, refused for a human's
    commits on its branch, and stopped on a conflict (with summary.md's text)."""
    port = Ported(tmp_path, monkeypatch)
    remote = tmp_path / "remote.git"
    g(tmp_path, "init", "-q", "--bare", str(remote))
    port.tag({"docs/index.md": "a\n"}, "core_v0.17.0", "0.17.0")
    (built,), record = _bot(port, capsys)
    assert built["status"] == "not-verified" and shape(built) == BOT_BUILT_SHAPE, sorted(shape(built))
    assert shape(record) == BOT_RECORD_SHAPE | BOT_RECORD_BUILT_SHAPE, sorted(shape(record))
    (pushed,), record = _bot(port, capsys, "--push", str(remote))
    assert pushed["push"] == "pushed" and shape(pushed) == BOT_PUSHED_SHAPE, sorted(shape(pushed))
    assert shape(record) == BOT_RECORD_SHAPE | BOT_RECORD_PUSHED_SHAPE, sorted(shape(record))
    # A branch with a human's commits on it is not rebuilt: needs a human, with no summary.
    port.tag({"docs/index.md": "b\n"}, "core_v0.17.1", "0.17.1")
    g(port.root, "checkout", "-q", "-b", "rocmport/refresh-core_v0.17.1")
    commit(port.root, {"NOTE.md": "mine\n"}, "a human's note")
    g(port.root, "checkout", "-q", "main")
    (human,), record = _bot(port, capsys)
    assert human["status"] == "needs-a-human" and shape(human) == BOT_HUMAN_SHAPE, sorted(shape(human))
    assert shape(record) == BOT_RECORD_SHAPE | BOT_RECORD_PUSHED_SHAPE | BOT_RECORD_HUMAN_SHAPE, sorted(shape(record))
    port.tag({"docs/index.md": "c\n"}, "core_v0.17.2", "0.17.2")
    (fresh,), record = _bot(port, capsys, "--push", str(remote))
    assert fresh["tag"] == "core_v0.17.2" and shape(fresh) == BOT_BUILT_SHAPE | BOT_PUSH_KEYS, sorted(shape(fresh))
    port.tag({"megatron/core/layers.py": edit_line(LAYERS, 30, "line 30 upstream")}, "core_v0.17.3", "0.17.3")
    (conflict,), record = _bot(port, capsys)
    assert conflict["reason"] == "conflict in 0002-layers-thirty.patch"
    assert shape(conflict) == BOT_HUMAN_SHAPE | {"summary: str"}, sorted(shape(conflict))
    assert shape(record) == BOT_RECORD_SHAPE | BOT_RECORD_PUSHED_SHAPE | BOT_RECORD_HUMAN_SHAPE, sorted(shape(record))
    assert set(record["tags"]) == {f"core_v0.17.{n}" for n in range(4)}


# Recorded from the bot at fa1b8ce (results as dicts), before they were typed.
BOT_PUSH_KEYS: set[str] = {"push: str", "pushed_to: str"}
BOT_BUILT_SHAPE: set[str] = {
    "tag: str",
    "status: str",
    "commit: str",
    "inputs: str",
    "branch: str",
    "summary_file: str",
    "reason: str",
}
BOT_PUSHED_SHAPE: set[str] = (BOT_BUILT_SHAPE - {"inputs: str"}) | BOT_PUSH_KEYS
BOT_HUMAN_SHAPE: set[str] = {"tag: str", "status: str", "commit: str", "inputs: str", "reason: str"}
BOT_RECORD_SHAPE: set[str] = {"tags: dict", "tags.*: dict"}
BOT_RECORD_BUILT_SHAPE: set[str] = {f"tags.*.{k}" for k in sorted(BOT_BUILT_SHAPE - {"tag: str"})}
BOT_RECORD_PUSHED_SHAPE: set[str] = BOT_RECORD_BUILT_SHAPE | {f"tags.*.{k}" for k in BOT_PUSH_KEYS}
BOT_RECORD_HUMAN_SHAPE: set[str] = {f"tags.*.{k}" for k in BOT_HUMAN_SHAPE - {"tag: str"}}


@pytest.mark.torch
@pytest.mark.slow
def test_the_bots_json_of_a_ready_release_keeps_its_shape(tmp_path, monkeypatch, capsys):
    """A release whose verify ran and passed (stage 3 on the one test file the hop reaches): built,
    with no reason."""
    port = Ported(tmp_path, monkeypatch)
    (port.root / "pyproject.toml").write_text("[tool.rocmport]\ntp = 1\npp = 1\n")
    ops = "megatron/core/ops.py"
    port.tag(
        {
            # the RNG hooks the proxy shim backs with the CPU generator: without them stage 3 is
            # unsupported-in-proxy, which verifies nothing (not-verified, never ready)
            "megatron/core/tensor_parallel/__init__.py": "",
            "megatron/core/tensor_parallel/random.py": (
                "def _get_cuda_rng_state():\n    pass\n\n\ndef _set_cuda_rng_state(state):\n    pass\n\n\n"
                "class CudaRNGStatesTracker:\n    pass\n"
            ),
            ops: "def add(x, y):\n    return x + y\n",
            "tests/unit_tests/test_ops.py": "from megatron.core.ops import add\n\n\ndef test_add():\n    assert add(1, 2) == 3\n",
        },
        "core_v0.16.2",
        "0.16.2",
    )
    assert port.run("refresh", "--to", "core_v0.16.2", "--no-verify") == 0
    g(port.root, "add", "-A")
    g(port.root, "commit", "-qm", "port at core_v0.16.2")
    port.tag({ops: "def add(x, y):\n    return y + x\n"}, "core_v0.16.3", "0.16.3")
    capsys.readouterr()
    assert port.run("bot", "--once", "--verify-stages", "3", "--json") == 0
    (ready,) = json.loads(capsys.readouterr().out)["processed"]
    assert ready["status"] == "ready" and shape(ready) == BOT_BUILT_SHAPE - {"reason: str"}, sorted(shape(ready))
    record = json.loads((port.root / ".rocmport" / "bot-state.json").read_text())
    assert shape(record) == BOT_RECORD_SHAPE | BOT_RECORD_BUILT_SHAPE - {"tags.*.reason: str"}, sorted(shape(record))


# Stage 3's entry in a verify report (recorded from the run above with 926c5ea's code, before its details
# were typed; since, its baseline's `ran` and `tests_not_on_port`: the unported tree runs the port's failures).
UNIT_STAGE_SHAPE: set[str] = {
    "stages[].baseline.cached: bool",
    "stages[].baseline.commit: str",
    "stages[].baseline.counts.error: int",
    "stages[].baseline.counts.failed: int",
    "stages[].baseline.counts.passed: int",
    "stages[].baseline.counts.skipped: int",
    "stages[].baseline.counts: dict",
    "stages[].baseline.guards: list",
    "stages[].baseline.overlay: list",
    "stages[].baseline.peak.released_groups: int",
    "stages[].baseline.peak.rss_mb: float",
    "stages[].baseline.peak.rss_mb_all_ranks: float",
    "stages[].baseline.peak.threads: int",
    "stages[].baseline.peak: dict",
    "stages[].baseline.ran: list",
    "stages[].baseline.ran[]: str",
    "stages[].baseline.tests: int",
    "stages[].baseline.tests_not_on_port: int",
    "stages[].baseline: dict",
    "stages[].baseline_seconds: float",
    "stages[].counts.error: int",
    "stages[].counts.failed: int",
    "stages[].counts.passed: int",
    "stages[].counts.skipped: int",
    "stages[].counts: dict",
    "stages[].deselected: dict",
    "stages[].failures.*: str",
    "stages[].failures: dict",
    "stages[].file_seconds.*: float",
    "stages[].file_seconds: dict",
    "stages[].files.*.counts.failed: int",
    "stages[].files.*.counts.passed: int",
    "stages[].files.*.counts.skipped: int",
    "stages[].files.*.counts: dict",
    "stages[].files.*.hangs: int",
    "stages[].files.*.not_run: list",
    "stages[].files.*.reason: str",
    "stages[].files.*.status: str",
    "stages[].files.*: dict",
    "stages[].files: dict",
    "stages[].hung: list",
    "stages[].known_failures: dict",
    "stages[].known_failures_not_applied: dict",
    "stages[].label_reasons.*: str",
    "stages[].label_reasons: dict",
    "stages[].labels.*: str",
    "stages[].labels: dict",
    "stages[].local_spec_instead_of_te: list",
    "stages[].machine.cpus: int",
    "stages[].machine.others_cores: float",
    "stages[].machine.overloaded: bool",
    "stages[].machine.run_cores: float",
    "stages[].machine.seconds: float",
    "stages[].machine: dict",
    "stages[].applicable: bool",
    "stages[].name: str",
    "stages[].nproc: int",
    "stages[].on_baseline.*: str",
    "stages[].on_baseline: dict",
    "stages[].outcomes.*: str",
    "stages[].outcomes: dict",
    "stages[].peak.released_groups: int",
    "stages[].peak.rss_mb: float",
    "stages[].peak.rss_mb_all_ranks: float",
    "stages[].peak.threads: int",
    "stages[].peak: dict",
    "stages[].port_seconds: float",
    "stages[].reason: str",
    "stages[].rerun_alone: dict",
    "stages[].restarts: int",
    "stages[].restarts_per_file: int",
    "stages[].seconds: float",
    "stages[].slow: dict",
    "stages[].status: str",
    "stages[].swaps: list",
    "stages[].swaps[]: str",
    "stages[].tests: list",
    "stages[].tests[]: str",
    "stages[].why.*: str",
    "stages[].why: dict",
    "stages[]: dict",
}
