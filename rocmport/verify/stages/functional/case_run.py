"""Stage 4's one case, run: the uninterrupted run under torchrun saving its checkpoint half way,
the run resumed from it, the checks on their logs and this device kind's golden (run_case, split
by concern; stage_functional is the same as a stage result), and how it failed."""

from __future__ import annotations

import json
import re
import subprocess
import tempfile
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rocmport import output
from rocmport.fsutil import atomic_write_text
from rocmport.verify.orchestration.device_kind import DeviceKind
from rocmport.verify.orchestration.launcher import Launcher
from rocmport.verify.orchestration.stage_result import (
    FAIL,
    PASS,
    SKIPPED,
    UNSUPPORTED,
    StageResult,
    skipped,
    tree_lacks,
)
from rocmport.verify.runtime import protocol
from rocmport.verify.stages import after_script, case_plan
from rocmport.verify.stages.case_plan import CasePlan
from rocmport.verify.stages.gpt_training import took_part

from rocmport.verify.stages.functional.case_args import (
    CASES,
    NAME,
    PROXY_ENV,
    RESUME_TOLERANCE,
    TOLERANCE,
    ResumeSupport,
    _args_difference,
    build_args,
    case_dir,
    cases_near,
    check_case,
    functional_command,
    golden_path,
    load_case,
    nvrx_usable,
    recorded_args,
    resume_support,
    world_size,
)
from rocmport.verify.stages.functional.case_log import (
    cause_line,
    _blocker,
    exception_line,
    expected_resumed,
    failure_of,
    loaded_iteration,
    loss_steps,
    normalise,
    params_norms,
    short_of_iterations,
)
from rocmport.verify.stages.functional.rank_servers import WHY as FORKED_WHY, RankServer, applies
from rocmport.verify.stages.functional.details import (
    CaseFailure,
    FunctionalRun,
    CudaTwin,
    GoldenComparison,
    ResumeCheck,
    ResumeSkipped,
    upstream_golden,
)

# megatron's training log: " [2026-11-26 01:30:00] iteration        5/      10 | consumed samples: ..."
_ITERATION = re.compile(r"\biteration\s+(\d+)/\s*(\d+)\s*\|")


# After a run's time limit: how long its launcher has to end its ranks (torchrun gives its workers 30 s
# after SIGTERM before SIGKILL) before it is killed itself.
STOP_GRACE_S = 45.0
# The problems a golden's and an FP8 case's CUDA-path twin's comparison report (case_labels reads them).
GOLDEN_DRIFT = "losses drift from the golden by"
TWIN_DIFFERS = "losses differ from the port's own CUDA path with the same arithmetic"  # no figure: normalise keeps it


def _launch(
    cmd: list[str], tree: Path, env: dict, timeout: float = 1800, what: str = "pretrain_gpt.py"
) -> subprocess.CompletedProcess:
    """subprocess.run(capture_output=True) that says each training iteration as megatron logs it
    (a line per iteration with the elapsed time: a run of minutes is not silent)."""
    import threading

    start = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=tree, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    err: list[str] = []
    reader = threading.Thread(target=lambda: err.append(proc.stderr.read() if proc.stderr else ""), daemon=True)
    reader.start()
    expired = threading.Event()

    def stop() -> None:  # the run's time limit
        expired.set()
        # SIGTERM first: torchrun then ends its workers' sessions (each in its own, killpg) with what they
        # started; killed outright it cannot, and they would keep our pipes open, the read below never ending.
        proc.terminate()
        last = threading.Timer(STOP_GRACE_S, proc.kill)
        last.daemon = True
        last.start()

    timer = threading.Timer(timeout, stop)
    timer.start()
    out: list[str] = []
    try:
        for line in proc.stdout or ():
            out.append(line)
            m = _ITERATION.search(line)
            if m:
                output.info(
                    f"stage 4 {what}: iteration {m.group(1)}/{m.group(2)}, {output.elapsed(time.monotonic() - start)} elapsed"
                )
        proc.wait()
    finally:
        timer.cancel()
        reader.join()
    if expired.is_set():
        raise subprocess.TimeoutExpired(cmd, timeout, "".join(out), "".join(err))
    return subprocess.CompletedProcess(cmd, proc.returncode, "".join(out), "".join(err))


def _failure(
    proc: subprocess.CompletedProcess,
    tree: Path,
    proxy: bool,
    hip: str | None,
    what: str,
    seconds: float,
    details: FunctionalRun,
    short: str | None = None,
) -> StageResult:
    """Why a run of pretrain_gpt.py did not log every iteration: a CPU blocker or a break the HIP
    simulation made (unsupported-in-proxy, naming the site), else a failure. ``short``: for a run that
    exited 0, which of its iterations it logged (short_of_iterations), the reason in place of a stderr line."""
    blocker = _blocker(proc.stderr, tree) if proxy else None
    te_kernel = re.search(r"unsupported-in-proxy: transformer_engine_torch\.\w+[^\n]*", proc.stderr) if proxy else None
    if te_kernel:  # TE's Python layer reached a kernel the CPU proxy has no reference implementation for (verify --te)
        return StageResult(
            NAME, UNSUPPORTED, f"pretrain_gpt.py with TE's Python layer: {te_kernel.group(0)}", seconds, details
        )
    if blocker:
        return StageResult(NAME, UNSUPPORTED, f"pretrain_gpt.py cannot run on CPU: {blocker}", seconds, details)
    if proxy and hip:
        from rocmport.verify.runtime.hip_sim import simulation_break

        site = simulation_break(proc.stderr, tree)
        if site:
            return StageResult(
                NAME,
                UNSUPPORTED,
                f"the HIP simulation breaks {site} (a ROCm build of torch would not)",
                seconds,
                details,
            )
    if proc.returncode == 0 and short:
        return StageResult(NAME, FAIL, f"{what} {short}", seconds, details)
    return StageResult(
        NAME,
        FAIL,
        f"{what} exited {proc.returncode}: {cause_line(proc.stderr, proc.stdout or '')[:500]}",
        seconds,
        details,
    )


@dataclass
class CaseOutcome:
    """One case's run: its result (a stage result of its own), its details (None when it stopped
    before training), and how it failed (None unless it failed)."""

    case: str
    result: StageResult
    run: FunctionalRun | None = None
    failure: CaseFailure | None = None


@dataclass
class CaseSetup:
    """What one case's runs share: the tree and environment, the case's config and plan, the ranks,
    the iterations (the checkpoint at ``half``), and how it runs (proxy, simulated HIP, the launcher)."""

    tree: Path
    env: dict
    case: str
    config: dict
    plan: CasePlan | None
    world: int
    iters: int
    proxy: bool
    data_path: str | None
    launcher: Launcher
    resume: bool
    hip: str | None
    rocm: bool
    support: ResumeSupport
    server: RankServer | None = None  # forks the ranks of the case's runs (--fork-ranks), else torchrun
    checks: after_script.AfterScript | None = None  # upstream's AFTER_SCRIPT, which decides the case

    def command(self, args: list[str], env: dict) -> list[str]:
        """The launch of one run: the rank server's client when the server serves ``env``, else torchrun."""
        socket = self.server.socket_for(env) if self.server is not None else None
        return functional_command(self.launcher, self.world, args, rank_server=socket)

    @property
    def half(self) -> int:
        return self.iters // 2

    @property
    def ckpt_format(self) -> str:
        """The case's checkpoint format (megatron's default, torch_dist, where it names none)."""
        return str((self.config.get("MODEL_ARGS") or {}).get("--ckpt-format") or "torch_dist")

    @property
    def async_save(self) -> bool:
        """Whether verify saves the case's checkpoint asynchronously with a persistent worker: where the tree
        can, in a format its save_checkpoint writes async (torch_dist; from v0.17 torch_dcp and fsdp_dtensor too).
        Megatron refuses it for the others, the legacy `--ckpt-format torch` always ("Async checkpoint save not
        implemented for legacy checkpoints"): both trees would stop there, verify's defect, not upstream's."""
        return self.support.async_save and self.ckpt_format in self.support.async_formats

    def args(self, work: Path, extra: dict[str, object]) -> list[str]:
        return build_args(
            self.config,
            iters=self.iters,
            proxy=self.proxy,
            data_path=self.data_path,
            work=work,
            extra=extra,
            plan=self.plan,
        )


@dataclass
class _Trained:
    """A case whose uninterrupted run logged every iteration: its details, its log's losses by
    iteration, the reason so far, what the checks found wrong, and its args as a golden records them."""

    run: FunctionalRun
    steps: dict[int, float]
    log: str
    reason: str
    problems: list[str]
    recorded: list[str]
    run_env: dict
    save: dict[str, object]
    shim: str | None = None  # a failed upstream check's cause in the proxy shim ("function (proxy_shim.py)")


def stage_functional(tree: Path, env: dict, **kwargs: Any) -> tuple[StageResult, FunctionalRun | None]:
    """Upstream's case through pretrain_gpt.py (run_case, the same keywords), as a stage result and
    its details."""
    out = run_case(tree, env, **kwargs)
    return out.result, out.run


def case_sites_env(env: Mapping[str, str], case: str, kind: str = "case") -> dict[str, str]:
    """``env`` for one case's processes: the port-site records (protocol.PORT_SITES, the stage's
    directory) go to the case's own subdirectory, made here (port_sites.unit_dir_name), so the report
    and `--record-reach` know which case ran which site. Without PORT_SITES, ``env`` as it is.
    ``kind``: the unit's kind in its directory's name (stage 6's reach variants are "variant")."""
    from rocmport.verify.analyses.port_sites import unit_dir_name

    out = dict(env)
    stage_dir = protocol.PORT_SITES.read(env)
    if stage_dir:
        own = Path(stage_dir) / unit_dir_name(kind, case)
        own.mkdir(parents=True, exist_ok=True)
        protocol.PORT_SITES.set(out, str(own))
    return out


def note_case_seconds(case_env: Mapping[str, str], seconds: float, outcome: str) -> None:
    """Beside a case's site records (``case_env``: case_sites_env's), its wall seconds, what the reach
    selection weighs the case by, and its outcome (its status): a case that did not pass is not selected."""
    from rocmport.verify.analyses.port_sites import OUTCOME_FILE, SECONDS_FILE

    own = protocol.PORT_SITES.read(case_env)
    if own and Path(own).is_dir():
        atomic_write_text(Path(own) / SECONDS_FILE, f"{seconds:.2f}\n")
        atomic_write_text(Path(own) / OUTCOME_FILE, f"{outcome}\n")


def run_case(
    tree: Path,
    env: dict,
    *,
    case: str,
    dp: int,
    iters: int,
    proxy: bool,
    data_path: str | None,
    series_dir: Path | None,
    record: bool,
    device_kind: DeviceKind,
    defaulted: bool = False,
    launcher: Launcher = Launcher(),
    resume: bool = True,
    hip: str | None = None,
    rocm: bool = False,
    te: case_plan.ProxyTE | None = None,
    fork_ranks: bool = False,
    cuda_twin_env: dict | None = None,
) -> CaseOutcome:
    """Upstream's case through pretrain_gpt.py: the uninterrupted run saves a checkpoint at
    iteration iters // 2; with ``resume``, a second run loads it and must log the same losses for
    the remaining iterations; then this device kind's golden. ``hip``: the simulated ROCm version
    (proxy), for the report; ``rocm``: the runs see HIP (a ROCm GPU or the simulation), where the
    port picks the async writer; ``fork_ranks``: a rank server forks both runs' ranks (on the proxy
    with torchrun on one node; rank_servers); ``cuda_twin_env``: the environment of an FP8 case's CUDA-path
    twin (_twin), run where the golden cannot decide (None: no twin)."""
    start = time.monotonic()
    ready = _prepare(tree, case, dp, proxy, data_path, series_dir, str(device_kind), defaulted, te, cuda=not rocm)
    if isinstance(ready, StageResult):
        return CaseOutcome(case, ready)
    config, plan, world = ready
    # upstream's own checks: the plan's on the proxy; on a GPU (no plan) read from the YAML the same way
    checks = plan.after_script if plan is not None else case_plan.upstream_checks(case, config)
    if isinstance(checks, case_plan.Unsupported):
        return CaseOutcome(case, StageResult(NAME, UNSUPPORTED, f"{case} ({checks.kind}): {checks.reason}"))
    s = CaseSetup(
        tree, env, case, config, plan, world, iters, proxy, data_path, launcher, resume, hip, rocm, resume_support(tree)
    )
    s.checks = checks
    with tempfile.TemporaryDirectory(prefix="rocmport-func-") as tmp:
        s.server = RankServer(tree, Path(tmp), world) if fork_ranks and applies(launcher, proxy) else None
        try:
            trained = _train(s, Path(tmp), start)
            if isinstance(trained, CaseOutcome):
                return trained
            if resume:
                stopped = _resume(s, Path(tmp), trained, start)
                if stopped is not None:
                    return stopped
        finally:
            if s.server is not None:
                s.server.close()
    if series_dir is not None:
        # an FP8 case's golden is its encoding's (FNUZ on a simulated gfx942, OCP otherwise): DeviceKind.fp8
        kind = device_kind.for_fp8(plan.fp8.encoding if plan is not None and plan.fp8 is not None else None)
        _golden(trained, s, golden_path(series_dir, case, str(kind)), record, kind)
    if cuda_twin_env is not None and _needs_twin(trained, plan, record):
        common = dict(case=case, dp=dp, iters=iters, proxy=proxy, data_path=data_path, device_kind=device_kind)
        _twin(trained, _run_twin(tree, cuda_twin_env, te, launcher, fork_ranks, common), cuda_twin_env)
    if data_path:
        reference = upstream_golden(case_dir(tree, case), trained.run.losses)
        if reference:
            trained.run.upstream_golden_a100 = reference
            trained.reason += f"; upstream's A100 golden (reference only): {reference.summary}"
    return _finish(s, trained, time.monotonic() - start)


def _prepare(
    tree: Path,
    case: str,
    dp: int,
    proxy: bool,
    data_path: str | None,
    series_dir: Path | None,
    device_kind: str,
    defaulted: bool,
    te: case_plan.ProxyTE | None = None,
    cuda: bool = False,
) -> StageResult | tuple[dict, CasePlan | None, int]:
    """The case's config, plan and ranks, or why it does not run (before any launch). ``cuda``: the runs
    take the CUDA path (the plan's env_unset)."""
    cdir = check_case(tree, case)
    if series_dir is not None:  # a golden that cannot be named is bad input now, not after minutes of training
        golden_path(series_dir, case, device_kind)
    if not (tree / "pretrain_gpt.py").is_file():
        return skipped(NAME, tree_lacks("pretrain_gpt.py"))
    if not (cdir / "model_config.yaml").is_file():
        text = f"upstream has no functional case {case} ({CASES / case}); pass --cases NAME (e.g. {', '.join(cases_near(tree))})"
        return StageResult(NAME, SKIPPED if defaulted else FAIL, text)
    config = load_case(tree, case)
    plan: CasePlan | None = None
    if proxy:
        planned = case_plan.plan_case(case, config, data_path=bool(data_path), te=te, cuda=cuda)
        if isinstance(planned, case_plan.Unsupported):
            return StageResult(NAME, UNSUPPORTED, f"{case} ({planned.kind}): {planned.reason}")
        plan = planned
    return config, plan, world_size(config, dp, plan)


def _save_args(s: CaseSetup, work: Path) -> tuple[dict[str, object], dict[str, str]]:
    """The checkpoint flags of the uninterrupted run, and the arguments verify chose, with why."""
    save: dict[str, object] = {"--save": str(work / "ckpt"), "--load": str(work / "ckpt"), "--save-interval": s.half}
    chosen: dict[str, str] = {}
    if s.async_save:
        save.update({"--async-save": True, "--use-persistent-ckpt-worker": True})
        if s.support.async_strategy and not s.rocm and not nvrx_usable(s.env):
            # Upstream's default writer (nvrx) is nvidia-resiliency-ext's: on HIP the port switches to mcore by itself
            # (async-save-strategy), the CUDA path keeps upstream's default, which needs the package.
            save["--async-strategy"] = "mcore"
            chosen["--async-strategy mcore"] = (
                "nvidia-resiliency-ext (upstream's default async writer, nvrx) is NVIDIA-only "
                "and not importable here; on HIP the port picks mcore itself"
            )
    return save, chosen


def _run_env(s: CaseSetup, work: Path) -> tuple[dict, dict[str, str]]:
    """The runs' environment (the case's ENV_VARS, less the launch profile's variables an FSDP case must
    not have; in proxy mode the shim in every worker and PROXY_ENV, less what the plan unsets), and the
    swaps with why."""
    run_env = {**s.env, **{k: str(v) for k, v in (s.config.get("ENV_VARS") or {}).items()}}
    # verify's own launch environment an FSDP case must not have, on a GPU as on the proxy
    launch = {
        f"{var} unset (it was {run_env.pop(var)})": why
        for var, why in case_plan.fsdp_launch_env(s.config)
        if var in run_env
    }
    if not s.proxy:
        return run_env, launch
    unset = {
        f"{var} unset (the case's {run_env.pop(var, '')})": why for var, why in (s.plan.env_unset if s.plan else ())
    }
    unset.update(launch)
    (work / "shim").mkdir(exist_ok=True)
    run_env.update({**protocol.SHIM_WORKERS.entry(True), **protocol.SHIM_OUT.entry(str(work / "shim"))})
    run_env.update({k: v for k, (v, _) in PROXY_ENV.items()})
    run_env.update(dict(s.plan.fp8.env) if s.plan and s.plan.fp8 else {})  # the CUDA control's simulated H100
    swaps = {**{f"{k}={v}": why for k, (v, why) in PROXY_ENV.items()}, **unset}
    if s.async_save:
        from rocmport.verify.runtime.proxy_shim import FORKED_WRITER

        swaps["persistent checkpoint writer started by fork"] = FORKED_WRITER
    return run_env, swaps


def _note_launch(s: CaseSetup, swaps: dict[str, str]) -> None:
    """The report's line on how the ranks started: forked by a rank server, or torchrun and why not."""
    if s.server is None:
        return
    if s.server.ready is not None:
        from rocmport.verify.runtime.served_spawn import WHY as SPAWN_WHY

        swaps["ranks forked by a rank server"] = f"{FORKED_WHY} (its imports: {s.server.ready.get('seconds')} s)"
        swaps["what the ranks start with spawn forked by the rank server"] = SPAWN_WHY
    elif s.server.refused:
        swaps["ranks started by torchrun (no rank server)"] = s.server.refused


def _tail(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if "rank0" in ln or "Error" in ln][-15:]


def _train(s: CaseSetup, work: Path, start: float) -> _Trained | CaseOutcome:
    """The uninterrupted run, saving its checkpoint half way: trained, or the outcome it stopped with."""
    save, chosen = _save_args(s, work)
    chosen.update({f"{flags} dropped": why for flags, why in (s.plan.dropped if s.plan else ())})
    chosen.update({f"{flag} kept": why for flag, why in (s.plan.kept if s.plan else ())})
    chosen.update({f"{option} set": why for option, why in (s.plan.set_args if s.plan else ())})
    args = s.args(work, save)
    run_env, swaps = _run_env(s, work)
    cmd = s.command(args, run_env)
    _note_launch(s, swaps)
    proc = _launch(cmd, s.tree, run_env)
    log = proc.stdout + proc.stderr
    steps = loss_steps(log)
    losses = [steps[i] for i in sorted(steps)]
    if proc.returncode == 0 and not losses and s.launcher.multi_node:
        return CaseOutcome(s.case, took_part(NAME, s.launcher, time.monotonic() - start))
    run = FunctionalRun(s.case, " ".join(cmd), losses, s.iters, swaps, chosen, _tail(proc.stderr))
    if s.proxy:
        from rocmport.verify.runtime.proxy_shim import read_redirects

        run.redirects = read_redirects(work / "shim")
    hook = work / "shim" / "unsupported.txt"
    if s.proxy and hook.is_file():
        text = f"proxy shim hook missing: {hook.read_text()}"
        return CaseOutcome(s.case, StageResult(NAME, UNSUPPORTED, text, time.monotonic() - start, run), run)
    fp8 = s.plan.fp8 if s.plan is not None else None
    if fp8 is not None:
        run.fp8 = fp8.to_dict()
        if fp8.refusal:
            return CaseOutcome(s.case, _fp8_refusal(fp8, proc, s.case, losses, time.monotonic() - start, run), run)
        from rocmport.verify.runtime.proxy_shim import read_fp8_casts

        run.fp8["casts"] = read_fp8_casts(work / "shim")  # the first run's alone: the resumed run adds its own
    checked = _upstream_checks(s, run, proc, log)
    complete = len(losses) >= s.iters
    exit_zero = s.checks is not None and s.checks.exit_zero  # upstream's launcher sets the exit status aside
    if not complete and exit_zero:
        return _decided_by_checks(s, proc, checked, losses, start, run)
    if not complete or (proc.returncode != 0 and not exit_zero):
        what = (
            "pretrain_gpt.py"
            if proc.returncode == 0
            else f"pretrain_gpt.py (after {len(losses)} of {s.iters} iterations)"
        )
        return _stopped(s, proc, what, "run", start, run, steps, range(1, s.iters + 1))
    problems = [] if losses[-1] < losses[0] else [f"loss did not fall ({losses[0]:.4f} -> {losses[-1]:.4f})"]
    reason = f"{s.case}: lm loss {losses[0]:.4f} -> {losses[-1]:.4f} in {s.iters} iterations"
    failed = [r for r in checked if not r.passed]
    problems = [f"{CHECK_FAILED}{r.describe()}" for r in failed] + problems
    if checked:
        reason += f"; upstream's checks: {len(checked) - len(failed)} of {len(checked)} pass on the run's log"
    if fp8 is not None and run.fp8 is not None:
        from rocmport.verify.runtime.te_flavour import fp8_casts_differ

        wrong = fp8_casts_differ(run.fp8["casts"], fp8.encoding)
        problems += [f"{fp8.describe()}: {wrong}"] if wrong else []
        casts = ", ".join(f"{k} ×{v}" for k, v in sorted(run.fp8["casts"].items()))
        reason += f"; {fp8.describe()} ({casts or 'none'})"
    return _Trained(run, steps, log, reason, problems, recorded_args(args, work), run_env, save, _shim_of(failed))


# How a failed upstream check reads among a case's problems.
CHECK_FAILED = "upstream's check failed: "


def _compared(problems: list[str], tree: Path) -> str:
    """The problems as two trees' failures compare (normalise): a check of verify's with its measured figures
    as #, upstream's checks as they are (their text is the YAML's, the same on every run)."""
    return "; ".join(normalise(p, tree, figures=not p.startswith(CHECK_FAILED)) for p in problems)


def _upstream_checks(
    s: CaseSetup, run: FunctionalRun, proc: subprocess.CompletedProcess, log: str
) -> list[after_script.CheckResult]:
    """Upstream's AFTER_SCRIPT checks over the uninterrupted run's log (into ``run``): the run upstream's
    regular case is, whose ranks' logs are all its $LOG_DIR holds. Verify's resumed run is verify's own
    round trip, not upstream's: its log is not theirs to check. [] for a case without checks."""
    if s.checks is None:
        return []
    results = after_script.evaluate(s.checks, log)
    run.upstream_checks = {
        "exit_status_decides": not s.checks.exit_zero,
        "exit_status": proc.returncode,
        "checks": [r.to_dict() for r in results],
    }
    return results


def _shim_of(failed: list[after_script.CheckResult]) -> str | None:
    """The proxy shim's function behind the first failed check the proxy fails by itself, as a frame."""
    fn = next((r.shim_function for r in failed if r.shim_function), None)
    return f"{fn} (proxy_shim.py)" if fn else None


def _decided_by_checks(
    s: CaseSetup,
    proc: subprocess.CompletedProcess,
    checked: list[after_script.CheckResult],
    losses: list[float],
    start: float,
    run: FunctionalRun,
) -> CaseOutcome:
    """A run that stopped early in a case whose AFTER_SCRIPT sets EXIT_CODE=0: upstream's launcher exits 0
    when every check passes whatever the training's exit status (gpt3_mcore_reruns_persistent_1 exits 16 on
    purpose), so the checks decide. A stopped run has no losses past the point it stopped at to compare a
    resumed run with: verify's round trip is not checked. A check that fails where the proxy could not run
    the case (a CUDA-only blocker, the HIP simulation) is that unsupported; else the case fails, naming it."""
    seconds = time.monotonic() - start
    how = (
        f"pretrain_gpt.py stopped after {len(losses)} of {s.iters} iterations, exit {proc.returncode}: "
        f"{cause_line(proc.stderr, proc.stdout or '')[:300]}"
    )
    failed = [r for r in checked if not r.passed]
    if not failed:
        why = f"the run stopped at iteration {len(losses)} as the case has it: no losses past it for a resumed run to match"
        run.resume = ResumeSkipped(why)
        reason = (
            f"{s.case}: upstream's checks pass on the run's log ({len(checked)} of {len(checked)}); {how}, which the "
            f"case's EXIT_CODE=0 leaves to the checks; checkpoint resume not checked ({why})"
        )
        return CaseOutcome(s.case, StageResult(NAME, PASS, reason, seconds, run), run)
    res = _failure(proc, s.tree, s.proxy, s.hip, "pretrain_gpt.py", seconds, run)
    if res.status == UNSUPPORTED:
        return CaseOutcome(s.case, res, run)
    problems = "; ".join(f"{CHECK_FAILED}{r.describe()}" for r in failed)
    failure = CaseFailure("check", _compared([problems], s.tree), None, _shim_of(failed))
    return CaseOutcome(s.case, StageResult(NAME, FAIL, f"{problems} [{how}]", seconds, run), run, failure)


def _fp8_refusal(
    fp8: case_plan.Fp8Plan,
    proc: subprocess.CompletedProcess,
    case: str,
    losses: list[float],
    seconds: float,
    details: FunctionalRun,
) -> StageResult:
    """An FP8 case whose recipe the simulated GPU cannot run: the port's argument validation must refuse
    it, naming the arch and the recipe, before any iteration (that is the check passing); a run that
    trains, or stops anywhere else (a TE assert, a kernel), fails the stage."""
    said = case_plan.refusal_in(fp8, proc.stderr)
    if proc.returncode != 0 and said and not losses:
        if details.fp8 is not None:
            details.fp8["refused"] = said
        return StageResult(
            NAME,
            PASS,
            f"{case}: refused in argument validation as planned ({fp8.recipe} on {fp8.device}, the port's "
            f"fp8-arch-check): {said}",
            seconds,
            details,
        )
    got = (
        f"it trained ({len(losses)} iterations logged)"
        if proc.returncode == 0 or losses
        else f"it stopped elsewhere: {(exception_line(proc.stderr) or f'exit {proc.returncode}')[:300]}"
    )
    return StageResult(
        NAME,
        FAIL,
        f"{case}: {fp8.device} cannot run the {fp8.recipe} recipe, so argument validation must refuse it "
        f"('{fp8.refusal} ...'); {got}",
        seconds,
        details,
    )


def _stopped(
    s: CaseSetup,
    proc: subprocess.CompletedProcess,
    what: str,
    phase: str,
    start: float,
    run: FunctionalRun,
    logged: Iterable[int],
    wanted: Iterable[int],
) -> CaseOutcome:
    """A run that did not log every ``wanted`` iteration (it logged ``logged``): its result (_failure)
    and, when it failed, how. One that exited 0 failed by what it did not log, the same words on both
    trees (a warning's source line on its stderr is no cause)."""
    short = short_of_iterations(logged, wanted) if proc.returncode == 0 else None
    res = _failure(proc, s.tree, s.proxy, s.hip, what, time.monotonic() - start, run, short)
    if res.status != FAIL:
        return CaseOutcome(s.case, res, run)
    failure = CaseFailure(phase, short) if short else failure_of(proc.stderr, s.tree, phase, proc.stdout or "")
    return CaseOutcome(s.case, res, run, failure)


def _resume(s: CaseSetup, work: Path, t: _Trained, start: float) -> CaseOutcome | None:
    """The checkpoint round trip: a run resumed from the iteration-``half`` checkpoint must log the
    uninterrupted run's losses (and params norm) for the rest. None when it ran to its end (its
    findings in ``t``), else the outcome it stopped with."""
    if s.half < 1 or not s.support.ckpt_step:
        why = "fewer than 2 iterations" if s.half < 1 else "the tree's training loop has no --ckpt-step"
        t.run.resume = ResumeSkipped(why)
        t.reason += f"; checkpoint resume not checked ({why})"
        return None
    again = {
        **t.save,
        "--load": str(checkpoint_at(work / "ckpt", s.half, work / f"ckpt-at-{s.half}")),
        "--ckpt-step": s.half,
        "--save": str(work / "ckpt-resumed"),
        "--async-save": None,
        "--use-persistent-ckpt-worker": None,
    }
    cmd = s.command(s.args(work, again), t.run_env)
    rproc = _launch(cmd, s.tree, t.run_env, what=f"resumed from iteration {s.half}")
    rlog = rproc.stdout + rproc.stderr
    rsteps = loss_steps(rlog)
    wanted = list(range(s.half + 1, s.iters + 1))
    t.run.resume_log_tail = _tail(rproc.stderr)
    if rproc.returncode != 0 or any(i not in rsteps for i in wanted):
        return _stopped(s, rproc, f"the run resumed from iteration {s.half}", "resume", start, t.run, rsteps, wanted)
    _compare_resumed(s, t, rlog, rsteps, wanted)
    return None


# megatron's checkpoint tracker (checkpointing.get_checkpoint_tracker_filename) and its iteration directories.
TRACKER = "latest_checkpointed_iteration.txt"


def checkpoint_at(saved: Path, iteration: int, where: Path) -> Path:
    """A load directory whose tracker names ``iteration``: ``where``, holding a link to ``saved``'s iteration
    directory and a tracker of its own; ``saved`` itself where it has no such directory (the load then
    fails naming it, as before). --ckpt-step alone does not decide what a run loads: upstream's
    load_checkpoint reads the tracker again for the legacy format's distributed-optimizer state
    (core_v0.16.1 checkpointing.py: "NOTE: this is a manual read of the tracker file") and takes its
    iteration, so a run resumed with --ckpt-step 5 beside the tracker's 10 loaded iteration 10's optimizer
    state, began at iteration 10 and exited 0 without training. Upstream's own resume loads the latest
    checkpoint; so does this directory's."""
    name = f"iter_{iteration:07d}"
    if not (saved / name).is_dir():
        return saved
    where.mkdir(parents=True, exist_ok=True)
    (where / name).symlink_to((saved / name).resolve(), target_is_directory=True)
    atomic_write_text(where / TRACKER, f"{iteration}\n")
    return where


def _compare_resumed(s: CaseSetup, t: _Trained, rlog: str, rsteps: dict[int, float], wanted: list[int]) -> None:
    """The resumed run's losses and params norm against the uninterrupted run's, into ``t``."""
    half, iters = s.half, s.iters
    expected = expected_resumed(t.steps, half, iters, s.support.first_two_logged_together)
    diff = max(abs(rsteps[i] - expected[i]) for i in wanted)
    norms, rnorms = params_norms(t.log), params_norms(rlog)
    norm_diff = max((abs(rnorms[i] - norms[i]) for i in wanted if i in norms and i in rnorms), default=None)
    tol = RESUME_TOLERANCE[s.proxy]
    t.run.resume = resumed = ResumeCheck(
        from_iteration=half,
        loaded_iteration=loaded_iteration(rlog),
        max_abs_diff=diff,
        tolerance=tol,
        async_save=s.async_save,
        losses=[rsteps[i] for i in wanted],
        params_norm_max_abs_diff=norm_diff,
        averaged_iteration=half + 2 if s.support.first_two_logged_together and half + 2 <= iters else None,
    )
    t.reason += (
        f"; resumed from the iteration-{half} checkpoint ({'async ' if s.async_save else ''}{s.ckpt_format}): "
        f"max |Δ| {diff:.2g} over iterations {half + 1}-{iters} (≤ {tol:g})"
    )
    if norm_diff is not None:
        t.reason += f", params norm max |Δ| {norm_diff:.2g}"
        if norm_diff > tol:
            t.problems.append(
                f"resumed parameters differ from the uninterrupted run's (params norm |Δ| {norm_diff:.3g} > {tol:g})"
            )
    if resumed.loaded_iteration != half:
        t.problems.append(f"the resumed run did not load iteration {half} (it says {resumed.loaded_iteration})")
    if diff > tol:
        t.problems.append(f"resumed losses differ from the uninterrupted run's by {diff:.3g} > {tol:g}")


def _golden(t: _Trained, s: CaseSetup, golden: Path, record: bool, device_kind: DeviceKind) -> None:
    """This device kind's golden: recorded (``record``, from a passing run only), else compared."""
    if record and t.problems:
        # a golden is what a passing run logged: a failed run's curve would excuse the failure next time
        t.reason += f"; golden not recorded: the run failed ({golden} unchanged)"
        return
    losses = t.run.losses
    if record:
        made = {"case": s.case, "device_kind": str(device_kind), "iters": s.iters, "losses": losses}
        atomic_write_text(golden, json.dumps({**made, "hip_sim": s.hip, "args": t.recorded}, indent=1) + "\n")
        t.reason += f"; golden recorded in {golden}"
        return
    if not golden.is_file():
        t.reason += "; no golden for this device kind yet (--record-golden)"
        return
    ref = json.loads(golden.read_text())
    compared = t.run.golden = GoldenComparison(str(golden))
    if ref.get("args") != t.recorded:
        why = (
            _args_difference(t.recorded, ref["args"]) if ref.get("args") else "the golden records no args; re-record it"
        )
        compared.other_args = why
        t.reason += f"; golden made with other args, not compared ({why})"
        return
    n = min(len(ref["losses"]), len(losses))
    pairs = zip(losses[:n], ref["losses"][:n])
    drift = max(abs(a - b) / max(abs(b), 1e-12) for a, b in pairs) if n else float("inf")
    tol = TOLERANCE["cpu-proxy" if device_kind.proxy else "gpu"]  # with TE's layer or not
    compared.max_rel_drift, compared.tolerance, compared.hip_sim = drift, tol, ref.get("hip_sim")
    t.reason += f"; max relative drift vs golden {drift:.2g} (≤ {tol:g})"
    if drift > tol:
        t.problems.append(f"{GOLDEN_DRIFT} {drift:.3g} > {tol:g} ({golden})")


def _needs_twin(t: _Trained, plan: CasePlan | None, record: bool) -> bool:
    """Whether an FP8 case's CUDA-path twin runs: a case that trains in FP8 (not one the port must refuse),
    whose golden cannot decide (none for this device kind, made with other args, or drifted: an FP8
    golden holds only on the machine that recorded it, docs/rocm-te-flavour.md), and no other check
    failed (the case fails whatever the twin logs)."""
    if record or plan is None or plan.fp8 is None or plan.fp8.refusal:
        return False
    if any(not p.startswith(GOLDEN_DRIFT) for p in t.problems):
        return False
    golden = t.run.golden
    return golden is None or golden.other_args is not None or bool(t.problems)


def _run_twin(
    tree: Path,
    env: dict,
    te: case_plan.ProxyTE | None,
    launcher: Launcher,
    fork_ranks: bool,
    common: dict[str, Any],
) -> CaseOutcome:
    """The CUDA-path twin's run: the case's ``common`` arguments on ``env`` (the ROCm run's with --no-hip-sim
    and TE's arithmetic deltas only), its TE the CUDA path's (no simulated GPU), no golden, no resume."""
    flavour = protocol.TE_FLAVOUR.read(env) or "nvidia"
    twin_te = case_plan.ProxyTE(flavour, te.fp8 if te else "ocp", None)
    with output.progress(f"stage 4 case {common['case']}: its CUDA-path twin (the golden cannot decide)"):
        return run_case(
            tree,
            env,
            **common,
            series_dir=None,
            record=False,
            launcher=launcher,
            resume=False,
            te=twin_te,
            fork_ranks=fork_ranks,
        )


def _twin(t: _Trained, twin: CaseOutcome, env: Mapping[str, str]) -> None:
    """The CUDA-path twin against the ROCm run: the same losses (TOLERANCE, as a golden on its own machine)
    decide the case's arithmetic in the golden's place, and the golden's drift is then said, not a
    problem; other losses are a problem (TWIN_DIFFERS); a twin that did not train decides nothing."""
    deltas = protocol.TE_DELTAS.read(env) or ()
    te = "NVIDIA's Python layer" + (f" with ROCm TE's arithmetic deltas ({', '.join(deltas)})" if deltas else "")
    seconds = twin.result.seconds or 0.0
    losses = twin.run.losses if twin.run is not None else []
    record = t.run.cuda_twin = CudaTwin(te, twin.result.reason[:400], seconds, list(losses))
    if twin.run is None or len(losses) != len(t.run.losses) or not losses:
        t.reason += f"; its CUDA-path twin did not train the case ({twin.result.status}: {twin.result.reason[:200]})"
        return
    drift = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(t.run.losses, losses))
    tol = TOLERANCE["cpu-proxy"]
    record.max_rel_drift, record.tolerance = drift, tol
    if drift > tol:
        t.problems.append(
            f"{TWIN_DIFFERS} by {drift:.3g} > {tol:g} (the same tree and args on the CUDA path, {te}, {seconds:.0f} s)"
        )
        return
    drifted = [p for p in t.problems if p.startswith(GOLDEN_DRIFT)]
    t.problems[:] = [p for p in t.problems if not p.startswith(GOLDEN_DRIFT)]
    t.reason += (
        f"; its CUDA-path twin ({te}, {seconds:.0f} s) logged the same losses: max relative drift {drift:.2g} "
        f"(≤ {tol:g}), the arithmetic check in the golden's place"
        + (f" (the golden's drift is not the HIP path's: {drifted[0]})" if drifted else "")
    )


def _finish(s: CaseSetup, t: _Trained, seconds: float) -> CaseOutcome:
    """The case's result from its checks: pass, or fail with its problems first."""
    if not t.problems:
        return CaseOutcome(s.case, StageResult(NAME, PASS, t.reason, seconds, t.run), t.run)
    reason = "; ".join(t.problems) + f" [{t.reason}]"
    failure = CaseFailure("check", _compared(t.problems, s.tree), None, t.shim)
    return CaseOutcome(s.case, StageResult(NAME, FAIL, reason, seconds, t.run), t.run, failure)
