"""Stage 4's reason for a run in which one rank died of a signal and the others raised exceptions losing
it: the crashed rank leads (its signal and last words), the survivors' lost connection after it, and two
trees' such failures compare by the signal (case_log.crash_first, case_labels.label_case).

The lines are a real run's (tests/test_rank_server.py's gloo run, where rank 1 double-frees: glibc's
message, gloo's error on rank 0, the rank server's torchrun summary), arranged as torchrun may order them
when it reaps the survivor first."""

from __future__ import annotations

import textwrap
from pathlib import Path

from rocmport.verify.orchestration.stage_result import FAIL, StageResult
from rocmport.verify.stages.functional import case_log
from rocmport.verify.stages.functional.case_labels import BaselineRun, label_case
from rocmport.verify.stages.functional.case_run import CaseOutcome

GLIBC = "free(): double free detected in tcache 2\n"
LOST = (
    "[rank0]: Traceback (most recent call last):\n"
    '[rank0]:   File "/w/pretrain_gpt.py", line 14, in <module>\n'
    "[rank0]:     dist.all_reduce(torch.ones(4))\n"
    "[rank0]: RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error "
    "[127.0.0.1]:{port}: Connection reset by peer. This is typically caused by a remote worker hanging or bugs in "
    "the application. Check the logs of the remote worker before reporting an error. GLHF!\n"
)
RAISED = (
    "[rank0]: Traceback (most recent call last):\n"
    '[rank0]:   File "/w/pretrain_gpt.py", line 9, in <module>\n'
    "[rank0]: ValueError: boom on purpose\n"
)
WORKER = """\
[{idx}]:
  time      : 2026-11-28T11:12:24+00:00
  host      : localhost
  rank      : {rank} (local_rank: {rank})
  exitcode  : {code} (pid: {pid}){signal}
  error_file: <N/A>
  traceback : {traceback}"""


def worker(idx: int, rank: int, code: int) -> str:
    signal = {-6: " (SIGABRT)", -9: " (SIGKILL)", -15: " (SIGTERM)"}.get(code, "")
    traceback = (
        f"Signal {-code}{signal} received by PID {22559 + rank}"
        if code < 0
        else "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html"
    )
    return WORKER.format(idx=idx, rank=rank, code=code, pid=22559 + rank, signal=signal, traceback=traceback)


def summary(root: str, other: str) -> str:
    return textwrap.dedent("""\
        ============================================================
        pretrain_gpt.py FAILED
        ------------------------------------------------------------
        Failures:
        {other}
        ------------------------------------------------------------
        Root Cause (first observed failure):
        {root}
        ============================================================
        """).format(other=other, root=root)


def test_the_crashed_rank_leads_when_it_was_reaped_first_or_after_the_survivor_that_lost_it():
    crashed_first = GLIBC + LOST.format(port=11154) + summary(worker(0, 1, -6), worker(1, 0, 1))
    survivor_first = GLIBC + LOST.format(port=11154) + summary(worker(0, 0, 1), worker(1, 1, -6))
    for stderr in (crashed_first, survivor_first):
        reason = case_log.cause_line(stderr)
        assert reason.startswith(
            "a rank died of signal 6 (SIGABRT) (rank 1): free(): double free detected in tcache 2; "
            "then, on the other ranks: RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/"
            "pair.cc:537] Read error [127.0.0.1]:11154: Connection reset by peer"
        ), reason


def test_a_rank_that_raised_first_keeps_its_exception_and_sigterm_is_no_crash():
    # rank 0 raised an error of its own first; rank 1 died of a signal after: the error leads, as before
    raised = RAISED + GLIBC + summary(worker(0, 0, 1), worker(1, 1, -6))
    assert case_log.cause_line(raised) == "ValueError: boom on purpose"
    # torchrun's SIGTERM to a survivor is no crash
    terminated = RAISED + summary(worker(0, 0, 1), worker(1, 1, -15))
    assert case_log.cause_line(terminated) == "ValueError: boom on purpose"
    # without a survivor's exception, the signal is said as before, with the crashed rank's last words
    alone = GLIBC + summary(worker(0, 1, -6), worker(1, 0, -15))
    assert case_log.cause_line(alone) == "a rank died of signal 6 (SIGABRT): free(): double free detected in tcache 2"


def outcome(stderr: str) -> tuple[CaseOutcome, BaselineRun]:
    port = case_log.failure_of(stderr, Path("/w"), "run")
    return CaseOutcome("c", StageResult("functional", FAIL, port.message), None, port), BaselineRun(
        "a" * 40, FAIL, "y", 1.0
    )


def test_two_trees_whose_ranks_died_of_a_signal_compare_by_the_signal():
    here = GLIBC + LOST.format(port=11154) + summary(worker(0, 1, -6), worker(1, 0, 1))
    there = GLIBC + LOST.format(port=40593) + summary(worker(0, 0, -6), worker(1, 1, 1))  # another rank, port
    port, base = outcome(here)
    assert port.failure is not None and port.failure.site is None  # the survivor's frame is not the crash's
    base.failure = outcome(there)[0].failure
    label, why = label_case(port, base)
    assert label == "unverified" and why.startswith("a rank died of a signal on both trees (in the uninterrupted run: ")
    assert why.endswith("nothing to compare"), why
    killed = [GLIBC + LOST.format(port=p) + summary(worker(0, r, -9), worker(1, 1 - r, 1)) for p, r in ((1, 0), (2, 1))]
    port, base = outcome(killed[0])
    base.failure = outcome(killed[1])[0].failure
    label, why = label_case(port, base)
    assert label == "proxy-artifact" and "OOM killer" in why
