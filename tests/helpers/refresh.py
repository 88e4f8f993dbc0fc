"""A project ported at core_v0.16.1 of a real local upstream, with a three-patch series, for
refresh and bot tests. New upstream tags are made by the tests."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from rocmport.cli import main
from tests.helpers.patches import BASE_FILES, LAYERS, make_patch
from tests.helpers.sync import commit, g, init, package_info


def edit_line(text: str, n: int, new: str) -> str:
    lines = text.splitlines(keepends=True)
    lines[n - 1] = new + "\n"
    return "".join(lines)


class Ported:
    """Upstream repo + project with patchsets/megatron-lm/v0.16 (patches A, B, C), synced and applied."""

    def __init__(self, tmp: Path, monkeypatch):
        monkeypatch.setenv("ROCMPORT_CACHE_DIR", str(tmp / "cache"))
        self.up = init(tmp / "upstream")
        # megatron/core a real package: stage 1 fails a tree whose megatron.core imports as a namespace package
        self.files = {**BASE_FILES, "megatron/core/__init__.py": ""}
        self.base = commit(self.up, self.files, "0.16.1")
        g(self.up, "tag", "core_v0.16.1")
        self.patches = {
            "0001-layers-ten.patch": make_patch(
                self.up,
                {"megatron/core/layers.py": edit_line(LAYERS, 10, "line 10 rocm")},
                "rocm line ten",
                context=2,
                bug="https://example.invalid/1",
            ),
            "0002-layers-thirty.patch": make_patch(
                self.up,
                {"megatron/core/layers.py": edit_line(LAYERS, 30, "line 30 rocm")},
                "rocm line thirty",
                bug="https://example.invalid/2",
            ),
            "0003-utils.patch": make_patch(
                self.up,
                {"megatron/core/utils.py": "def f():\n    return 2\n"},
                "f returns 2",
                bug="https://example.invalid/3",
            ),
        }
        self.root = tmp / "project"
        self.series_dir = self.root / "patchsets" / "megatron-lm" / "v0.16"
        self.series_dir.mkdir(parents=True)
        for name, text in self.patches.items():
            (self.series_dir / name).write_text(text)
        (self.series_dir / "series").write_text(
            "# Megatron-LM v0.16: test recipe.\nupstream: megatron-lm\nline: v0.16\n"
            'versions: ">=0.16.0rc0,<0.17.0rc0"\npatches:\n'
            + "".join(f"  - {n}\n" for n in self.patches)
            + "codemods: []\n"
        )
        init(self.root)
        (self.root / ".gitignore").write_text("/build/\n/.rocmport/\n")
        assert self.run("sync", "--ref", "v0.16", "--no-bridge", "--remote", f"megatron-lm={self.up}") == 0
        assert self.run("apply") == 0
        g(self.root, "add", "-A")
        g(self.root, "commit", "-qm", "port at core_v0.16.1")

    def run(self, *args) -> int:
        return main(["-C", str(self.root), *args])

    def tag(self, edits: dict[str, str], tag: str, version: str, msg: str | None = None) -> str:
        files = {"megatron/core/package_info.py": package_info(version), **edits}
        sha = commit(self.up, files, msg or f"release {version}")
        g(self.up, "tag", tag)
        return sha

    def upstream_commit(self, edits: dict[str, str], msg: str) -> str:
        return commit(self.up, edits, msg)

    @property
    def lock(self) -> dict:
        return yaml.safe_load((self.root / "upstream.lock").read_text())

    @property
    def summary(self) -> dict:
        return json.loads((self.root / "build" / "refresh" / "summary.json").read_text())

    def series(self, line: str) -> dict:
        return yaml.safe_load((self.root / "patchsets" / "megatron-lm" / line / "series").read_text())

    def rows(self) -> dict:
        return {p["name"]: p for p in self.summary["upstreams"]["megatron-lm"]["patches"]}
