"""The impacted stage 3 on real hops of upstream (a local Megatron-LM mirror; skipped unless given).

Each hop is a pair of consecutive first-parent commits. The port is built as a refresh hop builds it
(sync + apply at the old commit, `refresh --to` the new one). Then:

- a port bug in the module the hop changed (an import the rewrite got wrong): the impacted run
  selects the files that reach it and catches it as port-regression;
- a port bug in a module the hop did not touch (export/trtllm/trtllm_layers.py): the impacted run
  does not select its tests; the full suite does. The full suite is 170-340 files, hours on the CPU
  proxy, so it runs restricted to test_trtllm_layers.py, one of the files that reach that module.

No full suite has run in the test's cache, so the summary's line is "N tests selected (n of m test
files ...); full suite: no pass recorded here" (with a nightly record it reads "N tests selected of M;
full suite last passed at <commit>": tests/test_impact.py holds that form). Stage 3 runs on 2 ranks
(upstream CI uses 8): the proof needs the labels, not the 8-rank layouts.

The hops:

- main (`test_..._on_a_main_hop`): 1aa880d0ea -> 2c579b45b9 ("Set Bert TE spec q/k_layernorm to
  None", #5687), the 245th first-parent commit of main after v0.18's branch point (de030fc5823e), in
  the stretch the bot's replay covers (every 30th commit: its hop 9 is commits 241-270); the v0.19 series.
  It changes megatron/core/models/bert/bert_layer_specs.py (and its test) only, and selects the 2
  files that reach it (models/test_bert_model.py, dist_checkpointing/models/test_bert_model.py) and the
  3 smoke files: 5 of 335. Main declares requires-python >= 3.12: run with a 3.12 interpreter that
  has torch, else the test is skipped saying so. Measured (Python 3.12.1, torch 2.14.1): 21 tests; with the bug
  the impacted run exits 1 in 37 s (port 23 s, baseline 12 s): test_bert_model.py port-regression,
  dist_checkpointing/models/test_bert_model.py port-regression too (it does not import on the unported
  tree either, "Transformer Engine is not installed": its module builds the TE spec at import; on the
  port it stops at `cannot import name 'HAVE_TEE'`, another message: when stage 3 compared types only,
  it was needs-nvidia-only), 7 upstream-known (test_mappings.py on 2 ranks); the restricted full suite
  catches the trtllm bug in 21 s.
- core_r0.16.0 (`test_..._on_a_real_hop`): 21c1053570 -> bce706c5f0 ("Cherry-pick #3399 for Mamba
  Uneven PP fix"), which changes megatron/core/ssm/mamba_block.py only: 11 of 174 files (217 tests);
  runs on 3.10+."""

from __future__ import annotations

import json
import platform
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet

from rocmport._compat import tomllib
from rocmport.cli import main
from rocmport.verify.stages.unit_tests import suite
from tests.helpers.real import MLM, needs_mlm_mirror, project_with

UNTOUCHED = "megatron/core/export/trtllm/trtllm_layers.py"
UNTOUCHED_TEST = "tests/unit_tests/export/trtllm/test_trtllm_layers.py"
# a suffix that no longer strips the prefix's dot: test_get_layer_name_without_prefix fails
UNTOUCHED_BUG = ('layer.value.replace("transformer.layers.", "")', 'layer.value.replace("transformer.layers", "")')


@dataclass(frozen=True)
class Hop:
    line: str  # the series that builds the port (patchsets/megatron-lm/<line>)
    old: str
    new: str
    changed: str  # the module the hop changed, where the port bug goes
    bug: tuple[str, str]  # its text, and the same text with the bug (an import the rewrite got wrong)
    regressions: tuple[str, ...]  # test files that reach it: labelled port-regression by the impacted run
    files: int  # test files selected (smoke set included)
    # selected test files the unported tree cannot import either on the proxy (TE absent): their label
    # is needs-nvidia-only whatever the port does (no test of theirs runs on either tree)
    untestable: tuple[str, ...] = ()


def _unmet_python(commit: str) -> str | None:
    """The `requires-python` the upstream commit declares when this interpreter does not satisfy it."""
    text = subprocess.run(
        ["git", "--git-dir", str(MLM), "show", f"{commit}:pyproject.toml"], capture_output=True, text=True, check=False
    ).stdout
    spec = tomllib.loads(text).get("project", {}).get("requires-python") if text else None
    return spec if spec and not SpecifierSet(spec).contains(platform.python_version()) else None


def _prove(hop: Hop, tmp_path: Path, monkeypatch, capsys) -> None:
    if (spec := _unmet_python(hop.new)) is not None:
        pytest.skip(f"{hop.new[:12]} declares requires-python {spec}; this is Python {platform.python_version()}")
    monkeypatch.setenv("ROCMPORT_CACHE_DIR", str(tmp_path / "cache"))
    root = project_with(tmp_path / "project", {"megatron-lm": hop.line})
    run = lambda *a: main(["-C", str(root), *a])  # noqa: E731
    start = time.monotonic()
    assert run("sync", "--ref", hop.old, "--no-bridge", "--remote", f"megatron-lm={MLM}") == 0
    assert run("apply") == 0
    assert run("refresh", "--to", hop.new, "--no-verify") == 0
    built = time.monotonic() - start
    tree = root / "build" / "megatron-lm"
    verify = ["verify", "--stages", "3", "--unit-nproc", "2"]
    capsys.readouterr()

    def selected() -> list[str]:
        assert run(*verify, "--unit-tests", "impacted", "--since", hop.old, "--dry-run", "--json") == 0
        plan = json.loads(capsys.readouterr().out)
        return [a for a in plan[0]["command"] if a.startswith("tests/unit_tests/")]

    chosen = selected()
    assert set(hop.regressions) <= set(chosen) and UNTOUCHED_TEST not in chosen, chosen
    assert set(suite.SMOKE_TESTS) <= set(chosen) and len(chosen) == hop.files, chosen
    total = len(list((tree / "tests" / "unit_tests").rglob("test_*.py")))

    # 1. A port bug in the module the hop changed: an import list the rewrite got wrong.
    text = (tree / hop.changed).read_text()
    broken = text.replace(*hop.bug, 1)
    assert broken != text
    (tree / hop.changed).write_text(broken)
    start = time.monotonic()
    assert run(*verify, "--unit-tests", "impacted", "--since", hop.old, "--json") == 1
    seconds = time.monotonic() - start
    stage = json.loads(capsys.readouterr().out)["stages"][2]
    regressions = {k for k, v in stage["labels"].items() if v == "port-regression"}
    assert set(hop.regressions) <= regressions, stage["labels"]
    assert all(stage["labels"].get(f) == "needs-nvidia-only" for f in hop.untestable), stage["labels"]
    figures = stage["impact"]
    assert figures["selected_files"] == len(chosen) and figures["total_files"] == total
    assert figures["changed"] == sorted(
        subprocess.run(
            ["git", "--git-dir", str(MLM), "diff", "--name-only", "--no-renames", hop.old, hop.new],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
    )
    # no full suite ran in this cache: no M, no last pass, no time saved
    assert figures["total_tests"] is None and figures["full_suite_last_passed"] is None
    assert figures["estimated_seconds_saved"] is None
    assert stage["reason"].startswith(
        f"{figures['selected_tests']} tests selected ({len(chosen)} of {total} test files: those whose imports "
        f"reach the {len(figures['changed'])} files changed in {hop.old[:12]}..{hop.new[:12]}, and the smoke set); "
        "full suite: no pass recorded here"
    ), stage["reason"]
    labels: dict[str, int] = {}
    for v in stage["labels"].values():
        labels[v] = labels.get(v, 0) + 1
    with capsys.disabled():  # the figures for the report, never into the next command's JSON
        print(
            f"\nport built (sync, apply, refresh) in {built:.0f} s; impacted run, bug in {hop.changed}: exit 1, "
            f"{len(chosen)} of {total} test files, {figures['selected_tests']} tests, {seconds:.0f} s "
            f"(port {stage['port_seconds']} s, baseline {stage['baseline_seconds']} s); labels {labels}; "
            f"port-regression: {sorted(regressions)}; files: {stage.get('files')}; reason: {stage['reason'][:400]}"
        )
    (tree / hop.changed).write_text(text)

    # 2. A port bug in a module the hop did not touch: not selected; the full suite (restricted) catches it.
    text = (tree / UNTOUCHED).read_text()
    broken = text.replace(*UNTOUCHED_BUG, 1)
    assert broken != text
    (tree / UNTOUCHED).write_text(broken)
    assert UNTOUCHED_TEST not in selected()
    start = time.monotonic()
    assert run(*verify, "--unit-test", UNTOUCHED_TEST, "--json") == 1
    seconds = time.monotonic() - start
    stage = json.loads(capsys.readouterr().out)["stages"][2]
    assert stage["labels"] and set(stage["labels"].values()) == {"port-regression"}, stage["labels"]
    assert f"{UNTOUCHED_TEST}::TestTRTLLMLayers::test_get_layer_name_without_prefix" in stage["labels"]
    with capsys.disabled():
        print(
            f"full suite restricted to {UNTOUCHED_TEST}, bug in {UNTOUCHED}: exit 1, {seconds:.0f} s; "
            f"counts {stage.get('counts')}; {len(stage['labels'])} port-regression: {sorted(stage['labels'])}"
        )
    (tree / UNTOUCHED).write_text(text)


MAIN_HOP = Hop(
    line="v0.19",
    old="1aa880d0ea1dfddef567785ebc9a384f2a600d18",
    new="2c579b45b96b6eb0fdc45de0a819697f0e09afb8",
    changed="megatron/core/models/bert/bert_layer_specs.py",
    # the TE guard's flag (the guard-nvidia-only-imports codemod's ground), misspelt
    bug=(
        "from megatron.core.extensions.transformer_engine import HAVE_TE\n",
        "from megatron.core.extensions.transformer_engine import HAVE_TEE\n",
    ),
    # the second does not import on the unported tree either (its module builds the TE Bert spec at
    # import: "ImportError: Transformer Engine is not installed. Please use local Bert layer spec
    # instead.", measured); on the port it stops earlier, at the bug's ImportError: another message
    regressions=(
        "tests/unit_tests/models/test_bert_model.py",
        "tests/unit_tests/dist_checkpointing/models/test_bert_model.py",
    ),
    files=5,
)

V016_HOP = Hop(
    line="v0.16",
    old="21c1053570d225af6f25c06e474f6b79da366d32",
    new="bce706c5f031b866a780bcb8089f1e6c999b6954",
    changed="megatron/core/ssm/mamba_block.py",
    bug=("from megatron.core.utils import WrappedTensor,", "from megatron.core.utils import WrappedTensr,"),
    regressions=("tests/unit_tests/ssm/test_mamba_block.py",),
    files=11,
)


@pytest.mark.mirror
@pytest.mark.slow
@pytest.mark.torch
@needs_mlm_mirror
def test_impacted_selection_on_a_main_hop_catches_a_changed_module_s_bug_and_leaves_an_untouched_one_to_nightly(
    tmp_path, monkeypatch, capsys
):
    _prove(MAIN_HOP, tmp_path, monkeypatch, capsys)


@pytest.mark.mirror
@pytest.mark.slow
@pytest.mark.torch
@needs_mlm_mirror
def test_impacted_selection_on_a_real_hop_catches_a_changed_module_s_bug_and_leaves_an_untouched_one_to_nightly(
    tmp_path, monkeypatch, capsys
):
    _prove(V016_HOP, tmp_path, monkeypatch, capsys)
