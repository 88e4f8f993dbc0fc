"""docs/cases.md is generated (scripts/case_table.py) from each line's own GPT cases: the script run on
a small real git mirror (two case YAMLs, tags and main as upstream names them) and on verify
reports, and, with the real mirror, the committed page regenerated and compared."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers.sync import commit, g, init
from tests.test_case_plan import BASE

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "case_table.py"
DOC = REPO / "docs" / "cases.md"
REPORTS = REPO / "tests" / "data" / "reports"
CASES = "tests/functional_tests/test_cases/gpt"
RELEASES = ["core_v0.15.3", "core_v0.16.1", "core_v0.17.1", "core_v0.18.2", "core_v0.19.0"]
# The real report's stage 4 case (tests/data/reports/v0.16-pass.json): the mirror holds a case of that name.
REPORTED = "gpt3_mcore_tp2_pp2_uninstall_te"


def case_yaml(tp: int = 1, pp: int = 1, **args) -> str:
    """An upstream-sized case (test_case_plan's widths) at tp×pp, with ``args`` on top."""
    layout = {"--tensor-model-parallel-size": tp, "--pipeline-model-parallel-size": pp}
    return yaml.safe_dump({"MODEL_ARGS": {**BASE, **layout, **args}, "TEST_TYPE": "regular"})


def mirror(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A Megatron-LM-shaped repository: the release tags v0.15-v0.18 on a commit with two cases
    (tp2×pp2 with local layers, and flash attention), v0.19 on one that drops flash and adds a
    distributed-optimizer case, and main one commit later with an inference case."""
    repo = init(tmp_path / "mlm")
    first = commit(
        repo,
        {
            f"{CASES}/{REPORTED}/model_config.yaml": case_yaml(2, 2, **{"--transformer-impl": "local"}),
            f"{CASES}/gpt3_flash/model_config.yaml": case_yaml(**{"--attention-backend": "flash"}),
        },
        "two cases",
    )
    for tag in RELEASES[:4]:
        g(repo, "tag", tag, first)
    g(repo, "rm", "-q", "-r", f"{CASES}/gpt3_flash")
    second = commit(
        repo, {f"{CASES}/gpt3_dist_opt/model_config.yaml": case_yaml(**{"--use-distributed-optimizer": True})}, "dist"
    )
    g(repo, "tag", RELEASES[4], second)
    head = commit(
        repo,
        {f"{CASES}/gpt3_infer/model_config.yaml": yaml.safe_dump({"MODE": "inference", "MODEL_ARGS": BASE})},
        "inference",
    )
    return repo / ".git", {"first": first, "second": second, "head": head}


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120)


def table(text: str, heading: str) -> list[list[str]]:
    """The rows (cells, unescaped) of the first Markdown table under ``## heading``."""
    section = text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    rows = [ln for ln in section.splitlines() if ln.startswith("|")]
    cells = [[c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", r)[1:-1]] for r in rows]
    return [r for r in cells[2:]]  # past the header and its rule


def by_first(rows: list[list[str]]) -> dict[str, list[str]]:
    return {r[0].strip("`"): r[1:] for r in rows}


def test_each_line_s_counts_and_cells_come_from_its_own_cases(tmp_path):
    mlm, commits = mirror(tmp_path)
    out = tmp_path / "cases.md"
    proc = run("--mlm", str(mlm), "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    text = out.read_text()
    counts = by_first(table(text, "Counts"))
    # ref, commit, cases, runnable, gpu-only, not-on-proxy, needs-nvidia-only, not-training, results
    assert counts["v0.15"] == ["`core_v0.15.3`", f"`{commits['first'][:12]}`", "2", "1", "1", "0", "0", "0", "—"]
    assert counts["v0.19"] == ["`core_v0.19.0`", f"`{commits['second'][:12]}`", "2", "2", "0", "0", "0", "0", "—"]
    assert counts["main"] == ["`main`", f"`{commits['head'][:12]}`", "3", "2", "0", "0", "0", "1", "—"]
    cells = by_first(table(text, "Cases"))
    assert list(cells) == ["gpt3_dist_opt", "gpt3_flash", "gpt3_infer", REPORTED]
    assert cells[REPORTED][0] == "tp2×pp2×dp1 (4 ranks) · local"
    assert cells["gpt3_flash"][:4] == ["gpu-only: --attention-backend flash (R1)"] * 4
    assert cells["gpt3_flash"][4:] == ["—", "—"]
    assert cells["gpt3_dist_opt"][:4] == ["—"] * 4
    assert cells["gpt3_dist_opt"][4].startswith("tp1×pp1×dp2 (2 ranks) · ")
    assert "distributed-optimizer" in cells["gpt3_dist_opt"][4]
    assert cells["gpt3_infer"][5] == "not-training: MODE inference (R2)"
    reasons = by_first(table(text, "Reasons"))
    assert reasons["R1"][0] == "gpu-only" and reasons["R1"][1].startswith("--attention-backend flash: flash-attn's")
    # main pinned to the v0.19 commit: the same cases as v0.19, main still named
    pinned = tmp_path / "pinned.md"
    assert run("--mlm", str(mlm), "--pin", f"main={commits['second']}", "--out", str(pinned)).returncode == 0
    row = by_first(table(pinned.read_text(), "Counts"))["main"]
    assert row[:4] == ["`main`", f"`{commits['second'][:12]}`", "2", "2"]


def test_stage_4_results_fill_the_cells_of_the_line_whose_report_is_given(tmp_path):
    """The real v0.16 report (stage 4: one case, pass), a report whose stage 4 lists several cases (the
    shape stage 4 grows to), and one without stage 4 (its line keeps the plans alone)."""
    mlm, _ = mirror(tmp_path)
    several = json.loads((REPORTS / "v0.16-pass.json").read_text())
    several["line"] = "v0.17"
    stage4 = next(s for s in several["stages"] if s["name"] == "functional")
    stage4["cases"] = [
        {"case": REPORTED, "status": "fail", "label": "port-regression", "reason": "resume drift 0.01"},
        {"case": "gpt3_flash", "status": "unsupported-in-proxy", "reason": "--attention-backend flash: no CPU kernel"},
        {"case": "gpt3_unknown", "status": "pass"},  # not one of the line's cases: not counted
        {"name": "no status here"},
    ]
    (tmp_path / "several.json").write_text(json.dumps(several))
    without = json.loads((REPORTS / "v0.16-pass.json").read_text())
    without["line"] = "v0.18"
    without["stages"] = [s for s in without["stages"] if s["name"] != "functional"]
    (tmp_path / "without.json").write_text(json.dumps(without))
    out = tmp_path / "cases.md"
    proc = run(
        "--mlm",
        str(mlm),
        "--report",
        f"v0.16={REPORTS / 'v0.16-pass.json'}",
        "--report",
        f"v0.17={tmp_path / 'several.json'}",
        "--report",
        f"v0.18={tmp_path / 'without.json'}",
        "--out",
        str(out),
    )
    assert proc.returncode == 0, proc.stderr
    text = out.read_text()
    counts = by_first(table(text, "Counts"))
    assert [counts[line][-1] for line in ("v0.15", "v0.16", "v0.17", "v0.18")] == [
        "—",
        "1 pass",
        "1 fail, 1 unsupported-in-proxy",
        "none of its cases",
    ]
    cells = by_first(table(text, "Cases"))
    plan = "tp2×pp2×dp1 (4 ranks) · local"
    assert cells[REPORTED][:4] == [plan, f"**pass**<br>{plan}", f"**fail** (port-regression)<br>{plan}", plan]
    assert cells["gpt3_flash"][2].startswith("**unsupported-in-proxy**: --attention-backend flash<br>gpu-only: ")
    assert "v0.16: `" in text and str(tmp_path / "several.json") in text


def test_a_line_takes_several_reports_merged_in_order(tmp_path):
    """A sweep run in chunks: two reports of v0.16, each with some of the cases; both chunks' cases fill
    the line, and a case in both takes the later report's entry."""
    mlm, _ = mirror(tmp_path)
    chunks = []
    for i, cases in enumerate(
        [
            [{"case": REPORTED, "status": "fail", "label": "unverified", "reason": "first chunk"}],
            [
                {"case": REPORTED, "status": "pass"},
                {"case": "gpt3_flash", "status": "unsupported-in-proxy", "reason": "--attention-backend flash"},
            ],
        ]
    ):
        report = json.loads((REPORTS / "v0.16-pass.json").read_text())
        next(s for s in report["stages"] if s["name"] == "functional")["cases"] = cases
        chunks.append(tmp_path / f"chunk-{i}.json")
        chunks[-1].write_text(json.dumps(report))
    out = tmp_path / "cases.md"
    proc = run("--mlm", str(mlm), *(a for c in chunks for a in ("--report", f"v0.16={c}")), "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    text = out.read_text()
    assert by_first(table(text, "Counts"))["v0.16"][-1] == "1 pass, 1 unsupported-in-proxy"
    cells = by_first(table(text, "Cases"))
    assert cells[REPORTED][1].startswith("**pass**<br>")
    assert cells["gpt3_flash"][1].startswith("**unsupported-in-proxy**: --attention-backend flash")
    assert f"`{chunks[0]}`, `{chunks[1]}`" in text


def test_bad_input_is_one_line_and_exit_2_and_check_writes_nothing(tmp_path):
    mlm, _ = mirror(tmp_path)
    cases = [
        (["--mlm", str(tmp_path)], "not a git directory"),
        (["--mlm", str(mlm), "--pin", "main=0123456789abcdef"], "no commit 0123456789abcdef in the mirror"),
        (["--mlm", str(mlm), "--pin", "v0.99=HEAD"], "no line v0.99"),
        (["--mlm", str(mlm), "--report", "v0.16"], "give LINE=VALUE"),
        (["--mlm", str(mlm), "--report", f"v0.15={REPORTS / 'v0.16-pass.json'}"], "the report is of line v0.16"),
        (["--mlm", str(mlm), "--report", f"v0.16={tmp_path / 'none.json'}"], "no such report"),
    ]
    for args, words in cases:
        proc = run(*args, "--out", str(tmp_path / "x.md"))
        assert proc.returncode == 2 and words in proc.stderr, (args, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not (tmp_path / "x.md").exists()
    g(mlm.parent, "tag", "-d", "core_v0.17.1")
    proc = run("--mlm", str(mlm), "--out", str(tmp_path / "x.md"))
    assert proc.returncode == 2 and "no commit core_v0.17.1" in proc.stderr
    g(mlm.parent, "tag", "core_v0.17.1", "core_v0.16.1")
    out = tmp_path / "cases.md"
    assert run("--mlm", str(mlm), "--out", str(out)).returncode == 0
    fresh = out.read_text()
    assert run("--mlm", str(mlm), "--out", str(out), "--check").returncode == 0
    out.write_text(fresh.replace("| 2 |", "| 3 |", 1))
    stale = run("--mlm", str(mlm), "--out", str(out), "--check")
    assert stale.returncode == 1 and "stale" in stale.stderr
    assert out.read_text() == fresh.replace("| 2 |", "| 3 |", 1)  # --check writes nothing


MIRROR = os.environ.get("ROCMPORT_TEST_MLM_MIRROR")


@pytest.mark.mirror
@pytest.mark.skipif(not MIRROR, reason="set ROCMPORT_TEST_MLM_MIRROR to a Megatron-LM mirror")
def test_the_committed_page_is_what_the_mirror_and_the_planner_give():
    """Regenerated from the mirror (main at the commit the page records: a newer main is a deliberate
    regeneration) and compared: a change to the planner or a stale page fails here."""
    recorded = by_first(table(DOC.read_text(), "Counts"))["main"][1].strip("`")
    proc = run("--mlm", str(MIRROR), "--pin", f"main={recorded}", "--out", str(DOC), "--check")
    assert proc.returncode == 0, proc.stderr


def test_every_megatron_lm_series_is_a_line_of_the_page(monkeypatch):
    """A new line's series without its release tag in LINES would leave it off the page."""
    spec = importlib.util.spec_from_file_location("case_table", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "case_table", module)  # its dataclasses look their module up
    spec.loader.exec_module(module)
    series = {p.parent.name for p in (REPO / "patchsets" / "megatron-lm").glob("*/series")}
    assert series and set(module.LINES) == series | {"main"}
    assert all(module.LINES[line] == f"core_{line}." + module.LINES[line].rsplit(".", 1)[1] for line in series)
