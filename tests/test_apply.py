"""`rocmport apply` on real git repositories with real patches."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from rocmport.cli import main
from tests.helpers.patches import BASE_FILES, LAYERS, Project, make_patch, run_apply_subprocess
from tests.helpers.sync import g


@pytest.fixture()
def proj(tmp_path, monkeypatch):
    return Project(tmp_path, monkeypatch)


def apply(proj, *args):
    return main(["-C", str(proj.root), "apply", *args])


def report(proj):
    return json.loads((proj.root / "build" / "megatron-lm.report.json").read_text())


def test_clean_apply_builds_layered_branch(proj, capsys):
    p1 = make_patch(proj.up, {"megatron/core/utils.py": "def f():\n    return 2\n"}, desc="make f return 2")
    proj.write_series({"0001-f.patch": p1})
    assert apply(proj) == 0
    t = proj.tree
    assert g(t, "rev-parse", "--abbrev-ref", "HEAD") == "rocm/core_v0.16.1"
    assert g(t, "rev-parse", "rocmport/base/core_v0.16.1^{commit}") == proj.base
    assert g(t, "rev-parse", "rocmport/port/core_v0.16.1^{commit}") == g(t, "rev-parse", "HEAD")
    msg = g(t, "log", "-1", "--format=%B")
    assert (
        msg.startswith("make f return 2\n\nmore words")
        and "Patch: 0001-f.patch" in msg
        and "Upstream-Status: ROCm-only" in msg
    )
    assert (t / "megatron/core/utils.py").read_text() == "def f():\n    return 2\n"
    r = report(proj)
    assert r["patches"][0]["bucket"] == "clean" and r["base"] == proj.base and r["totals"] == {"clean": 1}
    # No refs or worktrees were written into the shared cache.
    assert "rocm/" not in g(proj.mirror, "for-each-ref") and g(proj.mirror, "worktree", "list").count("\n") == 0


def test_same_inputs_same_result_and_fast_noop(proj, tmp_path, monkeypatch, capsys):
    proj.write_series({"0001-f.patch": make_patch(proj.up, {"megatron/core/utils.py": "x = 1\n"})})
    assert apply(proj) == 0
    head = g(proj.tree, "rev-parse", "HEAD")
    state_before = (proj.tree / ".git" / "rocmport-state.json").read_text()
    report_before = (proj.root / "build" / "megatron-lm.report.json").stat().st_mtime_ns
    capsys.readouterr()
    # The no-op path: nothing is checked out or written (its time is a figure of benchmarks/bench_apply.py).
    assert apply(proj) == 0
    err = capsys.readouterr().err
    assert "megatron-lm: up to date (rocm/core_v0.16.1" in err and "nothing to do" in err
    assert g(proj.tree, "rev-parse", "HEAD") == head
    assert (proj.tree / ".git" / "rocmport-state.json").read_text() == state_before
    assert (proj.root / "build" / "megatron-lm.report.json").stat().st_mtime_ns == report_before
    # A second project from the same inputs gets the same commit ids.
    import shutil

    shutil.rmtree(proj.tree)
    assert apply(proj) == 0
    assert g(proj.tree, "rev-parse", "HEAD") == head


def test_offset_is_recorded(proj):
    patch = make_patch(proj.up, {"megatron/core/layers.py": LAYERS.replace("line 30\n", "line thirty\n")}, context=2)
    new = proj.upstream_commit({"megatron/core/layers.py": "new top\n" * 4 + LAYERS})
    proj.refresh_mirror()
    proj.pin(new)
    proj.write_series({"0001-l.patch": patch})
    assert apply(proj) == 0
    p = report(proj)["patches"][0]
    assert p["bucket"] == "offset" and p["offsets"] == [{"hunk": 1, "line": 32, "offset": 4}]


def test_three_way_merge(proj):
    patch = make_patch(proj.up, {"megatron/core/layers.py": LAYERS.replace("line 20\n", "line twenty\n")})
    # Upstream edits a line inside the patch's context: exact apply fails, 3-way merges.
    new = proj.upstream_commit({"megatron/core/layers.py": LAYERS.replace("line 18\n", "line eighteen\n")})
    proj.refresh_mirror()
    proj.pin(new)
    proj.write_series({"0001-l.patch": patch})
    assert apply(proj) == 0
    assert report(proj)["patches"][0]["bucket"] == "merged-3way"
    text = (proj.tree / "megatron/core/layers.py").read_text()
    assert "line eighteen\nline 19\nline twenty\n" in text


def test_already_upstream_and_not_applicable(proj):
    patch = make_patch(proj.up, {"megatron/core/utils.py": "merged = True\n"})
    # A patch to megatron/training/, which a package-index source (megatron/core only) lacks.
    other = (
        "Description: training\nUpstream-Status: Pending\n---\n"
        "diff --git a/megatron/training/arguments.py b/megatron/training/arguments.py\n"
        "--- a/megatron/training/arguments.py\n+++ b/megatron/training/arguments.py\n@@ -1 +1 @@\n-x\n+y\n"
    )
    new = proj.upstream_commit({"megatron/core/utils.py": "merged = True\n"}, "upstream merged our patch")
    proj.refresh_mirror()
    proj.pin(new)
    proj.write_series({"0001-u.patch": patch, "0002-t.patch": other})
    assert apply(proj) == 0
    buckets = [p["bucket"] for p in report(proj)["patches"]]
    assert buckets == ["already-upstream", "not-applicable"]
    assert g(proj.tree, "rev-parse", "HEAD") == new  # neither made a commit


def conflict_setup(proj):
    good = make_patch(proj.up, {"megatron/core/utils.py": "def f():\n    return 2\n"}, desc="good")
    bad = make_patch(proj.up, {"megatron/core/layers.py": LAYERS.replace("line 20\n", "line twenty\n")}, desc="bad")
    after = make_patch(
        proj.up, {"megatron/core/package_info.py": BASE_FILES["megatron/core/package_info.py"] + "# x\n"}, desc="after"
    )
    new = proj.upstream_commit({"megatron/core/layers.py": LAYERS.replace("line 20\n", "line 20 changed upstream\n")})
    proj.refresh_mirror()
    proj.pin(new)
    proj.write_series({"0001-good.patch": good, "0002-bad.patch": bad, "0003-after.patch": after})
    return new


def test_conflict_stops_cleanly_then_continue(proj, capsys):
    conflict_setup(proj)
    assert apply(proj) == 1
    err = capsys.readouterr().err
    assert "0002-bad.patch does not apply (megatron/core/layers.py:" in err and "rocmport apply --continue" in err
    t = proj.tree
    assert g(t, "status", "--porcelain") == ""  # nothing half-applied
    assert g(t, "log", "-1", "--format=%s") == "good"
    assert report(proj)["status"] == "conflict"
    assert apply(proj) == 2  # a plain re-run refuses while stopped
    assert apply(proj, "--continue") == 2  # nothing committed yet
    (t / "megatron/core/layers.py").write_text(LAYERS.replace("line 20\n", "line twenty (resolved)\n"))
    g(t, "commit", "-qam", "bad, resolved by hand")
    assert apply(proj, "--continue") == 0
    assert [s for s in g(t, "log", "--format=%s", "-3").splitlines()] == ["after", "bad, resolved by hand", "good"]
    r = report(proj)
    assert r["status"] == "done" and r["patches"][1]["detail"].startswith("resolved by hand")


def test_conflict_abort_restores_previous_branch(proj):
    proj.write_series({"0001-f.patch": make_patch(proj.up, {"megatron/core/utils.py": "x = 1\n"})})
    assert apply(proj) == 0
    before = g(proj.tree, "rev-parse", "HEAD")
    conflict_setup(proj)
    assert apply(proj) == 1
    state_before = json.loads((proj.tree / ".git" / "rocmport-state.json").read_text())
    assert apply(proj, "--abort") == 0
    assert g(proj.tree, "rev-parse", "HEAD") == before
    # The state is the finished port's again, so a plain apply goes on from there (no --force needed).
    restored = json.loads((proj.tree / ".git" / "rocmport-state.json").read_text())
    assert restored["status"] == "done" and restored["result"] == before == state_before["prev_head"]


def test_dirty_tree_is_refused_then_backed_up_with_force(proj, capsys):
    proj.write_series({"0001-f.patch": make_patch(proj.up, {"megatron/core/utils.py": "x = 1\n"})})
    assert apply(proj) == 0
    (proj.tree / "megatron/core/utils.py").write_text("my precious edit\n")
    (proj.tree / "notes.txt").write_text("untracked\n")
    proj.write_series({"0001-f.patch": make_patch(proj.up, {"megatron/core/utils.py": "x = 2\n"})})
    capsys.readouterr()
    assert apply(proj) == 2
    err = capsys.readouterr().err
    assert (
        "uncommitted changes in megatron/core/utils.py" in err and "rocmport patches export" in err and "--force" in err
    )
    assert (proj.tree / "megatron/core/utils.py").read_text() == "my precious edit\n"
    assert apply(proj, "--force") == 0
    backup = g(proj.tree, "for-each-ref", "--format=%(refname)", "refs/rocmport/backup/")
    assert backup == "refs/rocmport/backup/1"
    assert g(proj.tree, "show", f"{backup}:megatron/core/utils.py") == "my precious edit"
    assert g(proj.tree, "show", f"{backup}:notes.txt") == "untracked"
    assert (proj.tree / "megatron/core/utils.py").read_text() == "x = 2\n"


def test_unexplained_commits_are_refused(proj, capsys):
    assert apply(proj) == 0
    (proj.tree / "new.py").write_text("x\n")
    g(proj.tree, "add", "new.py")
    g(proj.tree, "commit", "-qm", "my work")
    proj.write_series({"0001-f.patch": make_patch(proj.up, {"megatron/core/utils.py": "x = 1\n"})})
    assert apply(proj) == 2
    assert "1 commit(s) on rocm/core_v0.16.1 that no patch explains" in capsys.readouterr().err
    assert apply(proj, "--force") == 0
    assert g(proj.tree, "show", "refs/rocmport/backup/1:new.py") == "x"


def test_kill_mid_apply_then_recover(proj):
    """Interrupted from outside, at a point the test observes: once the state file records a patch,
    the apply's process group is stopped (SIGSTOP), checked, and killed (SIGKILL)."""
    patches = {
        f"{i:04d}-p.patch": make_patch(proj.up, {f"megatron/core/new{i}.py": f"x = {i}\n"}, desc=f"p{i}")
        for i in range(1, 31)
    }
    proj.write_series(patches)
    proc = run_apply_subprocess(proj.root, wait=False)
    state = proj.root / "build" / "megatron-lm" / ".git" / "rocmport-state.json"

    def applied() -> list[str]:
        try:
            return [p["name"] for p in json.loads(state.read_text()).get("patches", [])]
        except (OSError, ValueError):
            return []

    deadline = time.monotonic() + 90
    while not applied() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGSTOP)
    done = applied()
    assert 1 <= len(done) < 30, f"the apply was not stopped mid-series ({len(done)} patches recorded)"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert json.loads(state.read_text())["status"] == "in-progress"
    rc, out, err = run_apply_subprocess(proj.root)
    assert rc == 0, err
    assert "recovering from an interrupted apply" in err
    assert g(proj.tree, "log", "--format=%s", "-3").splitlines() == ["p30", "p29", "p28"]
    assert g(proj.tree, "status", "--porcelain") == ""


@pytest.mark.parametrize(
    "path, why",
    [("../outside.py", "escapes the tree"), ("/etc/passwd", "is absolute"), (".git/hooks/post-commit", "inside .git/")],
)
def test_path_escapes_are_rejected_before_anything_changes(proj, capsys, path, why):
    patch = (
        "Description: evil\nUpstream-Status: Pending\n---\n"
        f"diff --git a/{path} b/{path}\nnew file mode 100644\n--- /dev/null\n+++ b/{path}\n@@ -0,0 +1 @@\n+pwned\n"
    )
    proj.write_series({"0001-evil.patch": patch})
    assert apply(proj) == 2
    err = capsys.readouterr().err
    assert "0001-evil.patch" in err and why in err
    assert not proj.tree.exists()


def test_symlink_in_path_is_rejected(proj, capsys):
    import os

    proj.upstream_commit({"README": "x\n"})
    os.symlink("/tmp", proj.up / "escape")
    g(proj.up, "add", "escape")
    g(proj.up, "commit", "-qm", "symlink")
    proj.refresh_mirror()
    proj.pin(g(proj.up, "rev-parse", "HEAD"))
    patch = (
        "Description: via link\nUpstream-Status: Pending\n---\n"
        "diff --git a/escape/x.py b/escape/x.py\nnew file mode 100644\n--- /dev/null\n+++ b/escape/x.py\n@@ -0,0 +1 @@\n+x\n"
    )
    proj.write_series({"0001-link.patch": patch})
    assert apply(proj) == 2
    assert "goes through the symlink escape" in capsys.readouterr().err


def test_malformed_diff_and_header(proj, capsys):
    good = make_patch(proj.up, {"megatron/core/utils.py": "x = 1\n"})
    broken = good.replace("@@ -1,2 +1 @@", "@@ -1,9 +1,7 @@")
    proj.write_series({"0001-broken.patch": broken})
    assert apply(proj) == 2
    err = capsys.readouterr().err
    assert "0001-broken.patch:" in err and "malformed diff" in err
    proj.write_series({"0001-hdr.patch": good.replace("Upstream-Status: ROCm-only", "Upstream-Status: Maybe")})
    assert apply(proj) == 2
    assert "Upstream-Status 'Maybe' must be" in capsys.readouterr().err
    proj.write_series({"0001-hdr.patch": good.replace("Description: fix a thing", "this is not a field")})
    assert apply(proj) == 2
    assert "0001-hdr.patch:1: malformed DEP-3 header line" in capsys.readouterr().err


def test_no_series_for_version(proj, capsys):
    proj.pin(proj.base, version="0.20.0")
    assert apply(proj) == 2
    err = capsys.readouterr().err
    assert "megatron-lm 0.20.0: no series" in err and "rocmport refresh --to" in err and "--codemods-only" in err
    assert apply(proj, "--codemods-only") == 0


def test_sparse_checkout_excludes_paths_and_commits_work(proj):
    # Drop the docs blob from the mirror, as the real Bridge mirror lacks its large GIFs.
    proj.write_series({"0001-f.patch": make_patch(proj.up, {"megatron/core/utils.py": "x = 1\n"})}, excluded=["docs"])
    blob = g(proj.mirror, "rev-parse", f"{proj.base}:docs/index.md")
    import subprocess

    packs = list((proj.mirror / "objects" / "pack").glob("*.pack"))
    for pack in packs:
        data = pack.read_bytes()
        pack.unlink()
        pack.with_suffix(".idx").unlink()
        subprocess.run(["git", "unpack-objects", "-q"], cwd=proj.mirror, input=data, check=True)
    (proj.mirror / "objects" / blob[:2] / blob[2:]).unlink()
    assert apply(proj) == 0
    assert not (proj.tree / "docs").exists()
    assert (proj.tree / "megatron/core/utils.py").read_text() == "x = 1\n"
    assert g(proj.tree, "config", "index.sparse") == "true"


def test_json_output(proj, capsys):
    proj.write_series({"0001-f.patch": make_patch(proj.up, {"megatron/core/utils.py": "x = 1\n"})})
    assert apply(proj, "--json") == 0
    data = json.loads(capsys.readouterr().out)
    r = data["upstreams"]["megatron-lm"]
    assert r["status"] == "done" and r["totals"] == {"clean": 1} and len(r["series_hash"]) == 64


def test_concurrent_apply_on_one_tree_is_refused(proj, capsys):
    from filelock import FileLock

    proj.tree.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(proj.tree.parent / ".megatron-lm.lock")):
        rc, out, err = run_apply_subprocess(proj.root)
    assert rc == 2 and "another rocmport apply is running on this work tree" in err
    assert not proj.tree.exists()
    assert apply(proj) == 0
    assert not (proj.tree.parent / ".megatron-lm.cloning").exists()
