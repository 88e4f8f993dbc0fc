"""The package index as a second upstream source: sdists turned into deterministic git commits.

Files are fetched by name and hash from the index's PEP 691 JSON page rather than through
`pip download`: megatron-bridge's sdist only downloads through pip from an environment that has
torch (build isolation), and v0.17+ declare Requires-Python >=3.12, which pip would refuse here.
"""

from __future__ import annotations

import email.parser
import json
import os
import re
import tarfile
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from rocmport.errors import BadInput, RocmportError
from rocmport.release_line import ReleaseLine
from rocmport.upstream.companion import tightest_range
from rocmport.upstream.lock import Pin
from rocmport.upstream.store import Store
from rocmport.upstreams import MEGATRON_BRIDGE, MEGATRON_LM, UPSTREAMS

DEFAULT_INDEX = "https://pypi.org/simple"
_ACCEPT = "application/vnd.pypi.simple.v1+json"
_EXACT_RE = re.compile(r"^(?:core_)?v?(?P<v>\d+\.\d+\.\d+\S*)$")


class IndexUnreachable(RocmportError):
    """The package index did not answer."""


@dataclass(frozen=True)
class SdistFile:
    dist: str
    version: Version
    filename: str
    url: str
    sha256: str
    upload_time: str | None


def index_url(explicit: str | None = None) -> str:
    return (explicit or os.environ.get("ROCMPORT_INDEX_URL") or DEFAULT_INDEX).rstrip("/")


SYNC_HINT = "use --source git with a mirror, or set ROCMPORT_INDEX_URL"


def _get(url: str, accept: str | None = None, timeout: float = 120, hint: str = SYNC_HINT) -> bytes:
    """``url``'s body; unreachable, or silent for ``timeout`` seconds, is IndexUnreachable ending in
    ``hint`` (what the command that asked can do instead)."""
    req = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.read()
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        if isinstance(reason, TimeoutError) or "timed out" in str(reason):
            reason = f"no answer in {timeout:g} s"
        raise IndexUnreachable(f"cannot read {url}: {reason}; {hint}") from None


def _page(dist: str, index: str | None, timeout: float = 120, hint: str = SYNC_HINT) -> tuple[str, list[dict]]:
    """The URL of ``dist``'s PEP 691 page on the index and its files, yanked ones left out."""
    page_url = f"{index_url(index)}/{canonicalize_name(dist)}/"
    try:
        page = json.loads(_get(page_url, _ACCEPT, timeout=timeout, hint=hint))
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
        raise IndexUnreachable(f"{page_url}: not a PEP 691 JSON simple page; {hint}") from None
    files = page.get("files") if isinstance(page, dict) else None
    if not isinstance(files, list):
        raise IndexUnreachable(f"{page_url}: not a PEP 691 JSON simple page (no list of files); {hint}")
    return page_url, [
        f for f in files if isinstance(f, dict) and not f.get("yanked") and isinstance(f.get("filename"), str)
    ]


def index_files(
    dist: str, index: str | None = None, timeout: float = 120, hint: str = SYNC_HINT
) -> list[tuple[str, str, str]]:
    """(filename, url, sha256) of every file of ``dist`` on the index that has a sha256."""
    page_url, files = _page(dist, index, timeout, hint)
    return [
        (f["filename"], urllib.parse.urljoin(page_url, f["url"]), f["hashes"]["sha256"])
        for f in files
        if isinstance(f.get("url"), str)
        and isinstance(f.get("hashes"), dict)
        and isinstance(f["hashes"].get("sha256"), str)
    ]


def list_sdists(dist: str, index: str | None = None) -> list[SdistFile]:
    """All sdists of ``dist`` on the index, oldest version first."""
    page_url, files = _page(dist, index)
    prefix = re.sub(r"[-_.]+", "_", dist).lower() + "-"
    out = []
    for f in files:
        name = f["filename"]
        if not name.endswith(".tar.gz") or not name.lower().startswith(prefix):
            continue
        try:
            version = Version(name[len(prefix) : -len(".tar.gz")])
        except InvalidVersion:
            continue
        sha = (f.get("hashes") or {}).get("sha256")
        if not sha:
            continue
        url = urllib.parse.urljoin(page_url, f["url"])
        out.append(SdistFile(dist, version, name, url, sha, f.get("upload-time")))
    return sorted(out, key=lambda s: s.version)


def is_final(v: Version) -> bool:
    return not (v.is_prerelease or v.is_devrelease)


def list_final_versions(dist: str, index: str | None = None) -> list[Version]:
    return [s.version for s in list_sdists(dist, index) if is_final(s.version)]


def select_sdist(files: list[SdistFile], requested: str, pre: bool = False) -> SdistFile:
    """`v0.16` -> newest final 0.16.x; `core_v0.16.1` / `v0.16.1` / `0.16.1` -> exactly that."""
    dist = files[0].dist if files else "the distribution"
    line, exact = ReleaseLine.match(requested), _EXACT_RE.match(requested)
    if line:
        cands = [f for f in files if line.admits(f.version) and (pre or is_final(f.version))]
    elif exact:
        try:
            want = Version(exact.group("v"))
        except InvalidVersion:
            raise BadInput(f"{dist}: '{requested}' is not a version") from None
        cands = [f for f in files if f.version == want]
    else:
        raise BadInput(f"{dist}: the package index knows versions, not '{requested}'; give v0.16 or 0.16.1")
    if not cands:
        finals = [str(f.version) for f in files if is_final(f.version)]
        import difflib

        close = (
            difflib.get_close_matches(re.sub(r"^(core_)?v", "", requested), finals, n=5, cutoff=0.5)
            or finals[-5:][::-1]
        )
        raise BadInput(
            f"{dist}: no {'release' if pre else 'final release'} matching '{requested}' on the index; closest: {', '.join(close)}"
        )
    return cands[-1]


def download(store: Store, sdist: SdistFile) -> Path:
    """The verified sdist in the cache, downloaded only when the cached copy is absent or wrong."""
    return store.sdist(sdist.filename, sdist.sha256, lambda: _get(sdist.url, timeout=600))


def pypi_url(dist: str) -> str:
    return f"https://pypi.org/project/{canonicalize_name(dist)}/"


def pin_from_index(
    store: Store, upstream: str, requested_ref: str, *, pre: bool = False, index_url: str | None = None
) -> Pin:
    """Resolve ``requested_ref`` on the index, fetch and verify the sdist, import it, return its Pin."""
    dist = UPSTREAMS[upstream].distribution
    sdist = select_sdist(list_sdists(dist, index_url), requested_ref, pre)
    with store.locked():
        path = download(store, sdist)
        commit = store.import_sdist(path, upstream, str(sdist.version), sdist.sha256)
    return Pin(
        url=pypi_url(dist),
        source="pypi",
        requested_ref=requested_ref,
        resolved_ref=str(sdist.version),
        commit=commit,
        commit_date=sdist.upload_time or "1970-01-01T00:00:00Z",
        sdist={"filename": sdist.filename, "sha256": sdist.sha256},
        version=str(sdist.version),
    )


def declared_requirement(sdist_path: Path, name: str) -> Requirement | None:
    """The `Requires-Dist` entry for ``name`` in the sdist's PKG-INFO (no build needed)."""
    with tarfile.open(sdist_path, "r:gz") as tar:
        pkg_info = next((m for m in tar.getmembers() if PurePosixPath(m.name).parts[1:] == ("PKG-INFO",)), None)
        data = tar.extractfile(pkg_info) if pkg_info is not None else None
        if data is None:
            return None
        meta = email.parser.Parser().parsestr(data.read().decode("utf-8", "replace"))
    for dep in meta.get_all("Requires-Dist") or []:
        try:
            req = Requirement(dep)
        except InvalidRequirement:
            continue
        if canonicalize_name(req.name) == canonicalize_name(name):
            return req
    return None


def choose_bridge_from_index(
    store: Store, core_version: str, index_url: str | None = None
) -> tuple[SdistFile, str] | None:
    """The final megatron-bridge sdist made for ``core_version``: of those whose declared megatron-core
    range is bounded and admits it, the tightest range (companion rule 3), with the explanation."""
    finals = [s for s in list_sdists(MEGATRON_BRIDGE.distribution, index_url) if is_final(s.version)][::-1]
    declared = []
    for sdist in finals:
        req = declared_requirement(download(store, sdist), MEGATRON_LM.distribution)
        declared.append((str(sdist.version), req.specifier if req is not None else None))
    chosen = tightest_range(declared, core_version)
    if chosen is None:
        return None
    return next(s for s in finals if str(s.version) == chosen[0]), chosen[1]
