"""A refresh's summary files: summary.json (the result without file texts) and summary.md (the PR
body) beside it, written atomically; what `refresh --json` prints and the bot commits."""

from __future__ import annotations

import json
from pathlib import Path

from rocmport.fsutil import atomic_write_text
from rocmport.refresh.report import markdown
from rocmport.refresh.result import RefreshResult


def public(result: RefreshResult) -> dict:
    """The result without file texts (they are in the series already): what --json and summary.json hold."""
    data = result.to_dict()
    for up in data["upstreams"].values():
        for key in ("regenerated", "dropped_texts", "series_text", "series_text_final"):
            up.pop(key, None)
    return data


def write_summary(result: RefreshResult, directory: Path) -> Path:
    """summary.md (the PR body) and summary.json beside it, written atomically."""
    data = public(result)
    atomic_write_text(directory / "summary.json", json.dumps(data, indent=2, sort_keys=True) + "\n")
    atomic_write_text(directory / "summary.md", markdown(data))
    return directory / "summary.md"
