"""rocmport's pytest plugin for upstream's unit tests in verify (loaded with `-p`).

In CPU-proxy mode it swaps only what proxy mode must: nccl -> gloo (with subgroup rendezvous named
by their members, see proxy_shim), no `cuda.set_device`, one "device" per rank, the CPU-proxy shim,
and the local layer spec (with the memory buffer it needs) where a test asks for Transformer
Engine's and TE is absent. Tests that need CUDA still skip by their own `skipif`; nothing else is
patched, so a port bug still fails. On GPUs it only records outcomes.

In both modes a per-test watchdog ($ROCMPORT_UNIT_TEST_TIMEOUT seconds) turns a test that hangs
(ranks waiting on a collective that never completes) into a failure, not a stage without end.

Every rank writes its outcomes to $ROCMPORT_UNIT_OUT/rank<RANK>.json after each test (a stage
stopped from outside still shows what ran, and which test was running)."""

from __future__ import annotations

import json
import os

SWAPS: list[str] = []
_STATE: dict[str, str] = {}   # nodeid -> passed | failed | error | skipped
_DETAIL: dict[str, str] = {}  # nodeid -> the exception and its site
_RUNNING: list[str] = []
_HUNG: list[list] = []  # [nodeid, start time] of each test the watchdog ended
_TIMERS: list = []
_LOCAL_SPEC: list[str] = []  # tests that asked for TE's layer spec and got the local one


def _proxy_swaps() -> None:
    from rocmport.verify import proxy_shim

    SWAPS.extend(proxy_shim.install_for_upstream_code())
    import importlib.util

    if importlib.util.find_spec("transformer_engine") is None:
        try:
            from megatron.core.models.gpt import gpt_layer_specs
        except ImportError:
            return
        local = gpt_layer_specs.get_gpt_layer_local_spec

        def te_spec_without_te(*args, **kwargs):
            nodeid = _RUNNING[0] if _RUNNING else "(collection)"
            if nodeid not in _LOCAL_SPEC:
                _LOCAL_SPEC.append(nodeid)
            _buffer_for_local_attention()
            names = ("num_experts", "moe_grouped_gemm", "qk_layernorm", "multi_latent_attention")
            return local(**{k: v for k, v in kwargs.items() if k in names})

        gpt_layer_specs.get_gpt_layer_with_transformer_engine_spec = te_spec_without_te
        SWAPS.append("TE layer spec -> local spec (TE absent)")


def _buffer_for_local_attention() -> None:
    """The local spec's DotProductAttention takes its scratch tensor from parallel_state's global
    memory buffer, which TE's attention never asks for: a test written for TE may build its model
    without initialize_model_parallel (the custom-process-group tests do). Where the plugin gives
    such a test the local spec, it provides that buffer too, if nothing has; the test's own
    teardown (destroy_model_parallel) frees it."""
    try:
        from megatron.core import parallel_state
    except ImportError:
        return
    if getattr(parallel_state, "_GLOBAL_MEMORY_BUFFER", True) is None and hasattr(parallel_state, "_set_global_memory_buffer"):
        parallel_state._set_global_memory_buffer()


def _watchdog(nodeid: str) -> None:
    """After the timeout this rank records the test as hung and exits; torchrun then stops the
    other ranks, and verify starts the run again without the tests that have an outcome."""
    import time

    started = time.time()
    seconds = float(os.environ.get("ROCMPORT_UNIT_TEST_TIMEOUT") or 0)
    if not seconds:
        return
    import threading

    def fire():
        _STATE[nodeid] = "failed"
        _DETAIL[nodeid] = (f"hung: no result after {seconds:g} s on rank {os.environ.get('RANK', '0')} "
                           "(waiting on a collective other ranks never entered)")
        _HUNG.append([nodeid, started])
        _RUNNING.clear()
        _write()
        os._exit(3)

    timer = threading.Timer(seconds, fire)
    timer.daemon = True
    timer.start()
    _TIMERS.append(timer)


def pytest_configure(config):
    if os.environ.get("ROCMPORT_PROXY") == "1":
        _proxy_swaps()


def pytest_runtest_logstart(nodeid, location):
    _RUNNING[:] = [nodeid]
    _write()
    _watchdog(nodeid)


def pytest_runtest_logfinish(nodeid, location):
    while _TIMERS:
        _TIMERS.pop().cancel()
    _RUNNING.clear()
    _write()


def pytest_runtest_logreport(report):
    if report.when == "call" or report.outcome != "passed":
        key = report.nodeid
        state = _STATE.setdefault(key, "passed")
        if report.outcome == "failed":
            _STATE[key] = "failed" if report.when == "call" else "error"
            _DETAIL[key] = _failure_line(report.longrepr)
        elif report.outcome == "skipped" and state == "passed":
            _STATE[key] = "skipped"


def pytest_collectreport(report):
    if report.failed:  # a module that does not even import: every test in it is an error
        _STATE[report.nodeid] = "error"
        _DETAIL[report.nodeid] = _failure_line(report.longrepr)


def _failure_line(longrepr) -> str:
    """The exception and where it was raised ("AssertionError: global memory buffer is not
    initialized at megatron/core/parallel_state.py:2048"); pytest's last line alone drops the message."""
    if not longrepr:
        return ""
    crash = getattr(longrepr, "reprcrash", None)
    if crash is not None and crash.message:
        path = os.path.relpath(crash.path) if os.path.isabs(crash.path) else crash.path
        return f"{' '.join(crash.message.split())[:240]} at {path}:{crash.lineno}"
    return str(longrepr).strip().splitlines()[-1][:300]


def pytest_sessionfinish(session, exitstatus):
    _write(int(exitstatus))
    # torchrun stops every rank as soon as one exits non-zero: a rank that finished first with a
    # failed test would cut its slower peers short and lose their outcomes. The outcomes travel in
    # the rank files; pytest's own status (kept there) is not the stage's verdict. Other statuses
    # (interrupted, usage error, internal error) still stop the run.
    if int(exitstatus) == 1:  # pytest.ExitCode.TESTS_FAILED
        session.exitstatus = 0


def _write(exitstatus: int | None = None) -> None:
    out = os.environ.get("ROCMPORT_UNIT_OUT")
    if not out:
        return
    path = os.path.join(out, f"rank{os.environ.get('RANK', '0')}.json")
    with open(path + ".tmp", "w") as fh:
        json.dump({"outcomes": _STATE, "details": _DETAIL, "swaps": SWAPS, "running": _RUNNING, "hung": _HUNG,
                   "local_spec": _LOCAL_SPEC, "exitstatus": exitstatus}, fh)
    os.replace(path + ".tmp", path)
