"""The cache shared by every project on the machine: bare upstream mirrors and package-index sdists.

Layout: <cache>/mirrors/<upstream>.git (bare, refs/tags/* and refs/heads/* only, plus
refs/rocmport/pypi/* for imported sdists), <cache>/sdists/ (verified sdists), <cache>/.lock.
Work trees never write refs into the cache; they borrow objects through alternates.

Local mirrors (a plain path or file://) are brought in through alternates plus a copy of their
refs, never through a transport that packs objects: some mirrors lack large blobs (Megatron-Bridge's
docs GIFs) and then `git fetch`/file:// die with "pack-objects died". An sdist becomes one commit
with a fixed author, date and message: the same sdist always gives the same commit id.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
import tarfile
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path, PurePosixPath

from rocmport import output
from rocmport.errors import BadInput, ProblemFound, RocmportError
from rocmport.fsutil import file_lock, tree_write_bytes, write_file
from rocmport.redact import redact
from rocmport.gitutil import FIXED_IDENTITY, GitError, clear_stale_locks, git, has_commit, run_git
from rocmport.upstream.remotes import Remote, RemoteUnreachable, local_git_dir
from rocmport.upstreams import UPSTREAMS

REFSPECS = ("+refs/heads/*:refs/heads/*", "+refs/tags/*:refs/tags/*")


class Store:
    def __init__(self, cache_dir: str | Path):
        self.root = Path(cache_dir)

    def mirror_dir(self, upstream: str) -> Path:
        return self.root / "mirrors" / f"{upstream}.git"

    def sdist_dir(self) -> Path:
        return self.root / "sdists"

    @contextmanager
    def locked(self, timeout: float = 600) -> Iterator[Store]:
        """Hold the cache's file lock: concurrent syncs wait for each other instead of corrupting it."""
        with file_lock(
            self.root / ".lock",
            f"another rocmport process is updating the cache {self.root}; "
            f"wait for it, or remove the lock file if none runs",
            timeout=timeout,
            error=RocmportError,
        ):
            self._clear_stale_git_locks()
            yield self

    def _clear_stale_git_locks(self) -> None:
        """Ref and config locks a killed sync left in a mirror: we hold the cache's lock, so no rocmport
        writes there, and they are removed when no git process works in that mirror."""
        mirrors = self.root / "mirrors"
        for mirror in sorted(mirrors.glob("*.git")) if mirrors.is_dir() else []:
            for lock in clear_stale_locks(mirror):
                output.info(f"removed {lock}, left behind by an interrupted sync (no git process works in {mirror})")

    def has_commit(self, upstream: str, commit: str) -> bool:
        """Does the cache's mirror of ``upstream`` hold ``commit``?"""
        mirror = self.mirror_dir(upstream)
        return (mirror / "HEAD").exists() and has_commit(mirror, commit)

    # -- mirrors ---------------------------------------------------------------------------------

    def update_mirror(self, remote: Remote, offline: bool = False) -> Path:
        """Bring the cache mirror of ``remote`` up to date (or just check it exists when offline)."""
        mirror = self.mirror_dir(remote.name)
        _check_alternates(mirror, remote.name)
        if offline:
            if not (mirror / "HEAD").exists():
                raise BadInput(
                    f"--offline: no cached mirror of {remote.name} in {self.root}; run `rocmport sync` online once"
                )
            return mirror
        with self.locked():
            _init_mirror(mirror)
            try:
                if remote.is_local:
                    _import_local(mirror, remote)
                else:
                    _fetch_network(mirror, remote)
            except GitError as exc:
                raise RocmportError(
                    f"updating the cache mirror of {remote.name} from {remote.shown} failed: {redact(str(exc))}"
                ) from None
        return mirror

    # -- sdists ----------------------------------------------------------------------------------

    def sdist(self, filename: str, sha256: str, fetch: Callable[[], bytes]) -> Path:
        """The verified sdist in the cache; ``fetch()`` gives its bytes only when the cached copy is
        absent or wrong. A download whose sha256 differs is discarded."""
        dest = self.sdist_dir() / filename
        if dest.is_file() and _sha256(dest) == sha256:
            return dest
        data = fetch()
        got = hashlib.sha256(data).hexdigest()
        if got != sha256:
            raise ProblemFound(
                f"{filename}: sha256 {got} does not match the index's {sha256}; the download was discarded"
            )
        write_file(dest, data)  # checked first: only a verified download is ever in the cache
        return dest

    def import_sdist(self, sdist_path: Path, upstream: str, version: str, sha256: str) -> str:
        """Import the sdist into the mirror of ``upstream`` as one commit (fixed author, date and
        message: same sdist, same id), referenced as refs/rocmport/pypi/<distribution>/<version>."""
        repo, dist = self.mirror_dir(upstream), UPSTREAMS[upstream].distribution
        if not (repo / "HEAD").exists():
            repo.mkdir(parents=True, exist_ok=True)
            git("init", "--bare", "-q", str(repo))
        with tempfile.TemporaryDirectory(prefix="rocmport-sdist-") as tmp:
            work = Path(tmp) / "tree"
            work.mkdir()
            with tarfile.open(sdist_path, "r:gz") as tar:
                for member, rel in _safe_members(tar, sdist_path.name):
                    target = work / rel
                    target.parent.mkdir(parents=True, exist_ok=True)
                    if member.issym():
                        os.symlink(member.linkname, target)
                        continue
                    src = tar.extractfile(member)
                    if src is None:
                        continue
                    with src:  # never through a link an earlier member made
                        tree_write_bytes(work, rel, src.read())
                    os.chmod(target, 0o755 if member.mode & stat.S_IXUSR else 0o644)
            env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
            common = [
                "-c",
                "core.autocrlf=false",
                "-c",
                "core.fileMode=true",
                "-c",
                "core.symlinks=true",
                f"--git-dir={repo}",
                f"--work-tree={work}",
            ]
            run_git(*common, "add", "-A", "-f", ".", cwd=work, env=env)
            tree = git(*common, "write-tree", cwd=work, env=env)
        message = f"{dist} {version} from the package index\n\nsdist sha256: {sha256}\n"
        commit = git("commit-tree", tree, "-m", message, cwd=repo, env=FIXED_IDENTITY)
        git("update-ref", f"refs/rocmport/pypi/{dist}/{version}", commit, cwd=repo)
        return commit


def _init_mirror(path: Path) -> None:
    if not (path / "HEAD").exists():
        path.mkdir(parents=True, exist_ok=True)
        git("init", "--bare", "-q", str(path))


def _import_local(mirror: Path, remote: Remote) -> None:
    """Borrow the source's objects via alternates and copy its branch and tag refs."""
    src = local_git_dir(remote)
    objects = (src / "objects").resolve()
    alt = mirror / "objects" / "info" / "alternates"
    alt.parent.mkdir(parents=True, exist_ok=True)
    existing = alt.read_text().split() if alt.exists() else []
    if str(objects) not in existing:
        write_file(alt, "\n".join([*existing, str(objects)]) + "\n")
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
    proc = run_git(
        "fetch", "--prune", "--no-tags", "--quiet", "--", remote.url, *REFSPECS, cwd=mirror, check=False, timeout=3600
    )
    if proc.returncode == 0:
        return
    err = proc.stderr
    if "pack-objects died" in err or re.search(r"unable to read [0-9a-f]{40}|missing blob object", err):
        raise RocmportError(
            f"fetching {remote.name} from {remote.shown} failed: the source lacks objects (pack-objects died); "
            f"clone it by plain path instead: `rocmport sync --remote {remote.name}=/path/to/mirror`"
        )
    first = next((ln for ln in err.splitlines() if ln.strip()), f"exit {proc.returncode}").strip()
    raise RemoteUnreachable(
        f"cannot reach {remote.name} at {remote.shown}: {redact(first)}; check the URL, or use --offline / --source pypi"
    )


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


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _safe_members(tar: tarfile.TarFile, filename: str) -> Iterator[tuple[tarfile.TarInfo, PurePosixPath]]:
    """Members below the single top-level directory, with that directory stripped; refuse escapes."""
    for m in tar.getmembers():
        p = PurePosixPath(m.name)
        if p.is_absolute() or ".." in p.parts:
            raise BadInput(f"{filename}: member '{m.name}' escapes the archive; refusing to import it")
        target = PurePosixPath(m.linkname)
        if m.islnk() and (target.is_absolute() or ".." in target.parts):
            raise BadInput(f"{filename}: hard link '{m.name}' -> '{m.linkname}' points outside the archive")
        if m.issym() and (target.is_absolute() or _escapes(p.parent, target)):
            raise BadInput(f"{filename}: symlink '{m.name}' -> '{m.linkname}' points outside the archive")
        # Generated *.egg-info directories are build output, not source.
        if not (m.isfile() or m.issym()) or len(p.parts) < 2 or any(x.endswith(".egg-info") for x in p.parts[1:-1]):
            continue
        yield m, PurePosixPath(*p.parts[1:])


def _escapes(base: PurePosixPath, target: PurePosixPath) -> bool:
    depth = len(base.parts) - 1  # below the stripped top directory
    for part in target.parts:
        depth += -1 if part == ".." else (0 if part == "." else 1)
        if depth < 0:
            return True
    return False
