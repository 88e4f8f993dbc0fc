"""`rocmport refresh` on real local upstreams whose new tags move, touch, merge or conflict with patches."""

from __future__ import annotations

import json
import re
import shutil

import pytest

from rocmport.cli import main
from rocmport.config import load_settings
from rocmport.refresh.result import EXIT_CODES, READY, RefreshResult, RefreshVerify
from rocmport.upstream.lock import load_lock
from rocmport.verify.stages.gpt_training import StageResult
from rocmport.refresh.summary import public, write_summary
from tests.helpers.refresh import LAYERS, Ported, edit_line
from tests.helpers.sync import commit, g, init, package_info


@pytest.fixture()
def port(tmp_path, monkeypatch):
    return Ported(tmp_path, monkeypatch)


def _hunks_and_body(text: str) -> tuple[list[str], str]:
    """Hunk headers / index lines, and everything else."""
    moving = [ln for ln in text.splitlines() if ln.startswith(("@@", "index "))]
    rest = "\n".join(ln for ln in text.splitlines() if not ln.startswith(("@@", "index ")))
    return moving, rest


def test_offset_patch_is_shifted_into_a_new_series_and_lock_is_bumped(port, capsys):
    new = port.tag(
        {"megatron/core/layers.py": "".join(f"new {i}\n" for i in range(5)) + LAYERS}, "core_v0.17.0", "0.17.0"
    )
    old_lock = (port.root / "upstream.lock").read_text()
    assert port.run("refresh", "--to", "v0.17", "--no-verify") == 0
    rows = port.rows()
    assert rows["0001-layers-ten.patch"]["bucket"] == "offset" and rows["0001-layers-ten.patch"]["action"] == "shifted"
    assert rows["0002-layers-thirty.patch"]["action"] == "shifted"
    assert rows["0003-utils.patch"] == {**rows["0003-utils.patch"], "bucket": "clean", "action": "kept"}
    v17 = port.root / "patchsets" / "megatron-lm" / "v0.17"
    assert port.series("v0.17")["versions"] == ">=0.17.0rc0,<0.18.0rc0" and port.series("v0.17")["line"] == "v0.17"
    assert port.series("v0.17")["patches"] == list(port.patches)
    # Byte-stable: header, hunk bodies and context width kept; only positions and blob ids moved.
    old_text, new_text = port.patches["0001-layers-ten.patch"], (v17 / "0001-layers-ten.patch").read_text()
    assert _hunks_and_body(old_text)[1] == _hunks_and_body(new_text)[1]
    assert "@@ -8,5 +8,5 @@" in old_text and "@@ -13,5 +13,5 @@" in new_text
    assert (v17 / "0003-utils.patch").read_text() == port.patches["0003-utils.patch"]
    # The old series is untouched; the lock pins the new tag; the work tree is the new port.
    assert (port.series_dir / "0001-layers-ten.patch").read_text() == old_text
    assert (
        port.lock["upstreams"]["megatron-lm"]["commit"] == new and (port.root / "upstream.lock").read_text() != old_lock
    )
    tree = port.root / "build" / "megatron-lm"
    assert g(tree, "rev-parse", "rocmport/base/core_v0.17.0^{commit}") == new
    assert "line 10 rocm" in (tree / "megatron/core/layers.py").read_text()
    # The work tree is what `apply` makes from the promoted series (every patch clean): its state names
    # the project's series, and the next apply is a no-op that keeps every commit (a wheel built in
    # between still names a port commit that exists).
    state = json.loads((tree / ".git" / "rocmport-state.json").read_text())
    assert state["series"] == str(v17 / "series") and state["report"]["tree"] == str(tree)
    head = g(tree, "rev-parse", "HEAD")
    capsys.readouterr()
    assert port.run("apply") == 0
    assert "megatron-lm: up to date" in capsys.readouterr().err and g(tree, "rev-parse", "HEAD") == head
    assert json.loads((port.root / "build" / "megatron-lm.report.json").read_text())["totals"] == {"clean": 3}
    # A second refresh to the same ref has nothing to do.
    assert port.run("refresh", "--to", "v0.17", "--no-verify") == 0
    assert port.summary["status"] == "up-to-date"
    md = (port.root / "build" / "refresh" / "summary.md").read_text()
    assert "already up to date" in md


def test_three_way_patch_is_regenerated_with_its_context_width(port):
    # Upstream edits a context line of patch 0002: exact apply fails, the 3-way merge succeeds.
    port.tag({"megatron/core/layers.py": edit_line(LAYERS, 28, "line 28 upstream")}, "core_v0.17.0", "0.17.0")
    assert port.run("refresh", "--to", "core_v0.17.0", "--no-verify") == 0
    row = port.rows()["0002-layers-thirty.patch"]
    assert row["bucket"] == "merged-3way" and row["action"] == "regenerated"
    text = (port.root / "patchsets/megatron-lm/v0.17/0002-layers-thirty.patch").read_text()
    assert " line 28 upstream" in text and "+line 30 rocm" in text
    assert text.startswith(
        "Description: rocm line thirty\n more words\nUpstream-Status: ROCm-only\nBug: https://example.invalid/2\n---\n"
    )
    assert len([ln for ln in text.split("\n---\n", 1)[1].splitlines() if ln.startswith(" ")]) == 6
    assert re.search(
        r"2:  [0-9a-f]+ ! 2:  [0-9a-f]+ rocm line thirty", port.summary["range_diff"]
    )  # three lines each side, as written
    assert port.run("apply") == 0
    assert json.loads((port.root / "build" / "megatron-lm.report.json").read_text())["totals"] == {"clean": 3}


def test_patch_upstream_merged_is_dropped_with_evidence(port):
    # Upstream lands exactly patch 0003's change (same patch-id), then tags.
    merged = port.upstream_commit({"megatron/core/utils.py": "def f():\n    return 2\n"}, "upstream: f returns 2")
    port.tag({"docs/index.md": "docs 2\n"}, "core_v0.17.0", "0.17.0")
    assert port.run("refresh", "--to", "v0.17", "--no-verify") == 0
    row = port.rows()["0003-utils.patch"]
    assert row["bucket"] == "already-upstream" and row["action"] == "dropped"
    assert "reverse-applies" in row["evidence"] and merged[:12] in row["evidence"]
    v17 = port.root / "patchsets" / "megatron-lm" / "v0.17"
    assert port.series("v0.17")["patches"] == ["0001-layers-ten.patch", "0002-layers-thirty.patch"]
    assert not (v17 / "0003-utils.patch").exists() and (port.series_dir / "0003-utils.patch").exists()
    assert "# dropped 0003-utils.patch: reverse-applies on the new base; patch-id" in (v17 / "series").read_text()
    assert "0003-utils.patch" in (port.root / "build/refresh/summary.md").read_text()


def test_conflict_stops_for_a_human_then_continue(port):
    port.tag({"megatron/core/layers.py": edit_line(LAYERS, 30, "line 30 upstream")}, "core_v0.17.0", "0.17.0")
    lock_before = (port.root / "upstream.lock").read_text()
    assert port.run("refresh", "--to", "v0.17", "--no-verify") == 1
    conflict = port.summary["conflict"]
    assert conflict["patch"] == "0002-layers-thirty.patch" and conflict["files"] == ["megatron/core/layers.py"]
    assert conflict["hunks"] == [{"file": "megatron/core/layers.py", "line": 27}]
    # Nothing of the project changed; the refresh tree is clean at the last good commit.
    assert (port.root / "upstream.lock").read_text() == lock_before
    assert not (port.root / "patchsets/megatron-lm/v0.17").exists()
    assert g(port.root, "status", "--porcelain") == ""
    assert port.run("refresh", "--to", "v0.17", "--no-verify") == 2  # a stopped refresh is not started over
    rtree = port.root / "build" / "refresh" / "megatron-lm"
    assert g(rtree, "status", "--porcelain") == ""
    (rtree / "megatron/core/layers.py").write_text(edit_line(LAYERS, 30, "line 30 upstream rocm"))
    assert port.run("refresh", "--continue") == 2  # uncommitted resolution
    g(rtree, "commit", "-qam", "resolve 0002 by hand")
    assert port.run("refresh", "--continue") == 0
    row = port.rows()["0002-layers-thirty.patch"]
    assert row["bucket"] == "resolved-by-hand" and row["action"] == "regenerated"
    text = (port.root / "patchsets/megatron-lm/v0.17/0002-layers-thirty.patch").read_text()
    assert "-line 30 upstream\n+line 30 upstream rocm\n" in text
    assert port.lock["upstreams"]["megatron-lm"]["resolved_ref"] == "core_v0.17.0"
    assert port.run("apply") == 0
    assert json.loads((port.root / "build" / "megatron-lm.report.json").read_text())["totals"] == {"clean": 3}


@pytest.mark.torch
def test_continue_verifies_as_the_stopped_refresh_was_asked(port):
    """The verify options (RefreshVerifyOptions, typed and frozen) are kept in the refresh's state file:
    `--continue` runs the stages and sizes the refresh was started with."""
    from rocmport.config import DEFAULT_BACKEND, DEFAULT_ITERS
    from rocmport.refresh.report import RefreshVerifyOptions

    port.tag({"megatron/core/layers.py": edit_line(LAYERS, 30, "line 30 upstream")}, "core_v0.17.0", "0.17.0")
    assert port.run("refresh", "--to", "v0.17", "--verify-stages", "1", "--tp", "1", "--pp", "1") == 1
    state = json.loads((port.root / "build" / "refresh" / "state.json").read_text())
    asked = RefreshVerifyOptions.from_dict(state["verify_opts"])
    assert asked == RefreshVerifyOptions(tp=1, pp=1, stages=("imports",))
    assert (asked.iters, asked.backend) == (DEFAULT_ITERS, DEFAULT_BACKEND)  # verify's own defaults
    rtree = port.root / "build" / "refresh" / "megatron-lm"
    (rtree / "megatron/core/layers.py").write_text(edit_line(LAYERS, 30, "line 30 upstream rocm"))
    g(rtree, "commit", "-qam", "resolve 0002 by hand")
    assert port.run("refresh", "--continue") == 0
    stages = {s["name"]: s for s in port.summary["verify"]["stages"]}
    assert stages["imports"]["status"] == "pass", stages["imports"]
    assert (stages["gpt-training"]["status"], stages["gpt-training"]["reason"]) == (
        "skipped",
        "not selected (--stages)",
    )
    assert stages["unit-tests"]["reason"].startswith("refresh verifies imports (--verify-stages)")
    # A state written before the options were typed (tp and pp only) reads with verify's defaults.
    assert RefreshVerifyOptions.from_dict({"tp": 1, "pp": 1}) == RefreshVerifyOptions(tp=1, pp=1)


def test_conflict_abort_leaves_everything_as_it_was(port):
    port.tag({"megatron/core/layers.py": edit_line(LAYERS, 30, "line 30 upstream")}, "core_v0.17.0", "0.17.0")
    lock_before = (port.root / "upstream.lock").read_text()
    head_before = g(port.root / "build/megatron-lm", "rev-parse", "HEAD")
    assert port.run("refresh", "--to", "v0.17", "--no-verify") == 1
    assert port.run("refresh", "--abort") == 0
    assert not (port.root / "build" / "refresh").exists()
    assert (port.root / "upstream.lock").read_text() == lock_before and g(port.root, "status", "--porcelain") == ""
    assert g(port.root / "build/megatron-lm", "rev-parse", "HEAD") == head_before
    assert port.run("refresh", "--continue") == 2


def test_abort_keeps_a_committed_resolution_and_untracked_files_on_a_backup_ref(port, capsys):
    """As `apply --abort` does: the human's work in the refresh tree outlives the refresh area."""
    port.tag({"megatron/core/layers.py": edit_line(LAYERS, 30, "line 30 upstream")}, "core_v0.17.0", "0.17.0")
    assert port.run("refresh", "--to", "v0.17", "--no-verify") == 1
    rtree = port.root / "build" / "refresh" / "megatron-lm"
    (rtree / "megatron/core/layers.py").write_text(edit_line(LAYERS, 30, "line 30 upstream rocm"))
    g(rtree, "commit", "-qam", "resolve 0002 by hand")
    mine = g(rtree, "rev-parse", "HEAD")
    (rtree / "NOTES.md").write_text("what I tried\n")
    project_tree = port.root / "build" / "megatron-lm"
    head_before = g(project_tree, "rev-parse", "HEAD")
    capsys.readouterr()
    assert port.run("refresh", "--abort") == 0
    err = capsys.readouterr().err
    assert not (port.root / "build" / "refresh").exists()
    ref = "refs/rocmport/backup/1"
    assert f"on {ref} of {project_tree}" in err and "NOTES.md" in err
    assert g(project_tree, "for-each-ref", "--format=%(refname)", "refs/rocmport/backup/") == ref
    # The backup holds the committed resolution (an ancestor) and the untracked file, byte for byte.
    g(project_tree, "merge-base", "--is-ancestor", mine, ref)
    assert g(project_tree, "show", f"{ref}:NOTES.md") == "what I tried"
    assert "line 30 upstream rocm" in g(project_tree, "show", f"{ref}:megatron/core/layers.py")
    # The project's own port is untouched, and a plain abort right after a conflict saves nothing.
    assert g(project_tree, "rev-parse", "HEAD") == head_before and g(project_tree, "status", "--porcelain") == ""
    assert port.run("refresh", "--to", "v0.17", "--no-verify") == 1
    assert port.run("refresh", "--abort") == 0
    assert g(project_tree, "for-each-ref", "--format=%(refname)", "refs/rocmport/backup/") == ref


def test_abort_without_a_project_tree_keeps_the_refresh_tree_aside(port, capsys):
    port.tag({"megatron/core/layers.py": edit_line(LAYERS, 30, "line 30 upstream")}, "core_v0.17.0", "0.17.0")
    assert port.run("refresh", "--to", "v0.17", "--no-verify") == 1
    rtree = port.root / "build" / "refresh" / "megatron-lm"
    (rtree / "NOTES.md").write_text("what I tried\n")
    shutil.rmtree(port.root / "build" / "megatron-lm")
    capsys.readouterr()
    assert port.run("refresh", "--abort") == 0
    (aside,) = (port.root / "build").glob("refresh-aborted-megatron-lm-*")
    assert f"in {aside}, on refs/rocmport/backup/1" in capsys.readouterr().err
    assert g(aside, "show", "refs/rocmport/backup/1:NOTES.md") == "what I tried"


def test_tag_touching_nothing_ported_changes_only_the_lock(port):
    new = port.tag({"docs/index.md": "more docs\n"}, "core_v0.16.2", "0.16.2")
    assert port.run("refresh", "--to", "v0.16", "--no-verify") == 0
    assert {p["action"] for p in port.rows().values()} == {"kept"}
    assert g(port.root, "status", "--porcelain") == "M upstream.lock"
    assert port.lock["upstreams"]["megatron-lm"]["commit"] == new
    assert port.summary["upstreams"]["megatron-lm"]["created"] is False


def test_refresh_json_and_bad_input(port, capsys):
    assert port.run("refresh") == 2
    assert port.run("refresh", "--to", "v0.99", "--no-verify") == 2
    assert "v0.99" in capsys.readouterr().err
    port.tag({"megatron/core/layers.py": "x\n" + LAYERS}, "core_v0.17.0", "0.17.0")
    capsys.readouterr()
    assert port.run("refresh", "--to", "v0.17", "--no-verify", "--json") == 0
    data = json.loads(capsys.readouterr().out)
    assert (
        data["status"] == "not-verified"
        and data["to"] == "v0.17"
        and "series_text" not in data["upstreams"]["megatron-lm"]
    )
    # Moved but unchanged patches read as equal in the range-diff.
    assert re.search(r"1:  [0-9a-f]+ = 1:  [0-9a-f]+ rocm line ten", data["range_diff"])


@pytest.mark.torch
def test_verify_failure_is_labelled_against_the_old_pin(port):
    """The new release breaks imports; the old port imports fine, so the failure is the new upstream's."""
    port.tag({"megatron/core/__init__.py": "import rocmport_test_no_such_package  # noqa\n"}, "core_v0.17.0", "0.17.0")
    lock_before = (port.root / "upstream.lock").read_text()
    assert port.run("refresh", "--to", "v0.17", "--tp", "1", "--pp", "1") == 1
    v = port.summary["verify"]
    assert v["failed"] == ["imports"] and port.summary["status"] == "needs-a-human"
    assert v["labels"]["imports"].startswith("passes on the old pin")
    assert "rocmport_test_no_such_package" in next(s["reason"] for s in v["stages"] if s["name"] == "imports")
    # Nothing promoted: the lock and the series stay; the summary says why.
    assert (port.root / "upstream.lock").read_text() == lock_before
    assert not (port.root / "patchsets/megatron-lm/v0.17").exists()
    assert "passes on the old pin" in (port.root / "build/refresh/summary.md").read_text()


def test_patch_merged_then_changed_upstream_is_dropped_by_patch_id(port):
    """Upstream landed patch 0002 and then edited the same line: it neither applies nor reverse-applies,
    but its patch-id names the upstream commit, so it is dropped instead of stopping as a conflict."""
    landed = port.upstream_commit(
        {"megatron/core/layers.py": edit_line(LAYERS, 30, "line 30 rocm")}, "upstream takes 0002"
    )
    port.tag({"megatron/core/layers.py": edit_line(LAYERS, 30, "line 30 rocm, tuned")}, "core_v0.17.0", "0.17.0")
    assert port.run("refresh", "--to", "v0.17", "--no-verify") == 0
    row = port.rows()["0002-layers-thirty.patch"]
    # The evidence names the patch-id git computes for the upstream commit itself.
    upstream_pid = g(port.up, "patch-id", "--stable", input=g(port.up, "show", landed) + "\n").split()[0]
    assert (
        row["action"] == "dropped"
        and row["evidence"] == f"patch-id {upstream_pid[:12]} matches upstream commit {landed[:12]}"
    )
    assert port.series("v0.17")["patches"] == ["0001-layers-ten.patch", "0003-utils.patch"]


def guarded(name: str) -> str:
    return f"import modelopt\n\n\ndef {name}():\n    return modelopt\n"


def test_unverified_summary_explains_files_a_codemod_lost_and_holds_no_machine_path(tmp_path, monkeypatch):
    """Upstream deletes one file a codemod rewrote, moves another, edits the import out of a third: the
    summary says which, calls a --no-verify refresh "not verified", and names no path of this machine."""
    monkeypatch.setenv("ROCMPORT_CACHE_DIR", str(tmp_path / "cache"))
    up = init(tmp_path / "upstream")
    commit(
        up,
        {
            "megatron/core/package_info.py": package_info("0.16.1"),
            "megatron/core/a.py": guarded("a"),
            "megatron/core/b.py": guarded("b"),
            "megatron/core/c.py": guarded("c"),
        },
        "0.16.1",
    )
    g(up, "tag", "core_v0.16.1")
    root = tmp_path / "project"
    (root / "patchsets/megatron-lm/v0.16").mkdir(parents=True)
    (root / "patchsets/megatron-lm/v0.16/series").write_text(
        'upstream: megatron-lm\nline: v0.16\nversions: ">=0.16.0rc0,<0.17.0rc0"\npatches: []\ncodemods:\n  - guard-nvidia-only-imports\n'
    )
    run = lambda *a: main(["-C", str(root), *a])  # noqa: E731
    assert run("sync", "--ref", "v0.16", "--no-bridge", "--remote", f"megatron-lm={up}") == 0
    assert run("apply") == 0
    g(up, "rm", "-q", "megatron/core/a.py")
    g(up, "mv", "megatron/core/b.py", "megatron/core/b2.py")
    commit(
        up,
        {"megatron/core/package_info.py": package_info("0.17.0"), "megatron/core/c.py": "def f():\n    return None\n"},
        "0.17.0",
    )
    g(up, "tag", "core_v0.17.0")
    assert run("refresh", "--to", "v0.17", "--no-verify") == 0
    md = (root / "build/refresh/summary.md").read_text()
    assert (
        "**Status:** `not-verified`: the patches and codemods carried over, but verify was skipped (--no-verify)" in md
    )
    assert "ready to merge" not in md
    assert "| guard-nvidia-only-imports | 3 → 1 | 4 → 2 | `megatron/core/b2.py` |" in md  # with the generated _rocm.py
    assert "- guard-nvidia-only-imports: `megatron/core/a.py`: deleted upstream" in md
    assert "- guard-nvidia-only-imports: `megatron/core/b.py`: moved upstream to `megatron/core/b2.py`" in md
    assert (
        "- guard-nvidia-only-imports: `megatron/core/c.py`: changed upstream: nothing left for the codemod to rewrite"
        in md
    )
    assert "(new series `patchsets/megatron-lm/v0.17/series`)" in md
    assert str(tmp_path) not in md and str(tmp_path.resolve()) not in md
    summary = json.loads((root / "build/refresh/summary.json").read_text())
    gone = summary["upstreams"]["megatron-lm"]["codemods"][0]["no_longer_rewritten"]
    assert [f["file"] for f in gone] == ["megatron/core/a.py", "megatron/core/b.py", "megatron/core/c.py"]


def _said(capsys, port, *args) -> tuple[int, dict, dict, str]:
    """A refresh's exit code, its --json, its summary.json and the status word its summary.md leads with."""
    capsys.readouterr()
    code = port.run(*args, "--json")
    printed = json.loads(capsys.readouterr().out)
    md = (port.root / "build" / "refresh" / "summary.md").read_text()
    m = re.search(r"^\*\*Status:\*\* `([a-z-]+)`", md, re.M)
    return code, printed, port.summary, m.group(1) if m else md


def _agree(code: int, printed: dict, summary: dict, md_word: str, expected: str) -> None:
    assert (printed["status"], summary["status"], md_word) == (expected, expected, expected)
    assert code == EXIT_CODES[expected] and printed["why"] == summary["why"]


def test_one_status_in_json_summary_and_exit_code_for_every_outcome(port, capsys):
    """not-verified (--no-verify; a tree needing another Python), needs-a-human (a conflict), up-to-date:
    run for real; ready and a failed verify: built results through the same renderers."""
    port.tag({"docs/index.md": "x\n"}, "core_v0.16.2", "0.16.2")
    code, printed, summary, word = _said(capsys, port, "refresh", "--to", "core_v0.16.2", "--no-verify")
    _agree(code, printed, summary, word, "not-verified")
    assert printed["why"] == "verify was skipped (--no-verify)" and printed["verify"] is None
    code, printed, summary, word = _said(capsys, port, "refresh", "--to", "core_v0.16.2", "--no-verify")
    _agree(code, printed, summary, word, "up-to-date")
    # Without --no-verify, on a tree that needs a Python this one is not: verify cannot run.
    port.tag(
        {"pyproject.toml": '[project]\nname = "megatron-core"\nrequires-python = ">=3.99"\n'}, "core_v0.16.3", "0.16.3"
    )
    code, printed, summary, word = _said(capsys, port, "refresh", "--to", "core_v0.16.3")
    _agree(code, printed, summary, word, "not-verified")
    assert printed["why"].startswith("verify did not run: the new tree requires Python >=3.99")
    port.tag({"megatron/core/layers.py": edit_line(LAYERS, 30, "line 30 upstream")}, "core_v0.17.0", "0.17.0")
    code, printed, summary, word = _said(capsys, port, "refresh", "--to", "v0.17", "--no-verify")
    _agree(code, printed, summary, word, "needs-a-human")
    assert printed["why"] == "conflict in 0002-layers-thirty.patch"
    assert port.run("refresh", "--abort") == 0
    settings = load_settings(port.root)
    lock = load_lock(settings.lock_path)
    for verify, expected in (
        (RefreshVerify("cpu-proxy", [StageResult("imports", "pass", "", 1.0)], []), "ready"),
        # a stage the refresh did not ask for is skipped, saying so: still ready
        (
            RefreshVerify(
                "cpu-proxy",
                [
                    StageResult("imports", "pass", "", 1.0),
                    StageResult("unit-tests", "skipped", "refresh verifies imports"),
                ],
                [],
                requested=["imports"],
            ),
            "ready",
        ),
        # a stage it asked for that did not run (no tests/unit_tests in the tree) verified nothing
        (
            RefreshVerify(
                "cpu-proxy",
                [StageResult("imports", "pass", "", 1.0), StageResult("unit-tests", "skipped", "no tests/unit_tests")],
                [],
                requested=["imports", "unit-tests"],
            ),
            "not-verified",
        ),
        (RefreshVerify("cpu-proxy", [StageResult("imports", "fail", "", 1.0)], ["imports"]), "needs-a-human"),
    ):
        result = RefreshResult(READY, "v0.17", lock, lock, verify=verify).settle()
        md = (write_summary(result, settings.refresh_dir, settings)).read_text()
        word = re.search(r"^\*\*Status:\*\* `([a-z-]+)`", md, re.M).group(1)  # type: ignore[union-attr]
        _agree(result.exit_code, public(result), port.summary, word, expected)
