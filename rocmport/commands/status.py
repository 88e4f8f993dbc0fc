"""`rocmport status`: the lock, whether the cache holds the pinned commits, and the work trees."""

from __future__ import annotations

from pathlib import Path

import click

from rocmport import output
from rocmport.config import UPSTREAMS, Settings, load_settings
from rocmport.errors import EXIT_OK
from rocmport.gitutil import git, is_git_dir, run_git
from rocmport.lock import load_lock_or_none
from rocmport.remotes import has_commit
from rocmport.store import Store


def worktree_info(path: Path) -> dict | None:
    """Where a ported tree is and what it holds, or None when there is none."""
    if not (path / ".git").exists() or not is_git_dir(path):
        return None
    branch = run_git("symbolic-ref", "--short", "-q", "HEAD", cwd=path, check=False).stdout.strip() or None
    base_tags = git("tag", "--list", "rocmport/base/*", "--points-at", "HEAD", cwd=path).split() or git(
        "tag", "--list", "rocmport/base/*", "--merged", "HEAD", cwd=path
    ).split()
    base = git("rev-parse", f"{base_tags[0]}^{{commit}}", cwd=path) if base_tags else None
    from rocmport.worktree import read_state

    state = read_state(path) or {}
    clean = run_git("status", "--porcelain", "--untracked-files=no", cwd=path).stdout.strip() == ""
    return {
        "path": str(path),
        "branch": branch,
        "base": base,
        "head": git("rev-parse", "HEAD", cwd=path),
        "clean": clean,
        "series": state.get("series"),
        "series_hash": state.get("series_hash"),
        "apply_status": state.get("status"),
    }


def status(settings: Settings) -> dict:
    lock = load_lock_or_none(settings.lock_path)
    store = Store(settings.cache_dir)
    cache = {}
    if lock:
        for name, pin in lock.upstreams.items():
            mirror = store.mirror_dir(name)
            cache[name] = bool((mirror / "HEAD").exists() and has_commit(mirror, pin.commit))
    worktrees = {}
    for name in UPSTREAMS:
        info = worktree_info(settings.worktree_path(name))
        if info:
            worktrees[name] = info
    return {
        "lock": lock.to_dict() if lock else None,
        "lock_path": str(settings.lock_path),
        "cache_dir": str(settings.cache_dir),
        "cached": cache,
        "worktrees": worktrees,
    }


@click.command("status")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable: keys lock, worktrees, cached.")
@click.pass_obj
def command(obj, as_json):
    """Show the lock, whether the cache has the pinned commits, and the ported work trees."""
    data = status(load_settings(obj["project"]))
    if as_json:
        output.emit_json(data)
        return EXIT_OK
    if not data["lock"]:
        output.info(f"no lock at {data['lock_path']}: run `rocmport sync --ref REF`")
        return EXIT_OK
    rows = []
    for name, pin in data["lock"]["upstreams"].items():
        wt = data["worktrees"].get(name)
        rows.append([
            name, pin["source"], pin["resolved_ref"], pin.get("version") or "?", pin["commit"][:12],
            "yes" if data["cached"].get(name) else "NO",
            f"{wt['path']} ({wt['branch']}, {'clean' if wt['clean'] else 'DIRTY'}, series {str(wt['series_hash'])[:12]})" if wt else "-",
        ])
    output.table(["upstream", "source", "ref", "version", "commit", "cached", "work tree"], rows, title=data["lock_path"])
    return EXIT_OK
