"""`rocmport codemod` over any tree: the codemods' layers folded into each file's final text, a
per-file outcome (changed with its sites per codemod, or failed), written in place unless asked
only to show or check."""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rocmport.codemods.base import Report
from rocmport.codemods.catalog import registry
from rocmport.codemods.runner import LayersResult, compute_layers
from rocmport.errors import BadInput
from rocmport.fsutil import tree_kind, tree_read_text, tree_write_text


@dataclass
class TreeRewrite:
    tree: Path
    result: LayersResult
    final: dict[str, str] = field(default_factory=dict)  # file -> text after every layer
    per_file: dict[str, dict[str, int]] = field(default_factory=dict)  # file -> codemod -> sites
    written: bool = False

    @property
    def sites(self) -> dict[str, int]:
        return {layer.name: sum(layer.sites.values()) for layer in self.result.layers}

    def summary(self) -> dict[str, Any]:
        """What `codemod --json` prints."""
        files: dict[str, dict[str, Any]] = {
            rel: {"outcome": "changed", "sites": sites} for rel, sites in self.per_file.items()
        }
        for f in self.result.failures:
            files[f.path] = {"outcome": "failed", "line": f.line, "message": f.message}
        return {
            "files_total": self.result.files_total,
            "files_parsed": self.result.files_parsed,
            "cache_hits": self.result.cache_hits,
            "sites": self.sites,
            "files": files,
            "written": self.written,
            # What each codemod decided per site: rewritten (site), left and why (skip), or to check (warning).
            "reports": [r.to_json() for r in self.reports()],
        }

    def reports(self, kind: str | None = None) -> list[Report]:
        return [r for layer in self.result.layers for r in layer.all_reports() if kind is None or r.kind == kind]

    def diff(self) -> str:
        """The changes as a unified diff (a/ and b/ prefixes)."""
        chunks = []
        for rel in sorted(self.final):
            old = (
                tree_read_text(self.tree, rel).splitlines(keepends=True) if tree_kind(self.tree, rel) == "file" else []
            )
            chunks.append(
                "".join(difflib.unified_diff(old, self.final[rel].splitlines(keepends=True), f"a/{rel}", f"b/{rel}"))
            )
        return "".join(chunks)


def rewrite_tree(tree: Path, only: list[str], jobs: int | None, write: bool) -> TreeRewrite:
    """Run ``only`` (default: every codemod) over ``tree``; write the changed files when ``write``."""
    for name in only:
        if name not in registry:
            raise BadInput(f"--only {name}: unknown codemod; known: {', '.join(registry)}")
    out = TreeRewrite(tree, compute_layers(tree, list(only) or list(registry), jobs=jobs))
    for layer in out.result.layers:
        for rel, text in layer.files.items():
            out.final[rel] = text
            out.per_file.setdefault(rel, {})[layer.name] = layer.sites.get(rel, 0)
    if write:
        for rel, text in out.final.items():
            tree_write_text(tree, rel, text)  # never through a link
        out.written = True
    return out
