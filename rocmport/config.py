"""The project's configuration: defaults, `[tool.rocmport]` in pyproject.toml, and the untracked
local overrides in `.rocmport/local.yaml` (remotes and cache dir given to `sync`).

Precedence, lowest first: built-in defaults < [tool.rocmport] < .rocmport/local.yaml < CLI flags.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from rocmport._compat import tomllib
from rocmport.errors import BadInput
from rocmport.fsutil import atomic_write_text
from rocmport.inputs import is_str_map, parse_yaml, read_text
from rocmport.redact import without_credentials
from rocmport.upstreams import NAMES, UPSTREAMS

DEFAULT_REMOTES = {name: u.url for name, u in UPSTREAMS.items()}

LOCK_NAME = "upstream.lock"
LOCAL_CONFIG = Path(".rocmport") / "local.yaml"

_KNOWN_TOOL_KEYS = {"remotes", "cache-dir", "worktree-dir", "tp", "pp", "release-lines", "python"}


def default_cache_dir() -> Path:
    env = os.environ.get("ROCMPORT_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "rocmport"


@dataclass
class Settings:
    """Resolved settings of one project directory."""

    root: Path
    remotes: dict[str, str] = field(default_factory=lambda: dict(DEFAULT_REMOTES))
    cache_dir: Path = field(default_factory=default_cache_dir)
    worktree_dir: Path | None = None
    tool: dict = field(default_factory=dict)

    @property
    def lock_path(self) -> Path:
        return self.root / LOCK_NAME

    @property
    def local_config_path(self) -> Path:
        return self.root / LOCAL_CONFIG

    @property
    def patchsets_dir(self) -> Path:
        return self.root / "patchsets"

    @property
    def worktrees_dir(self) -> Path:
        """Where the ported work trees live: build/ or [tool.rocmport] worktree-dir."""
        return self.worktree_dir if self.worktree_dir is not None else self.root / "build"

    def worktree_path(self, upstream: str) -> Path:
        return self.worktrees_dir / upstream

    @property
    def refresh_dir(self) -> Path:
        """Where `refresh` works aside, beside the work trees: its trees, staged series, state and summary."""
        return self.worktrees_dir / "refresh"

    def is_default_remote(self, upstream: str) -> bool:
        return self.remotes.get(upstream) == DEFAULT_REMOTES.get(upstream)


def _read_tool_table(root: Path) -> dict:
    pyproject = root / "pyproject.toml"
    if not pyproject.is_file():
        return {}
    try:
        data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise BadInput(f"{pyproject}: not valid TOML ({exc}); fix the file") from None
    table = data.get("tool", {}).get("rocmport", {})
    if not isinstance(table, dict):
        raise BadInput(f"{pyproject}: [tool.rocmport] must be a table")
    unknown = set(table) - _KNOWN_TOOL_KEYS
    if unknown:
        raise BadInput(f"{pyproject}: unknown key [tool.rocmport].{sorted(unknown)[0]}; known: {', '.join(sorted(_KNOWN_TOOL_KEYS))}")
    remotes = table.get("remotes", {})
    if not isinstance(remotes, dict) or not all(isinstance(v, str) for v in remotes.values()):
        raise BadInput(f"{pyproject}: [tool.rocmport].remotes must map upstream names to URL strings")
    for name in remotes:
        if name not in NAMES:
            raise BadInput(f"{pyproject}: [tool.rocmport].remotes.{name}: unknown upstream; known: {', '.join(NAMES)}")
    return table


def read_local_config(root: Path) -> dict:
    path = root / LOCAL_CONFIG
    if not path.is_file():
        return {}
    data = parse_yaml(read_text(path, "local settings file", max_bytes=1 << 20, fix="fix or delete it"), path, "fix or delete it") or {}
    if not isinstance(data, dict):
        raise BadInput(f"{path}: expected a mapping; fix or delete it")
    unknown = sorted(str(k) for k in set(data) - {"remotes", "cache_dir", "worktree_dir"})
    if unknown:
        raise BadInput(f"{path}: unknown key '{unknown[0]}' (known: cache_dir, remotes, worktree_dir); fix or delete it")
    remotes = data.get("remotes") or {}
    if not is_str_map(remotes) or set(remotes) - set(NAMES):
        raise BadInput(f"{path}: key 'remotes' must map upstream names ({', '.join(NAMES)}) to URLs; fix or delete it")
    for key in ("cache_dir", "worktree_dir"):
        if data.get(key) is not None and not isinstance(data[key], str):
            raise BadInput(f"{path}: key '{key}' must be a directory path; fix or delete it")
    return data


def write_local_config(root: Path, data: dict) -> None:
    """Persist overrides (untracked, git-ignored) so later commands need no repeated flags."""
    path = root / LOCAL_CONFIG
    ignore = path.parent / ".gitignore"
    if not ignore.exists():
        atomic_write_text(ignore, "*\n")
    if isinstance(data.get("remotes"), dict):  # never a credential on disk: git's credential helpers keep those
        data = {**data, "remotes": {k: without_credentials(v) for k, v in data["remotes"].items()}}
    atomic_write_text(path, yaml.safe_dump(data, sort_keys=True, default_flow_style=False))


def load_settings(root: str | os.PathLike, remotes: dict[str, str] | None = None, cache_dir: str | None = None) -> Settings:
    """Resolve the settings for project ``root`` with CLI overrides on top."""
    root = Path(root).resolve()
    table = _read_tool_table(root)
    local = read_local_config(root)
    settings = Settings(root=root, tool=table)
    settings.remotes.update(table.get("remotes", {}))
    if table.get("cache-dir"):
        settings.cache_dir = (root / os.path.expanduser(table["cache-dir"])).resolve()
    if table.get("worktree-dir"):
        settings.worktree_dir = (root / os.path.expanduser(table["worktree-dir"])).resolve()
    settings.remotes.update(local.get("remotes", {}) or {})
    if local.get("cache_dir") and not os.environ.get("ROCMPORT_CACHE_DIR"):
        settings.cache_dir = Path(local["cache_dir"])
    if local.get("worktree_dir"):
        settings.worktree_dir = Path(local["worktree_dir"])
    if remotes:
        for name in remotes:
            if name not in NAMES:
                raise BadInput(f"--remote {name}=...: unknown upstream; known: {', '.join(NAMES)}")
        settings.remotes.update(remotes)
    if cache_dir:
        settings.cache_dir = Path(cache_dir).expanduser().resolve()
    return settings


def persist_overrides(settings: Settings, remotes: dict[str, str] | None, cache_dir: str | None) -> None:
    """Remember remotes / cache dir given on the command line in .rocmport/local.yaml."""
    if not remotes and not cache_dir:
        return
    local = read_local_config(settings.root)
    if remotes:
        local.setdefault("remotes", {}).update(remotes)
    if cache_dir:
        local["cache_dir"] = str(Path(cache_dir).expanduser().resolve())
    write_local_config(settings.root, local)
