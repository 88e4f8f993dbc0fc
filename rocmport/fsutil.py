"""Small filesystem helpers: atomic writes, so lock and report files are never half-written, and
the one file-lock wrapper (the cache, a work tree, the bot)."""

from __future__ import annotations

import os
import tempfile
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
