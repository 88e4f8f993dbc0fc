"""The command stage 4 runs in torchrun's place when a rank server serves the case
(rocmport.verify.runtime.rank_server): it hands the server this run (the script, its arguments, the
environment, the working directory, its own stdout and stderr), waits for the ranks the server forks,
and ends as torchrun ends: 0 when every rank exited 0, else 1 after torchrun's failure summary
(each failed rank's exit code, or the signal that killed it), which stage 4 reads as it reads
torchrun's.

    python -I rank_client.py --socket PATH --nproc_per_node=N --master_addr=HOST --master_port=P script.py ARGS...

Started with ``-I`` and the standard library only: no bootstrap, no torch (a launch costs the
ranks' start-up, not this process's). If this process dies (a time limit's SIGKILL), its socket
closes and the server kills the run's ranks and what they started."""

from __future__ import annotations

import json
import os
import socket
import struct
import sys
import time
from datetime import datetime, timezone
from string import Template

# How long to wait for the server's socket to appear (it binds it before importing torch and megatron).
CONNECT_S = 120.0
# torchrun's summary of a failed run (torch.distributed.elastic.multiprocessing.errors), which stage 4 parses.
_FAILURE = """[${idx}]:
  time      : ${time}
  host      : ${host}
  rank      : ${rank} (local_rank: ${rank})
  exitcode  : ${code} (pid: ${pid})${signal}
  error_file: <N/A>
  traceback : ${message}"""
_SUMMARY = """
${border}
${title}
${section}
Failures:
${others}
${section}
Root Cause (first observed failure):
${root}
${border}"""


def parse(argv: list[str]) -> tuple[dict, list[str]]:
    """The launch options (torchrun's spelling, ``--name=value``) and the script with its arguments."""
    opts: dict = {"master_addr": "127.0.0.1"}
    i = 0
    while i < len(argv) and argv[i].startswith("--"):
        key, sep, value = argv[i][2:].partition("=")
        if not sep:
            i += 1
            value = argv[i]
        opts[key.replace("-", "_")] = value
        i += 1
    missing = [k for k in ("socket", "nproc_per_node", "master_port") if k not in opts]
    if missing or i >= len(argv):
        raise SystemExit(
            f"rank_client: usage: --socket PATH --nproc_per_node N --master_port P script.py ARGS (missing {missing or 'script'})"
        )
    return opts, argv[i:]


def connect(path: str) -> socket.socket:
    deadline = time.monotonic() + CONNECT_S
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(path)
            return sock
        except (FileNotFoundError, ConnectionRefusedError):
            sock.close()
            if time.monotonic() > deadline:
                raise SystemExit(f"rank_client: no rank server at {path} after {CONNECT_S:g} s") from None
            time.sleep(0.05)


def summary(title: str, failures: list[dict]) -> str:
    """torchrun's failure summary: the first failure as the root cause, the others listed."""
    host = socket.getfqdn()
    failures = sorted(failures, key=lambda f: f["time"])
    blocks = []
    for idx, f in enumerate(failures):
        code = f["code"]
        signal = message = ""
        if code < 0:
            import signal as signals

            name = signals.Signals(-code).name if -code in signals.Signals.__members__.values() else str(-code)
            signal = f" ({name})"
            message = f"Signal {-code} ({name}) received by PID {f['pid']}"
        else:
            message = "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html"
        when = datetime.fromtimestamp(f["time"], timezone.utc).astimezone().isoformat(timespec="seconds")
        blocks.append(
            Template(_FAILURE).substitute(
                idx=idx, time=when, host=host, rank=f["rank"], code=code, pid=f["pid"], signal=signal, message=message
            )
        )
    width = min(max(len(line) for b in blocks + [title] for line in b.split("\n")), 60)
    return Template(_SUMMARY).substitute(
        border="=" * width,
        title=title,
        section="-" * width,
        others="\n".join(blocks[1:] or ["  <NO_OTHER_FAILURES>"]),
        root=blocks[0],
    )


def main(argv: list[str]) -> int:
    opts, script = parse(argv)
    request = {
        "argv": script,
        "env": dict(os.environ),
        "cwd": os.getcwd(),
        "nproc": int(opts["nproc_per_node"]),
        "master_addr": opts["master_addr"],
        "master_port": int(opts["master_port"]),
    }
    body = json.dumps(request).encode()
    sock = connect(opts["socket"])
    sys.stdout.flush()
    sys.stderr.flush()
    # The ranks write to this process's own stdout and stderr (stage 4's pipes), as torchrun's workers do.
    socket.send_fds(sock, [struct.pack("!Q", len(body))], [1, 2])
    sock.sendall(body)
    reply = b""
    with sock.makefile("rb") as answers:
        for line in answers:
            reply = line
    if not reply:
        print("rank_client: the rank server closed the connection before the run ended", file=sys.stderr)
        return 1
    done = json.loads(reply)
    if done.get("error"):
        print(f"rank_client: {done['error']}", file=sys.stderr)
        return 1
    failures = done["failures"]
    if not failures:
        return 0
    print(summary(f"{os.path.basename(script[0])} FAILED", failures), file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
