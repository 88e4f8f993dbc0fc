"""Configuration precedence: defaults < [tool.rocmport] < .rocmport/local.yaml < CLI."""

import pytest

from rocmport.config import DEFAULT_REMOTES, load_settings, persist_overrides
from rocmport.errors import BadInput


def test_defaults(tmp_path, monkeypatch):
    monkeypatch.setenv("ROCMPORT_CACHE_DIR", str(tmp_path / "cache"))
    s = load_settings(tmp_path)
    assert s.remotes == DEFAULT_REMOTES
    assert s.cache_dir == tmp_path / "cache"
    assert s.worktree_path("megatron-lm") == tmp_path.resolve() / "build" / "megatron-lm"


def test_precedence_and_persistence(tmp_path):
    (tmp_path / "pyproject.toml").write_text(
        '[tool.rocmport]\nremotes = { megatron-lm = "https://example.org/mlm.git" }\nworktree-dir = "wt"\n'
    )
    s = load_settings(tmp_path)
    assert s.remotes["megatron-lm"] == "https://example.org/mlm.git"
    assert s.worktree_path("megatron-bridge") == tmp_path.resolve() / "wt" / "megatron-bridge"
    persist_overrides(s, {"megatron-lm": "/srv/mirror/mlm"}, str(tmp_path / "c"))
    assert (tmp_path / ".rocmport" / ".gitignore").read_text() == "*\n"
    s2 = load_settings(tmp_path)
    assert s2.remotes["megatron-lm"] == "/srv/mirror/mlm"
    assert s2.remotes["megatron-bridge"] == DEFAULT_REMOTES["megatron-bridge"]
    s3 = load_settings(tmp_path, remotes={"megatron-lm": "https://cli.example/x.git"})
    assert s3.remotes["megatron-lm"] == "https://cli.example/x.git"


def test_unknown_keys_are_rejected(tmp_path):
    (tmp_path / "pyproject.toml").write_text("[tool.rocmport]\nremote = {}\n")
    with pytest.raises(BadInput, match=r"pyproject.toml: unknown key \[tool.rocmport\].remote"):
        load_settings(tmp_path)
    with pytest.raises(BadInput, match="--remote apex=...: unknown upstream"):
        load_settings(tmp_path.parent / "nonexistent-ok", remotes={"apex": "x"})


def test_bad_local_yaml(tmp_path):
    (tmp_path / ".rocmport").mkdir()
    (tmp_path / ".rocmport" / "local.yaml").write_text("remotes: [\n")
    with pytest.raises(BadInput, match="local.yaml: not valid YAML"):
        load_settings(tmp_path)
