"""Upstream URLs: validation before any network access (no transport that runs commands, no
option injection), and what a URL is: a network remote or a local repository."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

from rocmport.errors import BadInput
from rocmport.gitutil import run_git

_SCHEME_RE = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_SCP_RE = re.compile(r"^(?:[A-Za-z0-9._~-]+@)?([A-Za-z0-9._-]+):(?!//)(.+)$")
NETWORK_SCHEMES = ("https", "http", "ssh", "git")


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


def local_git_dir(remote: Remote) -> Path:
    """The git directory of a local repository (bare mirror or work tree)."""
    if remote.local_path is None or not remote.local_path.is_dir():
        raise BadInput(f"remote {remote.name}={remote.url!r}: no such directory; give the path of a git repository or mirror")
    proc = run_git("rev-parse", "--absolute-git-dir", cwd=remote.local_path, check=False)
    if proc.returncode != 0:
        raise BadInput(f"remote {remote.name}={remote.url!r}: not a git repository; give a clone or bare mirror")
    return Path(proc.stdout.strip())
