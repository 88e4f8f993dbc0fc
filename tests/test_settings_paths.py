"""Issue #41, rule "Paths from settings" (rows 3, 21): worktree_dir and cache_dir from
.rocmport/local.yaml (and [tool.rocmport]'s worktree-dir/cache-dir) are resolved against the project
root, never the caller's directory, with `~` expanded, and confined (not the project itself or a
directory above it); `-C` naming no directory, and a settings file that is a directory, are refused
(exit 2, naming them)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rocmport.cli import main
from rocmport.config import load_settings
from rocmport.errors import EXIT_USAGE
from tests.helpers.patches import Project


def local_yaml(proj: Project, text: str) -> Path:
    path = proj.root / ".rocmport" / "local.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
    return path


def test_a_relative_worktree_dir_is_the_projects_from_any_directory(tmp_path, monkeypatch, capsys):
    """The issue's case: `-C PROJECT apply` from elsewhere built the work trees in the caller's directory."""
    proj = Project(tmp_path, monkeypatch)
    local_yaml(proj, "worktree_dir: relbuild\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert main(["-C", str(proj.root), "apply"]) == 0, capsys.readouterr().err
    assert (proj.root / "relbuild" / "megatron-lm" / ".git").exists()
    assert list(elsewhere.iterdir()) == []


def test_cache_dir_expands_the_home_directory_and_resolves_against_the_project(tmp_path, monkeypatch):
    proj = Project(tmp_path, monkeypatch)
    monkeypatch.delenv("ROCMPORT_CACHE_DIR")
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path)
    local_yaml(proj, "cache_dir: ~/my-cache\nworktree_dir: ../trees\n")
    s = load_settings(proj.root)
    assert s.cache_dir == home / "my-cache"  # was the relative Path('~/my-cache'): a '~' directory in the cwd
    assert s.worktrees_dir == (proj.root / ".." / "trees").resolve()
    local_yaml(proj, "cache_dir: cache-here\n")
    assert load_settings(proj.root).cache_dir == proj.root / "cache-here"


@pytest.mark.parametrize("value", [".", "..", "./", "~", "/"])
def test_a_worktree_dir_over_the_project_is_refused(tmp_path, monkeypatch, capsys, value):
    proj = Project(tmp_path, monkeypatch)
    monkeypatch.setenv("HOME", str(proj.root))  # `~` is the project here
    path = local_yaml(proj, f"worktree_dir: '{value}'\n")
    rc = main(["-C", str(proj.root), "status"])
    err = capsys.readouterr().err
    assert rc == EXIT_USAGE and f"{path}: worktree_dir" in err and "give a directory of its own" in err, err


def test_tool_table_paths_follow_the_same_rule(tmp_path, monkeypatch, capsys):
    proj = Project(tmp_path, monkeypatch)
    (proj.root / "pyproject.toml").write_text('[tool.rocmport]\nworktree-dir = ".."\n')
    rc = main(["-C", str(proj.root), "status"])
    err = capsys.readouterr().err
    assert rc == EXIT_USAGE and "[tool.rocmport] worktree-dir" in err and "a directory above the project" in err, err


def test_a_project_directory_that_does_not_exist_is_refused(tmp_path, capsys):
    rc = main(["-C", str(tmp_path / "nonexistent"), "status"])
    err = capsys.readouterr().err
    assert rc == EXIT_USAGE and "nonexistent" in err and "does not exist" in err, err
    assert not (tmp_path / "nonexistent").exists()


@pytest.mark.parametrize("name", [".rocmport/local.yaml", "pyproject.toml"])
def test_a_settings_file_that_is_a_directory_is_refused_naming_it(tmp_path, monkeypatch, capsys, name):
    proj = Project(tmp_path, monkeypatch)
    (proj.root / name).mkdir(parents=True)
    rc = main(["-C", str(proj.root), "status"])
    err = capsys.readouterr().err
    assert rc == EXIT_USAGE and f"{proj.root / name}: is not a file" in err, err
