"""The cache of bare upstream mirrors, shared by every project on the machine.

Layout: <cache>/mirrors/<upstream>.git (bare, refs/tags/* and refs/heads/* only),
<cache>/sdists/ (downloaded package-index sdists), <cache>/.lock (file lock).
Work trees never write refs into the cache; they borrow objects through alternates.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock, Timeout

from rocmport.errors import RocmportError


class Store:
    def __init__(self, cache_dir: str | Path):
        self.root = Path(cache_dir)

    def mirror_dir(self, upstream: str) -> Path:
        return self.root / "mirrors" / f"{upstream}.git"

    def sdist_dir(self) -> Path:
        return self.root / "sdists"

    @contextmanager
    def locked(self, timeout: float = 600):
        """Hold the cache's file lock: concurrent syncs wait for each other instead of corrupting it."""
        self.root.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(self.root / ".lock"))
        try:
            lock.acquire(timeout=timeout)
        except Timeout:
            raise RocmportError(f"{self.root}: the cache is locked by another rocmport process; wait or remove {self.root / '.lock'}") from None
        try:
            yield self
        finally:
            lock.release()
