"""The impacted stage 3 on a real hop of upstream (a local Megatron-LM mirror; skipped unless given).

The hop: core_r0.16.0's first-parent commits 21c1053570 -> bce706c5f0 ("Cherry-pick #3399 for Mamba
Uneven PP fix"), which changes megatron/core/ssm/mamba_block.py only. Python 3.11 runs it (upstream main
after v0.18's branch point declares 3.12, which this project's CPU venv is not). The port is built as
a refresh hop does it (sync + apply at the old commit, `refresh --to` the new one). Then:

- a port bug in the changed module (an import the rewrite got wrong): the impacted run selects the
  files that reach mamba_block.py and catches it as port-regression;
- a port bug in a module the hop did not touch (export/trtllm/trtllm_layers.py): the impacted run does
  not select its tests; the full suite does. The full suite is 174 files, hours on the CPU proxy, so
  it runs restricted to test_trtllm_layers.py, one of the files that reach that module.

Stage 3 runs on 2 ranks here (upstream CI uses 8): the proof needs the labels, not the 8-rank layouts."""

from __future__ import annotations

import json
import time

import pytest

from rocmport.cli import main
from rocmport.verify import suite
from tests.helpers.real import MLM, needs_mlm_mirror, project_with

OLD = "21c1053570d225af6f25c06e474f6b79da366d32"
NEW = "bce706c5f031b866a780bcb8089f1e6c999b6954"
CHANGED = "megatron/core/ssm/mamba_block.py"
UNTOUCHED = "megatron/core/export/trtllm/trtllm_layers.py"
UNTOUCHED_TEST = "tests/unit_tests/export/trtllm/test_trtllm_layers.py"


@pytest.mark.mirror
@pytest.mark.slow
@pytest.mark.torch
@needs_mlm_mirror
def test_impacted_selection_on_a_real_hop_catches_a_changed_module_s_bug_and_leaves_an_untouched_one_to_nightly(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("ROCMPORT_CACHE_DIR", str(tmp_path / "cache"))
    root = project_with(tmp_path / "project", {"megatron-lm": "v0.16"})
    run = lambda *a: main(["-C", str(root), *a])  # noqa: E731
    assert run("sync", "--ref", OLD, "--no-bridge", "--remote", f"megatron-lm={MLM}") == 0
    assert run("apply") == 0
    assert run("refresh", "--to", NEW, "--no-verify") == 0
    tree = root / "build" / "megatron-lm"
    verify = ["verify", "--stages", "3", "--unit-nproc", "2"]
    capsys.readouterr()

    def selected() -> list[str]:
        assert run(*verify, "--unit-tests", "impacted", "--since", OLD, "--dry-run", "--json") == 0
        plan = json.loads(capsys.readouterr().out)
        return [a for a in plan[0]["command"] if a.startswith("tests/unit_tests/")]

    chosen = selected()
    assert "tests/unit_tests/ssm/test_mamba_block.py" in chosen and UNTOUCHED_TEST not in chosen
    assert set(suite.SMOKE_TESTS) <= set(chosen)
    total = len(list((tree / "tests" / "unit_tests").rglob("test_*.py")))

    # 1. A port bug in the module the hop changed: an import list the rewrite got wrong.
    text = (tree / CHANGED).read_text()
    broken = text.replace(
        "from megatron.core.utils import WrappedTensor,", "from megatron.core.utils import WrappedTensr,", 1
    )
    assert broken != text
    (tree / CHANGED).write_text(broken)
    start = time.monotonic()
    assert run(*verify, "--unit-tests", "impacted", "--since", OLD, "--json") == 1
    seconds = time.monotonic() - start
    stage = json.loads(capsys.readouterr().out)["stages"][2]
    regressions = {k for k, v in stage["labels"].items() if v == "port-regression"}
    assert "tests/unit_tests/ssm/test_mamba_block.py" in regressions, stage["labels"]
    assert stage["impact"]["selected_files"] == len(chosen) and stage["impact"]["total_files"] == total
    assert stage["reason"].startswith(f"{stage['impact']['selected_tests']} tests selected")
    labels: dict[str, int] = {}
    for v in stage["labels"].values():
        labels[v] = labels.get(v, 0) + 1
    with capsys.disabled():  # the figures for the report, never into the next command's JSON
        print(
            f"\nimpacted run, bug in {CHANGED}: exit 1, {len(chosen)} of {total} test files selected, "
            f"{seconds:.0f} s (port {stage['port_seconds']} s, baseline {stage['baseline_seconds']} s); "
            f"labels {labels}; port-regression: {sorted(regressions)}; reason: {stage['reason'][:300]}"
        )
    (tree / CHANGED).write_text(text)

    # 2. A port bug in a module the hop did not touch: not selected; the full suite (restricted) catches it.
    text = (tree / UNTOUCHED).read_text()
    broken = text.replace(
        'layer.value.replace("transformer.layers.", "")', 'layer.value.replace("transformer.layers", "")', 1
    )
    assert broken != text
    (tree / UNTOUCHED).write_text(broken)
    assert UNTOUCHED_TEST not in selected()
    start = time.monotonic()
    assert run(*verify, "--unit-test", UNTOUCHED_TEST, "--json") == 1
    seconds = time.monotonic() - start
    stage = json.loads(capsys.readouterr().out)["stages"][2]
    assert stage["labels"] and set(stage["labels"].values()) == {"port-regression"}, stage["labels"]
    with capsys.disabled():
        print(
            f"full suite restricted to {UNTOUCHED_TEST}, bug in {UNTOUCHED}: exit 1, {seconds:.0f} s; "
            f"{len(stage['labels'])} port-regression: {sorted(stage['labels'])}"
        )
    (tree / UNTOUCHED).write_text(text)
