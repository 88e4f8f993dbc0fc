"""Stage 4's rank server for one case (`--fork-ranks`, the default on the CPU proxy with a one-node
torchrun launcher): one process imports torch, megatron and TE's Python layer with the shim
installed, once, and forks the ranks of the case's run and of its resumed run
(rocmport.verify.runtime.rank_server); the launch command is rocmport.verify.runtime.rank_client in
torchrun's place. The ranks run as torchrun's workers do (their environment variables, a session
each, the script as ``__main__``, exits and torchrun's failure summary), without importing again.

A server serves one environment: the runs' (the case's ENV_VARS, its port-site and shim directories,
OMP_NUM_THREADS=1 as torchrun sets it for several ranks). A run in another environment gets a new
server. When a server cannot start or refuses to fork (a thread besides the main one after its
imports), the case runs under torchrun as before and its report says why."""

from __future__ import annotations

import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rocmport.fsutil import open_log
from rocmport.verify.orchestration.launcher import Launcher

SERVER_MODULE = "rocmport.verify.runtime.rank_server"
SCRIPT = "pretrain_gpt.py"
READY_TIMEOUT_S = 600.0
WHY = (
    "the ranks are forked from one process that imported torch, megatron and TE's Python layer once, "
    "with the proxy shim (a rank server), for the case's run and its resumed run; torchrun's environment, "
    "sessions, exits and failure summary as torchrun gives them"
)


def applies(launcher: Launcher, proxy: bool) -> bool:
    """Whether a rank server can take torchrun's place: the CPU proxy, torchrun on this one node."""
    return proxy and launcher.kind == "torchrun" and not launcher.multi_node


def server_env(env: dict[str, str], world: int) -> dict[str, str]:
    """The environment the server imports with: the ranks' (OMP_NUM_THREADS=1 with several ranks,
    as torchrun sets it), less the per-rank variables the server sets in each."""
    out = dict(env)
    if world > 1:
        out.setdefault("OMP_NUM_THREADS", "1")
    return out


def server_command(socket_path: str) -> list[str]:
    # -u: torchrun runs each worker `python -u` (unbuffered stdout and stderr); the forked ranks
    # inherit the server's streams.
    return [sys.executable, "-u", "-m", SERVER_MODULE, "--socket", socket_path, SCRIPT]


class RankServer:
    """The rank server of one case in ``tree`` (started on the first launch that asks for it, for
    that launch's environment); ``refused`` says why a launch went to torchrun instead."""

    def __init__(self, tree: Path, log_dir: Path, world: int) -> None:
        self.tree, self.log_dir, self.world = tree, log_dir, world
        self.proc: subprocess.Popen | None = None
        self.env: dict[str, str] | None = None
        self.dir: str | None = None
        self.refused: str | None = None
        self.ready: dict | None = None
        self.started = 0

    @property
    def socket(self) -> str | None:
        return os.path.join(self.dir, "ranks.sock") if self.dir else None

    def socket_for(self, env: dict[str, str]) -> str | None:
        """The socket of a server ready for runs in ``env`` (started, or restarted for another
        environment); None when it cannot serve (``refused`` says why)."""
        wanted = server_env(env, self.world)
        if self.proc is not None and self.env == wanted and self.proc.poll() is None:
            return self.socket
        self.close()
        if self.refused:
            return None
        self.env = wanted
        self.dir = tempfile.mkdtemp(prefix="rocmport-ranks-")
        with open_log(self.log_dir / f"rank-server-{self.started}.log") as log:
            self.started += 1
            self.proc = subprocess.Popen(
                server_command(str(self.socket)),
                cwd=self.tree,
                env=wanted,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
            )
        line = _first_line(self.proc, READY_TIMEOUT_S)
        if line.startswith("ready "):
            import json

            self.ready = json.loads(line[6:])
            return self.socket
        self.refused = (line.strip() or f"exited {self.proc.poll()} before it was ready") + self._log_tail()
        self.close()
        return None

    def _log_tail(self) -> str:
        logs = sorted(self.log_dir.glob("rank-server-*.log"))
        tail = logs[-1].read_text(errors="replace").strip().splitlines()[-3:] if logs else []
        return f" ({' | '.join(tail)[:300]})" if tail else ""

    def close(self) -> None:
        """End the server (its stdin closes: it exits; its ranks have ended with their runs)."""
        proc, self.proc = self.proc, None
        if proc is not None:
            for stream in (proc.stdin, proc.stdout):
                if stream is not None:
                    stream.close()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None


def _first_line(proc: subprocess.Popen, timeout: float) -> str:
    """The server's first line on stdout ("ready ..." or "refused ..."), or "" at its end or the timeout."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    deadline = time.monotonic() + timeout
    data = b""
    while b"\n" not in data:
        left = deadline - time.monotonic()
        if left <= 0:
            proc.kill()
            return f"not ready after {timeout:g} s"
        readable, _, _ = select.select([fd], [], [], min(left, 1.0))
        if readable:
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            data += chunk
    return data.decode(errors="replace").partition("\n")[0]
