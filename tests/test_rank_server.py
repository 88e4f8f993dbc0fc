"""Stage 4's rank server (rocmport.verify.runtime.rank_server, its client, and the stage's
RankServer): a case's ranks are forked from one process that imported the script's modules once,
for each of the case's runs, and they end as torchrun's workers end (a rank's exit code and
exception in torchrun's summary, a hung run killed with its ranks and what they started).

The scripts here import no torch: a module of the toy tree records each process that imports it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from rocmport.verify.orchestration.launcher import Launcher
from rocmport.verify.stages.functional import case_log
from rocmport.verify.stages.functional.case_run import _launch
from rocmport.verify.stages.functional.rank_servers import RankServer, applies

# Each process that imports it appends its pid to $TOY_IMPORTS: the ranks' imports, counted.
HEAVY = textwrap.dedent("""\
    import os
    with open(os.environ["TOY_IMPORTS"], "a") as fh:
        fh.write(f"{os.getpid()}\\n")
    if os.environ.get("TOY_THREAD"):  # a module that leaves a thread running: forking would copy one
        import threading, time
        threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
    """)
SCRIPT = textwrap.dedent("""\
    import os, subprocess, sys, time
    import heavy
    rank = int(os.environ["RANK"])
    keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS")
    # one write per line (the ranks share the pipe; torchrun's workers are unbuffered, -u)
    sys.stdout.write(f"rank {rank} pid {os.getpid()} ppid {os.getppid()} cwd {os.getcwd()} argv {sys.argv} "
                     + " ".join(f"{k}={os.environ.get(k)}" for k in keys) + "\\n")
    if os.environ.get("TOY_FAIL_RANK") == str(rank):
        code = os.environ["TOY_FAIL_CODE"]
        if code == "raise":
            raise ValueError("boom on purpose")
        sys.exit(int(code))
    if os.environ.get("TOY_CHILD"):  # what a rank starts (a data-loader worker, a checkpoint writer)
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        sys.stdout.write(f"rank {rank} child {child.pid}\\n")
    time.sleep(float(os.environ.get("TOY_SLEEP", "0")))
    """)


def toy_tree(root: Path) -> Path:
    root.mkdir()
    (root / "heavy.py").write_text(HEAVY)
    (root / "pretrain_gpt.py").write_text(SCRIPT)
    return root


def toy_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    skip = ("TOY_", "RANK", "LOCAL_RANK", "WORLD_SIZE")
    env = {k: v for k, v in os.environ.items() if not k.startswith(skip)}
    return {**env, "TOY_IMPORTS": str(tmp_path / "imports.txt"), **extra}


def launch(server: RankServer, env: dict, world: int, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    sock = server.socket_for(env)
    assert sock is not None, server.refused
    cmd = Launcher().command(world, ["pretrain_gpt.py", *args], "functional", port=29555, rank_server=sock)
    return _launch(cmd, server.tree, env, timeout=timeout)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


@pytest.fixture
def tree(tmp_path):
    return toy_tree(tmp_path / "tree")


def test_the_ranks_of_every_run_are_forked_from_one_import(tmp_path, tree):
    env = toy_env(tmp_path)
    server = RankServer(tree, tmp_path, world=2)
    try:
        first = launch(server, env, 2, "--train-iters", "4")
        again = launch(server, env, 2, "--ckpt-step", "2")
    finally:
        server.close()
    assert first.returncode == 0 and again.returncode == 0, first.stderr + again.stderr
    ranks = re.findall(r"rank (\d) pid (\d+) ppid (\d+) cwd (\S+) argv (\[.*?\]) (.*)", first.stdout + again.stdout)
    assert sorted(r[0] for r in ranks) == ["0", "0", "1", "1"]
    server_pid = server.ready["pid"] if server.ready else None
    # the script's import ran once, in the server; each rank is its own process, forked by it
    assert (tmp_path / "imports.txt").read_text().split() == [str(server_pid)]
    assert len({r[1] for r in ranks}) == 4 and {r[2] for r in ranks} == {str(server_pid)}
    for rank, _, _, cwd, argv, env_text in ranks:
        assert cwd == str(tree) and "'pretrain_gpt.py'" in argv
        assert (
            f"RANK={rank} LOCAL_RANK={rank} WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 "
            f"MASTER_PORT=29555 OMP_NUM_THREADS=1" == env_text
        )


def test_a_ranks_exit_code_reaches_the_stage_in_torchruns_summary(tmp_path, tree):
    env = toy_env(tmp_path, TOY_FAIL_RANK="1", TOY_FAIL_CODE="17", TOY_SLEEP="120")
    server = RankServer(tree, tmp_path, world=2)
    start = time.monotonic()
    try:
        proc = launch(server, env, 2)
    finally:
        server.close()
    # torchrun's exit (1), the failed rank's code as the root cause, the survivor ended by SIGTERM
    assert proc.returncode == 1 and time.monotonic() - start < 60
    assert re.search(
        r"Root Cause \(first observed failure\):\n\[0\]:\n.*\n.*\n  rank      : 1 .*\n  exitcode  : 17 ", proc.stderr
    )
    assert "Signal 15 (SIGTERM) received by PID" in proc.stderr
    assert case_log.cause_line(proc.stderr) == (
        "a rank exited 17 without a Python exception (megatron's rerun state machine, "
        "EXIT_CODE_FAILED_ON_RESULT_VALIDATION: a result failed validation (NaN, Inf or a spiky loss) and did so again on rerun)"
    )


def test_a_ranks_exception_is_its_own_traceback(tmp_path, tree):
    env = toy_env(tmp_path, TOY_FAIL_RANK="0", TOY_FAIL_CODE="raise")
    server = RankServer(tree, tmp_path, world=2)
    try:
        proc = launch(server, env, 2)
    finally:
        server.close()
    assert proc.returncode == 1
    assert case_log.exception_line(proc.stderr) == "ValueError: boom on purpose"
    assert (
        f'File "{tree}/pretrain_gpt.py", line 11, in <module>' in proc.stderr and "exitcode  : 1 (pid:" in proc.stderr
    )


def test_a_hung_run_is_killed_with_its_ranks_and_what_they_started(tmp_path, tree):
    env = toy_env(tmp_path, TOY_CHILD="1", TOY_SLEEP="600")
    server = RankServer(tree, tmp_path, world=2)
    try:
        with pytest.raises(subprocess.TimeoutExpired) as hung:
            launch(server, env, 2, timeout=5)
        out = hung.value.output or ""
        pids = [int(p) for p in re.findall(r"rank \d pid (\d+)", out) + re.findall(r"rank \d child (\d+)", out)]
        assert len(pids) == 4, out
        deadline = time.monotonic() + 10
        while any(alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [p for p in pids if alive(p)]
        # the server outlives a killed run and serves the next
        assert launch(server, toy_env(tmp_path), 2).returncode == 0
    finally:
        server.close()


def test_a_run_in_another_environment_gets_its_own_server(tmp_path, tree):
    server = RankServer(tree, tmp_path, world=2)
    try:
        launch(server, toy_env(tmp_path), 2)
        first = server.ready
        launch(server, toy_env(tmp_path, TOY_OTHER="1"), 2)
        assert server.ready is not None and first is not None and server.ready["pid"] != first["pid"]
    finally:
        server.close()
    assert (tmp_path / "imports.txt").read_text().split() == [str(first["pid"]), str(server.ready["pid"])]


def test_a_client_whose_environment_differs_is_refused_naming_it(tmp_path, tree):
    server = RankServer(tree, tmp_path, world=2)
    try:
        sock = server.socket_for(toy_env(tmp_path))
        assert sock is not None
        cmd = Launcher().command(2, ["pretrain_gpt.py"], "functional", rank_server=sock)
        proc = _launch(cmd, tree, toy_env(tmp_path, TOY_OTHER="1"))
    finally:
        server.close()
    assert proc.returncode == 1 and "differs from the rank server's in TOY_OTHER" in proc.stderr
    assert not (tmp_path / "imports.txt").read_text().split()[1:]  # no rank ran


def test_a_server_with_a_thread_after_its_imports_refuses_and_the_case_keeps_torchrun(tmp_path, tree):
    server = RankServer(tree, tmp_path, world=2)
    try:
        assert server.socket_for(toy_env(tmp_path, TOY_THREAD="1")) is None
    finally:
        server.close()
    assert server.refused and "2 threads after the imports" in server.refused


def test_the_rank_server_takes_torchruns_place_on_the_proxy_with_one_node_only():
    assert applies(Launcher(), proxy=True)
    assert not applies(Launcher(), proxy=False)
    assert not applies(Launcher(kind="slurm"), proxy=True)
    assert not applies(Launcher(nnodes=2, rdzv_endpoint="node0:29500"), proxy=True)
    cmd = Launcher().command(4, ["pretrain_gpt.py", "--x"], "functional", port=1, rank_server="/tmp/s.sock")
    assert cmd[:2] == [sys.executable, "-I"] and cmd[2].endswith("rank_client.py")
    assert cmd[3:] == [
        "--socket=/tmp/s.sock",
        "--nproc_per_node=4",
        "--master_addr=127.0.0.1",
        "--master_port=1",
        "pretrain_gpt.py",
        "--x",
    ]
    # multi-node and Slurm launches never name a rank server
    assert "rank_client" not in " ".join(Launcher(kind="slurm").command(4, ["x.py"], "functional", rank_server="/s"))


def test_a_server_gone_before_ready_is_refused_with_its_log(tmp_path):
    tree = tmp_path / "empty"
    tree.mkdir()  # no pretrain_gpt.py: the server cannot read the script's imports
    server = RankServer(tree, tmp_path, world=1)
    try:
        assert server.socket_for(toy_env(tmp_path)) is None
    finally:
        server.close()
    assert server.refused and "exited" in server.refused and "pretrain_gpt.py" in server.refused


def test_the_server_ends_with_its_stdin(tmp_path, tree):
    server = RankServer(tree, tmp_path, world=1)
    assert server.socket_for(toy_env(tmp_path)) is not None
    proc = server.proc
    assert proc is not None
    server.close()
    assert proc.returncode == 0 and server.dir is None
    if proc.pid:
        with pytest.raises(ProcessLookupError):
            os.kill(proc.pid, 0)


# A process whose parent is already gone when it asks to die with it (the parent exited between the
# fork and PR_SET_PDEATHSIG, which then never fires): it must end itself. The grandchild writes to the
# pipe if it lives on; the top process reads until every holder of the pipe has exited.
ORPHANED = """
import os, time
r, w = os.pipe()
middle = os.fork()
if middle == 0:
    os.close(r)
    parent = os.getpid()
    if os.fork() == 0:
        deadline = time.monotonic() + 10
        while os.getppid() == parent and time.monotonic() < deadline:  # until the middle one has exited
            time.sleep(0.01)
        try:
            {call}
            os.write(w, b"survived")
        except BaseException as exc:
            os.write(w, f"error {{exc!r}}".encode())
    os._exit(0)
os.close(w)
os.waitpid(middle, 0)
print(os.read(r, 256).decode() or "ended")
"""
ASK_TO_DIE_WITH = {
    "procs.die_with_parent": "from rocmport.procs import die_with_parent; die_with_parent(parent)",
    "a forked rank": "from rocmport.verify.runtime.rank_server import Rank, _become_rank; "
    "_become_rank(Rank([], {{}}, '/', b'', b''), os.dup(1), os.dup(2), [], parent)",
}


@pytest.mark.parametrize("caller", sorted(ASK_TO_DIE_WITH))
def test_a_process_whose_parent_died_before_it_asked_to_die_with_it_exits(tmp_path, caller):
    """The server dying between a rank's fork and its prctl orphans the rank unless it checks getppid()."""
    script = ORPHANED.format(call=ASK_TO_DIE_WITH[caller].replace("{{}}", "{}"))
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ended", out.stderr


# One that asked while its parent lived is killed when the parent exits (PR_SET_PDEATHSIG).
WATCHED = """
import os, time
r, w = os.pipe()
ready_r, ready_w = os.pipe()
middle = os.fork()
if middle == 0:
    os.close(r)
    parent = os.getpid()
    if os.fork() == 0:
        try:
            from rocmport.procs import die_with_parent
            die_with_parent(parent)
            os.write(ready_w, b"x")
            time.sleep(10)
            os.write(w, b"survived")
        except BaseException as exc:
            os.write(w, f"error {exc!r}".encode())
        os._exit(0)
    os.close(ready_w)
    os.read(ready_r, 1)  # the grandchild has asked (or ended)
    os._exit(0)
os.close(w)
os.close(ready_w)
os.waitpid(middle, 0)
print(os.read(r, 256).decode() or "ended")
"""


def test_a_process_that_asked_to_die_with_its_parent_dies_with_it(tmp_path):
    out = subprocess.run([sys.executable, "-c", WATCHED], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert out.returncode == 0 and out.stdout.strip() == "ended", out.stderr


# A pretrain_gpt.py-shaped script that trains (the shaped loop of test_functional_stage) unless
# FAKE_EXIT asks rank 0 to end with megatron's exit code first (the case runs one rank).
EXITING_PRETRAIN = (
    "import os, sys\nfrom megatron.training.loop import train\n\n"
    "if os.environ.get('FAKE_EXIT') and os.environ['RANK'] == '0':\n    sys.exit(int(os.environ['FAKE_EXIT']))\n"
    "train(sys.argv[1:])\n"
)


@pytest.mark.torch
@pytest.mark.slow
def test_a_case_with_forked_ranks_matches_torchruns_and_its_exits_reach_the_stage_alike(tmp_path):
    """run_case on the proxy (the shim in every rank, the HIP simulation): with the rank server the
    case passes with torchrun's losses and resume, says how its ranks started, and a rank's exit 17
    reaches the stage's reason exactly as under torchrun."""
    from rocmport.verify.stages.functional.case_run import run_case
    from tests.helpers.canned_case import proxy_case_kwargs
    from tests.test_functional_stage import make_tree, proxy_env

    tree = make_tree(tmp_path / "tree", EXITING_PRETRAIN)
    kwargs = proxy_case_kwargs()
    env = proxy_env(tmp_path, tree)
    forked = run_case(tree, env, fork_ranks=True, **kwargs)
    started = run_case(tree, env, fork_ranks=False, **kwargs)
    assert forked.result.status == started.result.status == "pass", forked.result.reason
    assert forked.run is not None and started.run is not None
    assert forked.run.losses == started.run.losses and forked.run.resume == started.run.resume
    assert "ranks forked by a rank server" in (forked.run.proxy_env or {})
    assert "ranks forked by a rank server" not in (started.run.proxy_env or {})
    assert "rank_client.py" in forked.run.command and "torch.distributed.run" in started.run.command
    assert forked.run.redirects == started.run.redirects
    env = proxy_env(tmp_path, tree, FAKE_EXIT="17")
    forked = run_case(tree, env, fork_ranks=True, **kwargs)
    started = run_case(tree, env, fork_ranks=False, **kwargs)
    assert forked.result.status == started.result.status == "fail"
    assert "a rank exited 17 without a Python exception (megatron's rerun state machine" in forked.result.reason
    assert forked.result.reason == started.result.reason


@pytest.mark.torch
def test_the_proxy_starts_upstreams_checkpoint_processes_by_fork_only_while_they_start():
    """The shim's two fork swaps (proxy_shim.FORKED_WRITER): PersistentAsyncCaller's writer and the
    write-results Manager get a fork context when they ask for spawn's, counted as redirects; any
    other spawn of the module (and theirs after the start) stays spawn."""
    import multiprocessing
    import types

    from rocmport.verify.runtime import proxy_shim

    asked: list[str] = []
    module = types.SimpleNamespace(mp=multiprocessing, _results_queue=None)

    def get_queue():  # as filesystem_async._get_write_results_queue asks
        asked.append(module.mp.get_context("spawn").get_start_method())
        return "queue"

    module._get_write_results_queue = get_queue

    class Caller:  # as PersistentAsyncCaller.schedule_async_call asks, once per process
        process = None

        def schedule_async_call(self, req):
            asked.append(module.mp.get_context("spawn").get_start_method())
            self.process = "started"

    module.PersistentAsyncCaller = Caller
    proxy_shim.REDIRECTS.clear()
    proxy_shim._fork_results_manager(module)
    proxy_shim._fork_persistent_writer(module)
    assert module._get_write_results_queue() == "queue"
    caller = Caller()
    caller.schedule_async_call(types.SimpleNamespace(async_fn=print))
    caller.schedule_async_call(types.SimpleNamespace(async_fn=print))  # its process is running: untouched
    assert asked == ["fork", "fork", "spawn"]
    assert module.mp is multiprocessing and module.mp.get_context("spawn").get_start_method() == "spawn"
    assert sorted(k.split(" @ ")[0] for k in proxy_shim.REDIRECTS) == [
        "PersistentAsyncCaller writer: fork (spawn on a GPU)",
        "write-results queue's Manager: fork (spawn on a GPU)",
    ]
    proxy_shim.REDIRECTS.clear()


# A rank that starts processes with multiprocessing's spawn (as the port starts upstream's data-loader
# workers on HIP): the child reports through a Queue (its fds pickled, as a DataLoader's are) and exits
# with a code of its own; TOY_SPAWN_HANG: a child that never ends (the rank exits without it).
SPAWNING = textwrap.dedent("""\
    import multiprocessing as mp, os, sys
    import heavy

    def child(queue, word):
        queue.put((os.getpid(), os.getppid(), os.environ.get("RANK"), os.environ.get("TOY_SET_BY_RANK"),
                   word, os.getcwd(), __name__))
        sys.stdout.write(f"child of rank {os.environ.get('RANK')} says {word}\\n")
        sys.stdout.flush()
        if os.environ.get("TOY_SPAWN_HANG"):
            import time
            time.sleep(600)
        sys.exit(3)

    class SlowTeardown:  # a world whose interpreter teardown takes long (torch, megatron and TE: ~3 s on 2 cores)
        import time  # bound now: the interpreter's teardown imports nothing
        def __del__(self, sleep=time.sleep, seconds=float(os.environ.get("TOY_TEARDOWN_S", "0"))):
            sleep(seconds)

    if os.environ.get("TOY_TEARDOWN_S"):
        slow_teardown = SlowTeardown()

    def last_of_pipes(queue, word, ends):  # the child of TOY_SPAWN_PIPES: many fds in its pickle
        queue.put((os.getpid(), os.getppid(), os.environ.get("RANK"), os.environ.get("TOY_SET_BY_RANK"),
                   ends[-1].recv() + word + str(len(ends)), os.getcwd(), __name__))
        sys.exit(3)

    if __name__ == "__main__":
        os.environ["TOY_SET_BY_RANK"] = "yes"  # a fresh interpreter gets the rank's environment as it is now
        ctx = mp.get_context("spawn")
        queue = ctx.Queue()
        if os.environ.get("TOY_SPAWN_PIPES"):  # as a checkpoint writer gets a storage's fd per tensor
            pipes = [ctx.Pipe(duplex=False) for _ in range(int(os.environ["TOY_SPAWN_PIPES"]))]
            pipes[-1][1].send("last")
            proc = ctx.Process(target=last_of_pipes, args=(queue, "-", [r for r, _ in pipes]))
        else:
            proc = ctx.Process(target=child, args=(queue, "hello"))
        proc.start()
        got = queue.get(timeout=60)
        sys.stdout.write(f"rank {os.environ['RANK']} got {got} child-pid {proc.pid}\\n")
        if not os.environ.get("TOY_SPAWN_HANG"):
            import time
            start = time.monotonic()
            proc.join(60)
            sys.stdout.write(f"rank {os.environ['RANK']} child exit {proc.exitcode} "
                             f"after {time.monotonic() - start:.1f} s\\n")
            if os.environ.get("TOY_TEARDOWN_S"):
                os._exit(0)  # the rank's own teardown is not the question
        else:
            assert proc.is_alive()
            sys.stdout.write(f"rank {os.environ['RANK']} leaves child {proc.pid}\\n")
            sys.stdout.flush()
            os._exit(0)  # without multiprocessing's exit handlers: the child is left behind
    """)


@pytest.fixture
def spawning_tree(tmp_path):
    root = tmp_path / "spawning"
    root.mkdir()
    (root / "heavy.py").write_text(HEAVY)
    (root / "pretrain_gpt.py").write_text(SPAWNING)
    return root


def test_what_a_rank_spawns_is_forked_from_the_server_with_spawns_pickles_environment_and_exit(tmp_path, spawning_tree):
    env = toy_env(tmp_path)
    server = RankServer(spawning_tree, tmp_path, world=2)
    try:
        proc = launch(server, env, 2)
    finally:
        server.close()
    assert proc.returncode == 0, proc.stderr
    server_pid = str(server.ready["pid"]) if server.ready else None
    # the script's imports ran once, in the server: neither the ranks nor their spawned children import again
    assert (tmp_path / "imports.txt").read_text().split() == [server_pid]
    got = re.findall(
        r"rank (\d) got \((\d+), (\d+), '(\d)', '(\w+)', '(\w+)', '([^']+)', '(\w+)'\) child-pid (\d+)", proc.stdout
    )
    assert sorted(g[0] for g in got) == ["0", "1"], proc.stdout + proc.stderr
    for rank, pid, ppid, child_rank, set_by_rank, word, cwd, name, child_pid in got:
        # the server's child, with the rank's environment as the rank had it, its pickles, its working
        # directory and its script as spawn's __mp_main__
        assert pid == child_pid and ppid == server_pid
        assert (child_rank, set_by_rank, word, cwd, name) == (rank, "yes", "hello", str(spawning_tree), "__mp_main__")
        assert f"child of rank {rank} says hello" in proc.stdout  # the rank's stdout
        assert f"rank {rank} child exit 3 after" in proc.stdout  # its exit code, to the rank's Popen


def test_a_spawned_child_left_behind_ends_with_its_run(tmp_path, spawning_tree):
    env = toy_env(tmp_path, TOY_SPAWN_HANG="1")
    server = RankServer(spawning_tree, tmp_path, world=1)
    start = time.monotonic()
    try:
        proc = launch(server, env, 1, timeout=60)
        left = [int(p) for p in re.findall(r"leaves child (\d+)", proc.stdout)]
        assert proc.returncode == 0 and len(left) == 1, proc.stdout + proc.stderr
        assert time.monotonic() - start < 30 and not alive(left[0])
        # the server serves the next run
        assert launch(server, toy_env(tmp_path), 1).returncode == 0
    finally:
        server.close()


def test_a_served_child_ends_as_a_forked_child_does_after_its_exit_handlers(tmp_path, spawning_tree):
    """Its process done, a served child runs its exit handlers (the shim's redirects, the port-site
    record) and ends (os._exit, as multiprocessing's fork and forkserver children end): not through
    the interpreter's teardown of torch, megatron and TE, which took ~3 s per data-loader worker on
    2 cores, one worker after another at each run's end."""
    marker = tmp_path / "atexit.txt"
    handler = f"import atexit; atexit.register(lambda: open({str(marker)!r}, 'a').write('ran\\n'))\n"
    (spawning_tree / "heavy.py").write_text(HEAVY + handler)
    env = toy_env(tmp_path, TOY_TEARDOWN_S="8")
    server = RankServer(spawning_tree, tmp_path, world=1)
    try:
        proc = launch(server, env, 1)
    finally:
        server.close()
    took = re.search(r"rank 0 child exit 3 after ([\d.]+) s", proc.stdout)
    assert proc.returncode == 0 and took, proc.stdout + proc.stderr
    assert float(took.group(1)) < 4
    assert marker.read_text() == "ran\n"  # the child's (the server's own exit and the rank's os._exit run none)


def test_a_child_whose_pickle_names_more_fds_than_one_message_carries_still_starts(tmp_path, spawning_tree):
    """A spawn start passing more descriptors than a socket message carries (a process object with
    hundreds of pipes, or of tensors shared by fd) starts as a fresh interpreter, as before."""
    env = toy_env(tmp_path, TOY_SPAWN_PIPES="300")
    server = RankServer(spawning_tree, tmp_path, world=1)
    try:
        proc = launch(server, env, 1)
    finally:
        server.close()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    got = re.search(r"rank 0 got \((\d+), (\d+), '0', 'yes', 'last-300', ", proc.stdout)
    assert got and "rank 0 child exit 3 after" in proc.stdout, proc.stdout + proc.stderr
    assert got.group(2) != str(server.ready["pid"] if server.ready else None)  # the rank's own child


def _kill_marked(marker: str) -> list[int]:
    """Kill every process whose environment holds ``marker`` (a run's own tmp path): a hung run's leftovers."""
    killed = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                if marker.encode() not in fh.read():
                    continue
            os.kill(int(entry), 9)
            killed.append(int(entry))
        except OSError:
            pass
    return killed


def test_a_hung_torchrun_run_ends_at_its_limit_with_its_workers_and_what_they_started(tmp_path, tree):
    """torchrun starts each worker in a session of its own; killed outright at the run's limit, it left them
    (and the child each started) holding the run's stdout and stderr, and the launch read them for ever.
    At the limit torchrun is asked to end first (SIGTERM: it ends its workers' sessions)."""
    import threading

    env = toy_env(tmp_path, TOY_CHILD="1", TOY_SLEEP="600")
    cmd = Launcher().command(2, ["pretrain_gpt.py"], "functional", port=29558)
    assert "torch.distributed.run" in " ".join(cmd)
    got: list[BaseException] = []

    def run() -> None:
        try:
            _launch(cmd, tree, env, timeout=5)
        except BaseException as exc:  # noqa: BLE001 - the test's to inspect
            got.append(exc)

    launcher = threading.Thread(target=run, daemon=True)
    launcher.start()
    launcher.join(60)
    left = _kill_marked(str(tmp_path))  # a hung launch's workers, children and torchrun: not this test's to leave
    assert not launcher.is_alive(), f"the launch did not end 55 s after its limit ({len(left)} processes left)"
    assert len(got) == 1 and isinstance(got[0], subprocess.TimeoutExpired), got
    out = got[0].output or ""
    pids = [int(p) for p in re.findall(r"rank \d pid (\d+)", out) + re.findall(r"rank \d child (\d+)", out)]
    assert len(pids) == 4 and not left, (out, left)


# A gloo run in which rank 1 corrupts its heap (a double free: glibc prints its complaint and aborts,
# SIGABRT) right after the process group forms, while rank 0 waits in an all-reduce and loses its peer
# (gloo says "Connection closed by peer" or "Connection reset by peer", as the socket's end comes).
# Rank 0 ignores SIGTERM so that its connection error reaches stderr before the launcher's SIGTERM ends it
# (in a real run it usually does: gloo notices the closed socket at once).
CRASHING = textwrap.dedent("""\
    import ctypes, os, signal, sys
    import torch, torch.distributed as dist
    rank = int(os.environ["RANK"])
    if rank == 0:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    dist.init_process_group("gloo")
    if rank == 1:
        libc = ctypes.CDLL("libc.so.6")
        libc.malloc.restype = ctypes.c_void_p
        libc.free.argtypes = [ctypes.c_void_p]
        chunk = libc.malloc(48)
        libc.free(chunk)
        libc.free(chunk)
    dist.all_reduce(torch.ones(4))
    """)


@pytest.mark.torch
@pytest.mark.slow
@pytest.mark.parametrize("forked", [True, False], ids=["rank-server", "torchrun"])
def test_a_rank_that_dies_of_a_signal_leads_the_reason_before_the_survivors_lost_connection(tmp_path, forked):
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "pretrain_gpt.py").write_text(CRASHING)
    env = toy_env(tmp_path)
    if forked:
        server = RankServer(tree, tmp_path, world=2)
        try:
            proc = launch(server, env, 2, timeout=120)
        finally:
            server.close()
    else:
        cmd = Launcher().command(2, ["pretrain_gpt.py"], "functional", port=29556)
        proc = _launch(cmd, tree, env, timeout=120)
    assert proc.returncode == 1
    # what the run really printed: glibc's complaint, the survivor's lost connection, the crashed rank's signal
    assert "free(): double free detected" in proc.stderr, proc.stderr
    assert re.search(r"\[rank0\]: RuntimeError: .*Connection (closed|reset) by peer", proc.stderr), proc.stderr
    assert re.search(r"exitcode\s*: -6 ", proc.stderr), proc.stderr
    reason = case_log.cause_line(proc.stderr)
    assert reason.startswith("a rank died of signal 6 (SIGABRT) (rank 1): free(): double free detected in tcache 2"), (
        reason
    )
    lost = re.search(r"Connection (closed|reset) by peer", reason)
    assert lost, reason
    assert reason.index("SIGABRT") < lost.start() and "then, on the other ranks: " in reason[: lost.start()]
    failure = case_log.failure_of(proc.stderr, tree, "run")
    assert failure.message == case_log.normalise(reason, tree)[:300] and failure.site is None
