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
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from rocmport.errors import RocmportError

RUN_VAR = "ROCMPORT_RUN"
SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Stop(BaseException):
    """A SIGINT or SIGTERM arrived during a run: unwinds the run to its `run_scope`."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class Interrupted(RocmportError):
    """The run was interrupted and cleaned up: exit 128 + the signal (130 SIGINT, 143 SIGTERM)."""

    def __init__(self, message: str, signum: int):
        super().__init__(message, 128 + signum)
        self.signum = signum


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
def run_scope(prefix: str, finished: Callable[[], str] = lambda: "", pycache: Path | None = None) -> Iterator[Scope]:
    """A run's processes and temporary files. Inside: every child started from os.environ carries
    the run's mark and a private TMPDIR, and this process's own temporary files go there too; SIGINT
    and SIGTERM raise Stop. On leaving (normally, by an error or by a signal): every marked process
    is ended and the directory removed (and its bytecode under ``pycache``); a signal becomes
    Interrupted naming ``finished()``."""
    tmp = Path(tempfile.mkdtemp(prefix=prefix)).resolve()
    scope = Scope(id=uuid.uuid4().hex, tmp=tmp)
    saved_env = {k: os.environ.get(k) for k in (RUN_VAR, "TMPDIR")}
    saved_tempdir = tempfile.tempdir
    main = threading.current_thread() is threading.main_thread()  # only the main thread may set handlers
    saved_handlers: dict = {}
    stop: Stop | None = None
    ended = 0
    try:
        os.environ.update({RUN_VAR: scope.id, "TMPDIR": str(tmp)})
        tempfile.tempdir = str(tmp)
        for s in SIGNALS if main else ():
            saved_handlers[s] = signal.signal(s, _raise_stop)
        yield scope
    except Stop as exc:
        stop = exc
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
        done = finished()
        raise Interrupted(f"interrupted by {signal.Signals(stop.signum).name}; {done or 'nothing had finished'}; "
                          f"ended the {ended} process(es) still running and removed {tmp}", stop.signum) from None


def _die_with(parent: int) -> None:
    """A pool worker's initializer: end with the process that started it (Linux: PR_SET_PDEATHSIG),
    so that after a kill -9 of apply or refresh no worker finishes its task and then blocks forever
    writing the result into a pipe nobody reads."""
    if sys.platform.startswith("linux"):
        import ctypes

        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG
        except (OSError, AttributeError):  # no prctl to call: the check below still catches a parent already gone
            pass
    if os.getppid() != parent:  # it died before the prctl took effect
        os._exit(1)


def pool_initializer() -> tuple[Callable[[int], None], tuple[int]]:
    """``initializer`` and ``initargs`` for a ProcessPoolExecutor whose workers must die with this process."""
    return _die_with, (os.getpid(),)
