"""Small filesystem helpers: atomic writes, so lock and report files are never half-written, and
the one file-lock wrapper (the cache, a work tree, the bot)."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import sys
import tempfile
from fnmatch import fnmatchcase
from collections.abc import Iterator
from typing import IO
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock, Timeout

from rocmport.errors import BadInput, RocmportError


# -- the one writer ---------------------------------------------------------------------------------
#
# Every file rocmport writes (reports, JUnit, the Dockerfile, goldens, tuning tables, the lock, the
# caches' files, logs) goes through write_file (tests/test_architecture.py holds every module to it).
# It replaces a regular file atomically (a temp file beside it, fsync, rename): a reader never sees
# half a file and a crash leaves the old one. It never replaces anything else: a device, a FIFO, a
# socket, a directory or a symlink at the path is refused, naming it (a rename over /dev/full would
# turn the device into a file; over a link, it would drop the link the user made; through a link, it
# would write wherever the link points). A new file gets the mode the umask gives (0666 & ~umask,
# as `>` in a shell); an existing one keeps its mode (a tracked 0644 upstream.lock stays 0644).

STDOUT = "-"


class OutputRefused(BadInput):
    """An output path that is not a regular file (or a missing one): exit 2, one line naming it."""


class DiskFull(RocmportError):
    """A write ran out of space (ENOSPC, EDQUOT): exit 1, naming the path and "no space left"."""

    exit_code = 1


def _kind_of(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symlink"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def check_output_path(path: str | os.PathLike, option: str | None = None, *, stdout_dash: bool = False) -> None:
    """Refuse (OutputRefused, exit 2) an output path that exists and is not a regular file, before any
    work is done: ``option`` names the option it came from. ``-`` passes when ``stdout_dash``."""
    if stdout_dash and str(path) == STDOUT:
        return
    if not str(path):
        raise OutputRefused(f"{option + ' ' if option else ''}'': an empty path; give a file path")
    try:
        mode = os.lstat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):  # nothing there yet (making its directory says the rest)
        return
    if not stat.S_ISREG(mode):
        dash = " (or - for stdout)" if stdout_dash else ""
        raise OutputRefused(
            f"{option + ' ' if option else ''}{path}: is {_kind_of(mode)}; rocmport writes only regular files "
            f"(replacing it would destroy what is there, writing through it would write elsewhere): "
            f"give the path of a regular file{dash}"
        )


def umask() -> int:
    """The process umask, read without changing it where Linux tells it (/proc), else by a swap."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    old = os.umask(0o022)
    os.umask(old)
    return old


def is_disk_full(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)


def disk_full(path: str | os.PathLike, exc: BaseException | None = None) -> DiskFull:
    why = "disk quota exceeded" if isinstance(exc, OSError) and exc.errno == errno.EDQUOT else "no space left on device"
    return DiskFull(f"{path}: {why}; free space there (or choose another place) and run it again")


@contextmanager
def naming_disk_full(path: str | os.PathLike) -> Iterator[None]:
    """A full disk inside the block is DiskFull naming ``path`` (a write's OSError names no file)."""
    try:
        yield
    except OSError as exc:
        if is_disk_full(exc):
            raise disk_full(path, exc) from None
        raise


def write_file(
    path: str | os.PathLike,
    data: str | bytes,
    *,
    stdout_dash: bool = False,
    mode: int | None = None,
    durable: bool = True,
) -> None:
    """Write ``data`` (text is UTF-8, newlines as given) to ``path``: the one writer (see above).
    ``stdout_dash``: the path ``-`` is stdout, as the user asked. ``mode``: the mode of a new file
    (an executable shim); default 0666 & ~umask. An existing regular file keeps its mode and owner.
    ``durable=False``: no fsync (a worker's result file in a temporary directory, rewritten often)."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    if stdout_dash and str(path) == STDOUT:
        out = sys.stdout.buffer if hasattr(sys.stdout, "buffer") else None
        if out is None:
            sys.stdout.write(raw.decode("utf-8", errors="replace"))
        else:
            sys.stdout.flush()
            out.write(raw)
        sys.stdout.flush()
        return
    path = Path(path)
    check_output_path(path, stdout_dash=stdout_dash)
    with naming_disk_full(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            old: os.stat_result | None = os.lstat(path)
        except FileNotFoundError:
            old = None
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(raw)
                fh.flush()
                if durable:
                    os.fsync(fh.fileno())
                if old is not None:
                    os.fchmod(fh.fileno(), stat.S_IMODE(old.st_mode))
                    if os.geteuid() == 0 and (old.st_uid, old.st_gid) != (0, 0):
                        with contextlib.suppress(OSError):  # root keeps a user's file theirs
                            os.fchown(fh.fileno(), old.st_uid, old.st_gid)
                else:
                    os.fchmod(fh.fileno(), (0o666 if mode is None else mode) & ~umask())
            # lstat again: a device or link put there meanwhile is refused, not replaced
            check_output_path(path, stdout_dash=stdout_dash)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """``write_file`` for text (the name its callers have used since the first lock file)."""
    write_file(path, text)


def probe_writable_dir(directory: str | os.PathLike) -> None:
    """Make ``directory`` (and its parents) and check a file can be created in it, raising OSError
    when not: a file made and removed, since the permission bits alone lie to root."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    fd, probe = tempfile.mkstemp(prefix=".rocmport-probe-", dir=d)
    os.close(fd)
    os.unlink(probe)


@contextmanager
def open_log(path: str | os.PathLike) -> Iterator[IO[str]]:
    """A new log file for a subprocess to write into (its stdout and stderr): created or truncated,
    never through a link or onto a device (O_NOFOLLOW, a regular file checked), 0666 & ~umask."""
    path = Path(path)
    check_output_path(path)
    with naming_disk_full(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            check_output_path(path)
        with os.fdopen(fd, "w") as fh:
            yield fh


def move_dir(src: str | os.PathLike, dest: str | os.PathLike) -> None:
    """Put the directory ``src`` at ``dest`` (same file system, one rename): an unpacked cache entry."""
    os.replace(src, dest)


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


def tree_write_bytes(
    tree: str | os.PathLike, rel: str | os.PathLike, data: bytes, *, replace: bool = True, new_mode: int | None = None
) -> None:
    """Write ``tree/rel`` atomically (a temp file beside it, then rename), creating directories, never
    through a link: a symlink on the way or at ``rel`` itself is UnsafePath (it is not replaced either).
    ``replace=False``: an existing file is UnsafePath too (FileExistsError semantics, race-free).
    ``new_mode``: a new file's mode before the umask (default 0666); an existing file keeps its own."""
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
            mode = 0o666 if new_mode is None else new_mode  # less the umask, as git checks files out
        tmp = f".{name}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dfd)
        try:
            with os.fdopen(fd, "wb") as fh, naming_disk_full(tree / Path(*parts)):
                fh.write(data)  # no fsync: a work tree's files are git's to verify, not a journal
                fh.flush()
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
