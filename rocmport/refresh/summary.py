"""A refresh's summary files: summary.json (the result without file texts) and summary.md (the PR
body) beside it, written atomically; what `refresh --json` prints and the bot commits."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from rocmport.config import Settings
from rocmport.fsutil import atomic_write_text
from rocmport.refresh.report import markdown, page_link, verify_page
from rocmport.refresh.result import RefreshResult


def public(result: RefreshResult) -> dict:
    """The result without file texts (they are in the series already): what --json and summary.json hold."""
    data = result.to_dict()
    for up in data["upstreams"].values():
        for key in ("regenerated", "dropped_texts", "series_text", "series_text_final"):
            up.pop(key, None)
    return data


def machine_paths(settings: Settings) -> dict[str, str]:
    """This machine's absolute paths a summary may hold -> what the PR body says instead: the project's
    own paths become relative, the cache, the home and the temporary directory are named."""
    places = {}
    for path, name in (
        (Path(tempfile.gettempdir()), "$TMPDIR"),
        (Path.home(), "~"),
        (settings.cache_dir, "$ROCMPORT_CACHE_DIR"),
        (settings.root, "."),
    ):
        for form in {str(path), str(path.resolve())}:
            places[form] = name
            if name == ".":
                places[form + "/"] = ""
    return places


def page_of(result: RefreshResult, settings: Settings) -> str | None:
    """The PR body's reference to this refresh's verify page, when its verify ran and wrote one."""
    page = verify_page(settings, result.to)
    if result.verify is None or result.verify.skipped is not None or not page.is_file():
        return None
    return page_link(page, dict(os.environ))


def write_summary(result: RefreshResult, directory: Path, settings: Settings) -> Path:
    """summary.md (the PR body, with no absolute path of this machine) and summary.json beside it,
    written atomically."""
    data = public(result)
    atomic_write_text(directory / "summary.json", json.dumps(data, indent=2, sort_keys=True) + "\n")
    atomic_write_text(directory / "summary.md", markdown(result, machine_paths(settings), page_of(result, settings)))
    return directory / "summary.md"
