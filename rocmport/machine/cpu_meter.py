"""How much CPU a run's processes and the rest of the machine use (Linux /proc; elsewhere unknown).

Two questions stage 3 asks on a shared machine:
- the watchdog: is a test that has had no result for a while hung, or only slow? A rank waiting in
  a collective sleeps (its main thread uses no CPU); a rank starved by other jobs still gets some.
  So while the main threads of the run's ranks (or the children they reaped: a compiler) keep using
  CPU, the run is making progress (`working_seconds`).
- the report: were other processes using the machine meanwhile (`MachineShare`)? Hang and timeout
  verdicts on an overloaded machine say so."""

from __future__ import annotations

import os
import resource
import time
from dataclasses import asdict, dataclass
from pathlib import Path

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

# Other processes' average use above this share of the machine's cores makes it "overloaded".
OVERLOADED_SHARE = 0.5


def _stat_fields(path: Path) -> list[str] | None:
    """/proc/<pid>/stat after the command name (which may hold spaces and parentheses)."""
    try:
        text = path.read_text()
    except OSError:
        return None
    return text[text.rfind(")") + 2 :].split()


def _children() -> dict[int, list[int]]:
    """pid -> its children's pids, for every process in /proc."""
    kids: dict[int, list[int]] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        fields = _stat_fields(entry / "stat")
        if fields:
            kids.setdefault(int(fields[1]), []).append(int(entry.name))
    return kids


def working_seconds(root: int) -> float | None:
    """CPU seconds (user + system) used so far by the main threads of ``root``'s descendants (not
    ``root`` itself: for a rank, root is its torchrun agent), and by the children they have reaped. A
    rank that compiles (torch.compile's C++ compiler, one short process after another, reaped by its
    compile workers) is working while its main thread waits: without the reaped children's time that
    wait read as a hang, and an exited worker's time vanished from the sum. None where /proc is
    unavailable."""
    if not Path("/proc/self/stat").exists():
        return None
    kids = _children()
    total, todo = 0.0, list(kids.get(root, []))
    while todo:
        pid = todo.pop()
        fields = _stat_fields(Path(f"/proc/{pid}/task/{pid}/stat"))
        if fields:  # utime, stime; cutime, cstime (the process's reaped children, whichever thread waited)
            total += sum(int(fields[i]) for i in (11, 12, 13, 14)) / _TICK
        todo += kids.get(pid, [])
    return total


def _machine_busy_seconds() -> float | None:
    """CPU seconds all cores have spent busy since boot (/proc/stat: everything but idle and iowait)."""
    try:
        first = Path("/proc/stat").read_text().splitlines()[0].split()
    except (OSError, IndexError):
        return None
    ticks = [int(v) for v in first[1:9]]  # user nice system idle iowait irq softirq steal
    return (sum(ticks) - ticks[3] - ticks[4]) / _TICK


def _own_seconds() -> float:
    """CPU seconds this process and its waited-for descendants have used (torchrun folds its ranks in)."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


@dataclass
class Share:
    cpus: int
    seconds: float
    others_cores: float  # the average number of cores other processes kept busy
    run_cores: float  # the average number this run (and its finished children) kept busy
    overloaded: bool

    def to_dict(self) -> dict:
        return asdict(self)


class MachineShare:
    """Started before a run, read after it (its children waited for): how busy the rest of the machine
    kept the cores meanwhile. On a machine without /proc, `read` returns None."""

    def __init__(self) -> None:
        self._start = (time.monotonic(), _machine_busy_seconds(), _own_seconds())

    def read(self) -> Share | None:
        t0, busy0, own0 = self._start
        busy1 = _machine_busy_seconds()
        if busy0 is None or busy1 is None:
            return None
        wall = max(time.monotonic() - t0, 1e-6)
        cpus = os.cpu_count() or 1
        run = max(_own_seconds() - own0, 0.0)
        others = max(busy1 - busy0 - run, 0.0)
        others_cores = others / wall
        return Share(
            cpus, round(wall, 1), round(others_cores, 2), round(run / wall, 2), others_cores > OVERLOADED_SHARE * cpus
        )


def task_limit() -> int | None:
    """How many processes and threads this machine can hold at once: the smaller of the kernel's
    pid_max and threads-max (None where /proc does not say). Every thread takes a process id, so a
    run whose ranks hold thousands of threads each can meet pid_max (32768 on many machines) long
    before memory runs out; the next thread or fork then fails with EAGAIN."""
    limits = []
    for name in ("pid_max", "threads-max"):
        try:
            limits.append(int(Path("/proc/sys/kernel", name).read_text().split()[0]))
        except (OSError, ValueError, IndexError):
            continue
    return min(limits) if limits else None


def threads_running() -> int | None:
    """Threads on this machine now, every process's counted (None where /proc does not say): what
    meets :func:`task_limit`."""
    total = 0
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            total += int(status.read_text().split("Threads:")[1].split()[0])
        except (OSError, IndexError, ValueError):  # gone meanwhile, or not Linux's format
            continue
    return total or None


def task_limit_phrase(threads_per_rank: int, ranks: int, limit: int | None) -> str | None:
    """What to say when a run ended early and its ranks' threads came near the machine's task limit
    (within a fifth of it), else None."""
    if not limit or threads_per_rank * ranks < 0.8 * limit:
        return None
    return (
        f"the {ranks} ranks peaked at {threads_per_rank} threads each ({threads_per_rank * ranks} of this machine's "
        f"limit of {limit} processes and threads, kernel.pid_max / kernel.threads-max): a run that ended early may "
        f"have run out of them; raise the limit (`sysctl -w kernel.pid_max=4194304`) or run fewer ranks (--unit-nproc)"
    )
