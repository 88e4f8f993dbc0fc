"""Upstream URLs: validation before any network access, and the cache of bare mirrors.

Local mirrors (a plain path or file://) are brought into the cache through alternates plus a
copy of their refs, never through a transport that packs objects: some mirrors lack large blobs
(Megatron-Bridge's docs GIFs) and then `git fetch`/file:// die with "pack-objects died".
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

from rocmport.errors import BadInput, RocmportError
from rocmport.gitutil import GitError, git, run_git
from rocmport.upstream.store import Store

_SCHEME_RE = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_SCP_RE = re.compile(r"^(?:[A-Za-z0-9._~-]+@)?([A-Za-z0-9._-]+):(?!//)(.+)$")
NETWORK_SCHEMES = ("https", "http", "ssh", "git")
REFSPECS = ("+refs/heads/*:refs/heads/*", "+refs/tags/*:refs/tags/*")


class RemoteUnreachable(BadInput):
    """The remote did not answer (network down, host unknown, repository missing)."""


@dataclass(frozen=True)
class Remote:
    name: str
    url: str
    kind: str  # "local" | "network"
    local_path: Path | None = None

    @property
    def is_local(self) -> bool:
        return self.kind == "local"


def validate_url(name: str, url: str) -> Remote:
    """Classify ``url`` or raise BadInput; runs nothing, touches no network."""
    what = f"remote {name}={url!r}"
    if not url or not url.strip():
        raise BadInput(f"{what}: empty URL")
    if url.startswith("-"):
        raise BadInput(f"{what}: a URL may not start with '-' (it would be read as a git option)")
    m = _SCHEME_RE.match(url)
    if "::" in url.split("/", 1)[0] or (not m and "::" in url and not Path(url).exists()):
        raise BadInput(f"{what}: the '<transport>::<address>' form (ext::, fd:: ...) runs arbitrary commands; refused")
    if any(c in url for c in "\n\r\t\0 ") and not Path(url).exists():
        raise BadInput(f"{what}: whitespace or control characters in a URL; quote a real path or fix the URL")
    if m:
        scheme = m.group(1).lower()
        parsed = urlparse(url)
        if scheme == "file":
            return _local(name, url, Path(unquote(parsed.path)))
        if scheme not in NETWORK_SCHEMES:
            raise BadInput(f"{what}: transport '{scheme}' is not allowed; use https, ssh, git, a local path or file://")
        host = parsed.hostname or ""
        if not host or host.startswith("-") or (parsed.username or "").startswith("-"):
            raise BadInput(f"{what}: bad host in URL")
        return Remote(name, url, "network")
    scp = _SCP_RE.match(url)
    if scp and not Path(url).exists() and "/" not in url.split(":", 1)[0]:
        if scp.group(1).startswith("-") or scp.group(2).startswith("-"):
            raise BadInput(f"{what}: bad host or path in ssh URL")
        return Remote(name, url, "network")
    return _local(name, url, Path(url).expanduser())


def _local(name: str, url: str, path: Path) -> Remote:
    return Remote(name, url, "local", path.resolve())


def _local_git_dir(remote: Remote) -> Path:
    """The git directory of a local repository (bare mirror or work tree)."""
    if not remote.local_path.is_dir():
        raise BadInput(f"remote {remote.name}={remote.url!r}: no such directory; give the path of a git repository or mirror")
    proc = run_git("rev-parse", "--absolute-git-dir", cwd=remote.local_path, check=False)
    if proc.returncode != 0:
        raise BadInput(f"remote {remote.name}={remote.url!r}: not a git repository; give a clone or bare mirror")
    return Path(proc.stdout.strip())


def _init_mirror(path: Path) -> None:
    if not (path / "HEAD").exists():
        path.mkdir(parents=True, exist_ok=True)
        git("init", "--bare", "-q", str(path))


def _import_local(mirror: Path, remote: Remote) -> None:
    """Borrow the source's objects via alternates and copy its branch and tag refs."""
    src = _local_git_dir(remote)
    objects = (src / "objects").resolve()
    alt = mirror / "objects" / "info" / "alternates"
    alt.parent.mkdir(parents=True, exist_ok=True)
    existing = alt.read_text().split() if alt.exists() else []
    if str(objects) not in existing:
        alt.write_text("\n".join([*existing, str(objects)]) + "\n")
    theirs = _refs(src)
    ours = _refs(mirror)
    lines = [f"update {ref} {sha}" for ref, sha in sorted(theirs.items()) if ours.get(ref) != sha]
    lines += [f"delete {ref}" for ref in sorted(set(ours) - set(theirs))]
    if lines:
        git("update-ref", "--stdin", cwd=mirror, input="\n".join(lines) + "\n")


def _refs(git_dir: Path) -> dict[str, str]:
    out = git("for-each-ref", "--format=%(refname) %(objectname)", "refs/heads", "refs/tags", cwd=git_dir)
    return dict(line.split(" ", 1) for line in out.splitlines() if line)


def _fetch_network(mirror: Path, remote: Remote) -> None:
    proc = run_git("fetch", "--prune", "--no-tags", "--quiet", "--", remote.url, *REFSPECS, cwd=mirror, check=False, timeout=3600)
    if proc.returncode == 0:
        return
    err = proc.stderr
    if "pack-objects died" in err or re.search(r"unable to read [0-9a-f]{40}|missing blob object", err):
        raise RocmportError(
            f"fetching {remote.name} from {remote.url} failed: the source lacks objects (pack-objects died); "
            f"clone it by plain path instead: `rocmport sync --remote {remote.name}=/path/to/mirror`"
        )
    first = next((ln for ln in err.splitlines() if ln.strip()), f"exit {proc.returncode}").strip()
    raise RemoteUnreachable(f"cannot reach {remote.name} at {remote.url}: {first}; check the URL, or use --offline / --source pypi")


def update_mirror(store: Store, remote: Remote, offline: bool = False) -> Path:
    """Bring the cache mirror of ``remote`` up to date (or just check it exists when offline)."""
    mirror = store.mirror_dir(remote.name)
    _check_alternates(mirror, remote.name)
    if offline:
        if not (mirror / "HEAD").exists():
            raise BadInput(f"--offline: no cached mirror of {remote.name} in {store.root}; run `rocmport sync` online once")
        return mirror
    with store.locked():
        _init_mirror(mirror)
        try:
            if remote.is_local:
                _import_local(mirror, remote)
            else:
                _fetch_network(mirror, remote)
        except GitError as exc:
            raise RocmportError(f"updating the cache mirror of {remote.name} from {remote.url} failed: {exc}") from None
    return mirror


def _check_alternates(mirror: Path, name: str) -> None:
    """A mirror imported from a local path borrows its objects (like `git clone --shared`)."""
    alt = mirror / "objects" / "info" / "alternates"
    if not alt.exists():
        return
    for line in alt.read_text().split():
        if not Path(line).is_dir():
            raise BadInput(
                f"the cache mirror of {name} ({mirror}) borrows objects from {line}, which is gone; "
                f"restore that mirror or delete {mirror} and sync again"
            )


def has_commit(git_dir: Path, commit: str) -> bool:
    return run_git("cat-file", "-e", f"{commit}^{{commit}}", cwd=git_dir, check=False).returncode == 0
