"""A verify run: the options it is given, checked once (`prepare`: the run's shared options here,
each stage's own by its ``check``), the launches it would make (`--dry-run`) and the stages it runs
in the order of `registry.STAGES`, with a typed report (VerifyReport).
On GPUs: nccl (RCCL on ROCm). Without: CPU proxy on gloo, with the HIP simulation by default."""

from __future__ import annotations

import os
import re
from dataclasses import replace
import tempfile
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from rocmport import output, procs
from rocmport.config import Settings
from rocmport.errors import BadInput
from rocmport.gitutil import run_git
from rocmport.nvidia_only import blocked
from rocmport.patches.series import load_series
from rocmport.port import worktree as wt
from rocmport.machine import probe, python
from rocmport.verify.runtime import hip_sim, protocol
from rocmport.verify.analyses.port_sites import Site, tree_coverage
from rocmport.verify.orchestration import environment, firewall, options, te_layer
from rocmport.verify.orchestration.contract import Mode, NotRequested, RunSetup, VerifyContext, VerifyOptions
from rocmport.verify.runtime.gpt_worker import HEADS, LAYERS  # imports no torch at module level
from rocmport.verify.orchestration.launcher import Launcher
from rocmport.verify.orchestration import registry
from rocmport.verify.orchestration.result import ReportEnv, VerifyReport
from rocmport.verify.orchestration.sizes import MAX_ITERS, MAX_WORLD
from rocmport.verify.orchestration.stage_result import FAIL, SKIPPED, StageResult, skipped
from rocmport.verify.orchestration.te_layer import TELayer
from rocmport.verify.stages.unit_tests import suite
from rocmport.upstreams import MEGATRON_LM
from rocmport.verify.runtime import te_flavour as te_flavours

__all__ = ["MAX_ITERS", "MAX_WORLD", "VerifyOptions", "VerifyReport", "launch_plan", "prepare", "run_verify"]


def tree_identity(tree: Path) -> tuple[str | None, str | None]:
    """The release line the tree was ported for (its series' directory, "v0.19") and its HEAD commit;
    None for what is not known (a tree `rocmport apply` did not make, a tree that is not a git repository)."""
    state = wt.read_state(tree)
    line = Path(state.series).parent.name if state and state.series else None
    head = run_git("rev-parse", "HEAD", cwd=tree, check=False).stdout.strip() if (tree / ".git").exists() else ""
    return line, head or None


def check_sizes(
    tp: int, pp: int, iters: int, dp: int | None = None, nproc: int | None = None, named: dict[str, str] | None = None
) -> int:
    """The size and layout checks a run and a --dry-run share, from the options alone: answered before
    any tree is read, the environment probed or torch imported (a bad --tp is told in a fraction of a
    second). Returns dp (from --nproc when given). ``named``: where tp or pp came from when not from
    its option (refresh: "<root>/pyproject.toml: [tool.rocmport] tp ="), for the message."""
    label = {"tp": "--tp", "pp": "--pp", **(named or {})}
    for name, value in ((label["tp"], tp), (label["pp"], pp), ("--dp", dp), ("--nproc", nproc)):
        if value is not None and not 1 <= value <= MAX_WORLD:
            raise BadInput(f"{name} {value}: must be between 1 and {MAX_WORLD}")
    if not 2 <= iters <= MAX_ITERS:
        raise BadInput(f"--iters {iters}: must be between 2 and {MAX_ITERS}")
    if HEADS % tp:
        raise BadInput(f"{label['tp']} {tp}: the verify model has {HEADS} heads; use a tp that divides {HEADS}")
    if LAYERS % pp:
        raise BadInput(f"{label['pp']} {pp}: the verify model has {LAYERS} layers; use a pp that divides {LAYERS}")
    if nproc is not None:
        if nproc % (tp * pp):
            raise BadInput(f"--nproc {nproc} is not a multiple of tp×pp = {tp * pp}")
        if dp is not None and tp * pp * dp != nproc:
            raise BadInput(
                f"--dp {dp} and --nproc {nproc} disagree: tp {tp} × pp {pp} × dp {dp} = {tp * pp * dp} processes; give one of them"
            )
        dp = nproc // (tp * pp)
    dp = dp or 1
    if tp * pp * dp > MAX_WORLD:
        raise BadInput(
            f"world size {tp * pp * dp} (tp {tp} × pp {pp} × dp {dp}) is over {MAX_WORLD}; give smaller sizes"
        )
    return dp


def check_sizes_from(settings, tp: int | None, pp: int | None, iters: int) -> int:
    """check_sizes for the sizes a command will verify with: its options, else [tool.rocmport] tp/pp;
    the message names where the bad one came from (the file and key, not an option never given)."""
    named = {
        n: f"{settings.root / 'pyproject.toml'}: [tool.rocmport] {n} ="
        for n, v in (("tp", tp), ("pp", pp))
        if v is None
    }
    return check_sizes(settings.tp if tp is None else tp, settings.pp if pp is None else pp, iters=iters, named=named)


def parse_stages(text: str | None, option: str = "--stages") -> tuple[str, ...]:
    """`--stages 1,3` or `--stages imports,unit-tests` (numbers or names) -> stage names, in order.
    None (not given): every stage; a value that names no stage (``''``, ``','``) is bad input, its
    message naming ``option`` (refresh's --verify-stages)."""
    if text is None:
        return registry.NAMES
    numbers = {str(i): name for i, name in enumerate(registry.NAMES, 1)}
    hint = f"use 1-{len(registry.NAMES)} or {', '.join(registry.NAMES)}, comma-separated"
    chosen = set()
    for part in (p.strip() for p in text.split(",") if p.strip()):
        if part in numbers or part in registry.NAMES:
            chosen.add(numbers.get(part, part))
        else:
            raise BadInput(f"{option} {text[:80]!r}: unknown stage {part[:40]!r}; {hint}")
    if not chosen:
        raise BadInput(f"{option} {text[:80]!r}: names no stage; {hint}")
    return tuple(s for s in registry.NAMES if s in chosen)


def check_megatron_tree(tree: Path) -> None:
    """The tree has megatron/core (stage 1 then fails one that holds no code, or that imports as a
    namespace package: a stage that checks nothing does not pass)."""
    if not (tree / MEGATRON_LM.package_dir).is_dir():
        raise BadInput(f"{tree}: not a Megatron-LM tree (no megatron/core); run `rocmport apply` or pass --tree")


def inductor_cache_dir() -> str:
    """torch.compile's cache where torch keeps it by default (<tmp>/torchinductor_<user>), named for
    the started processes: their TMPDIR is the run's own directory, removed at its end, and a GPU run
    would otherwise compile every kernel again each time. An explicit TORCHINDUCTOR_CACHE_DIR wins."""
    import getpass

    if os.environ.get("TORCHINDUCTOR_CACHE_DIR"):
        return os.environ["TORCHINDUCTOR_CACHE_DIR"]
    try:
        user = re.sub(r'[\\/:*?"<>|]', "_", getpass.getuser())
    except (KeyError, OSError):  # no name for this uid (a container)
        user = str(os.getuid())
    return str(Path(tempfile.gettempdir()) / f"torchinductor_{user}")


def run_verify(opts: VerifyOptions) -> VerifyReport:
    """Run the selected stages of `registry.STAGES` over ``opts`` (as `prepare` checked them), in order."""
    machine = probe.probe()
    backend = opts.backend if opts.backend != "auto" else ("nccl" if machine.has_gpu else "gloo")
    per_node = opts.launcher.per_node(opts.world)
    if backend == "nccl" and per_node > machine.device_count:
        raise BadInput(
            f"world size {opts.world} (tp {opts.tp} × pp {opts.pp} × dp {opts.dp}) over {opts.launcher.nnodes} node(s) needs "
            f"{per_node} GPUs per node; this machine has {machine.device_count}"
        )
    mode: Mode = "gpu" if backend == "nccl" else "cpu-proxy"
    profile = "rocm" if mode == "gpu" else "cpu-proxy"
    hip_version = None if mode == "gpu" else opts.hip_version  # a real device: nothing to simulate
    extra, shut_out = _child_extra(opts, mode, profile, backend, hip_version)
    # The device's arch: the ROCm GPU's (its gcnArchName), the simulated one under the HIP simulation
    # (--hip-arch), none on the CUDA path. Its launch profile (`rocmport env --arch`) goes to the
    # started processes; stage 3's arch-conditional known failures follow it.
    from rocmport.machine.launch_profile import verify_env

    arch = device_arch(mode, machine, opts.hip_arch if hip_version else None)
    applied_launch_env = verify_env(arch)
    extra.update(applied_launch_env)
    line, commit = tree_identity(opts.tree)
    report = VerifyReport(
        mode=mode,
        backend=backend,
        world_size=opts.world,
        tp=opts.tp,
        pp=opts.pp,
        dp=opts.dp,
        tree=str(opts.tree),
        line=line,
        commit=commit,
        started=datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        hip_sim=hip_sim.summary(hip_version, opts.hip_arch),
        env=ReportEnv(machine, applied_launch_env, profile, _component_versions(opts.tree)),
        launcher=opts.launcher,
        te=opts.te,
    )

    def finished() -> str:
        """What the run had done when it was interrupted (the message of Interrupted)."""
        done = [s for s in report.stages if s.status != SKIPPED or s.reason != "not selected (--stages)"]
        running = next((n for n in opts.stages if n not in {s.name for s in report.stages}), None)
        return ("finished: " + ", ".join(f"{s.name} {s.status}" for s in done) if done else "no stage had finished") + (
            f"; stopped during {running}" if running else ""
        )

    # Ctrl-C or SIGTERM: every process of the run ended (torchrun's workers in their own sessions too),
    # its temporary files (torchelastic_*, the bootstrap) removed, exit 130/143 saying what finished.
    with procs.run_scope("rocmport-verify-", finished, opts.pycache) as scope:
        tmp = Path(scope.tmp)
        sites_dir = tmp / "port-sites"
        sites_dir.mkdir()
        extra.update(protocol.PORT_SITES.entry(str(sites_dir)))
        bootstrap = firewall.write_bootstrap(tmp / "boot")
        env = environment.child_env(opts.tree, bootstrap, extra, opts.pycache)
        twin_env = _cuda_twin_env(opts, mode, profile, backend, hip_version, bootstrap)
        ctx = VerifyContext(
            opts=opts,
            mode=mode,
            backend=backend,
            profile=profile,
            blocked=shut_out,
            machine=machine,
            hip_version=hip_version,
            device_arch=arch,
            env=env,
            tmp=tmp,
            sites_dir=sites_dir,
            cuda_twin_env=twin_env,
        )
        _run_stages(ctx, report)
        te_version = opts.te.version if opts.te else None
        if opts.record_reach is not None:
            _write_reach(opts.tree, opts.record_reach, sites_dir, report, te_version, ctx.port_sites)
        report.port_sites = tree_coverage(
            opts.tree, sites_dir, registry.NAMES, te_version, _explain(opts.tree), ctx.port_sites
        )
    return report


def _explain(tree: Path):
    """port_sites' ``explain``: each unreached site classified by the line's reach record (reach.classify)."""
    from rocmport.verify.analyses import reach
    from rocmport.verify.stages.case_plan import gpu_only_reasons

    _, series_dir, _ = series_settings(tree)
    return lambda coverage, sites: reach.classify(coverage, sites, series_dir, gpu_only_reasons(tree))


def _write_reach(
    tree: Path, series_dir: Path, sites_dir: Path, report: VerifyReport, te: str | None, sites: list[Site]
) -> None:
    """--record-reach: add this run's cases and test files to the line's reach record (their seconds:
    what each noted beside its records, else the stage's figures: stage 3's per-file seconds, stage
    4's one case)."""
    from rocmport.verify.analyses import reach
    from rocmport.verify.stages import functional
    from rocmport.verify.stages.case_plan import training_cases

    from rocmport.verify.stages.unit_tests.results import BLOCKING

    seconds: dict[tuple[str, str], float] = {}
    unit = report.unit_run()
    if unit is not None:
        seconds.update({("test", f): s for f, s in unit.file_seconds.items()})
    ran = report.stage(functional.NAME)
    case = report.data_of(functional.NAME, functional.FunctionalRun) or (ran.details if ran else None)
    if isinstance(case, functional.FunctionalRun) and ran is not None and ran.seconds:
        seconds[("case", case.case)] = ran.seconds
    totals = (len(training_cases(tree)), len(suite.test_files(tree, [suite.ALL])) if (tree / suite.ALL).is_dir() else 0)
    # each test file's outcome: its tests' labels (a file stage 3 did not label has none recorded)
    file_labels = unit.labels_by_file() if unit is not None else None
    in_part = sorted(reach.files_run_in_part(unit.tests)) if unit is not None else []
    path, record = reach.record_run(
        series_dir, tree, sites_dir, seconds, te, totals, sites, file_labels, BLOCKING, in_part
    )
    output.info(f"reach record: {path} ({record.holds})")
    # entries recorded on other codemod versions than the recipe runs now (kept from earlier runs, or this one's)
    for note in reach.codemod_notes(record, series_dir):
        output.info(f"reach record: {note}")
    if in_part:
        output.info(f"reach record: not recorded, run in part (a test id selected, not the file): {', '.join(in_part)}")


def _cuda_twin_env(
    opts: VerifyOptions, mode: Mode, profile: str, backend: str, hip_version: str | None, bootstrap: Path
) -> dict[str, str] | None:
    """The environment of stage 4's CUDA-path twin of an FP8 case (case_run._twin): this run's with
    --no-hip-sim and TE's arithmetic deltas only (te_flavour.cuda_twin), recording no port sites (the
    twin's are not the ROCm run's). None unless the ROCm TE flavour runs under the HIP simulation."""
    if mode != "cpu-proxy" or not hip_version or opts.te is None or opts.te.flavour.name != "rocm":
        return None
    twin = replace(opts, te=replace(opts.te, flavour=te_flavours.cuda_twin(opts.te.flavour)))
    extra, _ = _child_extra(twin, mode, profile, backend, None)  # no ROCm launch profile either: the CUDA path
    return environment.child_env(opts.tree, bootstrap, extra, opts.pycache)


def _child_extra(
    opts: VerifyOptions, mode: Mode, profile: str, backend: str, hip_version: str | None
) -> tuple[dict[str, str | None], tuple[str, ...]]:
    """What the started processes' environment adds (the backend, the firewall, TE's layer, the proxy
    and its HIP simulation), and the firewall's list (TE let through with --te)."""
    extra: dict[str, str | None] = {
        **protocol.BACKEND.entry(backend),
        **firewall.firewall_env(profile),
        "TORCHINDUCTOR_CACHE_DIR": inductor_cache_dir(),
    }
    shut_out = blocked(profile)
    if opts.te is not None:
        if mode != "cpu-proxy":
            raise BadInput(
                "--te runs TE's Python layer on the CPU proxy; on GPUs verify uses the Transformer Engine installed "
                "(see `rocmport doctor`): drop --te or pass --backend gloo"
            )
        shut_out = tuple(te_layer.unblocked(shut_out))
        extra.update({**protocol.FIREWALL.entry(tuple(shut_out)), **te_layer.child_env(opts.te)})
        if opts.fp8:
            extra.update(protocol.VERIFY_FP8.entry(opts.fp8))
            if not hip_version:  # the CUDA control: a GPU NVIDIA's TE runs FP8 on (compute capability 9.0)
                extra.update(protocol.CUDA_SIM_ARCH.entry("sm_90"))
    if mode == "cpu-proxy":
        extra.update(protocol.PROXY.entry(True))
        if hip_version:
            extra.update(hip_sim.child_env(hip_version, opts.hip_arch))
    return extra, shut_out


def _run_stages(ctx: VerifyContext, report: VerifyReport) -> None:
    """Each stage of `registry.STAGES`: run with its own options when selected and requested, else
    skipped saying why (and every stage after the imports when stage 1 failed)."""
    opts = ctx.opts
    imports_failed = False
    for stage in registry.STAGES:
        own = opts.by_stage.get(stage.name)
        if stage.name not in opts.stages:
            report.stages.append(StageResult(stage.name, SKIPPED, "not selected (--stages)"))
        elif stage.name not in opts.by_stage:
            report.stages.append(skipped(stage.name, opts.skipped.get(stage.name, "not requested")))
        elif stage.after_imports and imports_failed:
            report.stages.append(StageResult(stage.name, SKIPPED, "Megatron-LM imports failed (stage 1)"))
            leftover = stage.data_when_skipped(ctx, own)
            if leftover is not None:
                report.data[stage.name] = leftover
        else:
            if ctx.sites_dir is not None:
                # Its own directory of port-site records: the report names the stages that ran each site.
                (ctx.sites_dir / stage.name).mkdir()
                protocol.PORT_SITES.set(ctx.env, str(ctx.sites_dir / stage.name))
            ran = stage.run(ctx, own)
            report.stages.append(ran.result)
            if ran.data is not None:
                report.data[stage.name] = ran.data
            imports_failed = imports_failed or (not stage.after_imports and ran.result.status == FAIL)


def device_arch(mode: str, machine: probe.Environment, simulated: str | None) -> str | None:
    """The GPU architecture of the run: the simulated one under the HIP simulation, the first ROCm
    GPU's (its gcnArchName, e.g. gfx90a) on a GPU, else None (the CUDA path)."""
    if simulated:
        return simulated
    if mode == "gpu" and machine.hip:
        from rocmport.machine.probe import gpu_arch

        return gpu_arch()
    return None


def _component_versions(tree: Path) -> dict[str, dict[str, str | None]]:
    """doctor's view of the line's ROCm components here: {name: {version, status}} for the report's env."""
    from rocmport.machine.doctor import for_verify

    _, series_dir, _ = series_settings(tree)
    return for_verify(series_dir / "series" if series_dir else None).components


def series_settings(tree: Path) -> tuple[suite.VerifySettings, Path | None, str | None]:
    """The series the tree was ported with (verify's settings, its directory) and the base commit."""
    state = wt.read_state(tree)
    series = wt.project_series(tree, Path(state.series)) if state and state.series else None
    base = state.base if state else None
    if series and series.is_file():
        return suite.parse_settings(load_series(series).verify, str(series)), series.parent, base
    return suite.VerifySettings(), None, base


def launch_plan(opts: VerifyOptions) -> list[dict]:
    """The command line of every launch verify would make (``--dry-run``); temporary paths under $TMP."""
    return [
        step
        for stage in registry.STAGES
        if stage.name in opts.stages and stage.name in opts.by_stage
        for step in stage.launches(opts, opts.by_stage[stage.name], Path("$TMP"))
    ]


def prepare(settings: Settings, given: Mapping[str, Any]) -> VerifyOptions:
    """Check the trees and options for a run (or a --dry-run) of verify in project ``settings``: the
    one place a run's options are checked (run_verify takes them as checked). ``given``: the command
    line's values by parameter name (`options.all_options()`; one not given takes its default): the
    run's shared ones are checked here, each stage's own by its ``check``."""
    values = {**options.defaults(), **given}
    tp = settings.tp if values["tp"] is None else values["tp"]
    pp = settings.pp if values["pp"] is None else values["pp"]
    iters = values["iters"]
    dp = check_sizes(tp, pp, iters, values["dp"], values["nproc"])
    hip_version = None if values["no_hip_sim"] else values["hip_version"]
    if hip_version is not None:  # '' too: an empty version is a typo, never the CUDA path (that is --no-hip-sim)
        hip_sim.parse_version(hip_version)
    hip_sim.parse_arch(values["hip_arch"])
    chosen = parse_stages(values["stages_text"])
    tree = values["tree"]
    path = Path(tree) if tree else settings.worktree_path(MEGATRON_LM.name)
    if not path.is_dir():
        raise BadInput(f"{path}: no such tree; run `rocmport apply` first or pass --tree")
    check_megatron_tree(path)
    python.check_python(path)  # before anything imports torch: a 3.12 tree on 3.11 says how to get 3.12
    launcher = Launcher(
        kind=values["launcher_kind"],
        nnodes=values["nnodes"],
        node_rank=values["node_rank"],
        rdzv_endpoint=values["rdzv_endpoint"],
        gpus=values["backend"] != "gloo" and probe.probe().has_gpu,
    )
    series, series_dir, base = series_settings(path)
    te_spec, te_flavour, fp8_recipe = values["te_spec"], values["te_flavour"], values["fp8_recipe"]
    flavour = te_flavours.parse(te_flavour, hip_version is not None)
    if te_flavour is not None and te_spec.strip() == "none":
        raise BadInput("--te-flavour: it chooses the flavour of --te VERSION|auto; with --te none no TE runs")
    if fp8_recipe is not None and te_spec.strip() == "none":
        raise BadInput("--fp8-recipe: FP8 runs through Transformer Engine; pass --te VERSION|auto")

    def te_of_run() -> TELayer | None:
        """The run's TE layer (fetched on first use) in the flavour chosen for this run."""
        layer = te_for(te_spec, series_dir, settings.cache_dir)
        if layer is None:
            return None
        arch = values["hip_arch"] if hip_version is not None else None
        return replace(layer, flavour=te_flavours.choose(flavour, layer.version, arch, hip_version))

    setup = RunSetup(
        settings,
        path,
        tree_given=bool(tree),
        tp=tp,
        pp=pp,
        dp=dp,
        iters=iters,
        series=series,
        series_dir=series_dir,
        base=base,
        te=te_of_run,
    )
    by_stage: dict[str, Any] = {}
    not_run: dict[str, str] = {}
    for stage in registry.STAGES:
        checked = stage.check(values, setup)
        if isinstance(checked, NotRequested):
            not_run[stage.name] = checked.why
        else:
            by_stage[stage.name] = checked
    return VerifyOptions(
        tree=path.resolve(),
        tp=tp,
        pp=pp,
        dp=dp,
        backend=values["backend"],
        iters=iters,
        launcher=launcher,
        hip_version=hip_version,
        hip_arch=values["hip_arch"],
        stages=chosen,
        skipped=not_run,
        te=setup.te,
        fp8=f"{values['fp8_format']}:{fp8_recipe}" if fp8_recipe else None,
        pycache=settings.cache_dir / "pycache",
        by_stage=by_stage,
        record_reach=_record_reach(values["record_reach"], path, series_dir, base, setup.te),
    )


def _record_reach(
    wanted: bool, tree: Path, series_dir: Path | None, base: str | None, te: TELayer | None
) -> Path | None:
    """--record-reach: the series directory the record goes to (a tree `rocmport apply` made), else
    BadInput; a record there made on another port (upstream commit, recipe, TE) is refused now, not
    after the run."""
    if not wanted:
        return None
    if series_dir is None or not base:
        raise BadInput(
            f"{tree}: --record-reach needs a tree made by `rocmport apply` (the reach record lives beside its series)"
        )
    from rocmport.verify.analyses import reach

    reach.record_to_extend(series_dir, base, te.version if te else None)
    return series_dir


def te_for(spec: str, series_dir: Path | None, cache_dir: Path) -> TELayer | None:
    """``--te VERSION|auto|none``: the TE Python layer for this run, fetched into the cache (auto:
    the newest in the line's component-matrix range that the package index has)."""
    if spec.strip() == "none":
        return None
    te_layer.check_deps()
    line_range = None
    if series_dir is not None:
        matrix = load_series(series_dir / "series").rocm
        te = matrix.components.get("transformer_engine") if matrix else None
        line_range = str(te.versions) if te else None
    return te_layer.resolve(spec, line_range, cache_dir, output.progress)
