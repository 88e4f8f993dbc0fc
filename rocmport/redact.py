"""Credentials in URLs: never stored, never printed.

A URL's user-info (`https://user:TOKEN@host/...`, `https://TOKEN@host/...`) is a secret: rocmport uses
it for the fetch it was given to, but writes the URL without it (upstream.lock, .rocmport/local.yaml)
and prints it redacted. An ssh user name (`ssh://git@host/...`, `git@host:path`) is no secret and is kept;
an ssh password is. Keep credentials in a git credential helper instead
(`git config --global credential.helper store`, or your forge's helper)."""

from __future__ import annotations

import re
from urllib.parse import urlsplit, urlunsplit

# scheme://userinfo@ anywhere in a text (error messages, progress lines, git's stderr).
_USERINFO_RE = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)([^/@\s'\"]+)@")
CREDENTIAL_HELP = (
    "credentials in a URL are used for this run only and never stored or printed; "
    "keep them in a git credential helper (`git config --global credential.helper store`, "
    "or your forge's helper) and give the URL without them"
)


def _keep_user(scheme: str, userinfo: str) -> str | None:
    """What of ``userinfo`` may be shown and stored: an ssh user name, nothing else."""
    if scheme.lower().rstrip(":/") in ("ssh", "git+ssh", "ssh+git") and ":" not in userinfo:
        return userinfo
    return None


def redact(text: str) -> str:
    """``text`` with every URL's secret user-info replaced by `***`."""

    def sub(m: re.Match) -> str:
        keep = _keep_user(m.group(1), m.group(2))
        return m.group(0) if keep is not None else f"{m.group(1)}***@"

    return _USERINFO_RE.sub(sub, text) if "@" in text else text


def has_credentials(url: str) -> bool:
    return redact(url) != url


def without_credentials(url: str) -> str:
    """``url`` as it may be stored: no password, no token; an ssh user name stays."""
    if not has_credentials(url):
        return url
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = host + (f":{parts.port}" if parts.port else "")
    keep = _keep_user(parts.scheme, (parts.netloc.rpartition("@")[0]))
    if keep is None and parts.username and parts.scheme.lower() in ("ssh", "git+ssh", "ssh+git"):
        netloc = f"{parts.username}@{netloc}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
