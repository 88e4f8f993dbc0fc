"""docs/cases.md is generated (scripts/case_table.py) from each line's own GPT cases and its committed
stage-4 results (case-results.json): the script run on a small real git mirror (two case YAMLs, tags
and main as upstream names them) and on verify reports in the shapes verify writes, and, with the real
mirror and the committed records, the committed page regenerated and compared."""

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

from tests.helpers.sync import g
from tests.helpers.upstream_cases import case_dir, case_repo, commit_cases, stage_four
from tests.test_case_plan import BASE

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "case_table.py"
DOC = REPO / "docs" / "cases.md"
REPORTS = REPO / "tests" / "data" / "reports"
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
    repo = tmp_path / "mlm"
    first = case_repo(
        repo,
        {
            REPORTED: case_yaml(2, 2, **{"--transformer-impl": "local"}),
            "gpt3_flash": case_yaml(**{"--attention-backend": "flash"}),
        },
        "two cases",
    )
    for tag in RELEASES[:4]:
        g(repo, "tag", tag, first)
    g(repo, "rm", "-q", "-r", case_dir("gpt3_flash"))
    second = commit_cases(repo, {"gpt3_dist_opt": case_yaml(**{"--use-distributed-optimizer": True})}, "dist")
    g(repo, "tag", RELEASES[4], second)
    head = commit_cases(repo, {"gpt3_infer": yaml.safe_dump({"MODE": "inference", "MODEL_ARGS": BASE})}, "inference")
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
    proc = run("--mlm", str(mlm), "--series-root", str(series(tmp_path)), "--out", str(out))
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
    proc = run(
        "--mlm",
        str(mlm),
        "--series-root",
        str(tmp_path / "series"),
        "--pin",
        f"main={commits['second']}",
        "--out",
        str(pinned),
    )
    assert proc.returncode == 0, proc.stderr
    row = by_first(table(pinned.read_text(), "Counts"))["main"]
    assert row[:4] == ["`main`", f"`{commits['second'][:12]}`", "2", "2"]


# --- stage 4's results: the committed record of a line's sweep ----------------------------------------

# A failed case's message as stage 4 writes it for a NaN (a real v0.16 sweep's, longer than a record keeps).
NAN = (
    "a rank exited 16 without a Python exception (megatron's rerun state machine, EXIT_CODE_RESUME_TO_DISAMBIGUATE): "
    "Unexpected result nan on rank 7 at iteration #2 invocation #1 (message='found NaN in local forward loss "
    "calculation'); First rerun: unexpected result is reproducible within the tolerance (nan = nan)"
)
ASYNC = "NotImplementedError: Async checkpoint save not implemented for legacy checkpoints"


def passed(case: str, seconds: float = 22.66) -> dict:
    """A passing case's entry in a `--cases all` sweep's report (the keys stage 4 writes, trimmed)."""
    return {
        "case": case,
        "status": "pass",
        "iters": 10,
        "seconds": seconds,
        "losses": [7.0667, 6.0925],
        "reason": f"{case}: lm loss 7.0667 -> 6.0925 in 10 iterations; resumed from the iteration-5 checkpoint "
        "(async torch_dist): max |Δ| 5e-07 over iterations 6-10 (≤ 1e-05)",
    }


def failed(case: str, label: str, message: str, unported_at: str, unported: str = "fail") -> dict:
    """A failed case's entry with its label and the unported tree's run (``baseline``), as stage 4 writes them."""
    return {
        "case": case,
        "status": "fail",
        "label": label,
        "label_reason": f"fails the same way on the unported tree at {unported_at[:12]} (in the uninterrupted run)",
        "iters": 10,
        "seconds": 13.47,
        "losses": [],
        "reason": f"pretrain_gpt.py (after 0 of 10 iterations) exited 1: {message}",
        "failure": {"message": message, "phase": "run"},
        "baseline": {
            "cached": False,
            "commit": unported_at,
            "status": unported,
            "reason": f"pretrain_gpt.py (after 0 of 10 iterations) exited 1: {message}",
            "seconds": 18.47,
            "losses": [],
            "overlay": ["megatron/core/_rocm.py"],
        },
    }


def unsupported(case: str, kind: str, why: str) -> dict:
    return {
        "case": case,
        "kind": kind,
        "status": "unsupported-in-proxy",
        "seconds": 0.0,
        "reason": f"{case} ({kind}): {why}",
    }


def sweep_report(path: Path, cases: list[dict], line: str = "v0.16", te: str | None = "2.12.0") -> Path:
    """A verify report of a `--stages functional --cases NAMES` run: the real v0.16 report with stage 4's
    ``cases`` (and the TE layer, the selection) as a sweep's chunk has them."""
    report = json.loads((REPORTS / "v0.16-pass.json").read_text())
    report["line"] = line
    report["te"] = {"version": te, "python_layer": "NVIDIA's Python layer", "source": "a wheel"} if te else None
    stage_four(report)["cases"] = cases
    report["functional"]["selection"] = "named"
    path.write_text(json.dumps(report))
    return path


def series(tmp_path: Path) -> Path:
    """Series directories for the release lines (where their case-results.json go), none with a record."""
    root = tmp_path / "series"
    for tag in RELEASES:
        (root / tag.removeprefix("core_").rsplit(".", 1)[0]).mkdir(parents=True)
    return root


def head() -> str:
    return g(REPO, "rev-parse", "HEAD").strip()


def record_of(root: Path, line: str = "v0.16") -> dict:
    return json.loads((root / line / "case-results.json").read_text())


def test_a_line_s_record_is_its_reports_merged_in_order_and_the_page_shows_it(tmp_path):
    """A sweep run in chunks: two reports of v0.16, a case in both; the record holds both chunks' cases,
    the later report's entry for the shared one, and says what each report ran at. Given the other way
    round, the other entry wins."""
    mlm, commits = mirror(tmp_path)
    first = sweep_report(
        tmp_path / "chunk-00.json",
        [
            failed(REPORTED, "unverified", NAN, commits["first"]),
            unsupported("gpt3_flash", "gpu-only", "--attention-backend flash: flash-attn's CUDA kernels"),
        ],
    )
    second = sweep_report(tmp_path / "chunk-01.json", [passed(REPORTED)])
    root, out, code = series(tmp_path), tmp_path / "cases.md", head()
    proc = run(
        "--mlm",
        str(mlm),
        "--series-root",
        str(root),
        "--out",
        str(out),
        "--record",
        f"v0.16={first}@{code[:7]}",
        "--record",
        f"v0.16={second}@{code}",
    )
    assert proc.returncode == 0, proc.stderr
    record = record_of(root)
    assert record["line"] == "v0.16" and record["schema"] == 1
    assert record["recorded_on"] == {"upstream": commits["first"], "te": "2.12.0", "device_kind": "cpu-proxy-te2.12.0"}
    assert [(r["file"], r["rocmport"], r["cases"], r["selection"]) for r in record["reports"]] == [
        (str(first), code, 2, "named"),
        (str(second), code, 1, "named"),
    ]
    assert record["cases"][REPORTED] == {
        "status": "pass",
        "reason": "lm loss 7.0667 -> 6.0925 in 10 iterations; resumed from the iteration-5 checkpoint (async "
        "torch_dist): max |Δ| 5e-07 over iterations 6-10 (≤ 1e-05)",
        "seconds": 22.66,
        "report": 1,
    }
    assert record["cases"]["gpt3_flash"]["kind"] == "gpu-only" and record["cases"]["gpt3_flash"]["report"] == 0
    assert record["cases"]["gpt3_flash"]["reason"].startswith("--attention-backend flash: flash-attn's")
    text = out.read_text()
    counts = by_first(table(text, "Counts"))
    assert [counts[line][-1] for line in ("v0.15", "v0.16", "v0.17")] == ["—", "2 ran: 1 pass, 1 unsupported", "—"]
    cells = by_first(table(text, "Cases"))
    plan = "tp2×pp2×dp1 (4 ranks) · local"
    assert cells[REPORTED][:3] == [plan, f"**pass**<br>{plan}", plan]
    assert cells["gpt3_flash"][1].startswith("**unsupported-in-proxy**: --attention-backend flash<br>gpu-only: ")
    section = text.split("\n### v0.16\n", 1)[1].split("\n## ", 1)[0]
    assert section.lstrip().startswith("2 of its 2 cases ran: 1 pass, 1 unsupported; 23 s of stage 4")
    assert f"rocmport `{code[:12]}`" in section and f"upstream `{commits['first'][:12]}`" in section
    assert "TE 2.12.0" in section and "`cpu-proxy-te2.12.0`" in section
    assert by_first(table(text, "Verify results")) == {
        "gpt3_flash": ["**unsupported-in-proxy**", "—", "0", "--attention-backend flash: flash-attn's CUDA kernels"]
    }

    # the other order: the first chunk's failure is the case's entry, cut to one line of the record's length
    proc = run(
        "--mlm",
        str(mlm),
        "--series-root",
        str(root),
        "--out",
        str(out),
        "--record",
        f"v0.16={second}",
        "--record",
        f"v0.16={first}",
    )
    assert proc.returncode == 0, proc.stderr
    case = record_of(root)["cases"][REPORTED]
    assert (case["status"], case["label"], case["unported"], case["report"]) == ("fail", "unverified", "fail", 1)
    assert case["reason"].endswith("…") and len(case["reason"]) <= 160 and NAN.startswith(case["reason"][:-1])
    assert [r["rocmport"] for r in record_of(root)["reports"]] == [None, None]
    text = out.read_text()
    assert by_first(table(text, "Counts"))["v0.16"][-1] == "2 ran: 1 unsupported, 1 unverified"
    assert by_first(table(text, "Cases"))[REPORTED][1] == f"**fail** (unverified)<br>{plan}"
    row = by_first(table(text, "Verify results"))[REPORTED]
    assert row[:3] == ["**fail** (unverified)", "fail", "13"] and row[3] == case["reason"]
    assert "rocmport a commit not recorded" in text


def test_the_page_reads_the_committed_records_and_check_fails_when_one_changes(tmp_path):
    """No --record: the records in the series directories decide the results, so regenerating from the
    mirror gives the same page, and a changed record makes it stale."""
    mlm, commits = mirror(tmp_path)
    root, out = series(tmp_path), tmp_path / "cases.md"
    report = sweep_report(
        tmp_path / "chunk.json", [passed(REPORTED), failed("gpt3_flash", "upstream-known", ASYNC, commits["first"])]
    )
    assert (
        run("--mlm", str(mlm), "--series-root", str(root), "--out", str(out), "--record", f"v0.16={report}").returncode
        == 0
    )
    page = out.read_text()
    assert run("--mlm", str(mlm), "--series-root", str(root), "--out", str(out), "--check").returncode == 0
    # the same mirror without the records: the page it gives has no results, so the committed one is stale
    bare = run("--mlm", str(mlm), "--series-root", str(series(tmp_path / "bare")), "--out", str(out), "--check")
    assert bare.returncode == 1 and "stale" in bare.stderr
    data = record_of(root)
    data["cases"][REPORTED].update(status="fail", label="port-regression", unported="pass")
    (root / "v0.16" / "case-results.json").write_text(json.dumps(data))
    stale = run("--mlm", str(mlm), "--series-root", str(root), "--out", str(out), "--check")
    assert stale.returncode == 1 and "stale" in stale.stderr and out.read_text() == page
    assert run("--mlm", str(mlm), "--series-root", str(root), "--out", str(out)).returncode == 0
    text = out.read_text()
    assert by_first(table(text, "Counts"))["v0.16"][-1] == "2 ran: 1 port-regression, 1 upstream-known"
    assert by_first(table(text, "Verify results"))[REPORTED][:2] == ["**fail** (port-regression)", "pass"]


def test_a_report_from_before_stage_4_listed_its_cases_records_its_one_case(tmp_path):
    """The real v0.16 report (stage 4 ran one case, with no ``cases`` list, without TE): its case is the
    record's one entry, on the CPU proxy without TE; a report of each line goes to that line's record,
    and one run on a GPU names the GPU's kind."""
    mlm, commits = mirror(tmp_path)
    root, out = series(tmp_path), tmp_path / "cases.md"
    regression = failed(REPORTED, "port-regression", ASYNC, commits["first"], "pass")
    several = sweep_report(tmp_path / "v0.17.json", [regression], "v0.17")
    on_gpu = json.loads(sweep_report(tmp_path / "v0.18.json", [passed(REPORTED)], "v0.18", te=None).read_text())
    on_gpu.update(mode="gpu", hip_sim=None)
    on_gpu["env"].update(hip="7.1", devices=["AMD Instinct MI300X"], device_count=1)
    (tmp_path / "v0.18.json").write_text(json.dumps(on_gpu))
    proc = run(
        *("--mlm", str(mlm), "--series-root", str(root), "--out", str(out)),
        *("--record", f"v0.16={REPORTS / 'v0.16-pass.json'}", "--record", f"v0.17={several}"),
        *("--record", f"v0.18={tmp_path / 'v0.18.json'}"),
    )
    assert proc.returncode == 0, proc.stderr
    record = record_of(root)
    assert record["recorded_on"]["te"] is None and record["recorded_on"]["device_kind"] == "cpu-proxy"
    assert list(record["cases"]) == [REPORTED] and record["cases"][REPORTED]["status"] == "pass"
    assert record["cases"][REPORTED]["seconds"] == 285.48
    assert record["reports"][0]["started"] == "2026-11-27T12:50:01Z"
    assert record_of(root, "v0.18")["recorded_on"]["device_kind"] == "rocm-amd-instinct-mi300x"
    counts = by_first(table(out.read_text(), "Counts"))
    assert [counts[line][-1] for line in ("v0.16", "v0.17", "v0.18", "v0.19")] == [
        "1 ran: 1 pass",
        "1 ran: 1 port-regression",
        "1 ran: 1 pass",
        "—",
    ]


def test_bad_input_is_one_line_and_exit_2_and_check_writes_nothing(tmp_path):
    mlm, commits = mirror(tmp_path)
    root = series(tmp_path)
    good = sweep_report(tmp_path / "good.json", [passed(REPORTED)])
    other_upstream = sweep_report(
        tmp_path / "other.json", [failed(REPORTED, "upstream-known", ASYNC, commits["second"])]
    )
    other_te = sweep_report(tmp_path / "te.json", [passed("gpt3_flash")], te="2.9.0")
    no_cases = json.loads((REPORTS / "v0.16-pass.json").read_text())
    no_cases["stages"] = [s for s in no_cases["stages"] if s["name"] != "functional"]
    (tmp_path / "no-cases.json").write_text(json.dumps(no_cases))
    (tmp_path / "cut.json").write_text((REPORTS / "v0.16-pass.json").read_text()[:500])
    m = ["--mlm", str(mlm), "--series-root", str(root)]
    cases = [
        (["--mlm", str(tmp_path)], "not a git directory"),
        ([*m, "--pin", "main=0123456789abcdef"], "no commit 0123456789abcdef in the mirror"),
        ([*m, "--pin", "v0.99=HEAD"], "no line v0.99"),
        ([*m, "--record", "v0.16"], "give LINE=VALUE"),
        ([*m, "--record", f"v0.15={good}"], f"{good}: a report of line v0.16, not v0.15"),
        ([*m, "--record", f"v0.16={tmp_path / 'none.json'}"], "no such report"),
        ([*m, "--record", f"v0.16={tmp_path / 'cut.json'}"], f"{tmp_path / 'cut.json'}: not a verify report"),
        ([*m, "--record", f"main={good}"], "not a line's series directory"),
        ([*m, "--record", f"v0.16={good}@0000000"], "no commit 0000000 in this rocmport checkout"),
        ([*m, "--record", f"v0.16={tmp_path / 'no-cases.json'}"], "stage 4 ran no case in this report"),
        (
            [*m, "--record", f"v0.16={good}", "--record", f"v0.16={other_upstream}"],
            f"{other_upstream}: its cases ran the unported tree at {commits['second'][:12]}",
        ),
        (
            [*m, "--record", f"v0.16={good}", "--record", f"v0.16={other_te}"],
            f"{other_te}: ran with TE 2.9.0 on cpu-proxy-te2.9.0, the reports before it with TE 2.12.0",
        ),
        ([*m, "--record", f"v0.16={good}", "--check"], "--check writes nothing and --record writes a record"),
    ]
    for args, words in cases:
        proc = run(*args, "--out", str(tmp_path / "x.md"))
        assert proc.returncode == 2 and words in proc.stderr, (args, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not (tmp_path / "x.md").exists() and not list(root.glob("*/case-results.json"))
    g(mlm.parent, "tag", "-d", "core_v0.17.1")
    proc = run(*m, "--out", str(tmp_path / "x.md"))
    assert proc.returncode == 2 and "no commit core_v0.17.1" in proc.stderr
    g(mlm.parent, "tag", "core_v0.17.1", "core_v0.16.1")
    out = tmp_path / "cases.md"
    assert run(*m, "--out", str(out)).returncode == 0
    fresh = out.read_text()
    assert run(*m, "--out", str(out), "--check").returncode == 0
    out.write_text(fresh.replace("| 2 |", "| 3 |", 1))
    stale = run(*m, "--out", str(out), "--check")
    assert stale.returncode == 1 and "stale" in stale.stderr
    assert out.read_text() == fresh.replace("| 2 |", "| 3 |", 1)  # --check writes nothing


def test_a_broken_or_foreign_record_is_one_line_naming_the_file_and_a_bad_report_keeps_the_old_one(tmp_path):
    mlm, commits = mirror(tmp_path)
    root, out = series(tmp_path), tmp_path / "cases.md"
    report = sweep_report(tmp_path / "chunk.json", [passed(REPORTED)])
    assert (
        run("--mlm", str(mlm), "--series-root", str(root), "--out", str(out), "--record", f"v0.16={report}").returncode
        == 0
    )
    path = root / "v0.16" / "case-results.json"
    good = path.read_text()
    # v0.16's new chunk is good, v0.17's is of another upstream: refused before any record is written
    newer = sweep_report(tmp_path / "newer.json", [failed(REPORTED, "upstream-known", ASYNC, commits["first"])])
    other = sweep_report(
        tmp_path / "other.json", [failed(REPORTED, "upstream-known", ASYNC, commits["second"])], "v0.17"
    )
    proc = run(
        "--mlm",
        str(mlm),
        "--series-root",
        str(root),
        "--out",
        str(tmp_path / "x.md"),
        "--record",
        f"v0.16={newer}",
        "--record",
        f"v0.17={other}",
    )
    assert proc.returncode == 2 and path.read_text() == good and not (root / "v0.17" / "case-results.json").exists()

    def broken(edit) -> str:
        data = json.loads(good)
        edit(data)
        path.write_text(json.dumps(data))
        proc = run("--mlm", str(mlm), "--series-root", str(root), "--out", str(tmp_path / "x.md"))
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert not (tmp_path / "x.md").exists()
        return proc.stderr.strip().removeprefix("case_table.py: error: ")

    says = broken(lambda d: d["cases"][REPORTED].update(status="maybe"))
    assert says.startswith(f"{path}: not a case-results record (cases['{REPORTED}'].status is 'maybe', not one of pass")
    assert "scripts/case_table.py --record" in says
    assert "schema 2" in broken(lambda d: d.update(schema=2))
    assert ".report is not the index of one of its 1 reports" in broken(lambda d: d["cases"][REPORTED].update(report=1))
    assert "one line of at most 160" in broken(lambda d: d["cases"][REPORTED].update(reason="x" * 161))
    assert "unknown keys ['log']" in broken(lambda d: d["cases"][REPORTED].update(log="..."))
    assert "recorded_on.upstream" in broken(lambda d: d["recorded_on"].pop("upstream"))
    says = broken(lambda d: d["recorded_on"].update(upstream=commits["second"]))
    assert says.startswith(f"{path}: results of v0.16 at upstream {commits['second'][:12]}, and the page reads v0.16")
    path.write_text(good[:40])
    proc = run("--mlm", str(mlm), "--series-root", str(root), "--out", str(tmp_path / "x.md"))
    assert proc.returncode == 2 and str(path) in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_add_extends_the_committed_record_after_its_own_reports(tmp_path):
    """--add merges a later report after the record's own: its entry for a case the record holds
    replaces the record's, the others stay, and the report is listed after the record's with its file
    and commit; the record is the one --record makes from all the reports in that order."""
    mlm, commits = mirror(tmp_path)
    first = sweep_report(
        tmp_path / "chunk-00.json",
        [
            failed(REPORTED, "unverified", NAN, commits["first"]),
            unsupported("gpt3_flash", "gpu-only", "--attention-backend flash: flash-attn's CUDA kernels"),
        ],
    )
    second = sweep_report(tmp_path / "rerun.json", [passed(REPORTED, 31.5)])
    root, out, code = series(tmp_path), tmp_path / "cases.md", head()
    m = ["--mlm", str(mlm), "--series-root", str(root), "--out", str(out)]
    assert run(*m, "--record", f"v0.16={first}@{code}").returncode == 0
    assert by_first(table(out.read_text(), "Counts"))["v0.16"][-1] == "2 ran: 1 unsupported, 1 unverified"
    proc = run(*m, "--add", f"v0.16={second}@{code[:9]}")
    assert proc.returncode == 0, proc.stderr
    record = record_of(root)
    assert [(r["file"], r["rocmport"], r["cases"]) for r in record["reports"]] == [
        (str(first), code, 2),
        (str(second), code, 1),
    ]
    assert (record["cases"][REPORTED]["status"], record["cases"][REPORTED]["report"]) == ("pass", 1)
    assert "label" not in record["cases"][REPORTED] and record["cases"][REPORTED]["seconds"] == 31.5
    assert record["cases"]["gpt3_flash"]["report"] == 0 and record["cases"]["gpt3_flash"]["kind"] == "gpu-only"
    text = out.read_text()
    assert by_first(table(text, "Counts"))["v0.16"][-1] == "2 ran: 1 pass, 1 unsupported"
    assert "From 2 reports of `rocmport verify`" in text.split("\n### v0.16\n", 1)[1]
    assert run(*m, "--check").returncode == 0
    # the same as the record made anew from both reports in that order
    again = series(tmp_path / "again")
    proc = run(
        *m[:2],
        "--series-root",
        str(again),
        "--out",
        str(tmp_path / "again.md"),
        "--record",
        f"v0.16={first}@{code}",
        "--record",
        f"v0.16={second}@{code}",
    )
    assert proc.returncode == 0, proc.stderr
    assert record_of(again) == record and (tmp_path / "again.md").read_text() == text
    # a third report, without a commit: the case's entry is its, the record's reports three
    third = sweep_report(tmp_path / "third.json", [failed(REPORTED, "upstream-known", ASYNC, commits["first"])])
    assert run(*m, "--add", f"v0.16={third}").returncode == 0
    record = record_of(root)
    assert [r["rocmport"] for r in record["reports"]] == [code, code, None]
    assert (record["cases"][REPORTED]["label"], record["cases"][REPORTED]["report"]) == ("upstream-known", 2)
    assert by_first(table(out.read_text(), "Counts"))["v0.16"][-1] == "2 ran: 1 unsupported, 1 upstream-known"


def test_add_refuses_without_a_record_and_a_report_of_another_upstream_or_te_keeping_the_record(tmp_path):
    mlm, commits = mirror(tmp_path)
    root, out = series(tmp_path), tmp_path / "cases.md"
    good = sweep_report(tmp_path / "good.json", [passed(REPORTED)])
    other_upstream = sweep_report(
        tmp_path / "other.json", [failed(REPORTED, "upstream-known", ASYNC, commits["second"])]
    )
    other_te = sweep_report(tmp_path / "te.json", [passed("gpt3_flash")], te="2.9.0")
    m = ["--mlm", str(mlm), "--series-root", str(root), "--out", str(tmp_path / "x.md")]
    proc = run(*m, "--add", f"v0.16={good}")
    assert proc.returncode == 2 and f"{root / 'v0.16' / 'case-results.json'} does not exist" in proc.stderr
    assert "--record v0.16=REPORT@COMMIT" in proc.stderr and not (root / "v0.16" / "case-results.json").exists()
    assert (
        run("--mlm", str(mlm), "--series-root", str(root), "--out", str(out), "--record", f"v0.16={good}").returncode
        == 0
    )
    path = root / "v0.16" / "case-results.json"
    kept = path.read_text()
    cases = [
        (
            ["--add", f"v0.16={other_upstream}"],
            f"{other_upstream}: its cases ran the unported tree at {commits['second'][:12]}",
        ),
        (
            ["--add", f"v0.16={other_te}"],
            f"{other_te}: ran with TE 2.9.0 on cpu-proxy-te2.9.0, the reports before it with TE 2.12.0",
        ),
        (["--add", f"v0.16={good}@0000000"], "--add v0.16="),
        (["--add", f"v0.16={good}", "--record", f"v0.16={good}"], "give one"),
        (["--add", f"v0.16={good}", "--check"], "--check writes nothing and --add writes a record"),
        (["--add", f"v0.16={good}"], f"--add v0.16={good}: the report is in the record already"),
        (["--add", f"v0.16={other_te}", "--add", f"v0.16={other_te}"], "or given twice"),
        (["--add", f"v0.99={good}"], "--add v0.99="),
    ]
    for args, words in cases:
        proc = run(*m, *args)
        assert proc.returncode == 2 and words in proc.stderr, (args, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert path.read_text() == kept and not (tmp_path / "x.md").exists()
    # a record of another upstream commit than the page's is not extended
    data = json.loads(kept)
    data["recorded_on"]["upstream"] = commits["second"]
    path.write_text(json.dumps(data))
    proc = run(*m, "--add", f"v0.16={good}")
    assert proc.returncode == 2 and proc.stderr.strip().startswith(
        f"case_table.py: error: {path}: results of v0.16 at upstream {commits['second'][:12]}, and the page reads v0.16"
    )
    assert json.loads(path.read_text()) == data


MIRROR = os.environ.get("ROCMPORT_TEST_MLM_MIRROR")


@pytest.mark.mirror
@pytest.mark.skipif(not MIRROR, reason="set ROCMPORT_TEST_MLM_MIRROR to a Megatron-LM mirror")
def test_the_committed_page_is_what_the_mirror_and_the_planner_give():
    """Regenerated from the mirror (main at the commit the page records: a newer main is a deliberate
    regeneration) and the committed case-results.json records, and compared: a change to the planner or
    to a record, or a stale page, fails here."""
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
