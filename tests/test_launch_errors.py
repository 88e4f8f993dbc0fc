"""What a stage says when a launch fails or a run ends early: the exception a rank raised (not the
source line that raised it), and the machine's process-id limit when the ranks' threads came near it."""

from __future__ import annotations

import subprocess

from rocmport.machine.cpu_meter import task_limit, task_limit_phrase
from rocmport.verify.stages.gpt_training import _last_error


def failed(stderr: str) -> subprocess.CompletedProcess:
    return subprocess.CompletedProcess(["torchrun"], 1, "", stderr)


def test_the_reason_is_the_exception_a_rank_raised_not_the_line_that_raised_it():
    # what verify's stage 5 said on v0.19 with TE: "training through GPTModelProvider failed: [rank3]:     raise RuntimeError("
    stderr = (
        "[rank3]: Traceback (most recent call last):\n"
        '[rank3]:   File "/t/megatron/bridge/training/train.py", line 9, in step\n'
        "[rank3]:     raise RuntimeError(\n"
        "[rank3]: RuntimeError: the device of the expert weights is not the input's\n"
        "E1126 torch/distributed/elastic/multiprocessing/api.py failed (exitcode: 1)\n"
    )
    assert _last_error(failed(stderr)) == "RuntimeError: the device of the expert weights is not the input's"
    assert (
        _last_error(failed("ModuleNotFoundError: No module named 'x'\n")) == "ModuleNotFoundError: No module named 'x'"
    )
    assert _last_error(failed("torch.OutOfMemoryError: out of memory\n")) == "torch.OutOfMemoryError: out of memory"
    # no exception line: the first line that mentions an error, else the last line
    assert _last_error(failed("warning\nsomething errored here\nlast\n")) == "something errored here"
    assert _last_error(failed("only this\n")) == "only this"
    assert _last_error(failed("")) == "no output"


def test_a_run_near_the_machine_s_task_limit_says_so():
    # v0.19's stage 3 with TE: 8 ranks at 4052 threads each on a machine with pid_max 32768
    text = task_limit_phrase(4052, 8, 32768)
    assert text is not None and "32416 of this machine's limit of 32768" in text and "kernel.pid_max" in text
    assert task_limit_phrase(4052, 8, 4194304) is None  # far from a modern default
    assert task_limit_phrase(100, 8, None) is None  # /proc does not say
    limit = task_limit()
    assert limit is None or limit > 0


def test_the_threads_running_count_sees_a_process_s_threads_and_the_shell_s_fork_failure_is_exhaustion():
    import threading

    from rocmport.machine.cpu_meter import threads_running
    from rocmport.verify.stages.gpt_training import exhausted

    before = threads_running()
    stop = threading.Event()
    extra = [threading.Thread(target=stop.wait) for _ in range(20)]
    for t in extra:
        t.start()
    try:
        during = threads_running()
    finally:
        stop.set()
        for t in extra:
            t.join()
    assert before and during and during >= 20  # this process's 20 extra threads are counted
    # bash, when fork() meets the task limit: "bash: fork: retry: Resource temporarily unavailable" or this
    assert exhausted("bash: fork: Cannot fork") == "Cannot fork"
    assert exhausted("RuntimeError: a bug") is None
