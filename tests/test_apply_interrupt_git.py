"""Issue #41, row 13: Ctrl-C (SIGINT to the process group, as a terminal sends it) while `apply` is
in one of its git steps exits 130 with "interrupted", as the codemod phase does, and leaves a state
the next `apply` recovers from. It said "git checkout -q --force failed: ... index.lock ..." (exit 1).

The signal is sent while git itself runs: a `git` first on PATH announces the step (a file) and
execs the real git on a tree big enough that the step takes a moment."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.patches import Project
from tests.helpers.sync import g

GIT = shutil.which("git")


def big_project(tmp_path: Path, monkeypatch, files: int = 6000) -> Project:
    proj = Project(tmp_path, monkeypatch)
    many = proj.up / "megatron" / "core" / "many"
    many.mkdir(parents=True)
    for i in range(files):
        (many / f"f{i}.py").write_text(f"x = {i}\n")
    g(proj.up, "add", "-A")
    proj.pin(proj.upstream_commit({"megatron/core/many/__init__.py": ""}, "many files"))
    proj.refresh_mirror()
    return proj


def shim(tmp_path: Path, step: str) -> tuple[Path, Path]:
    """A PATH directory whose `git` touches a marker when it runs ``step``, then is the real git."""
    d = tmp_path / "shim"
    d.mkdir()
    marker = tmp_path / f"in-{step}"
    (d / "git").write_text(f'#!/bin/sh\ncase " $* " in *" {step} "*) touch "{marker}";; esac\nexec "{GIT}" "$@"\n')
    (d / "git").chmod(0o755)
    return d, marker


def interrupt_apply(root: Path, shim_dir: Path, marker: Path, env: dict) -> subprocess.CompletedProcess:
    proc = subprocess.Popen(
        [sys.executable, "-m", "rocmport", "-C", str(root), "apply"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own group: the test signals it as a terminal would
        env={**env, "PATH": f"{shim_dir}:{env['PATH']}"},
    )
    deadline = time.monotonic() + 120
    while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    assert marker.exists(), "the git step never ran"
    time.sleep(0.05)
    for _ in range(2):  # twice, as an impatient user does
        try:
            os.killpg(proc.pid, signal.SIGINT)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    out, err = proc.communicate(timeout=300)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.mark.parametrize("step", ["checkout", "clone"])
def test_sigint_during_a_git_step_of_apply_exits_130_and_apply_recovers(tmp_path, monkeypatch, step):
    proj = big_project(tmp_path, monkeypatch)
    shim_dir, marker = shim(tmp_path, step)
    done = interrupt_apply(proj.root, shim_dir, marker, dict(os.environ))
    assert done.returncode == 130, done.stderr
    lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert lines and "interrupted" in lines[-1] and "Traceback" not in done.stderr, done.stderr
    assert "failed" not in done.stderr, done.stderr
    again = subprocess.run(
        [sys.executable, "-m", "rocmport", "-C", str(proj.root), "apply"], capture_output=True, text=True, timeout=600
    )
    assert again.returncode == 0, again.stderr
    assert g(proj.tree, "status", "--porcelain") == ""
