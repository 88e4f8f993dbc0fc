"""An interrupted `rocmport refresh` ends every process it started, removes its temporary files and
says what had finished (issue 30, item 6 and its rule): a real refresh in a subprocess on a real git
project, signalled while its codemod pool's workers parse the new release, or while the verify it
runs has a child importing the new tree; and kill -9 of it leaves no pool worker behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from rocmport.cli import main
from rocmport.procs import marked
from tests.helpers.sync import commit, g, init, package_info

REPO = Path(__file__).resolve().parents[1]
# Slow to parse (libcst, about half a second each here): the pool's two workers are busy for seconds.
BIG = "import modelopt\n" + "".join(
    f"def f{i}(a, b):\n    return [a * {i} + b for _ in range(a)]\n" for i in range(1500)
)
# The new release's megatron.core, imported by verify's stage-1 probe (a child of refresh's verify):
# it starts a grandchild in a session of its own, then waits ten minutes.
SLOW_CORE = """import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
open(os.path.join(os.environ["KILLTEST_PIDS"], f"{os.getpid()}-{child.pid}"), "w").close()
time.sleep(600)
"""


def project(tmp: Path, monkeypatch, new_files: dict[str, str]) -> Path:
    """A project ported at core_v0.16.1 (one codemod, guard-nvidia-only-imports), and a core_v0.17.0
    upstream tag that adds ``new_files``."""
    monkeypatch.setenv("ROCMPORT_CACHE_DIR", str(tmp / "cache"))
    up = init(tmp / "upstream")
    commit(
        up,
        {
            "megatron/__init__.py": "",
            "megatron/core/__init__.py": "",
            "megatron/core/package_info.py": package_info("0.16.1"),
            "megatron/core/a.py": "import modelopt\n",
        },
        "0.16.1",
    )
    g(up, "tag", "core_v0.16.1")
    root = tmp / "project"
    (root / "patchsets/megatron-lm/v0.16").mkdir(parents=True)
    (root / "patchsets/megatron-lm/v0.16/series").write_text(
        'upstream: megatron-lm\nline: v0.16\nversions: ">=0.16.0rc0,<0.17.0rc0"\npatches: []\ncodemods:\n  - guard-nvidia-only-imports\n'
    )
    init(root)
    (root / ".gitignore").write_text("/build/\n/.rocmport/\n")
    assert main(["-C", str(root), "sync", "--ref", "v0.16", "--no-bridge", "--remote", f"megatron-lm={up}"]) == 0
    assert main(["-C", str(root), "apply"]) == 0
    g(root, "add", "-A")
    g(root, "commit", "-qm", "port at core_v0.16.1")
    commit(up, {"megatron/core/package_info.py": package_info("0.17.0"), **new_files}, "0.17.0")
    g(up, "tag", "core_v0.17.0")
    return root


class Run:
    """`rocmport ARGS` (refresh, the bot) in a subprocess of its own process group (as a terminal
    starts it), every process of it findable by a mark in its environment."""

    def __init__(self, tmp: Path, root: Path, *args: str):
        self.mark, self.tmpdir, self.pids = uuid.uuid4().hex, tmp / "tmp", tmp / "pids"
        self.tmpdir.mkdir()
        self.pids.mkdir()
        env = {
            **os.environ,
            "ROCMPORT_KILLTEST": self.mark,
            "TMPDIR": str(self.tmpdir),
            "KILLTEST_PIDS": str(self.pids),
            "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        }
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "rocmport", "-C", str(root), *args],
            env=env,
            cwd=tmp,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )

    def alive(self) -> list[int]:
        return marked(self.mark, "ROCMPORT_KILLTEST")

    def workers(self) -> list[int]:
        """The codemod pool's workers: forked from refresh, so its command line; no other child has it."""
        own = Path(f"/proc/{self.proc.pid}/cmdline").read_bytes()
        found = []
        for pid in self.alive():
            try:
                if pid != self.proc.pid and Path(f"/proc/{pid}/cmdline").read_bytes() == own:
                    found.append(pid)
            except OSError:
                pass
        return found

    def wait_for(self, what, seconds: float = 180) -> None:
        deadline = time.monotonic() + seconds
        while not what():
            assert self.proc.poll() is None, ("refresh ended first", self.proc.communicate())
            assert time.monotonic() < deadline, "refresh never got there"
            time.sleep(0.1)

    def gone_after(self, seconds: float = 10) -> list[int]:
        """The run's processes still alive ``seconds`` after refresh ended (none should be); any left are killed."""
        deadline = time.monotonic() + seconds
        while self.alive() and time.monotonic() < deadline:
            time.sleep(0.2)
        left = self.alive()
        for pid in left:  # never left to the next test, whatever the assertion says
            os.kill(pid, signal.SIGKILL)
        return left

    def close(self) -> None:
        """After a test that failed before the run ended: nothing of it left to the next test. (A run
        that ended is left alone: gone_after counts what it left, then ends it.)"""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            for pid in self.alive():
                os.kill(pid, signal.SIGKILL)


def big_release() -> dict[str, str]:
    return {f"megatron/core/big{i}.py": BIG for i in range(12)}


@pytest.mark.slow
@pytest.mark.parametrize(
    "signum, code, to",
    [(signal.SIGINT, 130, "group"), (signal.SIGTERM, 143, "group"), (signal.SIGTERM, 143, "refresh")],
)
def test_interrupted_refresh_ends_its_pool_workers_and_says_what_finished(tmp_path, monkeypatch, signum, code, to):
    """Ctrl-C (SIGINT to the process group), a CI runner's cancel (SIGTERM to the group), or `kill PID`
    (SIGTERM to refresh alone) while the codemod pool parses the new release."""
    root = project(tmp_path, monkeypatch, big_release())
    run = Run(tmp_path, root, "refresh", "--to", "v0.17", "--no-verify")
    try:
        run.wait_for(lambda: len(run.workers()) >= 2)
        time.sleep(0.5)  # inside their files
        started = time.monotonic()
        if to == "group":
            os.killpg(run.proc.pid, signum)
        else:
            run.proc.send_signal(signum)
        out, err = run.proc.communicate(timeout=120)
        took = time.monotonic() - started
    finally:
        run.close()
    left = run.gone_after()
    assert run.proc.returncode == code, (out, err)
    assert left == []
    assert took < 10, f"refresh took {took:.1f} s to stop (it waited for its workers to finish the files still queued)"
    assert list(run.tmpdir.iterdir()) == []
    line = err.strip().splitlines()[-1]
    assert f"interrupted by {signal.Signals(signum).name}" in line, err
    assert (
        "finished: megatron-lm v0.17 resolved to core_v0.17.0" in line and "stopped during applying megatron-lm" in line
    ), line
    assert "refresh --abort" in line  # what to do next
    assert "ended the" in line and "removed" in line
    # Nothing of the project changed: the lock still pins 0.16, no v0.17 series.
    assert (
        "core_v0.16.1" in (root / "upstream.lock").read_text() and not (root / "patchsets/megatron-lm/v0.17").exists()
    )
    assert main(["-C", str(root), "refresh", "--abort"]) == 0  # and the stopped refresh is given up as any other


@pytest.mark.slow
def test_kill_9_of_refresh_leaves_no_pool_worker(tmp_path, monkeypatch):
    """kill -9 cannot be handled: the pool's workers end with their parent (PR_SET_PDEATHSIG) instead of
    finishing their file and blocking forever on the result pipe."""
    root = project(tmp_path, monkeypatch, big_release())
    run = Run(tmp_path, root, "refresh", "--to", "v0.17", "--no-verify")
    try:
        run.wait_for(lambda: len(run.workers()) >= 2)
        time.sleep(0.5)
        workers = run.workers()
        run.proc.kill()  # refresh alone, as the OOM killer or `kill -9 PID` does
        run.proc.wait(timeout=60)  # not communicate(): a worker left alive holds the pipes open
    finally:
        run.close()
    assert len(workers) == 2
    assert run.gone_after() == []


@pytest.mark.torch
@pytest.mark.slow
@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_interrupted_refresh_during_its_verify_ends_the_verify_children_too(tmp_path, monkeypatch, signum, code):
    """Refresh's verify (a run scope inside refresh's own): its stage-1 probe and the probe's child in
    a session of its own are ended, both temporary directories removed, and the line names refresh's
    steps and verify's."""
    root = project(tmp_path, monkeypatch, {"megatron/core/__init__.py": SLOW_CORE})
    run = Run(tmp_path, root, "refresh", "--to", "v0.17")
    try:
        run.wait_for(lambda: list(run.pids.iterdir()), seconds=240)
        os.killpg(run.proc.pid, signum)
        out, err = run.proc.communicate(timeout=120)
    finally:
        run.close()
    left = run.gone_after()
    assert run.proc.returncode == code, (out, err)
    assert left == []
    assert list(run.tmpdir.iterdir()) == []
    line = err.strip().splitlines()[-1]
    assert f"interrupted by {signal.Signals(signum).name}" in line, err
    assert (
        "megatron-lm applied" in line
        and "stopped during verify (no stage had finished; stopped during imports)" in line
    ), line


@pytest.mark.slow
def test_a_bot_stopped_by_sigterm_goes_back_to_its_branch(tmp_path, monkeypatch):
    """The bot under cron or systemd gets SIGTERM mid-refresh: its refresh stops as `refresh` does, the
    checkout is back on main, and the release is not recorded as built, so the next run takes it again
    (before: killed by the signal, returncode -15, nothing said)."""
    root = project(tmp_path, monkeypatch, big_release())
    run = Run(tmp_path, root, "bot", "--once", "--no-verify")
    try:
        run.wait_for(lambda: len(run.workers()) >= 2)
        time.sleep(0.5)
        run.proc.send_signal(signal.SIGTERM)
        out, err = run.proc.communicate(timeout=120)
    finally:
        run.close()
    assert run.gone_after() == []
    assert run.proc.returncode == 143, (out, err)
    line = err.strip().splitlines()[-1]
    assert "interrupted by SIGTERM; nothing had finished; stopped during the refresh to core_v0.17.0" in line, line
    assert "the checkout is back on the branch it was on" in line
    assert (
        g(root, "symbolic-ref", "--short", "HEAD") == "main"
        and g(root, "status", "--porcelain", "--untracked-files=no") == ""
    )
    assert list(run.tmpdir.iterdir()) == []
    record = root / ".rocmport" / "bot-state.json"  # not recorded as built: the next run takes the release again
    assert not record.exists() or "core_v0.17.0" not in json.loads(record.read_text()).get("tags", {})


def test_pool_map_keeps_order_and_says_each_result():
    from rocmport.procs import pool_map

    seen: list[int] = []
    assert pool_map(abs, [-i for i in range(20)], 2, chunksize=3, each=seen.append) == list(range(20))
    assert seen == list(range(1, 21))


def test_a_held_step_finishes_before_the_interrupt_stops_the_run(tmp_path):
    """Refresh promotes its result (the series, then the lock, then the trees) under procs.held(): a
    Ctrl-C there waits until the step is done, then stops the run as anywhere else."""
    from rocmport import procs

    steps = []
    # what was there before the run: pytest's handler, or SIG_IGN where the tests were started in the
    # background of a non-interactive shell (`cmd &` starts with SIGINT ignored)
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(procs.Interrupted) as info:
        with procs.run_scope("rocmport-test-", lambda: f"finished: {', '.join(steps)}"):
            with procs.held():
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.2)  # the handler has run by now: only recorded
                steps.append("promoted")
            steps.append("not reached")
    assert steps == ["promoted"]
    assert info.value.exit_code == 130 and "finished: promoted;" in str(info.value)
    assert signal.getsignal(signal.SIGINT) is before  # the handler that was there is back


def test_readme_says_what_an_interrupted_refresh_does():
    readme = "".join(
        (REPO / "docs" / p).read_text() for p in ("exit-codes.md", "commands/bot.md", "commands/refresh.md")
    )
    assert "`verify`, `refresh` and `bot` first end every process they started" in readme
    assert "the checkout is back on the branch it was on, and the release is not recorded" in readme
    assert "Interrupted by Ctrl-C or SIGTERM (exit 130 / 143), refresh ends every process it started" in readme
