"""Small filesystem helpers: atomic writes, so lock and report files are never half-written, and
the one file-lock wrapper (the cache, a work tree, the bot)."""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from fnmatch import fnmatchcase
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock, Timeout

from rocmport.errors import BadInput, RocmportError


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``path`` via a temp file in the same directory and ``os.replace``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


@contextmanager
def file_lock(path: Path, busy: str, *, timeout: float, error: type[RocmportError] = BadInput) -> Iterator[None]:
    """Hold the file lock ``path`` (its directory is created). When another process holds it for
    ``timeout`` seconds (0: do not wait), raise ``error`` in one line naming the lock file: ``path: busy``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(path))
    try:
        lock.acquire(timeout=timeout)
    except Timeout:
        raise error(f"{path}: {busy}") from None
    try:
        yield
    finally:
        lock.release()


# -- files inside a tree, never through a link ------------------------------------------------------
#
# Every step after the patches (the codemods, their helper, the manifests, export, build) reads and
# writes a tree's files with these: each path component is opened with O_NOFOLLOW relative to the
# one before it, so a symlink anywhere on the way (one a patch or upstream put there) is refused
# instead of followed out of the tree, and nothing outside is read or written.


class UnsafePath(BadInput):
    """A path inside a tree that goes through (or is) a symlink or is otherwise not a plain file."""


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _parts(tree: Path, rel: str | os.PathLike) -> list[str]:
    parts = Path(rel).parts
    if not parts or Path(rel).is_absolute() or any(p in ("..", ".") for p in parts):
        raise UnsafePath(f"{tree}: {str(rel)!r} is not a plain relative path inside the tree")
    return list(parts)


def _refusal(tree: Path, parts: list[str], dir_fd: int) -> UnsafePath:
    try:
        link = stat.S_ISLNK(os.stat(parts[-1], dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        link = False
    what = "is a symlink" if link else "is not a directory or regular file"
    return UnsafePath(
        f"{Path(tree, *parts)} {what}; rocmport never reads or writes through a link (it could lead out of the tree)"
    )


def _open_dir(tree: Path, parts: list[str], create: bool) -> int:
    """An fd for the directory holding ``parts[-1]``, every component opened without following links."""
    fd = os.open(tree, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for i, name in enumerate(parts[:-1]):
            try:
                nfd = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                os.mkdir(name, 0o777, dir_fd=fd)
                nfd = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise _refusal(tree, parts[: i + 1], fd) from None
                raise
            os.close(fd)
            fd = nfd
        return fd
    except BaseException:
        os.close(fd)
        raise


def tree_read_bytes(tree: str | os.PathLike, rel: str | os.PathLike) -> bytes:
    """The bytes of the regular file ``tree/rel``; UnsafePath when a link or a non-file is on the way."""
    tree = Path(tree)
    parts = _parts(tree, rel)
    dfd = _open_dir(tree, parts, create=False)
    try:
        try:
            fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=dfd)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise _refusal(tree, parts, dfd) from None
            raise
        with os.fdopen(fd, "rb") as fh:
            if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
                raise _refusal(tree, parts, dfd)
            return fh.read()
    finally:
        os.close(dfd)


def tree_read_text(tree: str | os.PathLike, rel: str | os.PathLike) -> str:
    return tree_read_bytes(tree, rel).decode("utf-8")


def tree_is_file(tree: str | os.PathLike, rel: str | os.PathLike) -> bool:
    """Is ``tree/rel`` a regular file reached without any link (a link is not, wherever it points)?"""
    tree = Path(tree)
    try:
        parts = _parts(tree, rel)
        dfd = _open_dir(tree, parts, create=False)
    except (OSError, UnsafePath):
        return False
    try:
        return stat.S_ISREG(os.stat(parts[-1], dir_fd=dfd, follow_symlinks=False).st_mode)
    except OSError:
        return False
    finally:
        os.close(dfd)


def tree_write_bytes(tree: str | os.PathLike, rel: str | os.PathLike, data: bytes, *, replace: bool = True) -> None:
    """Write ``tree/rel`` atomically (a temp file beside it, then rename), creating directories, never
    through a link: a symlink on the way or at ``rel`` itself is UnsafePath (it is not replaced either).
    ``replace=False``: an existing file is UnsafePath too (FileExistsError semantics, race-free)."""
    tree = Path(tree)
    parts = _parts(tree, rel)
    dfd = _open_dir(tree, parts, create=True)
    name = parts[-1]
    try:
        try:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            if not stat.S_ISREG(st.st_mode):
                raise _refusal(tree, parts, dfd)
            if not replace:
                raise FileExistsError(errno.EEXIST, "exists", str(tree / Path(*parts)))
            mode = stat.S_IMODE(st.st_mode)
        except FileNotFoundError:
            mode = 0o644
        tmp = f".{name}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dfd)
        try:
            with os.fdopen(fd, "wb") as fh:  # no fsync: a work tree's files are git's to verify, not a journal
                fh.write(data)
            if replace:
                os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
            else:  # link() fails when the name exists: never overwrites, even in a race
                os.link(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd, follow_symlinks=False)
                os.unlink(tmp, dir_fd=dfd)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=dfd)
            except FileNotFoundError:
                pass
            raise
    finally:
        os.close(dfd)


def tree_write_text(tree: str | os.PathLike, rel: str | os.PathLike, text: str, *, replace: bool = True) -> None:
    tree_write_bytes(tree, rel, text.encode("utf-8"), replace=replace)


def tree_files(tree: str | os.PathLike, pattern: str) -> list[str]:
    """Tree-relative paths of the regular files matching the glob ``pattern`` (one `*`-glob per
    component), reached without following any link."""
    tree = Path(tree)
    found = [""]
    comps = pattern.split("/")
    for depth, comp in enumerate(comps):
        nxt = []
        for base in found:
            try:
                entries = sorted(os.scandir(tree / base) if base else os.scandir(tree), key=lambda e: e.name)
            except OSError:
                continue
            for e in entries:
                if fnmatchcase(e.name, comp):
                    nxt.append(f"{base}/{e.name}" if base else e.name)
        found = nxt
        # Only directories (not links to them) lead further; only regular files end a match.
        if depth < len(comps) - 1:
            found = [f for f in found if (tree / f).is_dir() and not (tree / f).is_symlink()]
    return [f for f in found if tree_is_file(tree, f)]


def tree_kind(tree: str | os.PathLike, rel: str | os.PathLike) -> str:
    """What ``tree/rel`` is, looked at without following links: "file", "dir", "link" (it, or a
    component on the way, is a symlink), "missing" or "other"."""
    tree = Path(tree)
    parts = _parts(tree, rel)
    try:
        dfd = _open_dir(tree, parts, create=False)
    except UnsafePath:
        return "link"
    except FileNotFoundError:
        return "missing"
    except OSError:
        return "other"
    try:
        mode = os.stat(parts[-1], dir_fd=dfd, follow_symlinks=False).st_mode
    except FileNotFoundError:
        return "missing"
    finally:
        os.close(dfd)
    return "link" if stat.S_ISLNK(mode) else "file" if stat.S_ISREG(mode) else "dir" if stat.S_ISDIR(mode) else "other"
