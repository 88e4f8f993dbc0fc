"""A rank server: one process that imports what upstream's training script imports (torch, megatron,
TE's Python layer; on the CPU proxy with the shim installed, as each torchrun worker installs it),
once, then forks the ranks of each run it is handed (stage 4: a case's run and its resumed run), so
that no rank imports them again. On 2 cores four ranks importing torch, megatron and TE took most of
a case's start-up.

    python -m rocmport.verify.runtime.rank_server --socket PATH SCRIPT

Started by stage 4 (rocmport.verify.stages.functional.rank_servers) in the tree, with the runs'
environment (the one each torchrun worker would get, OMP_NUM_THREADS included). It binds PATH, runs
the script's top-level imports with its own output captured, says ``ready {...}`` on stdout (or
``refused {...}`` when forking would be unsafe: a thread besides the main one), and then serves one
run per connection from rocmport.verify.runtime.rank_client (torchrun's place in the launch
command): it forks the run's ranks, each one in a session of its own (as torchrun starts them) with
the client's stdout and stderr, torchrun's environment variables, the script as ``__main__`` and the
captured import output written first; it ends the run as torchrun does (a rank that exits non-zero:
SIGTERM to the others' process groups, SIGKILL after a grace period) and answers the exits. A client
that goes away (killed by stage 4's time limit) takes its run's ranks with it (SIGKILL to their
process groups); the server ends when its stdin closes (stage 4 is done with it, or died), and each
rank dies with the server (rocmport.procs.die_with_parent: PR_SET_PDEATHSIG, and a server already gone
before that took effect ends the rank at once).

No torch thread pool, process group or CUDA-like state exists before a fork: the server only imports.
It checks that the environment a run asks for is the one it imported with (less the per-rank
variables), so a rank never runs with modules imported under another environment."""

from __future__ import annotations

import ast
import json
import os
import select
import signal
import socket
import sys
import tempfile
import time
from dataclasses import dataclass

from rocmport.procs import die_with_parent
from rocmport.verify.runtime import fd_messages, protocol
from rocmport.verify.runtime.served_spawn import SpawnJob, SpawnServer, run_spawned

# torchrun's per-worker variables (torch.distributed.elastic's local agent), set in each rank here.
RANK_VARS = (
    "RANK",
    "LOCAL_RANK",
    "GROUP_RANK",
    "ROLE_RANK",
    "ROLE_NAME",
    "LOCAL_WORLD_SIZE",
    "WORLD_SIZE",
    "GROUP_WORLD_SIZE",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_USE_AGENT_STORE",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING",
)
# torchrun's grace period between SIGTERM to the survivors of a failed rank and SIGKILL.
GRACE_S = 30.0
POLL_S = 0.05


@dataclass
class Rank:
    """What a forked rank runs: the script and its arguments, its environment and directory, the
    output it writes first (the server's captured imports)."""

    argv: list[str]
    env: dict[str, str]
    cwd: str
    early_out: bytes
    early_err: bytes


def rank_env(asked: dict[str, str], rank: int, nproc: int, addr: str, port: int) -> dict[str, str]:
    """The environment torchrun gives worker ``rank`` of ``nproc`` on one node (OMP_NUM_THREADS=1
    with several ranks unless set; the store hosted by rank 0: no agent here)."""
    env = dict(asked)
    if nproc > 1:
        env.setdefault("OMP_NUM_THREADS", "1")
    env.update(
        {
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "GROUP_RANK": "0",
            "ROLE_RANK": str(rank),
            "ROLE_NAME": "default",
            "LOCAL_WORLD_SIZE": str(nproc),
            "WORLD_SIZE": str(nproc),
            "GROUP_WORLD_SIZE": "1",
            "ROLE_WORLD_SIZE": str(nproc),
            "MASTER_ADDR": addr,
            "MASTER_PORT": str(port),
            "TORCHELASTIC_RESTART_COUNT": "0",
            "TORCHELASTIC_MAX_RESTARTS": "0",
            "TORCHELASTIC_RUN_ID": "none",
            "TORCHELASTIC_USE_AGENT_STORE": "False",
            "TORCH_NCCL_ASYNC_ERROR_HANDLING": asked.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
        }
    )
    return env


def env_difference(imported_with: dict[str, str], asked: dict[str, str]) -> list[str]:
    """The variables (names only) whose value differs between the environment the server imported
    with and a run's ranks' (less the per-rank variables)."""
    keys = (set(imported_with) | set(asked)) - set(RANK_VARS)
    return sorted(k for k in keys if imported_with.get(k) != asked.get(k))


def exec_environ() -> dict[str, str]:
    """This process's environment as it was started (before the bootstrap set anything)."""
    try:
        with open("/proc/self/environ", "rb") as fh:
            raw = fh.read()
    except OSError:
        return dict(os.environ)
    out = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            out[os.fsdecode(key)] = os.fsdecode(value)
    return out


def import_statements(script: str) -> list[ast.stmt]:
    """The script's top-level imports (those in a top-level try block too): what it imports before it runs."""
    with open(script, encoding="utf-8") as fh:
        tree = ast.parse(fh.read(), script)
    out: list[ast.stmt] = []
    for node in tree.body:
        if isinstance(node, ast.Import) or (isinstance(node, ast.ImportFrom) and node.module != "__future__"):
            out.append(node)
        elif isinstance(node, ast.Try):
            out += [n for n in node.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    return out


def preload(script: str) -> tuple[bytes, bytes]:
    """The shim as a torchrun worker installs it, then the script's imports; what they printed
    (stdout, stderr). An import that fails here is left to the rank, which meets it again."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
        try:
            from rocmport.verify.runtime import bootstrap

            bootstrap.install_worker_shim()
            for stmt in import_statements(script):
                try:
                    exec(compile(ast.Module([stmt], []), script, "exec"), {"__name__": "__rocmport_preload__"})
                except BaseException as exc:  # noqa: BLE001 - the rank meets it again and reports it
                    if isinstance(exc, KeyboardInterrupt):
                        raise
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
        out.seek(0)
        err.seek(0)
        return out.read(), err.read()


def threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        import threading

        return threading.active_count()


def _signal_groups(pids, sig: int) -> None:
    for pid in pids:
        try:
            os.killpg(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _reap(live: dict[int, int], failures: list[dict]) -> None:
    """Collect the ranks that exited; a non-zero exit (a signal as minus its number) is a failure."""
    for pid in list(live):
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            code = os.waitstatus_to_exitcode(status)
            rank = live.pop(pid)
            if code:
                failures.append({"rank": rank, "pid": pid, "code": code, "time": time.time()})


def _still_there(conn: socket.socket) -> bool:
    """Whether the client still holds its end (it sends nothing after its request: readable is its end)."""
    try:
        return bool(conn.recv(1, socket.MSG_PEEK))
    except OSError:
        return False


def watch(
    conn: socket.socket, live: dict[int, int], spawner: SpawnServer, listener: socket.socket
) -> list[dict] | SpawnJob | None:
    """Wait for a run's ranks (pid -> rank) as torchrun waits for its workers: the first failure
    ends the others (SIGTERM to their process groups, SIGKILL after GRACE_S); meanwhile fork what
    the ranks start with spawn (``spawner``; in such a child, the SpawnJob it runs). The failures,
    or None when the client went away (its ranks killed)."""
    pids = list(live)
    failures: list[dict] = []
    term_at = None
    while live:
        readable, _, _ = select.select([conn, spawner.listener], [], [], POLL_S)
        if spawner.listener in readable:
            job = spawner.accept([conn, listener])
            if job is not None:
                return job
        spawner.reap()
        if conn in readable and not _still_there(conn):
            _signal_groups(pids, signal.SIGKILL)
            spawner.end_run()
            while live:
                _reap(live, failures)
                time.sleep(POLL_S)
            return None
        _reap(live, failures)
        if failures and term_at is None and live:
            term_at = time.monotonic()
            _signal_groups(live, signal.SIGTERM)
        elif term_at is not None and live and time.monotonic() - term_at > GRACE_S:
            _signal_groups(live, signal.SIGKILL)
    _signal_groups(pids, signal.SIGTERM)  # what the ranks started and left behind, as torchrun's close does
    spawner.end_run()
    return failures


def _become_rank(job: Rank, out_fd: int, err_fd: int, closing: list[socket.socket], server: int) -> Rank:
    """In the forked child: a session of its own, death with the server (pid ``server``), the client's output."""
    for sock in closing:
        sock.close()
    os.setsid()
    die_with_parent(server)
    with open(os.devnull, "rb") as null:  # no stdin, as torchrun's workers read none
        os.dup2(null.fileno(), 0)
    os.dup2(out_fd, 1)
    os.dup2(err_fd, 2)
    for fd in {out_fd, err_fd} - {0, 1, 2}:
        os.close(fd)
    return job


def serve_one(
    conn: socket.socket, listener: socket.socket, spawner: SpawnServer, imported_with: dict, added: dict, early
) -> Rank | SpawnJob | None:
    """One run: fork its ranks (returns the Rank in each child) and what they spawn (the SpawnJob in
    each such child), and answer their exits (None here)."""
    try:
        req, fds = fd_messages.receive(conn, 2)  # rank_client's stdout and stderr
    except (ConnectionError, ValueError, OSError):
        return None
    nproc, addr, port = int(req["nproc"]), str(req["master_addr"]), int(req["master_port"])
    envs = [rank_env(req["env"], r, nproc, addr, port) for r in range(nproc)]
    differ = env_difference(imported_with, envs[0])
    if differ or len(fds) != 2:
        why = f"the run's environment differs from the rank server's in {', '.join(differ[:8])}" if differ else ""
        _answer(conn, {"error": why or "no stdout/stderr passed"})
        for fd in fds:
            os.close(fd)
        return None
    sys.stdout.flush()
    sys.stderr.flush()
    live: dict[int, int] = {}
    server = os.getpid()
    for r, env in enumerate(envs):
        pid = os.fork()
        if pid == 0:
            job = Rank(list(req["argv"]), {**env, **added}, str(req["cwd"]), *early)
            return _become_rank(job, fds[0], fds[1], [conn, listener, spawner.listener], server)
        live[pid] = r
    for fd in fds:
        os.close(fd)
    failures = watch(conn, live, spawner, listener)
    if isinstance(failures, SpawnJob):
        return failures
    if failures is not None:
        _answer(conn, {"failures": failures})
    return None


def _answer(conn: socket.socket, message: dict) -> None:
    try:
        conn.sendall(json.dumps(message).encode() + b"\n")
    except OSError:
        pass


def serve(argv: list[str]) -> Rank | SpawnJob | None:
    """The server's life; returns only in a forked rank (the Rank it runs) or a child a rank spawned
    (the SpawnJob it runs)."""
    if len(argv) != 3 or argv[0] != "--socket":
        print("usage: python -m rocmport.verify.runtime.rank_server --socket PATH SCRIPT", file=sys.stderr)
        os._exit(2)
    path, script = argv[1], argv[2]
    imported_with = exec_environ()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(4)
    spawner = SpawnServer(path + ".spawn")
    started = time.monotonic()
    early = preload(script)
    added = {k: v for k, v in os.environ.items() if imported_with.get(k) != v}  # the bootstrap's own settings
    added.update(protocol.SPAWN_SERVER.entry(spawner.path))
    count = threads()
    state = {"seconds": round(time.monotonic() - started, 2), "threads": count, "pid": os.getpid()}
    if count > 1:
        print("refused " + json.dumps({**state, "why": f"{count} threads after the imports: a fork copies one"}))
        sys.stdout.flush()
        os._exit(3)
    print("ready " + json.dumps(state), flush=True)
    while True:
        readable, _, _ = select.select([listener, sys.stdin], [], [])
        if sys.stdin in readable and not os.read(sys.stdin.fileno(), 4096):
            os._exit(0)  # stage 4 is done with this server (or gone): no atexit of the server's own
        if listener in readable:
            conn, _ = listener.accept()
            with conn:
                job = serve_one(conn, listener, spawner, imported_with, added, early)
            if job is not None:
                return job


def run_rank(job: Rank) -> None:
    """In a forked rank: the script as ``python SCRIPT ARGS`` runs it (its exceptions and exit code
    are the process's, through the interpreter's own shutdown: atexit, threads)."""
    os.environ.clear()
    os.environ.update(job.env)
    os.chdir(job.cwd)
    sys.argv = list(job.argv)
    sys.path[0] = os.path.dirname(os.path.realpath(job.argv[0]))
    if "multiprocessing" in sys.modules:  # a process's own key, as a fresh interpreter draws
        import multiprocessing

        multiprocessing.current_process().authkey = os.urandom(32)
    spawn_socket = protocol.SPAWN_SERVER.read()
    if spawn_socket:  # what the rank starts with spawn, the server forks (served_spawn)
        from rocmport.verify.runtime import served_spawn

        served_spawn.install(spawn_socket)
    for stream, data in ((sys.stdout, job.early_out), (sys.stderr, job.early_err)):
        if data:  # what the imports printed, first, as in a rank that imported them itself
            stream.buffer.write(data)
            stream.flush()
    run_as_main(job.argv[0])


def run_as_main(script: str) -> None:
    """``script`` as the interpreter runs ``python SCRIPT``: a fresh ``__main__`` module whose
    ``__file__`` (and the code's file name, which tracebacks show) is the absolute path, sys.argv[0]
    as given. (runpy.run_path would name the code by the relative path and rewrite sys.argv[0].)"""
    import builtins
    import importlib.machinery
    import types

    path = os.path.abspath(script)
    with open(path, "rb") as fh:
        source = fh.read()
    main = types.ModuleType("__main__")
    main.__file__ = path
    main.__cached__ = None  # type: ignore[attr-defined]
    main.__loader__ = importlib.machinery.SourceFileLoader("__main__", path)
    main.__builtins__ = builtins  # type: ignore[attr-defined]
    sys.modules["__main__"] = main
    exec(compile(source, path, "exec"), main.__dict__)


if __name__ == "__main__":
    job = serve(sys.argv[1:])
    if isinstance(job, Rank):
        run_rank(job)
    elif job is not None:
        run_spawned(job)
