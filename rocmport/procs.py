"""The processes a long run starts (verify's torchruns, their workers, pytest, pretrain_gpt.py), and
how the run ends every one of them, on an interrupt as at its end.

Each process the run starts, and each that one starts, carries ROCMPORT_RUN=<id> in its
environment; torchrun's workers start their own sessions (out of reach of a process group) and a
checkpoint writer may be re-parented to init, but they keep their environment, so the run finds
them all in /proc. The children also get a private TMPDIR (torchrun's torchelastic_* directories,
pytest's basetemp) inside a temporary directory the run owns and removes.

SIGINT and SIGTERM become `Stop` (a BaseException: no `except Exception` in a stage swallows it);
`run_scope` ends the processes, removes the directory and raises `Interrupted`, whose exit code is
130 (SIGINT) or 143 (SIGTERM), with a line saying what had finished."""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from rocmport.errors import RocmportError

RUN_VAR = "ROCMPORT_RUN"
T = TypeVar("T")
R = TypeVar("R")
SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Stop(BaseException):
    """A SIGINT or SIGTERM arrived during a run: unwinds the run to its `run_scope`."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class Interrupted(RocmportError):
    """The run was interrupted and cleaned up: exit 128 + the signal (130 SIGINT, 143 SIGTERM)."""

    def __init__(self, message: str, signum: int, done: str = "", ended: int = 0):
        super().__init__(message, 128 + signum)
        self.signum = signum
        self.done = done  # what had finished, for a scope around this one to name
        self.ended = ended


def marked(value: str, var: str = RUN_VAR) -> list[int]:
    """Live processes (not this one) whose environment holds ``var=value`` (Linux /proc; elsewhere none)."""
    needle = f"{var}={value}".encode()
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            environ = (entry / "environ").read_bytes()  # a zombie's reads empty: it runs nothing
        except OSError:  # another user's, or gone
            continue
        if needle in environ.split(b"\0") and int(entry.name) != os.getpid():
            found.append(int(entry.name))
    return found


def end_marked(value: str, var: str = RUN_VAR, seconds: float = 10.0) -> int:
    """SIGKILL every process marked ``var=value`` until none is left (a process may fork while the
    first ones die: scanned again until a scan finds none, for at most ``seconds``); how many."""
    ended: set[int] = set()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        pids = marked(value, var)
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                ended.add(pid)
            except OSError:  # gone meanwhile
                pass
        time.sleep(0.05)
    for pid in ended:  # this process's own children among them: collected, no zombie outlives the scope
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:  # not ours, or already collected
            pass
    return len(ended)


@dataclass
class Scope:
    id: str
    tmp: Path


def _raise_stop(signum, frame):
    raise Stop(signum)


@contextmanager
def run_scope(
    prefix: str, finished: Callable[[], str] = lambda: "", pycache: Path | None = None, then: str = ""
) -> Iterator[Scope]:
    """A run's processes and temporary files. Inside: every child started from os.environ carries
    the run's mark and a private TMPDIR, and this process's own temporary files go there too; SIGINT
    and SIGTERM raise Stop. On leaving (normally, by an error or by a signal): every marked process
    is ended and the directory removed (and its bytecode under ``pycache``); a signal becomes
    Interrupted naming ``finished()`` and then what to do (``then``). A scope inside another (refresh's
    verify) ends its own processes first; the outer one's line names what both had finished."""
    tmp = Path(tempfile.mkdtemp(prefix=prefix)).resolve()
    scope = Scope(id=uuid.uuid4().hex, tmp=tmp)
    saved_env = {k: os.environ.get(k) for k in (RUN_VAR, "TMPDIR")}
    saved_tempdir = tempfile.tempdir
    main = threading.current_thread() is threading.main_thread()  # only the main thread may set handlers
    saved_handlers: dict = {}
    stop: Stop | None = None
    inner: Interrupted | None = None
    ended = 0
    try:
        os.environ.update({RUN_VAR: scope.id, "TMPDIR": str(tmp)})
        tempfile.tempdir = str(tmp)
        for s in SIGNALS if main else ():
            saved_handlers[s] = signal.signal(s, _raise_stop)
        yield scope
    except Stop as exc:
        stop = exc
    except Interrupted as exc:  # a scope inside this one was interrupted and has ended its own processes
        stop, inner = Stop(exc.signum), exc
    finally:
        if main:  # a second Ctrl-C must not cut the cleanup short
            for s in SIGNALS:
                signal.signal(s, signal.SIG_IGN)
        try:
            ended = end_marked(scope.id)
            shutil.rmtree(tmp, ignore_errors=True)
            if pycache is not None:  # the bytecode of files that lived in the removed directory
                shutil.rmtree(pycache / tmp.relative_to(tmp.anchor), ignore_errors=True)
        finally:
            tempfile.tempdir = saved_tempdir
            for k, v in saved_env.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
            for s, handler in saved_handlers.items():
                signal.signal(s, handler)
    if stop is not None:
        done = finished() or "nothing had finished"
        if inner is not None:
            done, ended = f"{done} ({inner.done})", ended + inner.ended
        raise Interrupted(
            f"interrupted by {signal.Signals(stop.signum).name}; {done}; "
            f"ended the {ended} process(es) still running and removed {tmp}{'; ' + then if then else ''}",
            stop.signum,
            done,
            ended,
        ) from None


@contextmanager
def held() -> Iterator[None]:
    """A step that must not stop half-way (refresh promoting its result: the series, then the lock):
    inside a run scope, SIGINT and SIGTERM wait until it is done and then stop the run as usual."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) is not _raise_stop:
        yield
        return
    arrived: list[int] = []
    saved = {s: signal.signal(s, lambda signum, frame: arrived.append(signum)) for s in SIGNALS}
    try:
        yield
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)
    if arrived:
        raise Stop(arrived[0])


def die_with_parent(parent: int) -> None:
    """End this process with ``parent``, the process that forked it (Linux: PR_SET_PDEATHSIG): a pool
    worker after a kill -9 of apply or refresh, a rank after its rank server died. A parent that died
    between the fork and the prctl never sends the signal, so a parent already gone ends it here."""
    if sys.platform.startswith("linux"):
        import ctypes

        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # 1: PR_SET_PDEATHSIG
        except (OSError, AttributeError):  # no prctl to call: the check below still catches a parent already gone
            pass
    if os.getppid() != parent:  # it died before the prctl took effect: re-parented already
        os._exit(1)


def _die_with(parent: int) -> None:
    """A pool worker's initializer: end with the process that started it, so that after a kill -9 of
    apply or refresh no worker finishes its task and then blocks forever writing the result into a
    pipe nobody reads."""
    die_with_parent(parent)
    # Forked inside a run scope, it inherited the scope's handlers: a Stop raised in a worker cannot
    # even be sent back whole. A signal ends a worker as it ends any process; the parent handles the run.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def pool_initializer() -> tuple[Callable[[int], None], tuple[int]]:
    """``initializer`` and ``initargs`` for a ProcessPoolExecutor whose workers must die with this process."""
    return _die_with, (os.getpid(),)


def pool_map(
    fn: Callable[[T], R], items: list[T], jobs: int, chunksize: int = 1, each: Callable[[int], None] = lambda done: None
) -> list[R]:
    """``[fn(i) for i in items]`` in ``jobs`` worker processes that die with this one (kill -9 included);
    ``each(n)`` after the n-th result (progress). On an interrupt (Stop, KeyboardInterrupt) or any error
    the workers are killed at once: a pool left by ``with`` waits for the items already queued to it
    (and SIGTERM to refresh's process group hung it). Forked workers do not show a run scope's mark in
    /proc (their environment is the parent's from its start), so the scope cannot find them: they are
    ended here."""
    init, initargs = pool_initializer()
    pool = ProcessPoolExecutor(max_workers=jobs, initializer=init, initargs=initargs)
    try:
        done: list[R] = []
        for result in pool.map(fn, items, chunksize=chunksize):
            done.append(result)
            each(len(done))
        return done
    except BaseException:
        workers = list(
            (getattr(pool, "_processes", None) or {}).values()
        )  # the executor's own; no public handle before 3.14
        for worker in workers:
            worker.kill()
        pool.shutdown(wait=False, cancel_futures=True)
        for worker in workers:
            worker.join(5)  # collected: no zombie outlives the run
        raise
    finally:
        pool.shutdown(wait=True)  # after a success, at once (every task is done); after a kill, the manager thread ends
