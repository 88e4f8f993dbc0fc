"""Upstream URLs: validation before any network access (no transport that runs commands, no
option injection), and what a URL is: a network remote or a local repository."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

from rocmport.errors import BadInput, is_control
from rocmport.gitutil import run_git
from rocmport.redact import redact, without_credentials

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

    @property
    def shown(self) -> str:
        """The URL as it may be printed: credentials redacted."""
        return redact(self.url)

    @property
    def stored(self) -> str:
        """The URL as it may be written to a file: without credentials."""
        return without_credentials(self.url)


def _unsafe(part: str) -> bool:
    """A host, user or path of a URL that git or ssh could read as an option or that hides a
    control character, after percent-decoding (git decodes `%2D` to `-` before it runs ssh)."""
    decoded = unquote(part)
    return decoded.startswith("-") or any(map(is_control, decoded))


def validate_url(name: str, url: str) -> Remote:
    """Classify ``url`` or raise BadInput; runs nothing, touches no network."""
    what = f"remote {name}={redact(url)!r}"
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
        try:
            host, user, _ = parsed.hostname or "", parsed.username or "", parsed.port
        except ValueError:
            raise BadInput(f"{what}: bad port in URL") from None
        if not host or _unsafe(host) or _unsafe(user) or any(c in unquote(host) for c in "/@ "):
            raise BadInput(f"{what}: bad host or user in URL (after percent-decoding)")
        if _unsafe(parsed.path.lstrip("/")) or _unsafe(parsed.path):
            raise BadInput(f"{what}: bad path in URL (after percent-decoding)")
        return Remote(name, url, "network")
    scp = _SCP_RE.match(url)
    if scp and not Path(url).exists() and "/" not in url.split(":", 1)[0]:
        if _unsafe(scp.group(1)) or _unsafe(scp.group(2)):
            raise BadInput(f"{what}: bad host or path in ssh URL")
        return Remote(name, url, "network")
    return _local(name, url, Path(url).expanduser())


def _local(name: str, url: str, path: Path) -> Remote:
    return Remote(name, url, "local", path.resolve())


def local_git_dir(remote: Remote) -> Path:
    """The git directory of a local repository (bare mirror or work tree)."""
    if remote.local_path is None or not remote.local_path.is_dir():
        raise BadInput(
            f"remote {remote.name}={remote.shown!r}: no such directory; give the path of a git repository or mirror"
        )
    proc = run_git("rev-parse", "--absolute-git-dir", cwd=remote.local_path, check=False)
    if proc.returncode != 0:
        raise BadInput(f"remote {remote.name}={remote.shown!r}: not a git repository; give a clone or bare mirror")
    return Path(proc.stdout.strip())
