"""An interrupted verify ends every process it started and removes its temporary files (issue 30,
item 6): a real `rocmport verify` on a small tree whose stage-2 workers (torchrun's, in their own
sessions) each start a long-running process in yet another session; SIGINT or SIGTERM to verify's
process group, as a terminal's Ctrl-C or a CI runner's cancel sends it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from rocmport.procs import marked

REPO = Path(__file__).resolve().parents[1]
# Imported by each torchrun worker of stage 2 (LOCAL_RANK set): a grandchild in a session of its own,
# then nothing for ten minutes. Stage 1's import probe (no LOCAL_RANK) imports it at once.
CORE_INIT = """import os, subprocess, sys, time
if os.environ.get("LOCAL_RANK") is not None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    open(os.path.join(os.environ["KILLTEST_PIDS"], f"{os.getpid()}-{child.pid}"), "w").close()
    time.sleep(600)
"""


def slow_tree(root: Path) -> Path:
    for rel, text in {
        "megatron/__init__.py": "",
        "megatron/core/__init__.py": CORE_INIT,
        "megatron/core/utils.py": "",
    }.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


@pytest.mark.torch
@pytest.mark.slow
@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_interrupted_verify_leaves_no_process_and_no_temporary_directory(tmp_path, signum, code):
    tree = slow_tree(tmp_path / "tree")
    pids, tmpdir = tmp_path / "pids", tmp_path / "tmp"
    pids.mkdir()
    tmpdir.mkdir()
    mark = uuid.uuid4().hex
    env = {
        **os.environ,
        "ROCMPORT_KILLTEST": mark,
        "KILLTEST_PIDS": str(pids),
        "TMPDIR": str(tmpdir),
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "rocmport", "-C", str(tmp_path), "verify", "--tree", str(tree), "--stages", "1,2"],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 240
        while not list(pids.iterdir()):  # a worker and its grandchild are running
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "stage 2's workers never started"
            time.sleep(0.5)
        running = marked(mark, "ROCMPORT_KILLTEST")
        assert len(running) >= 3  # at least torchrun, its worker and the worker's own child
        assert any(p.name.startswith("torchelastic_") for p in tmpdir.rglob("*"))
        os.killpg(proc.pid, signum)  # verify and torchrun (its process group); the workers have sessions of their own
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    left = marked(mark, "ROCMPORT_KILLTEST")
    for pid in left:  # never leave them to the next test, whatever the assertion says
        os.kill(pid, signal.SIGKILL)
    assert proc.returncode == code, (out, err)
    assert left == []
    assert list(tmpdir.iterdir()) == []  # torchelastic_*, the bootstrap, the run's own directory: all removed
    line = err.strip().splitlines()[-1]
    assert f"interrupted by {signal.Signals(signum).name}" in line and "finished: imports pass" in line
    assert "stopped during gpt-training" in line
    assert not list(tree.rglob("__pycache__"))  # nor bytecode in the tree


POOL_PARENT = """
import os, sys, time
from concurrent.futures import ProcessPoolExecutor
from rocmport.procs import pool_initializer

def task(i):
    time.sleep(120)  # a codemod on a huge file, say; then its result would go down a pipe nobody reads
    return i

if __name__ == "__main__":
    init, initargs = pool_initializer()
    with ProcessPoolExecutor(max_workers=2, initializer=init, initargs=initargs) as pool:
        list(pool.map(task, range(4)))
"""


@pytest.mark.slow
def test_pool_workers_die_with_a_killed_parent(tmp_path):
    """kill -9 of apply/refresh (the codemod runner's process pool): its workers end too, instead of
    finishing their file and hanging on the result pipe forever."""
    script = tmp_path / "parent.py"
    script.write_text(POOL_PARENT)
    mark = uuid.uuid4().hex
    env = {
        **os.environ,
        "ROCMPORT_KILLTEST": mark,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    parent = subprocess.Popen([sys.executable, str(script)], env=env, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 60
        while len(marked(mark, "ROCMPORT_KILLTEST")) < 3:  # the parent and its two workers
            assert parent.poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
        time.sleep(1)  # the workers are inside their tasks
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 10
        while marked(mark, "ROCMPORT_KILLTEST") and time.monotonic() < deadline:
            time.sleep(0.2)
        left = marked(mark, "ROCMPORT_KILLTEST")
    finally:
        for pid in marked(mark, "ROCMPORT_KILLTEST"):
            os.kill(pid, signal.SIGKILL)
    assert left == []


def test_readme_says_what_an_interrupt_does():
    readme = (REPO / "docs" / "exit-codes.md").read_text() + (REPO / "docs" / "commands" / "verify.md").read_text()
    assert "| 130, 143 | interrupted by SIGINT (Ctrl-C) or SIGTERM" in readme
    assert "ROCMPORT_RUN=<id>" in readme and "PYTHONPYCACHEPREFIX" in readme


@pytest.mark.slow
def test_kill_9_of_a_codemod_run_leaves_no_worker(tmp_path):
    """The same end to end: `rocmport codemod --check --jobs 2` over files slow to parse, kill -9 once
    its workers are busy. Before: both workers outlived it (finishing their files, then blocked on the
    queues forever, as refresh's did)."""
    tree = tmp_path / "tree"
    body = "import apex\n" + "".join(
        f"def f{i}(a, b):\n    return [a * {i} + b for _ in range(a)]\n" for i in range(1500)
    )
    for i in range(12):
        (tree / "megatron" / "legacy" / f"m{i}.py").parent.mkdir(parents=True, exist_ok=True)
        (tree / "megatron" / "legacy" / f"m{i}.py").write_text(body)
    mark = uuid.uuid4().hex
    env = {
        **os.environ,
        "ROCMPORT_KILLTEST": mark,
        "ROCMPORT_CACHE_DIR": str(tmp_path / "cache"),
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "rocmport", "codemod", "--check", "--jobs", "2", str(tree)],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        while len(marked(mark, "ROCMPORT_KILLTEST")) < 3:  # the command and its two workers
            assert proc.poll() is None, "the run ended before its workers were seen"
            assert time.monotonic() < deadline
            time.sleep(0.1)
        time.sleep(1)
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 10
        while marked(mark, "ROCMPORT_KILLTEST") and time.monotonic() < deadline:
            time.sleep(0.2)
        left = marked(mark, "ROCMPORT_KILLTEST")
    finally:
        for pid in marked(mark, "ROCMPORT_KILLTEST"):
            os.kill(pid, signal.SIGKILL)
    assert left == []


def test_ctrl_c_before_the_run_starts_exits_130(tmp_path, capsys, monkeypatch):
    """A Ctrl-C while verify still checks its inputs (no process started yet): click makes it Abort; 130, as a shell expects."""
    from rocmport.cli import main
    from rocmport.commands import verify as verify_command

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(verify_command, "prepare", interrupted)
    assert main(["verify", "--tree", str(tmp_path)]) == 130
    assert "Aborted." in capsys.readouterr().err


@pytest.mark.torch
def test_torch_compile_cache_stays_where_torch_keeps_it(monkeypatch):
    """The started processes' TMPDIR is the run's own (removed at its end); torch.compile's cache is
    named for them as torch's own default, so a GPU run does not compile every kernel again each time."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    from rocmport.verify.orchestration.run import inductor_cache_dir

    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    assert inductor_cache_dir() == default_cache_dir()
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/somewhere")
    assert inductor_cache_dir() == "/somewhere"
