"""A verify run: the options it is given (VerifyOptions), the launches it would make (`--dry-run`)
and the stages it runs, as plain functions over a ported tree, with a typed report (VerifyReport).
On GPUs: nccl (RCCL on ROCm). Without: CPU proxy on gloo, with the HIP simulation by default."""

from __future__ import annotations

import os
import re
from dataclasses import replace
import tempfile
from datetime import datetime, timezone
from pathlib import Path

from rocmport import output, procs
from rocmport.config import DEFAULT_BACKEND, DEFAULT_ITERS, DEFAULT_PP, DEFAULT_TP, Settings
from rocmport.errors import BadInput
from rocmport.gitutil import run_git
from rocmport.inputs import has_control
from rocmport.nvidia_only import blocked
from rocmport.patches.series import load_series
from rocmport.port import worktree as wt
from rocmport.upstream.lock import load_lock
from rocmport.machine import probe, python
from rocmport.verify.orchestration import environment
from rocmport.verify.orchestration import firewall
from rocmport.verify.analyses import impact
from rocmport.verify.analyses import port_sites
from rocmport.verify.stages import gpt_training as stages
from rocmport.verify.stages.unit_tests import suite
from rocmport.verify.orchestration import te_layer
from rocmport.verify.runtime import hip_sim, protocol
from rocmport.verify.orchestration.contract import FunctionalOptions, Mode, UnitOptions, VerifyContext, VerifyOptions
from rocmport.verify.runtime.gpt_worker import HEADS, LAYERS  # imports no torch at module level
from rocmport.verify.orchestration.launcher import Launcher
from rocmport.verify.orchestration.registry import NAMES, STAGES
from rocmport.verify.orchestration.result import ReportEnv, VerifyReport
from rocmport.verify.stages.gpt_training import StageResult
from rocmport.verify.orchestration.te_layer import TELayer
from rocmport.verify.runtime import te_flavour as te_flavours
from rocmport.upstreams import MEGATRON_BRIDGE, MEGATRON_LM

# Re-exported: the options are part of the stage contract (contract.py); the stages' order is registry.py's.
__all__ = [
    "FunctionalOptions",
    "UnitOptions",
    "VerifyOptions",
    "VerifyReport",
    "NAMES",
    "prepare",
    "run_verify",
    "launch_plan",
]


def tree_identity(tree: Path) -> tuple[str | None, str | None]:
    """The release line the tree was ported for (its series' directory, "v0.19") and its HEAD commit;
    None for what is not known (a tree `rocmport apply` did not make, a tree that is not a git repository)."""
    state = wt.read_state(tree)
    line = Path(state.series).parent.name if state and state.series else None
    head = run_git("rev-parse", "HEAD", cwd=tree, check=False).stdout.strip() if (tree / ".git").exists() else ""
    return line, head or None


# The most processes a run may ask for: beyond any machine's (and torchrun's) reach, so a typo such as
# `--dp 99999999999999999999` is refused at once instead of reaching the launcher.
MAX_WORLD = 65536
MAX_ITERS = 10**7


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
        return NAMES
    numbers = {str(i): name for i, name in enumerate(NAMES, 1)}
    hint = f"use 1-{len(NAMES)} or {', '.join(NAMES)}, comma-separated"
    chosen = set()
    for part in (p.strip() for p in text.split(",") if p.strip()):
        if part in numbers or part in NAMES:
            chosen.add(numbers.get(part, part))
        else:
            raise BadInput(f"{option} {text[:80]!r}: unknown stage {part[:40]!r}; {hint}")
    if not chosen:
        raise BadInput(f"{option} {text[:80]!r}: names no stage; {hint}")
    return tuple(s for s in NAMES if s in chosen)


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
    tree, launcher = opts.tree, opts.launcher
    machine = probe.probe()
    backend = opts.backend if opts.backend != "auto" else ("nccl" if machine.has_gpu else "gloo")
    per_node = launcher.per_node(opts.world)
    if backend == "nccl" and per_node > machine.device_count:
        raise BadInput(
            f"world size {opts.world} (tp {opts.tp} × pp {opts.pp} × dp {opts.dp}) over {launcher.nnodes} node(s) needs "
            f"{per_node} GPUs per node; this machine has {machine.device_count}"
        )
    mode: Mode = "gpu" if backend == "nccl" else "cpu-proxy"
    profile = "rocm" if mode == "gpu" else "cpu-proxy"
    hip_version = None if mode == "gpu" else opts.hip_version  # a real device: nothing to simulate
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
    # The device's arch: the ROCm GPU's (its gcnArchName), the simulated one under the HIP simulation
    # (--hip-arch), none on the CUDA path. Its launch profile (`rocmport env --arch`) goes to the
    # started processes; stage 3's arch-conditional known failures follow it.
    from rocmport.machine.launch_profile import verify_env

    arch = device_arch(mode, machine, opts.hip_arch if hip_version else None)
    applied_launch_env = verify_env(arch)
    extra.update(applied_launch_env)
    line, commit = tree_identity(tree)
    report = VerifyReport(
        mode=mode,
        backend=backend,
        world_size=opts.world,
        tp=opts.tp,
        pp=opts.pp,
        dp=opts.dp,
        tree=str(tree),
        line=line,
        commit=commit,
        started=datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        hip_sim=hip_sim.summary(hip_version, opts.hip_arch),
        env=ReportEnv(machine, applied_launch_env, profile, _component_versions(tree)),
        launcher=launcher,
        te=opts.te,
    )

    def finished() -> str:
        """What the run had done when it was interrupted (the message of Interrupted)."""
        done = [s for s in report.stages if s.status != stages.SKIPPED or s.reason != "not selected (--stages)"]
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
        env = environment.child_env(tree, firewall.write_bootstrap(tmp / "boot"), extra, opts.pycache)
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
        )
        imports_failed = False
        for stage in STAGES:
            if stage.name not in opts.stages:
                report.stages.append(StageResult(stage.name, stages.SKIPPED, "not selected (--stages)"))
            elif not stage.requested(opts):
                report.stages.append(stages.skipped(stage.name, opts.skipped.get(stage.name, "not requested")))
            elif stage.after_imports and imports_failed:
                report.stages.append(StageResult(stage.name, stages.SKIPPED, "Megatron-LM imports failed (stage 1)"))
            else:
                # Its own directory of port-site records: the report names the stages that ran each site.
                (sites_dir / stage.name).mkdir()
                protocol.PORT_SITES.set(ctx.env, str(sites_dir / stage.name))
                ran = stage.run(ctx)
                report.stages.append(ran.result)
                if stage.report_key and ran.data is not None:
                    report.fill(stage.report_key, ran.data)
                imports_failed = imports_failed or (not stage.after_imports and ran.result.status == stages.FAIL)
        te_version = opts.te.version if opts.te else None
        report.port_sites = _port_sites(tree, sites_dir, te_version)
        if opts.bridge_tree is not None and "bridge" in opts.stages:
            report.bridge_port_sites = _port_sites(opts.bridge_tree, sites_dir, te_version)
    return report


def device_arch(mode: str, machine: probe.Environment, simulated: str | None) -> str | None:
    """The GPU architecture of the run: the simulated one under the HIP simulation, the first ROCm
    GPU's (its gcnArchName, e.g. gfx90a) on a GPU, else None (the CUDA path)."""
    if simulated:
        return simulated
    if mode == "gpu" and machine.hip:
        from rocmport.machine.probe import gpu_arch

        return gpu_arch()
    return None


def _port_sites(tree: Path, sites_dir: Path, te_version: str | None = None) -> dict[str, port_sites.Coverage]:
    """port_sites of the report: per codemod of the tree's port, the rewritten helper call sites
    that ran in this verify run ({} for a tree `rocmport apply` did not make)."""
    state = wt.read_state(tree)
    if state is None or not state.base:
        return {}
    sites = port_sites.find_sites(tree, state.base)
    calls, modules = port_sites.read_records(sites_dir, tree, NAMES)
    codemods = {c["name"]: c.get("sites") for c in state.codemods}
    return port_sites.coverage(sites, calls, modules, codemods, te_version)


def _component_versions(tree: Path) -> dict[str, dict[str, str | None]]:
    """doctor's view of the line's ROCm components here: {name: {version, status}} for the report's env."""
    from rocmport.machine.doctor import for_verify

    _, series_dir, _ = series_settings(tree)
    return for_verify(series_dir / "series" if series_dir else None).components


def series_settings(tree: Path) -> tuple[suite.VerifySettings, Path | None, str | None]:
    """The series the tree was ported with (verify's settings, its directory) and the base commit."""
    state = wt.read_state(tree)
    series = Path(state.series) if state and state.series else None
    base = state.base if state else None
    if series and series.is_file():
        return suite.parse_settings(load_series(series).verify, str(series)), series.parent, base
    return suite.VerifySettings(), None, base


def unit_options(
    settings: suite.VerifySettings,
    base: str | None,
    cache_dir: Path,
    tree: Path,
    wanted: str | bool | None,
    tests,
    nproc: int,
    since: str | None = None,
    impact_extra: tuple[str, ...] = (),
) -> tuple[UnitOptions | None, str]:
    """Stage 3's options, or None and why it does not run. ``wanted``: None (default), False
    (--no-unit-tests), "default", "all" or "impacted" (--unit-tests ...); ``tests``: explicit
    --unit-test paths; ``since``: the upstream commit an impacted selection diffs from (with
    ``impact_extra``, more changed files: those whose port rewrite changed in a refresh hop)."""
    if since is not None and wanted != "impacted":
        raise BadInput(f"--since {since[:80]}: only with --unit-tests impacted (the selection it diffs from)")
    if wanted == "impacted" and since is None:
        raise BadInput(
            "--unit-tests impacted: give --since COMMIT, the upstream commit the port was last verified at "
            "(the tests that reach what changed since then run)"
        )
    if wanted == "impacted" and tests:
        raise BadInput("--unit-test: not with --unit-tests impacted (it selects the files itself); give one of them")
    if wanted is False:
        return None, "--no-unit-tests"
    if not (tree / "tests" / "unit_tests").is_dir():
        if wanted or tests:
            raise BadInput(
                f"{tree}: no tests/unit_tests to run (a package-index source ships megatron/core only); drop --unit-tests"
            )
        return None, stages.tree_lacks("tests/unit_tests")
    if nproc < 1:
        raise BadInput(f"--unit-nproc {nproc}: must be at least 1")
    for test in tests:
        check_unit_test(tree, test)
    if tests:
        chosen, reasons, how = list(tests), {t: "--unit-test" for t in tests}, "explicit"
    elif wanted == "all":
        chosen, reasons, how = [suite.ALL], {suite.ALL: "--unit-tests all: upstream's whole unit-test suite"}, "all"
    elif wanted == "impacted":
        assert since is not None
        until = base or run_git("rev-parse", "HEAD", cwd=tree).stdout.strip()
        picked = impact.select(tree, since, until, suite.SMOKE_TESTS, cache_dir, impact_extra)
        if not picked.selected:  # never an empty list: pytest without paths would collect the whole tree
            return None, (
                f"--unit-tests impacted: no test file reaches the {len(picked.changed)} files changed in "
                f"{since[:12]}..{until[:12]}, and the tree has none of the smoke set's files"
            )
        chosen, reasons, how = list(picked.selected), dict(picked.selected), "impacted"
        return UnitOptions(
            tests=chosen,
            nproc=nproc,
            cache_dir=cache_dir,
            base=base,
            settings=settings,
            reasons=reasons,
            selection=how,
            impact=picked,
        ), ""
    elif settings.unit_tests:
        chosen, reasons, how = list(settings.unit_tests), dict(settings.unit_tests), "series"
    else:
        chosen, reasons, how = list(suite.FALLBACK_TESTS), dict(suite.FALLBACK_TESTS), "fallback"
    return UnitOptions(
        tests=chosen, nproc=nproc, cache_dir=cache_dir, base=base, settings=settings, reasons=reasons, selection=how
    ), ""


def check_unit_test(tree: Path, test: str) -> None:
    """``--unit-test`` names a file, directory or test id inside the tree's tests/unit_tests, after
    symlinks and `..` (pytest is handed nothing else), or BadInput."""
    hint = "give a path relative to the tree, under tests/unit_tests (e.g. tests/unit_tests/test_utils.py)"
    path = test.split("::")[0]
    if not path or has_control(test) or Path(path).is_absolute():
        raise BadInput(f"--unit-test {test[:120]!r}: not a path in {tree / 'tests/unit_tests'}; {hint}")
    root = (tree / "tests" / "unit_tests").resolve()
    target = (tree / path).resolve()
    if not target.is_relative_to(root):
        raise BadInput(f"--unit-test {test[:120]}: not in {tree / 'tests/unit_tests'} (it leads to {target}); {hint}")
    if not target.exists():
        raise BadInput(f"--unit-test {test[:120]}: no such file or directory in {tree}; {hint}")


def functional_options(
    tree: Path,
    series_dir: Path | None,
    wanted,
    case,
    tp: int,
    pp: int,
    data_path,
    record: bool,
    iters: int,
    resume: bool = True,
    te: bool = False,
) -> tuple[FunctionalOptions | None, str]:
    from rocmport.machine.doctor import for_verify
    from rocmport.verify.stages.functional import CASES, cases_near, check_case, default_case, load_case, missing_data

    if case is not None:  # confined to the tree's cases directory whether or not stage 4 runs
        check_case(tree, case)
    if wanted is False:
        return None, "--no-functional"
    if not (tree / "pretrain_gpt.py").is_file():
        if wanted:
            raise BadInput(
                f"{tree}: no pretrain_gpt.py to run (a package-index source ships megatron/core only); drop --functional"
            )
        return None, stages.tree_lacks("pretrain_gpt.py")
    if case is not None and not (check_case(tree, case) / "model_config.yaml").is_file():
        raise BadInput(
            f"--case {case!r}: no such case in {tree / CASES} (no model_config.yaml); e.g. {', '.join(cases_near(tree)) or '-'}"
        )
    if record and series_dir is None:
        raise BadInput(
            f"{tree}: --record-golden needs a tree made by `rocmport apply` (goldens live next to its series)"
        )
    # The TE case where doctor finds Transformer Engine usable (installed, in the line's range, built for the GPU),
    # or where TE's Python layer runs on the CPU proxy (--te).
    te_usable = te or for_verify(series_dir / "series" if series_dir else None).te_usable
    chosen = case or default_case(tp, pp, te_usable, tree)
    if data_path is not None:
        # --data-path is upstream CI's data root ($DATA_PATH; the case names its files under it), taken
        # whole (never split on spaces) and made absolute: pretrain_gpt.py runs in the tree.
        root = Path(data_path).expanduser().resolve()
        if not root.is_dir():
            raise BadInput(
                f"--data-path {data_path}: not a directory; give upstream CI's data root ($DATA_PATH), "
                f"under which the case names its dataset and tokenizer files"
            )
        config = check_case(tree, chosen) / "model_config.yaml"
        missing = missing_data(load_case(tree, chosen), root) if config.is_file() else []
        if missing:
            raise BadInput(
                f"--data-path {data_path}: case {chosen} reads {missing[0]}, which is not there"
                + (f" (nor {len(missing) - 1} more)" if len(missing) > 1 else "")
                + "; lay the data out as upstream CI does under that directory"
            )
        data_path = str(root)
    return FunctionalOptions(
        case=chosen,
        defaulted=not case,
        data_path=data_path,
        record=record,
        series_dir=series_dir,
        iters=iters,
        resume=resume,
    ), ""


def launch_plan(opts: VerifyOptions) -> list[dict]:
    """The command line of every launch verify would make (``--dry-run``); temporary paths under $TMP."""
    return [step for stage in STAGES if stage.name in opts.stages for step in stage.launches(opts, Path("$TMP"))]


def _lock_pins(settings: Settings, name: str) -> bool:
    """Whether the project's lock pins ``name`` (True when there is no lock to say otherwise)."""
    return not settings.lock_path.is_file() or name in load_lock(settings.lock_path).upstreams


def prepare(
    settings: Settings,
    tree: str | None,
    *,
    tp: int = DEFAULT_TP,
    pp: int = DEFAULT_PP,
    dp: int | None = None,
    nproc: int | None = None,
    iters: int = DEFAULT_ITERS,
    backend: str = DEFAULT_BACKEND,
    with_unit: str | bool | None = None,
    unit_tests=(),
    unit_nproc: int = 8,
    with_functional: bool | None = None,
    case: str | None = None,
    data_path: str | None = None,
    record_golden: bool = False,
    resume: bool = True,
    with_bridge: bool | None = None,
    launcher_kind: str = "torchrun",
    nnodes: int = 1,
    node_rank: int = 0,
    rdzv_endpoint: str | None = None,
    hip_version: str | None = hip_sim.DEFAULT_VERSION,
    stages_text: str | None = None,
    te: str = "none",
    moe: bool = True,
    hip_arch: str = hip_sim.DEFAULT_ARCH,
    since: str | None = None,
    impact_extra: tuple[str, ...] = (),
    te_flavour: str | None = None,
    fp8_recipe: str | None = None,
    fp8_format: str = "hybrid",
) -> VerifyOptions:
    """Check the trees and stage options for a run (or a --dry-run) of verify in project ``settings``:
    the one place a run's options are checked (run_verify takes them as checked)."""
    dp = check_sizes(tp, pp, iters, dp, nproc)
    if hip_version is not None:  # '' too: an empty version is a typo, never the CUDA path (that is --no-hip-sim)
        hip_sim.parse_version(hip_version)
    hip_sim.parse_arch(hip_arch)
    chosen = parse_stages(stages_text)
    path = Path(tree) if tree else settings.worktree_path(MEGATRON_LM.name)
    if not path.is_dir():
        raise BadInput(f"{path}: no such tree; run `rocmport apply` first or pass --tree")
    check_megatron_tree(path)
    python.check_python(path)  # before anything imports torch: a 3.12 tree on 3.11 says how to get 3.12
    bridge_tree = settings.worktree_path(MEGATRON_BRIDGE.name)
    skipped = {}
    if with_bridge is None:  # the Bridge tree of the lock: a refresh to a release without a companion unpins it
        pinned = _lock_pins(settings, MEGATRON_BRIDGE.name)
        with_bridge = not tree and bridge_tree.is_dir() and pinned
        if not with_bridge:
            skipped["bridge"] = (
                "--tree given (stage 5 runs with the project's own work trees; --bridge to ask for it)"
                if tree
                else "no Megatron-Bridge work tree (the lock pins no Bridge)"
                if not bridge_tree.is_dir()
                else "the lock pins no Megatron-Bridge (its old work tree is not verified against this Megatron-LM)"
            )
    elif not with_bridge:
        skipped["bridge"] = "--no-bridge"
    if with_bridge and not bridge_tree.is_dir():
        raise BadInput(
            f"{bridge_tree}: no Megatron-Bridge work tree; run `rocmport apply` with a Bridge pin or pass --no-bridge"
        )
    launcher = Launcher(
        kind=launcher_kind,
        nnodes=nnodes,
        node_rank=node_rank,
        rdzv_endpoint=rdzv_endpoint,
        gpus=backend != "gloo" and probe.probe().has_gpu,
    )
    cfg, series_dir, base = series_settings(path)
    unit, why = unit_options(
        cfg, base, settings.cache_dir, path, with_unit, unit_tests, unit_nproc, since, impact_extra
    )
    if why:
        skipped["unit-tests"] = why
    flavour = te_flavours.parse(te_flavour, hip_version is not None)
    if te_flavour is not None and te.strip() == "none":
        raise BadInput("--te-flavour: it chooses the flavour of --te VERSION|auto; with --te none no TE runs")
    if fp8_recipe is not None and te.strip() == "none":
        raise BadInput("--fp8-recipe: FP8 runs through Transformer Engine; pass --te VERSION|auto")
    te_layer_ = te_for(te, series_dir, settings.cache_dir)
    if te_layer_ is not None:
        te_layer_ = replace(
            te_layer_,
            flavour=te_flavours.choose(
                flavour, te_layer_.version, hip_arch if hip_version is not None else None, hip_version
            ),
        )
    functional, why = functional_options(
        path,
        series_dir,
        with_functional,
        case,
        tp,
        pp,
        data_path,
        record_golden,
        iters,
        resume,
        te=te_layer_ is not None,
    )
    if why:
        skipped["functional"] = why
    return VerifyOptions(
        tree=path.resolve(),
        tp=tp,
        pp=pp,
        dp=dp,
        backend=backend,
        iters=iters,
        unit=unit,
        functional=functional,
        bridge_tree=bridge_tree.resolve() if with_bridge else None,
        launcher=launcher,
        hip_version=hip_version,
        hip_arch=hip_arch,
        stages=chosen,
        skipped=skipped,
        te=te_layer_,
        moe=moe,
        fp8=f"{fp8_format}:{fp8_recipe}" if fp8_recipe else None,
        pycache=settings.cache_dir / "pycache",
    )


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
