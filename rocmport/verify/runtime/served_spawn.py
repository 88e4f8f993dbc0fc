"""Processes a rank starts with multiprocessing's spawn, forked from its rank server instead of a fresh
interpreter (rocmport.verify.runtime.rank_server; stage 4 on the CPU proxy). On HIP the port starts
upstream's data-loader workers with spawn (codemod dataloader-mp-context); megatron builds a loader
for each of the train, validation and test splits with a worker each (`--num-workers 1`), and each
spawned worker imports pretrain_gpt.py's world again before it reads the pickled dataset, while its
rank waits: measured on 2 cores (v0.16, gpt3_mcore_te_tp2_pp2, 4 ranks), 24 s of each run's 58 s.

What spawn means is kept: the child gets the pickled preparation data and process object through
its pipe and runs multiprocessing.spawn._main on them (the rank's sys.path, argv, working directory
and main script as ``__mp_main__``; the process object unpickled, the dataset with it), with the
rank's environment, its stdin, stdout and stderr, and the rank's file descriptors the pickle names
at the same numbers (spawn's own fd passing); its exit handlers run and its exit code reaches the
rank. What differs: the modules the server imported are imported already (the rank's state is not
inherited: the server only ever imported); the child's parent is the server, which tells the rank
the child's pid and exit code (popen_forkserver's way); and it ends as a forked child ends, without
the interpreter's teardown (about 3 s per worker on 2 cores).

Rank side: ``install(path)`` (run_rank, when protocol.SPAWN_SERVER names the server's socket) makes
spawn's Popen this module's ServedPopen. Server side: SpawnServer (the rank server's watch loop
accepts requests, forks, reaps and reports exits, and ends what a run left behind with the run)."""

from __future__ import annotations

import fcntl
import os
import re
import signal
import socket
import sys
import time
from dataclasses import dataclass
from multiprocessing import popen_spawn_posix
from multiprocessing.forkserver import read_signed, write_signed

from rocmport.procs import die_with_parent
from rocmport.verify.runtime import fd_messages

# what one SCM_RIGHTS message carries (Linux's SCM_MAX_FD); a start that passes more (a process object
# with hundreds of pipes, or of tensors shared by fd) is a fresh interpreter's, as without the server
_MAX_FDS = 253
# the redirect the rank's shim counts per served start (the report's redirects)
REDIRECT = "multiprocessing spawn: forked from the rank server (a fresh interpreter on a GPU)"
END_GRACE_S = 5.0
WHY = (
    "a process a rank starts with multiprocessing's spawn (on HIP the port's data-loader workers, codemod "
    "dataloader-mp-context) is forked from the rank server, which imported torch, megatron and TE once, not "
    "started as a fresh interpreter that imports them again (on 2 cores the three loaders' workers held each "
    "run's start for about 24 s); spawn's pickles, pipe, environment, fds and exit code are kept; it ends after "
    "its exit handlers as a forked child does, without the interpreter's teardown; each such start is counted "
    "in the redirects"
)


# ---- rank side ------------------------------------------------------------------------------------

_SOCKET: str | None = None
# spawn's command line for the child: spawn_main(tracker_fd=N, pipe_handle=M)
_SPAWN_MAIN = re.compile(r"spawn_main\(tracker_fd=(\d+), pipe_handle=(\d+)\)")


class ServedPopen(popen_spawn_posix.Popen):
    """spawn's own Popen (its pickling, pipes, fds and the write of the pickles), with the one step
    that starts a fresh interpreter (multiprocessing.util.spawnv_passfds) replaced, for this start
    only, by a request to the rank server, which forks the child; the child's pid and exit code
    come back on a status pipe (popen_forkserver's way: the child is not this process's)."""

    _status_r: int | None = None

    def _launch(self, process_obj) -> None:
        from multiprocessing import resource_tracker, util

        resource_tracker.ensure_running()  # the tracker's own start stays a fresh interpreter's
        fresh = util.spawnv_passfds
        util.spawnv_passfds = lambda path, args, passfds: self._start(fresh, path, args, passfds)
        try:
            super()._launch(process_obj)  # type: ignore[misc]
        finally:
            util.spawnv_passfds = fresh
        shim = sys.modules.get("rocmport.verify.runtime.proxy_shim")
        if shim is not None and self._status_r is not None:
            shim.REDIRECTS[f"{REDIRECT} @ {shim._site()}"] += 1

    def _start(self, fresh, path, args, passfds) -> int:
        """The child's pid: forked by the server, or (more fds than one message carries, a command
        that is not spawn's) a fresh interpreter as spawn starts it."""
        from multiprocessing import util

        fds = sorted(set(passfds) | {0, 1, 2})
        called = _SPAWN_MAIN.search(" ".join(map(str, args)))
        if called is None or len(fds) + 1 > _MAX_FDS:
            return fresh(path, args, passfds)
        status_r, status_w = os.pipe()
        try:
            message = {"fds": fds, "env": dict(os.environ), "tracker_fd": int(called[1]), "pipe": int(called[2])}
            _request(_SOCKET or "", message, status_w, fds)
        finally:
            os.close(status_w)
        util.Finalize(self, util.close_fds, (status_r,))  # type: ignore[attr-defined]
        self._status_r = status_r
        return read_signed(status_r)

    def poll(self, flag: int = os.WNOHANG) -> int | None:
        if self._status_r is None:  # a fresh interpreter's: this process's own child
            return super().poll(flag)
        if self.returncode is None:
            from multiprocessing.connection import wait

            if not wait([self._status_r], 0 if flag == os.WNOHANG else None):
                return None
            try:
                self.returncode = read_signed(self._status_r)
            except (OSError, EOFError):  # the server is gone, and its children with it
                self.returncode = 255
        return self.returncode


def _request(path: str, message: dict, status_w: int, fds: list[int]) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(path)
        fd_messages.send(sock, message, [status_w, *fds])


def install(path: str) -> None:
    """In a rank: processes started with spawn are forked by the rank server listening at ``path``."""
    global _SOCKET
    from multiprocessing import context

    _SOCKET = path
    context.SpawnProcess._Popen = staticmethod(lambda process_obj: ServedPopen(process_obj))  # type: ignore[method-assign]


# ---- server side ----------------------------------------------------------------------------------


@dataclass
class SpawnJob:
    """What a served child runs once it is set up: spawn's child (spawn_main) on ``pipe``."""

    pipe: int
    tracker_fd: int
    socket: str


def run_spawned(job: SpawnJob) -> None:
    """spawn_main's child, in the forked process: the preparation data and process object from the
    pipe, the process run (multiprocessing's own exit function included), then the exit handlers
    (the shim's redirects, the port-site record) and the end with its code, as multiprocessing's
    fork and forkserver children end (os._exit): not the interpreter's teardown of torch, megatron
    and TE, about 3 s per process on 2 cores, which each data-loader worker's rank waits for in turn
    at the end of each run."""
    import atexit
    from multiprocessing import resource_tracker, spawn

    install(job.socket)  # what it spawns in turn is served too
    resource_tracker._resource_tracker._fd = job.tracker_fd  # type: ignore[attr-defined]
    parent_sentinel = os.dup(job.pipe)
    code = spawn._main(job.pipe, parent_sentinel)
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code if isinstance(code, int) else 1)


def _place(received: list[int], targets: list[int]) -> None:
    """Each received fd at its target number (the rank's), whatever was there closed; the received
    copies closed."""
    high = max([*received, *targets, 2]) + 1
    moved = [fcntl.fcntl(fd, fcntl.F_DUPFD, high) for fd in received]
    for fd in received:
        os.close(fd)
    for fd, target in zip(moved, targets):
        os.dup2(fd, target, inheritable=True)
    for fd in moved:
        os.close(fd)


class SpawnServer:
    """The rank server's side: a socket the ranks ask at, the children it forked for each and the
    status pipe it answers each rank's Popen on."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(path)
        self.listener.listen(16)
        self.children: dict[int, int] = {}  # pid -> status pipe's write end

    def fileno(self) -> int:
        return self.listener.fileno()

    def accept(self, closing: list[socket.socket]) -> SpawnJob | None:
        """A rank's request: fork its child (which gets the SpawnJob to run), tell the rank its pid."""
        conn, _ = self.listener.accept()
        with conn:
            try:
                req, fds = fd_messages.receive(conn, _MAX_FDS)
            except (ConnectionError, ValueError, OSError):
                return None
        if len(fds) != len(req["fds"]) + 1:
            for fd in fds:
                os.close(fd)
            return None
        status_w, passed = fds[0], fds[1:]
        sys.stdout.flush()
        sys.stderr.flush()
        server = os.getpid()
        pid = os.fork()
        if pid == 0:
            for sock in [*closing, self.listener]:
                sock.close()
            for fd in [status_w, *self.children.values()]:
                os.close(fd)
            os.setsid()
            die_with_parent(server)
            _place(passed, [int(n) for n in req["fds"]])
            os.environ.clear()
            os.environ.update(req["env"])
            return SpawnJob(int(req["pipe"]), int(req["tracker_fd"]), self.path)
        for fd in passed:
            os.close(fd)
        try:
            write_signed(status_w, pid)
        except OSError:  # the rank went away mid-start
            pass
        self.children[pid] = status_w
        return None

    def reap(self) -> None:
        """The children that exited: each one's exit code to its rank (as a negative signal number)."""
        for pid in list(self.children):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                status_w = self.children.pop(pid)
                try:
                    write_signed(status_w, os.waitstatus_to_exitcode(status))
                except OSError:  # the rank is gone
                    pass
                os.close(status_w)

    def end_run(self) -> None:
        """What the run's ranks started and left (their ranks have exited): ended as torchrun ends a
        worker's process group, SIGTERM and SIGKILL after END_GRACE_S."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in list(self.children):
                try:
                    os.killpg(pid, sig)
                except (ProcessLookupError, PermissionError):
                    pass
            deadline = time.monotonic() + END_GRACE_S
            while self.children and time.monotonic() < deadline:
                self.reap()
                time.sleep(0.02)
            if not self.children:
                return

    def close(self) -> None:
        self.listener.close()
