"""A project with a real upstream repo in the cache, a lock, and a patch series, for apply tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

from rocmport.upstream.lock import Lock, Pin
from tests.helpers.sync import commit, g, init, package_info

LAYERS = "".join(f"line {i}\n" for i in range(1, 41))
HEADER = "Description: {desc}\n more words\nUpstream-Status: {status}\n{extra}---\n"

BASE_FILES = {
    "megatron/core/package_info.py": package_info("0.16.1"),
    "megatron/core/layers.py": LAYERS,
    "megatron/core/utils.py": "def f():\n    return 1\n",
    "docs/index.md": "docs\n",
}


def make_patch(
    repo: Path, edits: dict[str, str], desc="fix a thing", status="ROCm-only", context=3, bug: str | None = None
) -> str:
    """Edit files in ``repo`` on top of HEAD, return a DEP-3 patch of the change (``-U<context>``, a
    ``Bug:`` field when given), and restore HEAD."""
    for rel, text in edits.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    g(repo, "add", "-A")
    diff = g(repo, "diff", "--cached", "--full-index", f"-U{context}") + "\n"
    g(repo, "reset", "-q", "--hard", "HEAD")
    return HEADER.format(desc=desc, status=status, extra=f"Bug: {bug}\n" if bug else "") + diff


def link_patch(path: str, target: str, desc="add a link") -> str:
    """A DEP-3 patch that creates the symlink ``path`` -> ``target`` (mode 120000), as git writes it."""
    return (
        HEADER.format(desc=desc, status="Pending", extra="") + f"diff --git a/{path} b/{path}\nnew file mode 120000\n"
        f"--- /dev/null\n+++ b/{path}\n@@ -0,0 +1 @@\n+{target}\n\\ No newline at end of file\n"
    )


def file_to_link_patch(path: str, old: str, target: str) -> str:
    """A DEP-3 patch that turns the regular file ``path`` (content ``old``) into a symlink to ``target``."""
    lines = old.splitlines()
    return (
        HEADER.format(desc="file to link", status="Pending", extra="")
        + f"diff --git a/{path} b/{path}\ndeleted file mode 100644\n--- a/{path}\n+++ /dev/null\n"
        + f"@@ -1,{len(lines)} +0,0 @@\n"
        + "".join(f"-{ln}\n" for ln in lines)
        + f"diff --git a/{path} b/{path}\nnew file mode 120000\n--- /dev/null\n+++ b/{path}\n"
        + f"@@ -0,0 +1 @@\n+{target}\n\\ No newline at end of file\n"
    )


class Project:
    def __init__(self, tmp: Path, monkeypatch):
        self.tmp = tmp
        self.cache = tmp / "cache"
        monkeypatch.setenv("ROCMPORT_CACHE_DIR", str(self.cache))
        self.up = init(tmp / "upstream")
        self.base = commit(self.up, BASE_FILES, "upstream 0.16.1")
        self.root = tmp / "project"
        self.series_dir = self.root / "patchsets" / "megatron-lm" / "v0.16"
        self.series_dir.mkdir(parents=True)
        self.refresh_mirror()
        self.pin(self.base)
        self.write_series({})

    @property
    def mirror(self) -> Path:
        return self.cache / "mirrors" / "megatron-lm.git"

    def refresh_mirror(self):
        if self.mirror.exists():
            g(self.mirror, "fetch", "-q", str(self.up), "+refs/heads/*:refs/heads/*", "+refs/tags/*:refs/tags/*")
        else:
            self.mirror.parent.mkdir(parents=True, exist_ok=True)
            g(self.tmp, "clone", "-q", "--bare", str(self.up), str(self.mirror))

    def pin(self, sha: str, ref: str = "core_v0.16.1", version: str = "0.16.1"):
        Lock(
            upstreams={
                "megatron-lm": Pin(
                    "https://github.com/NVIDIA/Megatron-LM.git",
                    "git",
                    "v0.16",
                    ref,
                    sha,
                    "2025-01-01T00:00:00+00:00",
                    version=version,
                )
            }
        ).save(self.root / "upstream.lock")

    def write_series(self, patches: dict[str, str], excluded=(), codemods=(), **extra):
        for name, text in patches.items():
            (self.series_dir / name).write_text(text)
        data = {
            "upstream": "megatron-lm",
            "line": "v0.16",
            "versions": ">=0.16.0,<0.17.0",
            "patches": list(patches),
            "codemods": list(codemods),
            "excluded_paths": list(excluded),
            **extra,
        }
        (self.series_dir / "series").write_text(yaml.safe_dump(data, sort_keys=False))

    @property
    def tree(self) -> Path:
        return self.root / "build" / "megatron-lm"

    def upstream_commit(self, edits: dict[str, str], msg="upstream change") -> str:
        return commit(self.up, edits, msg)


def run_apply_subprocess(root: Path, *args, env=None, wait=True):
    """`rocmport apply` in a subprocess; with ``wait=False`` it runs in its own process group (the
    group a test signals: the apply and every git it started)."""
    cmd = [sys.executable, "-m", "rocmport", "-C", str(root), "apply", *args]
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.DEVNULL if not wait else subprocess.PIPE,
        stderr=subprocess.DEVNULL if not wait else subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
        start_new_session=not wait,
    )
    if wait:
        out, err = proc.communicate(timeout=120)
        return proc.returncode, out, err
    return proc
