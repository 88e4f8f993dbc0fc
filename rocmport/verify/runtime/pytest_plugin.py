"""rocmport's pytest plugin for upstream's unit tests in verify (loaded with `-p`).

Upstream's conftest.py files load as in upstream CI, with one exception: the test-data download
(`tests/test_utils/python_scripts/download_unit_tests_dataset.py`) is replaced by a stub that
raises ImportError, which upstream's `ensure_test_data` fixture reports and ignores. Every other
fixture (`tmp_path_dist_ckpt`, the default dist-checkpoint strategy, ...) is upstream's own.

In CPU-proxy mode it swaps only what proxy mode must: nccl -> gloo (with subgroup rendezvous named
by their members, see proxy_shim), no `cuda.set_device`, one "device" per rank, the CPU-proxy shim,
and the local layer spec (with the memory buffer it needs) where a test asks for Transformer
Engine's and TE is absent. Tests that need CUDA still skip by their own `skipif`; nothing else is
patched, so a port bug still fails. On GPUs it only records outcomes.

For the unported tree (protocol.BASELINE_GUARDS) it adds the minimal guards that let upstream's
modules import when the firewall has removed TE and flash-attn (`is_te_min_version` is False and
`get_fa_version` is 0.0.0 when the package is absent: the port's codemods do the same in source).

For that baseline (protocol.UNIT_ONLY) it runs only the tests a file names, the tests the port did
not pass: every selected file is still collected (its collection error is its outcome there), and the
others are deselected unrecorded. The stage names them there, not as arguments: pytest stops the whole
session ("found no collectors", a usage error) when one test id it is given cannot be collected,
which an id in a module that does not import on the unported tree cannot.

Like upstream's CI in its development environment it deselects the tests marked `flaky_in_dev`
(run_ci_test.sh: -m "not flaky_in_dev"), and records which, for the report.

Each test starts from a random state seeded from its id (_seed): its outcome does not depend on
what the rank drew before it, so the two trees and every rank run it alike.

Between tests it releases what a test leaked: gloo connects every subgroup at creation, with two
worker threads of its own (the proxy shim shares one TCP device, and its event loop, per process),
and megatron's `destroy_model_parallel` only forgets its groups; a group that a test created and
nothing references any more is destroyed after that test or, while something still holds it (the
last failure's traceback, megatron's state while model parallelism is up), after a later one. Two
holders that outlive every test are let go of first: the test's class instance, which pytest keeps on
its item (a model kept on `self`), and TE's caches keyed by a group (GROUP_KEYED_CACHES).

In both modes a per-test watchdog (protocol.UNIT_TEST_TIMEOUT seconds) turns a test that hangs
(ranks waiting on a collective that never completes) into a failure, not a stage without end. A test
whose ranks are still computing at the timeout is slow, not hung (a busy machine): the watchdog
waits while their main threads use CPU, up to SLOW_CAP timeouts, and records it as slow.

Every rank writes its outcomes to <protocol.UNIT_OUT>/rank<RANK>.json after each test (a stage
stopped from outside still shows what ran, and which test was running), with each failure's
exception type, the module a collection error found missing, and the rank's peak threads and
resident memory; once collected, the test ids and how each test file's collection went
(collected<RANK>.json: the stage accounts for every selected file with it)."""

from __future__ import annotations

import gc
import json
import os
import sys
import time
import types

import pytest

from rocmport.verify.runtime import protocol
from rocmport.verify.runtime.seeding import seed_host_generators

SWAPS: list[str] = []
GUARDS: list[str] = []
_STATE: dict[str, str] = {}  # nodeid -> passed | failed | error | skipped
_DETAIL: dict[str, str] = {}  # nodeid -> the exception and its site
_KIND: dict[str, str] = {}  # nodeid -> the exception's type ("AssertionError")
_MISSING: dict[str, str] = {}  # nodeid of a module that did not import -> the module it found missing
_RUNNING: list[str] = []
_HUNG: list[list] = []  # [nodeid, position in the run order, fire time] of each test the watchdog ended
_ORDER: dict[str, int] = {}  # each collected test's position: the same on every rank
_SPANS: dict[str, list] = {}  # nodeid -> [position, start time, end time or None while it runs]
_TIMERS: list = []
_LOCAL_SPEC: list[str] = []  # tests that asked for TE's layer spec and got the local one
_PEAK = {"threads": 0, "rss_mb": 0.0, "released_groups": 0}
_GROUPS_BEFORE: set[int] = set()
_GROUPS_LEFT: set[int] = set()  # groups earlier tests created that are still alive: still theirs to release
_DESELECTED: dict[str, str] = {}  # nodeid -> the marker for which upstream's CI deselects it
_MODULES: dict[str, str] = {}  # test file -> how its collection went: passed | skipped | failed
# (nodeid, phase) of a failure raised through the proxy shim's pass-through -> where, past it
_SITE_PAST_SHIM: dict[tuple[str, str], str | None] = {}

# What upstream's CI deselects in its development environment (latest PyTorch, the one verify
# resembles): tests/unit_tests/run_ci_test.sh runs pytest with -m "not flaky_in_dev" there.
UPSTREAM_CI_DESELECTS = ("flaky_in_dev",)

DATA_DOWNLOAD = "tests.test_utils.python_scripts.download_unit_tests_dataset"

# Port coverage per test file: the stage's records directory (protocol.PORT_SITES, read once), and
# while a test file is collected or runs, its own subdirectory in it (port_sites.unit_dir_name): the
# generated helper reads the variable at each call, so the report and `--record-reach` know which
# file ran which rewritten site. What runs before the first file (conftest.py) stays in the stage's.
_SITES_BASE = protocol.PORT_SITES.read()
_SITES_FILE: list[str] = []


def _sites_for(test_file: str | None) -> None:
    """Point this process's port-site records at ``test_file``'s subdirectory (None: the stage's)."""
    if not _SITES_BASE or _SITES_FILE == [test_file]:
        return
    _SITES_FILE[:] = [test_file] if test_file else []
    where = _SITES_BASE
    if test_file:
        from urllib.parse import quote

        # port_sites.unit_dir_name("test", file), spelled out: this plugin imports nothing of rocmport's analyses
        where = os.path.join(_SITES_BASE, "test=" + quote(test_file, safe=""))
        os.makedirs(where, exist_ok=True)
    protocol.PORT_SITES.set(os.environ, where)


def pytest_collectstart(collector):
    """A test module's imports (guarded NVIDIA-only imports among them) run as it is collected."""
    if isinstance(collector, pytest.Module):
        _sites_for(collector.nodeid.split("::")[0])


def _stub_data_download() -> None:
    """Upstream's conftest imports the test-data downloader (it needs click, requests and the
    network): a stub whose every function raises ImportError, which upstream's fixture catches.
    Any name: the conftest of each line imports its own (v0.15 `get_oldest_release_and_assets`,
    v0.16+ `download_and_extract_asset`)."""
    stub = types.ModuleType(DATA_DOWNLOAD)

    def skipped(*args, **kwargs):
        raise ImportError(
            "rocmport verify: the unit-test data download is skipped (tests that need /opt/data skip or fail)"
        )

    def __getattr__(name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return skipped

    setattr(stub, "__getattr__", __getattr__)
    sys.modules.setdefault(DATA_DOWNLOAD, stub)


_stub_data_download()


_UNSUPPORTED: list[str] = []


def _proxy_swaps() -> None:
    from rocmport.verify.runtime import proxy_shim

    try:
        SWAPS.extend(proxy_shim.install_for_upstream_code())
    except proxy_shim.Unsupported as exc:  # the stage reports it as unsupported-in-proxy, naming the hook
        _UNSUPPORTED.append(str(exc))
        _write()
        pytest.exit(f"rocmport: proxy shim hook missing: {exc}", returncode=4)
    protocol.SHIM_CHILDREN.set(os.environ, True)  # the bootstrap shims the children this rank spawns
    if protocol.TE.read():  # verify --te: TE's own Python layer, its kernels on the CPU
        proxy_shim.install_for_te()
        SWAPS.append(
            f"Transformer Engine {protocol.TE.read()}: TE's Python layer, its compiled kernels as CPU "
            "reference implementations (rocmport.verify.runtime.te_cpu)"
        )
    import importlib.util

    if importlib.util.find_spec("transformer_engine") is None:
        try:
            from megatron.core.models.gpt import gpt_layer_specs
        except ImportError:
            return
        # v0.17+ builds TE's spec from get_gpt_layer_with_transformer_engine_submodules, which tests
        # also call directly; earlier lines have the spec function only. The lowest one present is
        # redirected to its local counterpart (the spec then reaches it through its own call).
        for te_name, local_name in (
            ("get_gpt_layer_with_transformer_engine_submodules", "get_gpt_layer_local_submodules"),
            ("get_gpt_layer_with_transformer_engine_spec", "get_gpt_layer_local_spec"),
        ):
            te_fn, local_fn = getattr(gpt_layer_specs, te_name, None), getattr(gpt_layer_specs, local_name, None)
            if te_fn is not None and local_fn is not None:
                if _redirect_in_place(gpt_layer_specs, te_name, _te_to_local(te_fn, local_fn)):
                    SWAPS.append(f"TE layer spec -> local spec (TE absent): {te_name} -> {local_name}")
                return


def _te_to_local(te_fn, local_fn):
    """A stand-in for TE's layer-spec function ``te_fn`` that builds the local one: the arguments the
    call gave (positional ones by te_fn's signature) that the local function takes too. It records
    the running test and provides the memory buffer the local attention needs."""
    import inspect

    te_sig = inspect.signature(te_fn)
    takes = set(inspect.signature(local_fn).parameters) - {"fp8"}

    def te_spec_without_te(*args, **kwargs):
        nodeid = _RUNNING[0] if _RUNNING else "(collection)"
        if nodeid not in _LOCAL_SPEC:
            _LOCAL_SPEC.append(nodeid)
        _buffer_for_local_attention()
        try:
            given = dict(te_sig.bind(*args, **kwargs).arguments)
        except TypeError:  # not te_fn's signature: let the local function say what is wrong
            return local_fn(*args, **kwargs)
        return local_fn(**{k: v for k, v in given.items() if k in takes})

    return te_spec_without_te


def _redirect_in_place(module, name: str, replacement) -> bool:
    """Make the function ``module.name`` call ``replacement`` instead, in place: its code is
    swapped, so every `from module import name` made before the swap (a module that imported it at
    its top while the plugin was loading) reaches the replacement too, which rebinding the module
    attribute would miss."""
    fn = getattr(module, name, None)
    if not isinstance(fn, types.FunctionType):
        return False
    original = types.FunctionType(fn.__code__, fn.__globals__, name, fn.__defaults__, fn.__closure__)
    fn.__globals__[f"_rocmport_original_{name}"] = original
    fn.__globals__[f"_rocmport_replacement_{name}"] = replacement
    src = f"def {name}(*args, **kwargs):\n    return _rocmport_replacement_{name}(*args, **kwargs)\n"
    scope: dict = {}
    exec(src, {}, scope)
    fn.__code__ = scope[name].__code__.replace(co_name=name)
    fn.__defaults__ = None
    fn.__kwdefaults__ = None
    return True


def _guard(module, name: str, absent_package: str, answer, why: str) -> None:
    """Make ``module.name`` return ``answer`` when ``absent_package`` is not importable, in place
    (every `from module import name` made earlier sees it too)."""
    import importlib.util

    if importlib.util.find_spec(absent_package) is None and _redirect_in_place(module, name, lambda *a, **k: answer):
        GUARDS.append(why)


def _baseline_guards() -> None:
    """The unported tree's collection guards: what the port's codemods change so that upstream's
    modules import when the firewall has removed TE and flash-attn, applied at run time."""
    try:
        from megatron.core import utils
    except ImportError:
        return
    from packaging.version import Version

    _guard(
        utils,
        "is_te_min_version",
        "transformer_engine",
        False,
        "core.utils.is_te_min_version -> False when TE is absent (else it compares None with a Version)",
    )
    _guard(
        utils,
        "get_fa_version",
        "flash_attn",
        Version("0.0.0"),
        "core.utils.get_fa_version -> 0.0.0 when flash-attn is absent (else it asks pip for it)",
    )


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
    if getattr(parallel_state, "_GLOBAL_MEMORY_BUFFER", True) is None and hasattr(
        parallel_state, "_set_global_memory_buffer"
    ):
        parallel_state._set_global_memory_buffer()


# A test with no result after the timeout is hung only if the run's ranks have stopped computing:
# a rank waiting in a collective sleeps, and one starved by other jobs on a busy machine still gets
# some CPU. While their main threads (and the children they reaped) used at least this share of one
# core over the last window, the watchdog waits another window, up to SLOW_CAP windows in all (a
# livelock computes forever).
PROGRESS_SHARE = 0.02
SLOW_CAP = 10
_SLOW: dict[str, float] = {}  # nodeid -> seconds the watchdog waited past the timeout because ranks computed


def _watchdog(nodeid: str) -> None:
    """After the timeout with no CPU progress of the run's ranks (or SLOW_CAP timeouts in all), this
    rank records the test as hung and exits; torchrun then stops the other ranks, and verify starts
    the run again without the tests that have an outcome."""
    seconds = protocol.UNIT_TEST_TIMEOUT.read() or 0.0
    if not seconds:
        return
    from rocmport.machine.cpu_meter import working_seconds

    agent = os.getppid()  # torchrun's agent: the ranks are its children
    start = time.monotonic()
    last = [working_seconds(agent)]

    def fire(busy: float | None) -> None:
        waited = time.monotonic() - start
        _STATE[nodeid] = "failed"
        _KIND[nodeid] = "hang"
        why = (
            "waiting on a collective other ranks never entered"
            if busy is None or busy < _min_progress(seconds)
            else f"the ranks were still computing after {SLOW_CAP} timeouts: a livelock, or a machine too slow for it"
        )
        cpu = (
            f"; the ranks' main threads and reaped children used {busy:.1f} s of CPU in the last {seconds:g} s"
            if busy is not None
            else ""
        )
        _DETAIL[nodeid] = f"hung: no result after {waited:.0f} s on rank {os.environ.get('RANK', '0')} ({why}{cpu})"
        _HUNG.append([nodeid, _SPANS[nodeid][0], time.time()])
        _RUNNING.clear()
        _write()
        os._exit(3)

    def check() -> None:
        if _RUNNING != [nodeid]:  # it finished while this timer was due
            return
        now = working_seconds(agent)
        busy = None if now is None or last[0] is None else now - last[0]
        last[0] = now
        waited = time.monotonic() - start
        if busy is not None and busy >= _min_progress(seconds) and waited < seconds * SLOW_CAP - 1:
            _SLOW[nodeid] = round(waited, 1)  # slow, not hung: another window
            _arm(seconds, check)
            return
        fire(busy)

    _arm(seconds, check)


def _min_progress(seconds: float) -> float:
    return max(0.5, PROGRESS_SHARE * seconds)


def _arm(seconds: float, check) -> None:
    import threading

    timer = threading.Timer(seconds, check)
    timer.daemon = True
    timer.start()
    _TIMERS[:] = [timer]


# ---- what a test leaves behind ---------------------------------------------------------------------


def _c10d():
    try:
        import torch.distributed as dist
        from torch.distributed import distributed_c10d as c10d
    except ImportError:
        return None, None
    return (dist, c10d) if dist.is_available() and dist.is_initialized() else (None, None)


def _internal_refs(pg, c10d) -> int:
    """References torch's own group registry holds to ``pg``."""
    world, n = c10d._world, 0
    for name in dir(type(world)):
        if name.startswith("__"):
            continue
        try:
            value = getattr(world, name)
        except Exception:
            continue
        if isinstance(value, dict):
            n += sum(k is pg for k in value) + sum(v is pg for v in value.values())
            n += sum(x is pg for v in value.values() if isinstance(v, (list, tuple)) for x in v)
        elif isinstance(value, (list, tuple)):
            n += sum(x is pg for x in value)
    return n


def _unreferenced(pg, c10d) -> bool:
    # getrefcount's argument, this frame's `pg`, and the caller's loop variable and list copy.
    return sys.getrefcount(pg) - 4 - _internal_refs(pg, c10d) <= 0


def _release_groups() -> None:
    """Destroy the process groups the tests created that nothing references any more: this test's,
    and those earlier tests left alive (_GROUPS_LEFT). Groups that existed before the tests (a
    session's, the default group) are never touched; megatron's current groups are referenced by
    parallel_state while model parallelism is up, and stay.

    Whether model parallelism is still up does not matter: a test that fails before its
    `destroy_model_parallel` leaves it up, and the next test's `initialize_model_parallel` only
    forgets those groups before it makes its own. Released only once model parallelism was down and
    only the groups of the test that ran, a file whose tests fail in a row (upstream's
    test_attention.py on the proxy: 40 of its parallel-correctness tests) kept every failed test's
    groups, 2 gloo worker threads each, until its 8 ranks held 4036 threads apiece and the machine's
    thread limit ended the run."""
    _GROUPS_LEFT.clear()
    dist, c10d = _c10d()
    if dist is None:
        return
    new = [pg for pg in c10d._world.pg_map if id(pg) not in _GROUPS_BEFORE]
    if not new:
        return
    del new
    _drop_last_failure()
    _forget_cached_groups()
    gc.collect()  # a test's model holds its groups through reference cycles until a collection
    world = c10d.GroupMember.WORLD
    for pg in list(c10d._world.pg_map):
        if pg is world or id(pg) in _GROUPS_BEFORE or not _unreferenced(pg, c10d):
            continue
        try:
            dist.destroy_process_group(pg)
            _PEAK["released_groups"] += 1
        except Exception:  # noqa: BLE001 - a group torch will not destroy stays, as it would upstream
            pass
    _GROUPS_LEFT.update(id(pg) for pg in c10d._world.pg_map if id(pg) not in _GROUPS_BEFORE)


# Functions of the libraries the tests use whose `functools.lru_cache` is keyed by a process group:
# each keeps every group it was asked about (up to 128) for the session. TE's Python layer asks them
# about each TE module's tp_group; their answers (the group's size, this rank in it) are recomputed at
# the next call. The cache's key tuple holds only the group, which the garbage collector does not
# track, so gc.get_referrers does not show it: a group's refcount beyond torch's registry does.
GROUP_KEYED_CACHES = (
    ("transformer_engine.pytorch.distributed", "get_distributed_world_size"),
    ("transformer_engine.pytorch.distributed", "get_distributed_rank"),
)


def _forget_cached_groups() -> None:
    for module_name, name in GROUP_KEYED_CACHES:
        clear = getattr(getattr(sys.modules.get(module_name), name, None), "cache_clear", None)
        if clear is not None:
            clear()


def _let_go_of_test_instance(item) -> None:
    """pytest gives each test of a class a fresh instance and keeps it, with the test method bound to
    it, on the item for the whole session: whatever the test kept on `self` (a model, and through it
    its process groups) outlives the test. pytest lets go of a unittest TestCase's instance at its
    teardown; this does the same for every test class's once the test's teardown has run. pytest makes
    a fresh one if it asks again (a teardown failure's report finds the test's code through it)."""
    held = vars(item)
    if getattr(held.get("_obj"), "__self__", None) is None and held.get("_instance") is None:
        return  # a module's test function, or an instance pytest let go of already
    item._obj = None
    held.pop("_instance", None)


def _drop_last_failure() -> None:
    """pytest keeps the last failed test's exception in sys.last_* for post-mortem debugging, which
    verify's ranks never do: its traceback holds the test's frames, and through them its model and
    process groups, until the next failure. Its report is made by now."""
    for name in ("last_exc", "last_type", "last_value", "last_traceback"):
        if hasattr(sys, name):
            delattr(sys, name)


def _sample_peak() -> None:
    try:
        with open("/proc/self/status") as fh:
            status = dict(line.split(":", 1) for line in fh if ":" in line)
        _PEAK["threads"] = max(_PEAK["threads"], int(status["Threads"].strip()))
        _PEAK["rss_mb"] = max(_PEAK["rss_mb"], round(int(status["VmHWM"].split()[0]) / 1024, 1))
    except (OSError, KeyError, ValueError):
        pass


# ---- hooks ---------------------------------------------------------------------------------------------


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config, parser, args):
    """Before upstream's conftest.py files import megatron: the proxy swaps and baseline guards."""
    if protocol.PROXY.read():
        _proxy_swaps()
    if protocol.BASELINE_GUARDS.read():
        _baseline_guards()


def pytest_collection_modifyitems(session, config, items):
    """Deselect what upstream's CI deselects (UPSTREAM_CI_DESELECTS), on both trees, and record
    each such test: the stage lists them with the reason instead of running tests upstream itself
    does not run."""
    keep, drop = [], []
    for item in items:
        marker = next((m for m in UPSTREAM_CI_DESELECTS if item.get_closest_marker(m) is not None), None)
        if marker:
            _DESELECTED[item.nodeid] = marker
            drop.append(item)
        else:
            keep.append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
    only = _only()
    if only is not None:  # the unported baseline: the tests the port did not pass, nothing else
        named: list[pytest.Item] = []
        other: list[pytest.Item] = []
        for item in items:
            (named if _named(item.nodeid, only) else other).append(item)
        if other:
            config.hook.pytest_deselected(items=other)
            items[:] = named


def _only() -> set[str] | None:
    """The test ids and files protocol.UNIT_ONLY's file names (None: unset, every test runs)."""
    path = protocol.UNIT_ONLY.read()
    if not path:
        return None
    with open(path, encoding="utf-8") as fh:
        return {line.rstrip("\n") for line in fh if line.strip()}


def _named(nodeid: str, only: set[str]) -> bool:
    """Whether ``nodeid`` is a test ``only`` names: itself, or a test of a file or class it names."""
    parts = nodeid.split("::")
    return any("::".join(parts[:i]) in only for i in range(1, len(parts) + 1))


def pytest_collection_finish(session):
    _sites_for(None)
    _ORDER.update((item.nodeid, i) for i, item in enumerate(session.items))
    _write_collected(session.items)
    # Every test's teardown collects garbage (_release_groups) in a process that holds torch,
    # megatron and the collected test modules: about 0.5 million objects, 0.55 s for a full
    # collection, on each of 8 ranks sharing the machine's cores (most of a suite's time on 2
    # cores). What exists now lives for the whole session: frozen, a collection scans only what
    # the tests create since (milliseconds). Unfrozen at the end, for the interpreter's own cleanup.
    gc.freeze()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    _seed(item.nodeid)


def _seed(nodeid: str) -> None:
    """Start ``nodeid`` from one random state, whatever ran before it: Python's, numpy's and torch's
    generators seeded from its id, before its fixtures and setup. Upstream's tests that draw without
    seeding (a model built with `use_cpu_initialization` draws from torch's CPU generator, which
    `model_parallel_cuda_manual_seed` leaves alone) otherwise depend on the rank's history: what
    earlier tests, the port's code or a restart drew. Then a chance draw can fail one rank on one tree
    and be labelled a port-regression; seeded, both trees and every rank run each test from the same
    state (as pytest-randomly resets the seeds before each test)."""
    import zlib

    seed_host_generators(zlib.crc32(nodeid.encode()), imported_only=True)


def pytest_runtest_logstart(nodeid, location):
    _sites_for(nodeid.split("::")[0])
    _RUNNING[:] = [nodeid]
    _SPANS[nodeid] = [_ORDER.get(nodeid, len(_ORDER)), time.time(), None]
    dist, c10d = _c10d()
    _GROUPS_BEFORE.clear()
    if dist is not None:
        _GROUPS_BEFORE.update(id(pg) for pg in c10d._world.pg_map if id(pg) not in _GROUPS_LEFT)
    _write()
    _watchdog(nodeid)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    yield
    _sample_peak()
    _let_go_of_test_instance(item)
    _release_groups()


def pytest_runtest_logfinish(nodeid, location):
    while _TIMERS:
        _TIMERS.pop().cancel()
    if nodeid in _SPANS:
        _SPANS[nodeid][2] = time.time()
    _RUNNING.clear()
    _write()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed and call.excinfo is not None and item.nodeid not in _KIND:
        _KIND[item.nodeid] = call.excinfo.typename  # the exception's type, as raised (setup, call or teardown)
    if report.failed and call.excinfo is not None:
        _SITE_PAST_SHIM[(item.nodeid, report.when)] = _site_past_hand_ons(call.excinfo.tb)


def _site_past_hand_ons(tb) -> str | None:
    """Where an exception was raised ("path:line"), when its innermost frame is the proxy shim handing a
    call on unchanged: the innermost frame past the shim's hand-ons (proxy_causes.without_hand_ons),
    where a GPU run, without the shim, would have raised it. None when the innermost frame is another."""
    import traceback

    from rocmport.verify.runtime.proxy_causes import without_hand_ons

    frames = [(f.filename, f.name, f.lineno) for f in reversed(traceback.extract_tb(tb))]
    kept = without_hand_ons(frames)
    if not frames or not kept or kept[0] == frames[0]:
        return None
    path, _, line = kept[0]
    return f"{os.path.relpath(path) if os.path.isabs(path) else path}:{line}"


def pytest_runtest_logreport(report):
    if report.when == "call" or report.outcome != "passed":
        key = report.nodeid
        state = _STATE.setdefault(key, "passed")
        if report.outcome == "failed":
            _STATE[key] = "failed" if report.when == "call" else "error"
            _DETAIL[key] = _failure_line(report.longrepr, _SITE_PAST_SHIM.pop((key, report.when), None))
        elif report.outcome == "skipped" and state == "passed":
            _STATE[key] = "skipped"


def pytest_collectreport(report):
    if "::" not in report.nodeid and report.nodeid.endswith(".py"):
        _MODULES[report.nodeid] = report.outcome
    if report.failed:  # a module that does not even import: every test in it is an error
        _STATE[report.nodeid] = "error"
        _DETAIL[report.nodeid] = _failure_line(report.longrepr)
        _KIND[report.nodeid] = _exception_type(report.longrepr)
        missing = _missing_module(report.longrepr)
        if missing:
            _MISSING[report.nodeid] = missing


def _exception_type(longrepr) -> str:
    """The exception type of a collection error, from pytest's report of it ("E   ModuleNotFoundError: ...")."""
    import re

    found = re.findall(r"^E\s+([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Warning))\b", str(longrepr or ""), re.M)
    return found[-1].rsplit(".", 1)[-1] if found else "CollectError"


def _missing_module(longrepr) -> str | None:
    import re

    m = re.search(r"ModuleNotFoundError: No module named '([^']+)'", str(longrepr or ""))
    return m.group(1) if m else None


def _failure_line(longrepr, site: str | None = None) -> str:
    """The exception and where it was raised ("AssertionError: global memory buffer is not
    initialized at megatron/core/parallel_state.py:2048"); pytest's last line alone drops the message.
    ``site``: where, in place of pytest's innermost frame (_site_past_hand_ons)."""
    if not longrepr:
        return ""
    crash = getattr(longrepr, "reprcrash", None)
    if crash is not None and crash.message:
        path = os.path.relpath(crash.path) if os.path.isabs(crash.path) else crash.path
        return f"{' '.join(crash.message.split())[:240]} at {site or f'{path}:{crash.lineno}'}"
    lines = [ln for ln in str(longrepr).strip().splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("E ")]
    return (errors[-1] if errors else lines[-1])[:300] if lines else ""


def pytest_sessionfinish(session, exitstatus):
    gc.unfreeze()
    _sample_peak()
    _write(int(exitstatus))
    # torchrun stops every rank as soon as one exits non-zero: a rank that finished first with a
    # failed test would cut its slower peers short and lose their outcomes. The outcomes travel in
    # the rank files; pytest's own status (kept there) is not the stage's verdict. Other statuses
    # (interrupted, usage error, internal error) still stop the run.
    if int(exitstatus) == 1:  # pytest.ExitCode.TESTS_FAILED
        session.exitstatus = 0


def _write_collected(items) -> None:
    """What this rank's pytest collected, once per run (not with each test's record: a whole suite's
    ids): the stage accounts for every selected file from it (a file with tests that never got an
    outcome did not run)."""
    out = protocol.UNIT_OUT.read()
    if not out:
        return
    path = os.path.join(out, f"collected{os.environ.get('RANK', '0')}.json")
    from rocmport.fsutil import write_file

    write_file(path, json.dumps({"items": [item.nodeid for item in items], "modules": _MODULES}), durable=False)


def _write(exitstatus: int | None = None) -> None:
    out = protocol.UNIT_OUT.read()
    if not out:
        return
    path = os.path.join(out, f"rank{os.environ.get('RANK', '0')}.json")
    from rocmport.fsutil import write_file

    write_file(
        path,
        json.dumps(
            {
                "outcomes": _STATE,
                "details": _DETAIL,
                "kinds": _KIND,
                "missing": _MISSING,
                "swaps": SWAPS,
                "guards": GUARDS,
                "unsupported": _UNSUPPORTED,
                "running": _RUNNING,
                "spans": _SPANS,
                "rank": int(os.environ.get("RANK", "0")),
                "hung": _HUNG,
                "slow": _SLOW,
                "local_spec": _LOCAL_SPEC,
                "peak": _PEAK,
                "deselected": _DESELECTED,
                "exitstatus": exitstatus,
            }
        ),
        durable=False,  # rewritten after every test: a temp directory's file, not a journal
    )
