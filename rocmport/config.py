"""The project's configuration: defaults, `[tool.rocmport]` in pyproject.toml, and the untracked
local overrides in `.rocmport/local.yaml` (remotes and cache dir given to `sync`).

Precedence, lowest first: built-in defaults < [tool.rocmport] < .rocmport/local.yaml < CLI flags.
Every command reads one typed `Settings`, checked when it is loaded: a value of the wrong type is
bad input (exit 2) naming the file and the key, never a crash deep inside a command. Each option
has its one default here (DEFAULT_TP, DEFAULT_PP ...), which every command and its help reads.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from rocmport._compat import tomllib
from rocmport.errors import BadInput
from rocmport.fsutil import atomic_write_text
from rocmport.inputs import is_str_map, parse_yaml, read_text
from rocmport.redact import without_credentials
from rocmport.release_line import ReleaseLine
from rocmport.upstreams import NAMES, UPSTREAMS

DEFAULT_REMOTES = {name: u.url for name, u in UPSTREAMS.items()}

LOCK_NAME = "upstream.lock"
LOCAL_CONFIG = Path(".rocmport") / "local.yaml"

_KNOWN_TOOL_KEYS = {"remotes", "cache-dir", "worktree-dir", "tp", "pp", "release-lines", "python"}

# The one default of each verify size that `verify`, `refresh` and `bot` use without a flag or a setting.
DEFAULT_TP = 2
DEFAULT_PP = 2
DEFAULT_ITERS = 10  # verify's training iterations (stages 2, 4 and 5)
DEFAULT_BACKEND = "auto"  # verify's process-group backend: nccl with GPUs, gloo without


def default_cache_dir() -> Path:
    env = os.environ.get("ROCMPORT_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "rocmport"


@dataclass(frozen=True)
class Settings:
    """Resolved settings of one project directory, every option typed and checked (load_settings)."""

    root: Path
    remotes: Mapping[str, str] = field(default_factory=lambda: dict(DEFAULT_REMOTES))
    cache_dir: Path = field(default_factory=default_cache_dir)
    worktree_dir: Path | None = None
    tp: int = DEFAULT_TP  # verify's tensor-parallel size in `verify`, `refresh` and `bot`
    pp: int = DEFAULT_PP  # ... and pipeline-parallel size
    release_lines: tuple[str, ...] = ()  # what `bot` follows, normalised (v0.16); () = its own choice
    python: str | None = None  # the Python `build` builds for (its --python)

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


def _found(value: Any) -> str:
    names = {bool: "a boolean", int: "a number", float: "a number", str: "a string", list: "a list", dict: "a table"}
    return (
        f"{names.get(type(value), type(value).__name__)} {value!r}"
        if not isinstance(value, (list, dict))
        else names[type(value)]
    )


def _size(where: str, key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise BadInput(
            f"{where} {key} must be a whole number >= 1, e.g. {key} = 2 (found {_found(value)}); fix the file"
        )
    return value


def _path_text(where: str, key: str, value: Any, example: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise BadInput(
            f"{where} {key} must be a directory path string, e.g. {key} = {example} (found {_found(value)}); fix the file"
        )
    return value


def _release_lines(where: str, key: str, value: Any) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise BadInput(
            f'{where} {key} must be a list of release lines, e.g. {key} = ["v0.16", "v0.17"] '
            f"(found {_found(value)}); fix the file"
        )
    out = []
    for i, item in enumerate(value):
        line = ReleaseLine.match(item.strip()) if isinstance(item, str) else None
        if line is None:
            raise BadInput(
                f"{where} {key}[{i}] must be a release line of the form v0.16 (found {_found(item)}); fix the file"
            )
        out.append(str(line))
    return tuple(out)


def _read_tool_table(root: Path) -> dict[str, Any]:
    """[tool.rocmport] of ``root``'s pyproject.toml, every key checked and typed (BadInput naming the
    file and the key): remotes, cache-dir, worktree-dir, python as given; tp, pp as ints; release-lines
    as normalised line names."""
    pyproject = root / "pyproject.toml"
    if not _settings_file(pyproject):
        return {}
    try:
        data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise BadInput(f"{pyproject}: not valid TOML ({exc}); fix the file") from None
    tool = data.get("tool", {})
    table = tool.get("rocmport", {}) if isinstance(tool, dict) else {}
    if not isinstance(table, dict):
        raise BadInput(f"{pyproject}: [tool.rocmport] must be a table")
    unknown = set(table) - _KNOWN_TOOL_KEYS
    if unknown:
        raise BadInput(
            f"{pyproject}: unknown key [tool.rocmport].{sorted(unknown)[0]}; known: {', '.join(sorted(_KNOWN_TOOL_KEYS))}"
        )
    remotes = table.get("remotes", {})
    if not isinstance(remotes, dict) or not all(isinstance(v, str) for v in remotes.values()):
        raise BadInput(f"{pyproject}: [tool.rocmport].remotes must map upstream names to URL strings")
    for name in remotes:
        if name not in NAMES:
            raise BadInput(f"{pyproject}: [tool.rocmport].remotes.{name}: unknown upstream; known: {', '.join(NAMES)}")
    where = f"{pyproject}: [tool.rocmport]"
    out: dict[str, Any] = {"remotes": remotes}
    for key in ("tp", "pp"):
        if key in table:
            out[key] = _size(where, key, table[key])
    for key in ("cache-dir", "worktree-dir"):
        if key in table:
            out[key] = _path_text(where, key, table[key], '"build"' if key == "worktree-dir" else '"~/.cache/rocmport"')
    if "release-lines" in table:
        out["release-lines"] = _release_lines(where, "release-lines", table["release-lines"])
    if "python" in table:
        if not isinstance(table["python"], str) or not table["python"].strip():
            raise BadInput(
                f'{where} python must be the path of a Python interpreter, e.g. python = "python3.12" '
                f"(found {_found(table['python'])}); fix the file"
            )
        out["python"] = table["python"]
    return out


def _settings_file(path: Path) -> bool:
    """Is there a settings file at ``path``? Nothing there: no. Something that is not a file (a
    directory, a FIFO that would block the read): BadInput naming it, never silently ignored."""
    if not os.path.lexists(path):
        return False
    if not path.is_file():
        raise BadInput(
            f"{path}: is not a file (a directory or special file); remove it, or write the settings in a file"
        )
    return True


def setting_dir(root: Path, value: str, where: str) -> Path:
    """A directory setting (cache_dir, worktree_dir, cache-dir, worktree-dir) as a path: `~` expanded,
    a relative one resolved against the project root (never the caller's directory: `-C PROJECT`
    from anywhere means the same place), and confined: not the project itself or a directory above
    it (work trees and caches are rebuilt and removed there; over the project they would take it)."""
    path = (root / os.path.expanduser(value)).resolve()
    if path == root or path in root.parents:
        raise BadInput(
            f"{where}: {value!r} is {'the project directory' if path == root else 'a directory above the project'} "
            f"({path}); give a directory of its own, e.g. build or ~/.cache/rocmport"
        )
    return path


def read_local_config(root: Path) -> dict:
    path = root / LOCAL_CONFIG
    if not _settings_file(path):
        return {}
    data = (
        parse_yaml(
            read_text(path, "local settings file", max_bytes=1 << 20, fix="fix or delete it"), path, "fix or delete it"
        )
        or {}
    )
    if not isinstance(data, dict):
        raise BadInput(f"{path}: expected a mapping; fix or delete it")
    unknown = sorted(str(k) for k in set(data) - {"remotes", "cache_dir", "worktree_dir"})
    if unknown:
        raise BadInput(
            f"{path}: unknown key '{unknown[0]}' (known: cache_dir, remotes, worktree_dir); fix or delete it"
        )
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


def load_settings(
    root: str | os.PathLike, remotes: dict[str, str] | None = None, cache_dir: str | None = None
) -> Settings:
    """Resolve the settings for project ``root`` with CLI overrides on top (BadInput, exit 2, for a
    setting of the wrong type or value, naming its file and key)."""
    root = Path(root).resolve()
    table = _read_tool_table(root)
    local = read_local_config(root)
    merged = dict(DEFAULT_REMOTES)
    merged.update(table.get("remotes", {}))
    cache = default_cache_dir()
    tool, local_file = f"{root / 'pyproject.toml'}: [tool.rocmport]", root / LOCAL_CONFIG
    if table.get("cache-dir"):
        cache = setting_dir(root, table["cache-dir"], f"{tool} cache-dir")
    worktree_dir = (
        setting_dir(root, table["worktree-dir"], f"{tool} worktree-dir") if table.get("worktree-dir") else None
    )
    merged.update(local.get("remotes", {}) or {})
    if local.get("cache_dir") and not os.environ.get("ROCMPORT_CACHE_DIR"):
        cache = setting_dir(root, local["cache_dir"], f"{local_file}: cache_dir")
    if local.get("worktree_dir"):
        worktree_dir = setting_dir(root, local["worktree_dir"], f"{local_file}: worktree_dir")
    if remotes:
        for name in remotes:
            if name not in NAMES:
                raise BadInput(f"--remote {name}=...: unknown upstream; known: {', '.join(NAMES)}")
        merged.update(remotes)
    if cache_dir:
        cache = Path(cache_dir).expanduser().resolve()
    return Settings(
        root=root,
        remotes=merged,
        cache_dir=cache,
        worktree_dir=worktree_dir,
        tp=table.get("tp", DEFAULT_TP),
        pp=table.get("pp", DEFAULT_PP),
        release_lines=table.get("release-lines", ()),
        python=table.get("python"),
    )


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
