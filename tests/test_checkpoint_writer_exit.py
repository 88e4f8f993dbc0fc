"""A rank of upstream's training script that ends on an uncaught exception while upstream's persistent
checkpoint writer is alive (core_v0.16.1 `PersistentAsyncCaller`: a non-daemon process waiting on a queue
for a DONE that only a training that did not raise sends) must end promptly with its own exception on the
CPU proxy: multiprocessing's exit handler would join the writer for ever (proxy_shim.WRITER_ABORTED).

Each rank here is one real process started as torchrun starts a worker (LOCAL_RANK set, the bootstrap's
shim installed by `protocol.SHIM_WORKERS`), in its own session: a hung one is killed with everything it
started, so the test ends either way."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from rocmport.verify.runtime import protocol

# Upstream's persistent writer as core_v0.16.1's async_utils has it: asked for a spawn context through the
# module's `mp`, not a daemon, looping on a JoinableQueue until close() sends DONE; __del__ closes.
TOY_ASYNC_UTILS = textwrap.dedent("""\
    import collections
    import multiprocessing as mp

    AsyncRequest = collections.namedtuple("AsyncRequest", "async_fn async_fn_args call_idx")


    def write_marker(path):
        with open(path, "w") as fh:
            fh.write("written")


    class PersistentAsyncCaller:
        def __init__(self):
            self.process = None
            ctx = mp.get_context("spawn")
            self.queue = ctx.JoinableQueue()
            self.comp_q = ctx.Queue()

        def schedule_async_call(self, async_req):
            if async_req.async_fn is None:
                return
            if self.process is None:
                ctx = mp.get_context("spawn")
                self.process = ctx.Process(target=PersistentAsyncCaller.async_loop, args=(self.queue, self.comp_q))
                self.process.start()
            self.queue.put(async_req)

        def close(self, abort=False):
            if self.process:
                if abort:
                    self.process.kill()
                else:
                    self.queue.put("DONE")
                    self.queue.join()
                    self.process.join()
                self.process = None

        def __del__(self):
            self.close()

        @staticmethod
        def async_loop(queue, comp_q):
            while True:
                item = queue.get()
                if isinstance(item, str) and item == "DONE":
                    queue.task_done()
                    break
                item.async_fn(*item.async_fn_args)
                comp_q.put(item.call_idx)
                queue.task_done()
    """)
# A rank that saves once through the writer, then stops on an exception (as v0.16's native FP8 cases did at
# the save's finalization: CheckpointException), without closing it (upstream's exception path). TOY_END=close:
# it closes the writer and exits 0 (a training that ends).
SAVE_THEN_RAISE = textwrap.dedent("""\
    import os, sys
    from megatron.core.dist_checkpointing.strategies import async_utils
    caller = async_utils.PersistentAsyncCaller()
    mark = os.environ["TOY_MARK"] + os.environ["RANK"]
    caller.schedule_async_call(async_utils.AsyncRequest(async_utils.write_marker, (mark,), 0))
    sys.stdout.write(f"rank {os.environ['RANK']} writer {caller.process.pid} saved {caller.comp_q.get(timeout=60)}\\n")
    sys.stdout.flush()
    end = os.environ.get("TOY_END")
    if end == "close":
        caller.close()
        sys.exit(0)
    raise RuntimeError("the save failed on purpose")
    """)
HUNG_AFTER_S = 90


def toy_rank_tree(root: Path) -> Path:
    from tests.test_functional_stage import make_tree

    tree = make_tree(root, SAVE_THEN_RAISE)
    strategies = tree / "megatron" / "core" / "dist_checkpointing" / "strategies"
    strategies.mkdir(parents=True)
    (strategies.parent / "__init__.py").write_text("")
    (strategies / "__init__.py").write_text("")
    (strategies / "async_utils.py").write_text(TOY_ASYNC_UTILS)
    return tree


def run_bounded(cmd: list[str], cwd: Path, env: dict[str, str], logs: Path) -> tuple[int | None, float, str, str]:
    """``cmd`` in its own session, its output in files (a process it leaves behind holds no pipe of ours);
    (exit code or None when it hung, seconds, stdout, stderr). A hung run is killed with its session."""
    logs.mkdir(exist_ok=True)
    start = time.monotonic()
    with open(logs / "out", "w") as out, open(logs / "err", "w") as err:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=err, text=True, start_new_session=True)
        try:
            code: int | None = proc.wait(timeout=HUNG_AFTER_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            code = None
    return code, time.monotonic() - start, (logs / "out").read_text(), (logs / "err").read_text()


def run_rank(tree: Path, env: dict[str, str]) -> tuple[int | None, float, str, str]:
    """One rank, as torchrun starts a worker: ``python -u pretrain_gpt.py`` with LOCAL_RANK set."""
    return run_bounded([sys.executable, "-u", "pretrain_gpt.py"], tree, env, tree.parent / "logs")


def rank_env(tmp_path: Path, tree: Path, **extra: str) -> dict[str, str]:
    from tests.test_functional_stage import proxy_env

    shim_out = tmp_path / "shim"
    shim_out.mkdir()
    env = proxy_env(tmp_path, tree, TOY_MARK=str(tmp_path / "saved"), **extra)
    env.update({**protocol.SHIM_WORKERS.entry(True), **protocol.SHIM_OUT.entry(str(shim_out))})
    env.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1")
    return env


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def writers(out: str) -> list[int]:
    return [int(pid) for pid in re.findall(r"rank \d writer (\d+) saved 0", out)]


def redirects(tmp_path: Path) -> dict[str, int]:
    from rocmport.verify.runtime.proxy_shim import read_redirects

    return {k.split(" @ ")[0]: v for k, v in read_redirects(tmp_path / "shim").items()}


@pytest.mark.torch
def test_a_rank_that_raises_with_the_persistent_writer_alive_ends_promptly_with_its_exception(tmp_path):
    """Before: the rank printed its exception and then hung in multiprocessing's exit handler, joining the
    writer (killed here after 90 s). Now its excepthook aborts the writer by upstream's own close(abort=True),
    says so, and counts it; the rank exits 1 with its exception."""
    from rocmport.verify.runtime import proxy_shim

    tree = toy_rank_tree(tmp_path / "tree")
    code, seconds, out, err = run_rank(tree, rank_env(tmp_path, tree))
    assert code is not None, f"hung (killed after {HUNG_AFTER_S} s): {err[-2000:]}"
    assert (tmp_path / "saved0").read_text() == "written", out + err
    assert code == 1 and seconds < 60, (code, seconds, err[-3000:])
    assert "RuntimeError: the save failed on purpose" in err
    assert err.index("RuntimeError: the save failed on purpose") < err.index(proxy_shim.WRITER_ABORTED)
    assert not [pid for pid in writers(out) if alive(pid)]
    counted = redirects(tmp_path)
    assert counted["PersistentAsyncCaller writer aborted at an uncaught exception"] == 1, counted
    assert counted["PersistentAsyncCaller writer: fork (spawn on a GPU)"] == 1, counted


@pytest.mark.torch
def test_a_rank_that_closes_its_writer_exits_as_before(tmp_path):
    """A training that ends closes its writer (upstream's DONE) and exits 0: nothing aborted. (One that leaves
    it alive and calls sys.exit is upstream's own hang, untouched: no uncaught exception.)"""
    from rocmport.verify.runtime import proxy_shim

    tree = toy_rank_tree(tmp_path / "tree")
    code, _, out, err = run_rank(tree, rank_env(tmp_path, tree, TOY_END="close"))
    assert code == 0, (code, err[-3000:])
    assert proxy_shim.WRITER_ABORTED not in err and "saved 0" in out
    assert "PersistentAsyncCaller writer aborted at an uncaught exception" not in redirects(tmp_path)


@pytest.mark.torch
@pytest.mark.slow
@pytest.mark.parametrize("forked_ranks", [True, False], ids=["rank-server", "torchrun"])
def test_ranks_that_raise_with_their_writers_alive_end_promptly_as_stage_4_launches_them(tmp_path, forked_ranks):
    """Stage 4's two launches of a case's ranks: forked by a rank server (the shim installed in the server
    before the fork, its excepthook inherited) and started by torchrun (each worker installs it). Two ranks
    save once and raise: the run ends in seconds with the ranks' exception, both writers aborted."""
    from rocmport.verify.orchestration.launcher import Launcher
    from rocmport.verify.stages.functional import case_log
    from rocmport.verify.stages.functional.rank_servers import RankServer

    tree = toy_rank_tree(tmp_path / "tree")
    env = rank_env(tmp_path, tree)
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR"):
        del env[name]  # the launcher's to set
    server = RankServer(tree, tmp_path, world=2) if forked_ranks else None
    out = ""
    try:
        sock = server.socket_for(env) if server else None
        assert server is None or sock is not None, server.refused
        cmd = Launcher().command(2, ["pretrain_gpt.py"], "functional", port=29557, rank_server=sock)
        code, seconds, out, err = run_bounded(cmd, tree, env, tmp_path / "logs")
    finally:
        if server:
            server.close()
        for pid in writers(out):  # a hung run's writers outlive their ranks: not this test's to leave
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
    assert code is not None, f"hung (killed after {HUNG_AFTER_S} s): {err[-3000:]}"
    assert len(writers(out)) == 2 and (tmp_path / "saved0").exists() and (tmp_path / "saved1").exists(), out + err
    assert code == 1 and seconds < 80, (code, seconds, err[-3000:])
    assert case_log.exception_line(err) == "RuntimeError: the save failed on purpose"
    assert err.count(proxy_shim_text()) == 2
    assert redirects(tmp_path)["PersistentAsyncCaller writer aborted at an uncaught exception"] == 2


def proxy_shim_text() -> str:
    from rocmport.verify.runtime import proxy_shim

    return proxy_shim.WRITER_ABORTED


MLM = os.environ.get("ROCMPORT_TEST_MLM_MIRROR")
# upstream's own writer: megatron-core's PersistentAsyncCaller of core_v0.16.1, in a process group of one
UPSTREAM_SAVE_THEN_RAISE = textwrap.dedent("""\
    import os, sys
    import torch
    from megatron.core.dist_checkpointing.strategies.async_utils import AsyncRequest, PersistentAsyncCaller
    from marker import write_marker
    torch.distributed.init_process_group("gloo", init_method="file://" + os.environ["TOY_STORE"], rank=0, world_size=1)
    caller = PersistentAsyncCaller()
    caller.schedule_async_call(AsyncRequest(write_marker, (os.environ["TOY_MARK"] + "0",), [], call_idx=0))
    assert caller.is_current_async_call_done(blocking=True, no_dist=True)
    sys.stdout.write(f"rank 0 writer {caller.process.pid} saved 0\\n")
    sys.stdout.flush()
    raise RuntimeError("the save failed on purpose")
    """)


@pytest.mark.torch
@pytest.mark.slow
@pytest.mark.mirror
@pytest.mark.skipif(not MLM, reason="set ROCMPORT_TEST_MLM_MIRROR to a local Megatron-LM mirror")
def test_upstream_s_own_persistent_writer_is_aborted_when_its_rank_raises(tmp_path):
    """The same with core_v0.16.1's megatron-core itself (its close(abort=True) logs through
    torch.distributed, which is up): before the abort, this rank hung at exit."""
    tree = tmp_path / "tree"
    tree.mkdir()
    archive = subprocess.run(
        ["git", "--git-dir", str(MLM), "archive", "core_v0.16.1", "megatron/core"],
        capture_output=True,
        check=True,
        timeout=120,
    )
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True, timeout=120)
    (tree / "megatron" / "__init__.py").write_text("")
    (tree / "pretrain_gpt.py").write_text(UPSTREAM_SAVE_THEN_RAISE)
    (tree / "marker.py").write_text("def write_marker(path):\n    open(path, 'w').write('written')\n")
    env = rank_env(tmp_path, tree, TOY_STORE=str(tmp_path / "store"))
    code, seconds, out, err = run_rank(tree, env)
    assert code is not None, f"hung (killed after {HUNG_AFTER_S} s): {err[-2000:]}"
    assert (tmp_path / "saved0").read_text() == "written", out + err[-3000:]
    assert code == 1 and seconds < 80, (code, seconds, err[-3000:])
    assert "RuntimeError: the save failed on purpose" in err and proxy_shim_text() in err
    assert not [pid for pid in writers(out) if alive(pid)]
