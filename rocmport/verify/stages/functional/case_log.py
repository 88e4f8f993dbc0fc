"""What stage 4 reads from a run's log: Megatron's logged losses and params norm, the iteration a
resumed run loaded, the first exception and the CUDA-only blocker that stopped it, and how it
failed (CaseFailure), normalised so that two trees' failures compare."""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path


from rocmport.verify.runtime.proxy_causes import acting_shim_frame
from rocmport.verify.stages.functional.details import CaseFailure

_LOSS_RE = re.compile(r"iteration\s+(\d+)/\s*\d+ \|.*?lm loss: ([0-9.eE+-]+)")
# The last one: a torch.cuda call the proxy shim has no CPU answer for reaches the CPU build's missing
# CUDA bindings (the shim reports CUDA as initialised, so torch's own "not compiled" check is passed).
_CUDA_BLOCKER = re.compile(
    r"(Megatron requires CUDA|Torch not compiled with CUDA enabled|Found no NVIDIA driver|"
    r"No CUDA GPUs are available|CUDA driver|nvml|module 'torch\._C' has no attribute '_cuda)",
    re.I,
)
_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')


def loss_steps(log: str) -> dict[int, float]:
    """Megatron's logged `lm loss` by iteration."""
    return {int(it): float(loss) for it, loss in _LOSS_RE.findall(log)}


def parse_losses(log: str) -> list[float]:
    found = loss_steps(log)
    return [found[i] for i in sorted(found)]


_LOADED_RE = re.compile(r"successfully loaded checkpoint from .* at iteration (\d+)")


def loaded_iteration(log: str) -> int | None:
    """The iteration a run says it resumed from (megatron's `successfully loaded checkpoint ... at iteration N`)."""
    m = _LOADED_RE.search(log)
    return int(m.group(1)) if m else None


_PARAMS_NORM_RE = re.compile(r"iteration\s+(\d+)/\s*\d+ \|.*?params norm: ([0-9.eE+-]+)")


def params_norms(log: str) -> dict[int, float]:
    """Megatron's logged `params norm` by iteration (with --log-params-norm)."""
    return {int(it): float(v) for it, v in _PARAMS_NORM_RE.findall(log)}


def expected_resumed(steps: dict[int, float], start: int, end: int, first_two_together: bool) -> dict[int, float]:
    """What a run resumed from iteration ``start`` must log for start+1..end, from the uninterrupted
    run's losses ``steps``: the same values, except that a training loop which logs the first two
    iterations after a start as one interval logs the mean of start+1 and start+2 at start+2."""
    out = {i: steps[i] for i in range(start + 1, end + 1) if i in steps}
    if first_two_together and start + 2 in out:
        out[start + 2] = (steps[start + 1] + steps[start + 2]) / 2
    return out


def _blocker(stderr: str, tree: Path) -> str | None:
    """The first CUDA-only requirement that stopped upstream's script on CPU, with its upstream site
    (the innermost traceback frame inside the tree, e.g. megatron/training/initialize.py:62)."""
    lines = stderr.splitlines()
    root = str(tree.resolve()) + "/"
    for i, line in enumerate(lines):
        if not _CUDA_BLOCKER.search(line) or line.lstrip().startswith(("raise ", "assert ")):
            continue
        site = ""
        for prev in reversed(lines[:i]):
            m = _FRAME.search(prev)
            if m and m.group(1).startswith(root):
                site = f" at {m.group(1)[len(root) :]}:{m.group(2)} ({m.group(3)})"
                break
        return line.strip()[:200] + site
    return None


# A traceback's last line: the exception's type and message, as a rank prints it ("[rank0]: ValueError: ...").
_EXCEPTION = re.compile(r"^(?:\[rank\d+\]:\s*)?((?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Interrupt)\b:?.*)$")


def exception_line(stderr: str) -> str | None:
    """The first exception a run raised (its type and message), not a traceback's source line such as
    `raise ValueError(`: torchrun's own ChildFailedError and its elastic frames are skipped."""
    for line in stderr.splitlines():
        m = _EXCEPTION.match(line.strip())
        if m and "ChildFailedError" not in m.group(1) and "elastic" not in m.group(1):
            return m.group(1)
    return None


# torchrun's summary of a worker that died without a Python traceback: "traceback : Signal 9 (SIGKILL)
# received by PID 1234" (a signal), else its "exitcode : -6" line.
_SIGNAL = re.compile(r"traceback\s*:\s*Signal (\d+) \((\w+)\) received by PID \d+")
_EXITCODE = re.compile(r"exitcode\s*:\s*(-?\d+)")
DIED = "a rank died of signal"
SIGKILL_WHY = "a rank was killed by SIGKILL (on the proxy most likely the kernel's OOM killer: the ranks outgrew this machine's memory)"


# Exit codes upstream's training loop ends with on purpose (megatron/core/rerun_state_machine.py).
_MEGATRON_EXITS = {
    "16": "megatron's rerun state machine, EXIT_CODE_RESUME_TO_DISAMBIGUATE: a result failed validation "
    "(NaN, Inf or a spiky loss) and the job must resume to tell why",
    "17": "megatron's rerun state machine, EXIT_CODE_FAILED_ON_RESULT_VALIDATION: a result failed validation "
    "(NaN, Inf or a spiky loss) and did so again on rerun",
}


# What the rerun state machine logs when a result fails validation, and what its rerun in place found
# (megatron/core/rerun_state_machine.py validate_result): the result, the check's message, reproducible or not.
_RERUN_LOG = re.compile(r"(Unexpected result .*?\(message=.*?\)|First rerun: unexpected result is .*?(?:\)|$))")


def rerun_story(stderr: str) -> str:
    """The rerun state machine's own account of why it stopped: its first "Unexpected result ...
    (message='...')" and its first "First rerun: ..." line, joined; "" where it logged neither."""
    found: dict[str, str] = {}
    for m in _RERUN_LOG.finditer(stderr):
        found.setdefault("first" if m.group(1).startswith("First rerun") else "unexpected", m.group(1).strip())
    return "; ".join(found[k] for k in ("unexpected", "first") if k in found)


_RESULT_VALIDATION = re.compile(r"^a rank exited (16|17) without a Python exception")


def fails_result_validation(message: str) -> bool:
    """Whether a failure (death_line's words) is megatron's rerun state machine stopping on a result that
    failed validation: a NaN, Inf or spiky loss, the run's own numerics."""
    return bool(_RESULT_VALIDATION.match(message))


def death_line(stderr: str, stdout: str = "") -> str | None:
    """How torchrun says a worker died when it printed no exception: a signal other than SIGTERM, an
    exit code (megatron's own named, with the rerun state machine's account, which megatron's logger
    may write to either stream), else SIGTERM (what torchrun sends the survivors of a failure)."""
    signals = _SIGNAL.findall(stderr)
    killed = [m for m in signals if m[1] != "SIGTERM"]
    if killed:
        last = crash_line(stderr)  # its last words, where it said any (glibc's heap check, a fatal error)
        return f"{DIED} {killed[0][0]} ({killed[0][1]})" + (f": {last}" if last else "")
    codes = [c for c in _EXITCODE.findall(stderr) if not c.startswith("-")]
    if codes:
        why = _MEGATRON_EXITS.get(codes[0])
        story = rerun_story(f"{stdout}\n{stderr}") if why else ""
        if story and why:  # its own account says what failed validation: the exit's name, then the account
            return f"a rank exited {codes[0]} without a Python exception ({why.split(':')[0]}): {story}"
        return f"a rank exited {codes[0]} without a Python exception" + (f" ({why})" if why else "")
    return f"{DIED} {signals[0][0]} ({signals[0][1]})" if signals else None


# torchrun's summary of one failed worker (and the rank client's, which copies it): its rank, then its exit
# code, minus the signal's number for a worker a signal ended ("  rank      : 1 (local_rank: 1)\n  exitcode  : -6 (pid: 7)").
_FAILED_WORKER = re.compile(r"^\s*rank\s*:\s*(\d+)\b.*\n\s*exitcode\s*:\s*(-?\d+)", re.M)
_ROOT_CAUSE = "Root Cause (first observed failure):"
# What a process prints as it dies of a signal it brought on itself: glibc's heap checks (then SIGABRT: "free():
# double free detected in tcache 2", "malloc(): unaligned tcache chunk detected", "corrupted size vs. prev_size"),
# its stack protector, Python's faulthandler, and C++'s terminate on an uncaught exception with its what().
_CRASH_LINE = re.compile(
    r"^(?:(?:malloc|free|realloc|calloc|malloc_consolidate|munmap_chunk|_int_malloc|_int_free|tcache_thread_shutdown)"
    r"\(\): .+|double free or corruption.*|corrupted .+|\*\*\* stack smashing detected \*\*\*.*|"
    r"Fatal (?:Python|glibc) error: .+|terminate called after throwing an instance of .+|\s*what\(\): .+)$"
)
# A surviving rank's error when a peer is gone (gloo: "Connection closed by peer", "Read error ...: Connection
# reset by peer"): what a crash causes on the other ranks, never its cause.
_PEER_LOST = re.compile(r"Connection (?:closed|reset) by peer|Broken pipe")


def crashed_rank(stderr: str) -> tuple[int, int] | None:
    """The rank a signal ended on its own (its rank and the signal's number) in torchrun's summary: the first
    observed failure where a signal other than SIGTERM (what torchrun sends the survivors) ended it; or, where
    the first observed failure is a survivor whose exception says it lost a peer (the rank it lost died on
    its way out and was reaped after it), the first failure a signal other than SIGTERM or SIGKILL (what
    torchrun sends a survivor that outlives the grace period) ended. None where no signal ended one."""
    import signal

    root_at = stderr.rfind(_ROOT_CAUSE)
    if root_at < 0:
        return None
    workers = [(int(r), int(c)) for r, c in _FAILED_WORKER.findall(stderr[root_at:])]
    workers += [(int(r), int(c)) for r, c in _FAILED_WORKER.findall(stderr[:root_at])]  # the others, in order
    if not workers:
        return None
    rank, code = workers[0]
    if code < 0 and -code != signal.SIGTERM:
        return rank, -code
    if _PEER_LOST.search(exception_line(stderr) or ""):
        return next(((r, -c) for r, c in workers if c < 0 and -c not in (signal.SIGTERM, signal.SIGKILL)), None)
    return None


def crash_line(stderr: str) -> str | None:
    """The last line a crashing process printed as it died (_CRASH_LINE: glibc's heap check, a fatal
    error), among the lines no rank's Python traceback prefixes: the crashed rank's last words."""
    found = [ln.strip() for ln in stderr.splitlines() if not _RANK_PREFIX.match(ln) and _CRASH_LINE.match(ln)]
    return found[-1] if found else None


def crash_first(stderr: str) -> str | None:
    """Where a rank died of a signal (crashed_rank) and the others raised exceptions losing it: that rank
    and its signal, its last words (crash_line), then the survivors' first exception; else None (a run
    whose ranks raised nothing says its signal by death_line)."""
    import signal

    survivors = exception_line(stderr)
    crashed = crashed_rank(stderr) if survivors else None
    if crashed is None:
        return None
    rank, signo = crashed
    name = signal.Signals(signo).name if signo in signal.Signals._value2member_map_ else str(signo)
    last = crash_line(stderr)
    return (
        f"{DIED} {signo} ({name}) (rank {rank})"
        + (f": {last}" if last else "")
        + (f"; then, on the other ranks: {survivors}")
    )


def cause_line(stderr: str, stdout: str = "") -> str:
    """Why a run stopped, in one line: a rank that died of a signal first (crash_first), else its first
    exception, how torchrun says a worker died, or its last line."""
    return (
        crash_first(stderr)
        or exception_line(stderr)
        or death_line(stderr, stdout)
        or (stderr.strip().splitlines() or ["no output"])[-1]
    )


def iteration_span(iterations: Iterable[int]) -> str:
    """Iterations as runs of consecutive numbers: [6, 7, 9] -> "6-7, 9"."""
    runs: list[list[int]] = []
    for i in sorted(set(iterations)):
        if runs and i == runs[-1][-1] + 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    return ", ".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)


def short_of_iterations(logged: Iterable[int], wanted: Iterable[int]) -> str:
    """Why a run that exited 0 failed: it did not log every ``wanted`` iteration; which ones it did log
    (a stray stderr line, a warning's source line, says nothing of it). Iterations logged outside
    ``wanted`` (a resumed run that loaded another checkpoint) are named too."""
    want = set(wanted)
    got, other = sorted(set(logged) & want), sorted(set(logged) - want)
    text = f"exited 0 having logged {f'iterations {iteration_span(got)}' if got else 'none'} of {iteration_span(want)}"
    return text + (f" (and iterations {iteration_span(other)}, outside them)" if other else "")


# A traceback's start, and the rank prefix torchrun puts before each worker's line ("[rank3]: ").
_RANK_PREFIX = re.compile(r"^(\[rank\d+\]:)")
_ADDRESS = re.compile(r"0x[0-9a-fA-F]+")
_NUMBER = re.compile(r"(?<![\w.])[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")


def normalise(text: str, tree: Path, figures: bool = False) -> str:
    """``text`` as two trees compare it: the tree's path as <tree>, addresses as 0x#, with ``figures``
    every number as # (a check's measured values differ run to run; its words do not)."""
    for root in {str(tree.resolve()), str(tree)}:
        text = text.replace(root, "<tree>")
    text = _ADDRESS.sub("0x#", text)
    return _NUMBER.sub("#", text) if figures else text


def failure_of(stderr: str, tree: Path, phase: str, stdout: str = "") -> CaseFailure:
    """The first exception a run raised, with the innermost frames of its own rank's traceback inside
    the tree and where the proxy shim acted (proxy_causes.acting_shim_frame: not its pass-through); where
    a rank died of a signal (crash_first), that first, with no frame: a survivor's traceback is where it
    lost its peer, not where the crash was."""
    crash = crash_first(stderr)
    if crash:
        return CaseFailure(phase, normalise(crash, tree)[:300])
    lines = stderr.splitlines()
    message = exception_line(stderr)
    at = next((i for i, ln in enumerate(lines) if message and ln.strip().endswith(message)), len(lines))
    prefix = _RANK_PREFIX.match(lines[at].strip()) if at < len(lines) else None
    root = str(tree.resolve()) + "/"
    frames: list[tuple[str, str, str]] = []  # (path, function, line), innermost first
    for line in reversed(lines[:at]):
        if prefix and not line.strip().startswith(prefix.group(1)):
            continue  # another rank's lines, interleaved
        if "Traceback (most recent call last)" in line:
            break
        if m := _FRAME.search(line):
            frames.append((m.group(1), m.group(3), m.group(2)))
    site = next((f"{p[len(root) :]} ({fn})" for p, fn, _ in frames if p.startswith(root)), None)
    acted = acting_shim_frame(frames)
    shim = f"{acted[1]} (proxy_shim.py:{acted[2]})" if acted else None
    text = message or cause_line(stderr, stdout)
    return CaseFailure(phase, normalise(text, tree)[:300], site, shim)
