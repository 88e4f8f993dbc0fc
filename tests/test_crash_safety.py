"""Nothing lost: what a killed rocmport leaves behind is cleaned up, and a user's work in a tree is
never destroyed — refused without --force, kept on a backup ref with it. Real git trees throughout."""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from rocmport.cli import main
from rocmport.gitutil import clear_stale_locks, live_git_processes
from tests.helpers.patches import LAYERS, Project, make_patch
from tests.helpers.sync import build_mlm, commit, g


@pytest.fixture()
def proj(tmp_path, monkeypatch):
    return Project(tmp_path, monkeypatch)


def apply(proj, *args):
    return main(["-C", str(proj.root), "apply", *args])


def state(proj) -> dict:
    return json.loads((proj.tree / ".git" / "rocmport-state.json").read_text())


def backups(tree) -> list[str]:
    return g(tree, "for-each-ref", "--format=%(refname)", "refs/rocmport/backup/").split()


def test_stale_index_lock_is_removed_with_a_note(proj, capsys):
    proj.write_series({"0001-f.patch": make_patch(proj.up, {"megatron/core/utils.py": "x = 1\n"})})
    assert apply(proj) == 0
    for lock in (".git/index.lock", ".git/HEAD.lock", ".git/refs/heads/rocm/core_v0.16.1.lock"):
        (proj.tree / lock).write_text("")
    proj.write_series({"0001-f.patch": make_patch(proj.up, {"megatron/core/utils.py": "x = 2\n"})})
    capsys.readouterr()
    assert apply(proj) == 0
    err = capsys.readouterr().err
    assert "removed .git/index.lock, left behind by an interrupted git" in err and "removed .git/HEAD.lock" in err
    assert not list((proj.tree / ".git").rglob("*.lock"))
    assert (proj.tree / "megatron/core/utils.py").read_text() == "x = 2\n"


def test_a_lock_a_live_git_holds_is_left_alone(tmp_path):
    repo = tmp_path / "r"
    repo.mkdir()
    g(repo, "init", "-q")
    (repo / ".git" / "index.lock").write_text("")
    # A git process working in the repository (as an editor's `git status` would be).
    live = subprocess.Popen(["git", "cat-file", "--batch"], cwd=repo, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while not live_git_processes(repo) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert live.pid in live_git_processes(repo)
        assert clear_stale_locks(repo / ".git", repo) == []
        assert (repo / ".git" / "index.lock").exists()
    finally:
        live.stdin.close()
        live.wait(10)
    assert clear_stale_locks(repo / ".git", repo) == [repo / ".git" / "index.lock"]


def test_a_killed_auto_maintenances_lock_is_stale_too(tmp_path):
    """git's auto maintenance after a commit holds objects/maintenance.lock; CI killed an apply there
    (test_kill_apply_at_random_points, seed 1) and the next apply left the lock behind."""
    repo = tmp_path / "r"
    repo.mkdir()
    g(repo, "init", "-q")
    (repo / ".git" / "objects" / "maintenance.lock").write_text("")
    (repo / ".git" / "objects" / "pack" / "pack-x.keep").write_text("")  # not a lock: left alone
    assert clear_stale_locks(repo / ".git", repo) == [repo / ".git" / "objects" / "maintenance.lock"]
    assert not (repo / ".git" / "objects" / "maintenance.lock").exists()
    assert (repo / ".git" / "objects" / "pack" / "pack-x.keep").exists()


def test_a_killed_syncs_ref_lock_in_the_shared_cache_is_removed(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ROCMPORT_CACHE_DIR", str(tmp_path / "cache"))
    up = tmp_path / "Megatron-LM"
    build_mlm(up)
    root = tmp_path / "project"
    root.mkdir()
    assert main(["-C", str(root), "sync", "--ref", "v0.16", "--no-bridge", "--remote", f"megatron-lm={up}"]) == 0
    commit(up, {"x": "y"}, "more")
    mirror = tmp_path / "cache" / "mirrors" / "megatron-lm.git"
    (mirror / "refs" / "heads").mkdir(parents=True, exist_ok=True)
    (mirror / "refs" / "heads" / "main.lock").write_text("")
    (mirror / "packed-refs.lock").write_text("")
    capsys.readouterr()
    assert main(["-C", str(root), "sync", "--ref", "v0.16", "--no-bridge"]) == 0
    err = capsys.readouterr().err
    assert "main.lock, left behind by an interrupted sync" in err and "packed-refs.lock" in err
    assert g(mirror, "rev-parse", "refs/heads/main") == g(up, "rev-parse", "HEAD")


def _interrupted(proj) -> str:
    """A finished port whose state then says in-progress, as after a kill between two patches."""
    proj.write_series({"0001-f.patch": make_patch(proj.up, {"megatron/core/utils.py": "x = 1\n"}, desc="f")})
    assert apply(proj) == 0
    s = state(proj)
    s.update(status="in-progress", last_good=s["result"])
    s.pop("step", None)
    (proj.tree / ".git" / "rocmport-state.json").write_text(json.dumps(s))
    return s["result"]


def test_recovery_refuses_over_a_users_edits_untracked_files_and_commits(proj, capsys):
    _interrupted(proj)
    (proj.tree / "megatron/core/utils.py").write_text("MY EDIT AFTER THE CRASH\n")
    (proj.tree / "my notes — ü.txt").write_text("untracked\n")
    (proj.tree / "c.py").write_text("c\n")
    g(proj.tree, "add", "c.py")
    g(proj.tree, "commit", "-qm", "my commit after the crash")
    mine = g(proj.tree, "rev-parse", "HEAD")
    capsys.readouterr()
    assert apply(proj) == 2
    err = capsys.readouterr().err
    assert "recovering from an interrupted apply" in err
    assert "uncommitted changes in megatron/core/utils.py, my notes — ü.txt" in err
    assert f"1 commit(s) on rocm/core_v0.16.1 made after the interrupted apply ({mine[:12]})" in err
    assert (proj.tree / "my notes — ü.txt").exists() and g(proj.tree, "rev-parse", "HEAD") == mine
    assert apply(proj, "--force") == 0
    [ref] = backups(proj.tree)
    assert g(proj.tree, "show", f"{ref}:megatron/core/utils.py") == "MY EDIT AFTER THE CRASH"
    assert g(proj.tree, "show", f"{ref}:my notes — ü.txt") == "untracked"
    assert g(proj.tree, "merge-base", "--is-ancestor", mine, ref) == ""  # the commit is reachable from the backup
    assert g(proj.tree, "status", "--porcelain") == ""


def test_recovery_keeps_the_interrupted_steps_leftovers_without_refusing(proj, capsys):
    """A kill while a patch was being applied leaves its files dirty: rocmport's own, not the user's.
    The next run recovers on its own, keeping them on a backup ref all the same."""
    good = _interrupted(proj)
    s = state(proj)
    s["step"] = {"kind": "patch", "name": "0002-x.patch", "paths": ["megatron/core/layers.py"], "parent": good}
    (proj.tree / ".git" / "rocmport-state.json").write_text(json.dumps(s))
    (proj.tree / "megatron/core/layers.py").write_text("half-applied\n")
    (proj.tree / "megatron/core/.layers.py.4242.tmp").write_text("half-written\n")
    capsys.readouterr()
    assert apply(proj) == 0
    err = capsys.readouterr().err
    assert "saved what the interrupted apply left in megatron/core/layers.py" in err
    [ref] = backups(proj.tree)
    assert g(proj.tree, "show", f"{ref}:megatron/core/layers.py") == "half-applied"
    assert (proj.tree / "megatron/core/layers.py").read_text() == LAYERS


def test_recovery_takes_its_own_in_flight_commit_for_its_own(proj):
    """Killed between a commit and the state update: HEAD is one rocmport commit past last_good."""
    patches = {
        f"000{i}-p.patch": make_patch(proj.up, {f"megatron/core/new{i}.py": f"x = {i}\n"}, desc=f"p{i}") for i in (1, 2)
    }
    proj.write_series(patches)
    assert apply(proj) == 0
    s = state(proj)
    first = s["patches"][0]["commit"]
    s.update(status="in-progress", last_good=first, patches=s["patches"][:1])
    s["step"] = {"kind": "patch", "name": "0002-p.patch", "paths": ["megatron/core/new2.py"], "parent": first}
    (proj.tree / ".git" / "rocmport-state.json").write_text(json.dumps(s))
    assert apply(proj) == 0 and backups(proj.tree) == []


def test_backup_refs_never_overwrite(proj):
    proj.write_series({"0001-f.patch": make_patch(proj.up, {"megatron/core/utils.py": "x = 1\n"})})
    assert apply(proj) == 0
    for i in range(2):
        (proj.tree / "megatron/core/utils.py").write_text(f"edit {i}\n")
        assert apply(proj, "--force") == 0
    assert backups(proj.tree) == ["refs/rocmport/backup/1", "refs/rocmport/backup/2"]
    g(proj.tree, "update-ref", "-d", "refs/rocmport/backup/1")
    kept = g(proj.tree, "rev-parse", "refs/rocmport/backup/2")
    (proj.tree / "megatron/core/utils.py").write_text("edit 3\n")
    assert apply(proj, "--force") == 0
    assert g(proj.tree, "rev-parse", "refs/rocmport/backup/2") == kept
    assert g(proj.tree, "show", "refs/rocmport/backup/3:megatron/core/utils.py") == "edit 3"
    # Each apply remembers the finished port before it (for --abort), one level deep: no chain grows.
    proj.write_series({"0001-f.patch": make_patch(proj.up, {"megatron/core/utils.py": "x = 9\n"})})
    assert apply(proj) == 0
    assert state(proj)["prev_state"]["status"] == "done" and "prev_state" not in state(proj)["prev_state"]


def _conflict(proj):
    good = make_patch(proj.up, {"megatron/core/utils.py": "def f():\n    return 2\n"}, desc="good")
    bad = make_patch(proj.up, {"megatron/core/layers.py": LAYERS.replace("line 20\n", "line twenty\n")}, desc="bad")
    new = proj.upstream_commit({"megatron/core/layers.py": LAYERS.replace("line 20\n", "line 20 changed upstream\n")})
    proj.refresh_mirror()
    proj.pin(new)
    proj.write_series({"0001-good.patch": good, "0002-bad.patch": bad})
    return new


def test_abort_saves_edits_and_untracked_files_then_a_plain_apply_works(proj, capsys):
    new = _conflict(proj)
    assert apply(proj) == 1
    (proj.tree / "megatron/core/layers.py").write_text("half-done resolution\n")
    (proj.tree / "scratch notes.txt").write_text("untracked work\n")
    capsys.readouterr()
    assert apply(proj, "--abort") == 0
    err = capsys.readouterr().err
    assert "saved the uncommitted changes and untracked files" in err and "has no patches or codemods" not in err
    [ref] = backups(proj.tree)
    assert g(proj.tree, "show", f"{ref}:megatron/core/layers.py") == "half-done resolution"
    assert g(proj.tree, "show", f"{ref}:scratch notes.txt") == "untracked work"
    assert g(proj.tree, "rev-parse", "HEAD") == new and g(proj.tree, "status", "--porcelain") == ""
    assert state(proj)["status"] == "aborted"
    proj.write_series({"0001-good.patch": make_patch(proj.up, {"megatron/core/utils.py": "x = 3\n"})})
    assert apply(proj) == 0  # no "no state file" refusal, no --force needed


def test_abort_and_continue_act_on_the_tree_that_stopped(proj, capsys):
    """With Megatron-Bridge pinned too, --abort aborts Megatron-LM's stopped apply and leaves the
    Bridge alone (no "no stopped apply" exit 2, no Bridge clone)."""
    from rocmport.upstream.lock import Pin, load_lock
    from tests.helpers.sync import init

    bup = init(proj.tmp / "bridge-up")
    bbase = commit(bup, {"src/megatron/bridge/package_info.py": "MAJOR = 0\nMINOR = 3\nPATCH = 1\n"}, "bridge 0.3.1")
    g(proj.tmp, "clone", "-q", "--bare", str(bup), str(proj.cache / "mirrors" / "megatron-bridge.git"))
    _conflict(proj)
    lock = load_lock(proj.root / "upstream.lock")
    lock.upstreams["megatron-bridge"] = Pin(
        "https://github.com/NVIDIA-NeMo/Megatron-Bridge.git",
        "git",
        "v0.3.1",
        "v0.3.1",
        bbase,
        "2025-01-01T00:00:00+00:00",
        version="0.3.1",
        chosen_by="override",
    )
    lock.save(proj.root / "upstream.lock")
    d = proj.root / "patchsets" / "megatron-bridge" / "v0.3"
    d.mkdir(parents=True)
    (d / "series").write_text("upstream: megatron-bridge\nline: v0.3\nversions: '>=0.3.0,<0.4.0'\n")
    assert apply(proj) == 1
    bridge = proj.root / "build" / "megatron-bridge"
    assert not bridge.exists()  # the run ended at the conflict
    assert apply(proj, "--continue") == 2  # nothing committed yet: refused, and only for megatron-lm
    assert "HEAD is still the last good commit" in capsys.readouterr().err
    assert apply(proj, "--abort") == 0
    assert not bridge.exists()
    assert apply(proj, "--abort") == 2
    assert "no stopped apply to abort" in capsys.readouterr().err


def test_force_with_awkward_untracked_names(proj):
    assert apply(proj) == 0
    names = ["my notes.txt", "Grüße.txt", "tab\there.txt", 'quote"d.txt', "-dash.txt"]
    for name in names:
        (proj.tree / name).write_text(name + "\n")
    proj.write_series({"0001-f.patch": make_patch(proj.up, {"megatron/core/utils.py": "x = 1\n"})})
    assert apply(proj, "--force") == 0
    [ref] = backups(proj.tree)
    for name in names:
        assert g(proj.tree, "show", f"{ref}:{name}") == name


def test_export_never_overwrites_a_file_it_did_not_write(proj, capsys):
    assert apply(proj) == 0
    notes = proj.series_dir / "0001-fix.patch"
    notes.write_text("MY HAND-WRITTEN NOTES, not in the series\n")
    (proj.tree / "megatron/core/utils.py").write_text("def f():\n    return 3\n")
    g(proj.tree, "commit", "-qam", "fix")
    capsys.readouterr()
    assert main(["-C", str(proj.root), "patches", "export"]) == 0
    err = capsys.readouterr().err
    assert "0001-fix.patch exists and is not in the series: left alone" in err and "wrote" in err
    assert notes.read_text() == "MY HAND-WRITTEN NOTES, not in the series\n"
    assert "- 0002-fix.patch" in (proj.series_dir / "series").read_text()
    assert "return 3" in (proj.series_dir / "0002-fix.patch").read_text()
