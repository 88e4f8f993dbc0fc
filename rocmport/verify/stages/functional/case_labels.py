"""Stage 4's baseline and labels: a case that fails on the port runs again on the unported tree (stage
3's checkout of the lock's base commit, unit_tests.baseline, with the same plan, args and ranks), and
gets stage 3's labels by comparing the two failures:

- port-regression: the unported tree passes it, or the port's run failed inside the port's own
  generated helper (megatron/core/_rocm.py: no upstream path raises there, whatever the unported tree
  did; unless the proxy's shim acted in that traceback), or an FP8 case's losses differ from its
  CUDA-path twin's (case_run._twin: the port's own two paths, no unported run needed) (the only label
  that fails the stage);
- upstream-known: both fail at the same place (the innermost frame inside the tree, by path and
  function) with the same message (tree paths, addresses and a check's figures normalised);
- proxy-artifact: as upstream-known, where both failures pass through a frame where the CPU proxy's
  shim (rocmport/verify/runtime/proxy_shim.py) acted, naming the shim's mechanism (its pass-through,
  a call it handed on unchanged, is not one: runtime.proxy_causes); or where the message says the CPU
  backend lacks something a GPU has (proxy_causes.CPU_BACKEND_LACKS: "Torch not compiled with CUDA
  enabled", pin_memory's "requires a CUDA or other accelerator backend", ...), naming it; or where the
  machine ran out of a resource on both; or where both stop before the first iteration with a message
  naming a quantity verify's shrink changed (case_plan.shrink_changes: "verify's shrink: <the change>,
  <the error>"): the shrink, not upstream, may have made it;
- needs-nvidia-only: as upstream-known, where the failure names a package the firewall removes;
- unverified: the unported tree cannot run it for a reason of its own (it stops earlier, elsewhere,
  or the proxy cannot run it there), or both trees drift from the golden (the golden is in question);
  the reason says which. It passes the stage, except where the port's run stopped on a loss that
  failed Megatron's result validation (NaN, Inf or a spike): those numerics are the port's or the
  proxy's own emulation's, and nothing shows them upstream's, so such a case blocks (NUMERICS_BLOCK).

The unported tree's runs are cached like stage 3's (by commit, case, args, torch, Python, the mode
and the overlay's bytes)."""

from __future__ import annotations

import hashlib
import json
import platform
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rocmport.fsutil import atomic_write_text
from rocmport.gitutil import run_git
from rocmport.verify import runtime
from rocmport.verify.runtime import protocol
from rocmport.verify.runtime.proxy_causes import cpu_backend_mechanism
from rocmport.verify.stages.case_plan import ShrinkChange, shrink_named
from rocmport.verify.stages.functional.case_log import DIED, SIGKILL_WHY, fails_result_validation
from rocmport.verify.stages.functional.case_run import TWIN_DIFFERS, CaseOutcome
from rocmport.verify.stages.functional.details import CaseFailure
from rocmport.verify.stages.gpt_training import exhausted
from rocmport.upstreams import UPSTREAMS
from rocmport.verify.stages.unit_tests.baseline import overlay_files, unported_checkout, unported_env
from rocmport.verify.orchestration.stage_result import FAIL, PASS

# What pretrain_gpt.py needs from the port to start on the proxy at all, with why. Upstream's
# initialize_megatron builds the legacy fused kernels on every start: `fused_kernels.load()` runs
# `_get_cuda_bare_metal_version(cpp_extension.CUDA_HOME)`, `None + "/bin/nvcc"` without a CUDA
# toolkit (a TypeError before the first iteration). The port's load() returns early there
# (codemod fused-kernel-fallbacks); the kernels are never used by the proxy's fp32 runs.
START_OVERLAY = {
    "megatron/legacy/fused_kernels/__init__.py": (
        "upstream's fused_kernels.load() calls nvcc from CUDA_HOME, which is None without a CUDA "
        "toolkit; the port's returns early (fused-kernel-fallbacks)"
    ),
}

# What the unported tree's runs leave out of the port's environment, with why: verify's HIP simulation
# sets the attention variables AMD's images bake (hip_sim.child_env: NVTE_FLASH_ATTN=0,
# NVTE_FUSED_ATTN=1); upstream's language_module asserts them unset for any --attention-backend but
# auto (check_and_set_env_variable), which the port reconciles on HIP (codemod attention-backend-env).
# Left in, every case with an explicit backend stops there on the unported tree.
START_ENV_UNSET = {
    "NVTE_FLASH_ATTN": "AMD's images set it; upstream asserts it unset with --attention-backend (attention-backend-env)",
    "NVTE_FUSED_ATTN": "AMD's images set it; upstream asserts it unset with --attention-backend (attention-backend-env)",
}

# The proxy shim's functions, by the mechanism each is (the innermost frame of a traceback where the
# shim acted: proxy_causes.acting_shim_frame; __torch_function__ there redirected the call it got).
_SHIM_MECHANISMS = {
    "__torch_function__": "its TorchFunctionMode (CudaToCpu: device='cuda' made cpu, .cuda() a no-op, device RNG)",
    "on_device_rng": "its device RNG (random ops drawn from a CPU generator standing in for the GPU's)",
    "redirected": "a torch.cuda call answered on the CPU",
    "apply": "custom autograd backwards re-entered under its TorchFunctionMode",
    "init_process_group": "nccl made gloo",
    "_new_group_with_tag": "subgroups made on gloo",
    "all_to_all_single": "all_to_all_single's split sizes as lists (gloo)",
    # a failed upstream check (after_script.PROXY_LINES): a line the proxy prints otherwise than a GPU
    "current_device": "torch.cuda.current_device() answered 'cpu' (a GPU answers the rank's device index), "
    "which megatron prints where upstream's check expects a number",
}


@dataclass
class BaselineRun:
    """The unported tree's run of a case (`baseline` of the case in the report): its status and
    reason, how it failed, its losses, the commit, whether it came from the cache, the overlay."""

    commit: str
    status: str
    reason: str
    seconds: float
    losses: list[float] = field(default_factory=list)
    failure: CaseFailure | None = None
    cached: bool = False
    overlay: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "commit": self.commit,
            "status": self.status,
            "reason": self.reason,
            "seconds": round(self.seconds, 2),
            "losses": self.losses,
            "cached": self.cached,
            "overlay": self.overlay,
        }
        if self.failure is not None:
            out["failure"] = self.failure.to_dict()
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> BaselineRun:
        failure = CaseFailure.from_dict(d["failure"]) if isinstance(d.get("failure"), dict) else None
        return cls(
            str(d["commit"]),
            str(d["status"]),
            str(d["reason"]),
            float(d.get("seconds") or 0.0),
            [float(x) for x in d.get("losses") or []],
            failure,
            bool(d.get("cached")),
            list(d.get("overlay") or []),
        )


def baseline_overlay(tree: Path, base: str) -> list[str]:
    """Stage 3's overlay (the port's test files and generated helpers) and what pretrain_gpt.py needs
    to start (START_OVERLAY), where the port changed it."""
    changed = set(run_git("diff", "--name-only", base, "--", *START_OVERLAY, cwd=tree, check=False).stdout.split())
    return sorted(set(overlay_files(tree, base)) | {f for f in START_OVERLAY if f in changed and (tree / f).is_file()})


def cache_path(
    cache_dir: Path,
    base: str,
    case: str,
    port_command: str,
    env: dict,
    overlay_digest: str,
    env_unset: list[str] | None = None,
    checks: list[str] | None = None,
) -> Path:
    """Where the unported tree's run of ``case`` is kept: keyed by what makes a run differ (the
    port's args, its temporary directory as ${WORK}; torch, Python, the mode, TE, the overlay, the proxy's
    own sources (runtime.source_digest), and the
    variables verify left out of the case's runs, ``env_unset``: the port run's proxy_env says which),
    and by what decides it: upstream's AFTER_SCRIPT checks, ``checks`` (a run kept before verify decided
    them was judged otherwise)."""
    import torch

    args = re.sub(r"\S*/rocmport-func-[^/\s]+", "${WORK}", port_command.split("pretrain_gpt.py", 1)[-1])
    key = json.dumps(
        [
            base,
            case,
            args,
            torch.__version__,
            platform.python_version(),
            protocol.PROXY.raw(env),
            protocol.HIP_SIM.raw(env),
            protocol.TE.raw(env),
            overlay_digest,
            runtime.source_digest(),  # the proxy both trees' runs stood on
            sorted(START_ENV_UNSET),  # what the unported tree's runs leave out of the environment
            # and what the case's plan left out (an FSDP case's launch-profile CUDA_DEVICE_MAX_CONNECTIONS):
            # a run made before, with it, stopped at upstream's assertion and is no baseline for one without
            *([sorted(env_unset)] if env_unset else []),
            *([[CHECKS_COMPARED_AS, checks]] if checks else []),
        ]
    )
    return cache_dir / "functional-baselines" / f"{base[:12]}-{hashlib.sha256(key.encode()).hexdigest()[:20]}.json"


def run_baseline(
    tree: Path,
    base: str,
    port: CaseOutcome,
    env: dict,
    cache_dir: Path,
    run: Callable[[Path, dict], CaseOutcome],
) -> BaselineRun:
    """``run`` (the port's case, with the same plan, args and ranks) on the unported tree at ``base``
    with the baseline overlay, from the cache when it has it."""
    overlay = baseline_overlay(tree, base)
    digest = hashlib.sha256(b"".join((tree / f).read_bytes() for f in overlay)).hexdigest()[:16]
    unset = sorted(k for k in (port.run.proxy_env if port.run else {}) if " unset (" in k)
    decided = port.run.upstream_checks if port.run else None
    checks = (
        [str(c["check"]) for c in decided["checks"]] + [f"exit status decides: {decided['exit_status_decides']}"]
        if decided
        else None
    )
    cached = cache_path(cache_dir, base, port.case, port.run.command if port.run else "", env, digest, unset, checks)
    if cached.is_file():
        got = BaselineRun.from_dict(json.loads(cached.read_text()))
        got.cached = True
        return got
    with unported_checkout(tree, base, overlay) as checkout:
        benv = {k: v for k, v in unported_env(env, tree, checkout).items() if k not in START_ENV_UNSET}
        out = run(checkout, benv)
    losses = out.run.losses if out.run else []
    got = BaselineRun(
        base, out.result.status, out.result.reason, out.result.seconds, losses, out.failure, False, overlay
    )
    atomic_write_text(cached, json.dumps(got.to_dict(), indent=1, sort_keys=True))
    return got


# How a case decided by upstream's checks is kept in the cache: a failed check's message as the YAML writes it.
# Say otherwise here when that changes, so runs kept the old way are not compared with new ones.
CHECKS_COMPARED_AS = "decided by upstream's checks, a failed one quoted as the YAML writes it"


# --- the labels -------------------------------------------------------------------------------------


def shim_mechanism(frame: str) -> str:
    """The proxy shim's mechanism a frame ("function (proxy_shim.py:N)") is."""
    func = frame.split(" ", 1)[0]
    return f"the CPU proxy's shim, {_SHIM_MECHANISMS.get(func, func)}, at {frame}"


def _same(port: CaseFailure, base: CaseFailure) -> bool:
    return (port.phase, port.message, port.site) == (base.phase, base.message, base.site)


def _signal(f: CaseFailure) -> str | None:
    """The signal a failure says a rank died of (case_log.DIED: "9 (SIGKILL)"), or None."""
    m = re.match(rf"{re.escape(DIED)} (\d+ \(\w+\))", f.message)
    return m.group(1) if m else None


def _where(f: CaseFailure) -> str:
    phase = {"run": "in the uninterrupted run", "resume": "in the resumed run", "check": "in a check"}.get(
        f.phase, f.phase
    )
    return f"{phase}" + (f" at {f.site}" if f.site else "") + f": {f.message[:200]}"


# Said of an unverified case whose run stopped on a loss that failed Megatron's result validation.
NUMERICS_BLOCK = (
    "its loss failed Megatron's result validation (NaN, Inf or a spike) on the port: numerics of the port or of "
    "the proxy's own emulation (TE's CPU kernels, the shim) that nothing shows to be upstream's, so it blocks"
)


def blocks_on_numerics(label: str | None, failure: CaseFailure | None) -> bool:
    """An unverified case whose run stopped on a loss that failed Megatron's result validation (NUMERICS_BLOCK)."""
    return label == "unverified" and failure is not None and fails_result_validation(failure.message)


def twin_differs(failure: CaseFailure | None) -> bool:
    """A case that failed because its ROCm run's losses differ from its CUDA-path twin's (case_run._twin)."""
    return failure is not None and failure.phase == "check" and TWIN_DIFFERS in failure.message


def label_case(
    port: CaseOutcome,
    base: BaselineRun | None,
    blocked: tuple[str, ...] = (),
    changes: list[ShrinkChange] | None = None,
) -> tuple[str, str]:
    """A failing case's label and why, by what the unported tree did with it (the module docstring);
    ``changes``: what verify changed about the case to run it (case_plan.shrink_changes; None: nothing,
    a GPU run has no plan)."""
    label, why = _label(port, base, blocked, changes or [])
    return (label, f"{why}; {NUMERICS_BLOCK}") if blocks_on_numerics(label, port.failure) else (label, why)


def _label(
    port: CaseOutcome, base: BaselineRun | None, blocked: tuple[str, ...], changes: list[ShrinkChange]
) -> tuple[str, str]:
    if twin_differs(port.failure):
        return (
            "port-regression",
            "the port's ROCm path trained otherwise than its own CUDA path with the same FP8 arithmetic (its "
            "CUDA-path twin): TE's other ROCm deltas change which checks pass, not what is computed, so the "
            "difference is the port's HIP path's, whatever the unported tree does",
        )
    if base is None:
        return "unverified", "no unported commit to compare with (the tree was not made by rocmport apply)"
    if base.status == PASS:
        return "port-regression", f"passes on the unported tree at {base.commit[:12]}: the port broke it"
    pf, bf = port.failure, base.failure
    if pf is not None and not pf.shim and (helper := in_port_helper(pf.site)):
        return (
            "port-regression",
            f"fails in the port's own code ({_where(pf)}): upstream's library has no {helper}, so no upstream "
            f"path raises there, whatever the unported tree does (it {base.status}s here: {base.reason[:200]})",
        )
    if base.status != FAIL or bf is None or pf is None:
        return "unverified", f"the unported tree cannot run it here ({base.status}: {base.reason[:200]})"
    died, base_died = _signal(pf), _signal(bf)
    if died and base_died and pf.phase == bf.phase:
        # compared by the signal alone: which rank it struck and the survivors' lost connections (their ports)
        # differ from run to run, and a signal is no message to tell two trees' failures alike by
        if died == base_died == "9 (SIGKILL)":
            return "proxy-artifact", f"fails the same way on the unported tree: {SIGKILL_WHY}"
        return (
            "unverified",
            f"a rank died of a signal on both trees ({_where(pf)}; on the unported tree {_where(bf)}): "
            "nothing to compare",
        )
    if not _same(pf, bf):
        return "unverified", f"fails differently on the unported tree ({_where(bf)}; here {_where(pf)})"
    if pf.phase == "check" and "drift from the golden" in pf.message:
        return (
            "unverified",
            "both trees drift from the golden the same way: the golden, not the port, is in question (--record-golden)",
        )
    if pf.shim and bf.shim:  # both through a frame where the shim acted (a cached run's may name its pass-through)
        return (
            "proxy-artifact",
            f"fails the same way on the unported tree ({_where(pf)}), through {shim_mechanism(pf.shim)}",
        )
    if cpu := cpu_backend_mechanism(pf.message):
        return "proxy-artifact", f"fails the same way on the unported tree ({_where(pf)}), through {cpu}"
    if "signal 9 (SIGKILL)" in pf.message:
        return "proxy-artifact", f"fails the same way on the unported tree: {SIGKILL_WHY}"
    if pf.message.startswith(DIED) or "without a Python exception" in pf.message:
        # a signal or an exit code is no message: two trees dying so are not known to fail alike
        return (
            "unverified",
            f"the ranks died without a Python exception on both trees ({pf.message}): nothing to compare",
        )
    if resource := exhausted(pf.message):
        return (
            "proxy-artifact",
            f"fails the same way on the unported tree: this machine ran out of a resource ({resource})",
        )
    if needs := next((m for m in blocked if re.search(rf"No module named '{re.escape(m)}\b", pf.message)), None):
        return (
            "needs-nvidia-only",
            f"fails the same way on the unported tree: it needs {needs}, which the firewall removes here",
        )
    if named := shrunk_by(port, changes):
        return (
            "proxy-artifact",
            f"verify's shrink: {'; '.join(c.describe() for c in named)}, {_where(pf)} (the same on the unported tree "
            f"at {base.commit[:12]}, before the first iteration: the message names what verify changed about the case)",
        )
    return "upstream-known", f"fails the same way on the unported tree at {base.commit[:12]} ({_where(pf)})"


def in_port_helper(site: str | None) -> str | None:
    """The port's generated helper (megatron/core/_rocm.py, ...) a failure's innermost tree frame is in, or
    None. The port writes that file whole and upstream's library never imports it (the baseline's overlay
    copies it for the port's test files only), so a failure raised there is the port's: an unplanned FP8
    refusal (a planned one passes the case before any label), a gate called wrongly. Not the rewritten
    lines in upstream's files: a failure's site names no line, and the functions around them are upstream's."""
    path = (site or "").split(" (", 1)[0]
    return path if path in {u.helper_path for u in UPSTREAMS.values()} else None


def shrunk_by(port: CaseOutcome, changes: list[ShrinkChange]) -> list[ShrinkChange]:
    """What verify changed about the case (``changes``) that the port's failure names, where the run stopped
    before its first iteration (argument validation, the model's construction, the schedule's checks on the
    batch): a check of a size verify chose, not upstream's; [] otherwise (a failure in training is
    training's, whatever words its message has)."""
    failure = port.failure
    if failure is None or failure.phase != "run" or (port.run is not None and port.run.losses):
        return []
    return shrink_named(changes, failure.message)
