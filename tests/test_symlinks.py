"""Nothing escapes through a link: the steps after the patches (codemods, their helper, the
manifests, export, build) never read or write through a symlink, wherever it came from — here the
links come from upstream itself, which no patch check sees."""

from __future__ import annotations

import os

import pytest

from rocmport.cli import main
from rocmport.fsutil import UnsafePath, tree_files, tree_kind, tree_read_text, tree_write_text
from tests.helpers.patches import Project
from tests.helpers.sync import g

AMP = "import torch\n\n\n@torch.cuda.amp.custom_fwd\ndef f(x):\n    return x\n"


@pytest.fixture()
def proj(tmp_path, monkeypatch):
    return Project(tmp_path, monkeypatch)


@pytest.fixture()
def outside(tmp_path):
    d = tmp_path / "outside"
    d.mkdir()
    (d / "victim.py").write_text(AMP)
    (d / "base.txt").write_text("torch\ntransformer-engine\n")
    (d / "pyproject.toml").write_text('[project]\nname = "s"\ndependencies = ["nvidia-modelopt", "SECRET-TOKEN"]\n')
    return d


def snapshot(d):
    return {p.name: p.read_bytes() for p in d.iterdir()}


def upstream_with(proj, files: dict[str, str], links: dict[str, str]) -> None:
    """An upstream commit holding ``files`` and the symlinks ``links`` (path -> target); pinned."""
    for rel, text in files.items():
        (proj.up / rel).parent.mkdir(parents=True, exist_ok=True)
        (proj.up / rel).write_text(text)
    for rel, target in links.items():
        (proj.up / rel).parent.mkdir(parents=True, exist_ok=True)
        os.symlink(target, proj.up / rel)
    g(proj.up, "add", "-A")
    g(proj.up, "commit", "-qm", "upstream with links")
    proj.refresh_mirror()
    proj.pin(g(proj.up, "rev-parse", "HEAD"))


def test_tree_io_never_follows_a_link(tmp_path, outside):
    tree = tmp_path / "t"
    (tree / "a").mkdir(parents=True)
    (tree / "a" / "f.py").write_text("in\n")
    os.symlink(outside, tree / "a" / "dirlink")
    os.symlink(outside / "victim.py", tree / "a" / "filelink.py")
    before = snapshot(outside)
    assert tree_read_text(tree, "a/f.py") == "in\n"
    for rel in ("a/dirlink/victim.py", "a/filelink.py"):
        with pytest.raises(UnsafePath, match="is a symlink; rocmport never reads or writes through a link"):
            tree_read_text(tree, rel)
        with pytest.raises(UnsafePath):
            tree_write_text(tree, rel, "pwned\n")
    with pytest.raises(UnsafePath, match="not a plain relative path"):
        tree_write_text(tree, "../escape.py", "x")
    assert snapshot(outside) == before
    assert os.path.islink(tree / "a" / "filelink.py")  # refused, not replaced by a file either
    assert tree_kind(tree, "a/dirlink") == tree_kind(tree, "a/dirlink/victim.py") == "link"
    assert (
        tree_kind(tree, "a/f.py") == "file" and tree_kind(tree, "a") == "dir" and tree_kind(tree, "nope") == "missing"
    )
    tree_write_text(tree, "new/dir/n.py", "n\n")
    with pytest.raises(FileExistsError):
        tree_write_text(tree, "new/dir/n.py", "again\n", replace=False)
    assert tree_read_text(tree, "new/dir/n.py") == "n\n"
    assert tree_files(tree, "a/*.py") == ["a/f.py"] and tree_files(tree, "*/*.txt") == []


def test_codemods_skip_a_linked_source_file(proj, outside):
    upstream_with(proj, {"megatron/core/amp_user.py": AMP}, {"megatron/core/victim.py": str(outside / "victim.py")})
    proj.write_series({}, codemods=["apex-to-torch"])
    before = snapshot(outside)
    assert main(["-C", str(proj.root), "apply"]) == 0
    assert snapshot(outside) == before
    assert "torch.amp.custom_fwd" in (proj.tree / "megatron/core/amp_user.py").read_text()
    assert os.path.islink(proj.tree / "megatron/core/victim.py")
    assert g(proj.tree, "ls-files", "-s", "megatron/core/victim.py").startswith("120000")


def test_the_helper_is_never_written_through_a_link(proj, outside, capsys):
    upstream_with(proj, {"megatron/core/amp_user.py": AMP}, {"megatron/core/_rocm.py": str(outside / "victim.py")})
    proj.write_series({}, codemods=["apex-to-torch"])
    before = snapshot(outside)
    assert main(["-C", str(proj.root), "apply"]) == 2
    err = capsys.readouterr().err
    assert "megatron/core/_rocm.py: the codemods' helper goes here, but it is a symlink" in err
    assert snapshot(outside) == before
    assert g(proj.tree, "status", "--porcelain") == ""


def test_manifests_never_read_or_write_through_a_link(proj, outside):
    upstream_with(
        proj,
        {},
        {
            "requirements": str(outside),
            "pyproject.toml": str(outside / "pyproject.toml"),
            "requirements-dev.txt": str(outside / "base.txt"),
        },
    )
    proj.write_series({})
    before = snapshot(outside)
    assert main(["-C", str(proj.root), "apply"]) == 0
    assert snapshot(outside) == before
    assert subprocess_grep(proj.tree, "SECRET-TOKEN") == ""
    assert all(os.path.islink(proj.tree / p) for p in ("requirements", "pyproject.toml", "requirements-dev.txt"))


def subprocess_grep(tree, text) -> str:
    import subprocess

    return subprocess.run(["git", "grep", "-I", "-l", text, "HEAD"], cwd=tree, capture_output=True, text=True).stdout


def test_codemod_command_in_place_never_writes_outside(tmp_path, outside):
    tree = tmp_path / "t"
    (tree / "megatron" / "core").mkdir(parents=True)
    (tree / "megatron" / "core" / "a.py").write_text(AMP)
    os.symlink(outside / "victim.py", tree / "megatron" / "core" / "b.py")
    os.symlink(outside, tree / "megatron" / "linked")
    before = snapshot(outside)
    assert main(["codemod", str(tree), "--only", "apex-to-torch"]) == 0
    assert snapshot(outside) == before
    assert "torch.amp.custom_fwd" in (tree / "megatron" / "core" / "a.py").read_text()


def test_build_refuses_a_tree_with_a_link_leading_out(proj, outside, capsys):
    upstream_with(proj, {}, {"megatron/core/data": str(outside)})
    proj.write_series({})
    assert main(["-C", str(proj.root), "apply"]) == 0
    capsys.readouterr()
    assert main(["-C", str(proj.root), "build", "--no-check-deps"]) == 2
    assert "megatron/core/data is a symlink leading out of the tree" in capsys.readouterr().err
    assert not (proj.root / "dist").exists()
