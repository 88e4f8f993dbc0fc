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
import io
import json
import os
import signal
import socket
import struct
import sys
import time
from dataclasses import dataclass

from multiprocessing import popen_spawn_posix

from rocmport.procs import die_with_parent

# the exit code and pid on the status pipe: multiprocessing.forkserver's encoding
_SIGNED = struct.Struct("q")
# what a request carries over the socket: its JSON's length, then the JSON; the fds ride on the length
_HEADER = struct.Struct("!Q")
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


def _write_signed(fd: int, n: int) -> None:
    data = _SIGNED.pack(n)
    while data:
        data = data[os.write(fd, data) :]


def _read_signed(fd: int) -> int:
    data = b""
    while len(data) < _SIGNED.size:
        chunk = os.read(fd, _SIGNED.size - len(data))
        if not chunk:
            raise EOFError("the rank server closed the status pipe")
        data += chunk
    return _SIGNED.unpack(data)[0]


# ---- rank side ------------------------------------------------------------------------------------

_SOCKET: str | None = None


class ServedPopen(popen_spawn_posix.Popen):
    """spawn's Popen whose child the rank server forks: the same pickles through the same pipe, the
    same fd numbers in the child; pid and exit code from the server's status pipe (the sentinel)."""

    _fds: list[int]  # spawn's Popen: the fds the child gets at the same numbers
    _served = False

    def _launch(self, process_obj) -> None:
        from multiprocessing import reduction, resource_tracker, spawn, util
        from multiprocessing.context import set_spawning_popen

        tracker_fd = resource_tracker.getfd()
        assert tracker_fd is not None  # getfd starts the tracker
        self._fds.append(tracker_fd)
        prep_data = spawn.get_preparation_data(process_obj._name)
        buf = io.BytesIO()
        set_spawning_popen(self)
        try:
            reduction.dump(prep_data, buf)
            reduction.dump(process_obj, buf)
        finally:
            set_spawning_popen(None)
        if len(set(self._fds) | {0, 1, 2}) + 2 > _MAX_FDS:  # with the pipe's end and the status pipe's
            self._fds = []
            super()._launch(process_obj)  # type: ignore[misc]
            return
        self._served = True
        child_r, parent_w = os.pipe()
        status_r, status_w = os.pipe()
        try:
            fds = sorted(set(self._fds) | {child_r, 0, 1, 2})
            _request(
                _SOCKET or "",
                {"fds": fds, "env": dict(os.environ), "tracker_fd": tracker_fd, "pipe": child_r},
                status_w,
                fds,
            )
            os.close(status_w)
            status_w = -1
            self.sentinel = status_r
            self.pid = _read_signed(status_r)
            with open(parent_w, "wb", closefd=False) as f:
                f.write(buf.getbuffer())
        finally:
            self.finalizer = util.Finalize(self, util.close_fds, [status_r, parent_w])  # type: ignore[attr-defined]
            for fd in (child_r, status_w):
                if fd >= 0:
                    os.close(fd)
        shim = sys.modules.get("rocmport.verify.runtime.proxy_shim")
        if shim is not None:
            shim.REDIRECTS[f"{REDIRECT} @ {shim._site()}"] += 1

    def poll(self, flag: int = os.WNOHANG) -> int | None:
        if not self._served:  # a fresh interpreter's, its own child
            return super().poll(flag)
        if self.returncode is None:
            from multiprocessing.connection import wait

            if not wait([self.sentinel], 0 if flag == os.WNOHANG else None):
                return None
            try:
                self.returncode = _read_signed(self.sentinel)
            except (OSError, EOFError):  # the server is gone, and its children with it
                self.returncode = 255
        return self.returncode


def _request(path: str, message: dict, status_w: int, fds: list[int]) -> None:
    body = json.dumps(message).encode()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(path)
        socket.send_fds(sock, [_HEADER.pack(len(body))], [status_w, *fds])
        sock.sendall(body)


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


def _recv_exactly(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise ConnectionError("the rank closed the connection mid-request")
        data += chunk
    return data


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
                header, fds, _, _ = socket.recv_fds(conn, _HEADER.size, _MAX_FDS)
                if len(header) < _HEADER.size:
                    header += _recv_exactly(conn, _HEADER.size - len(header))
                (length,) = _HEADER.unpack(header)
                req = json.loads(_recv_exactly(conn, length))
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
            _write_signed(status_w, pid)
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
                    _write_signed(status_w, os.waitstatus_to_exitcode(status))
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
