"""A verify run: the options it is given (VerifyOptions), the launches it would make (`--dry-run`)
and the stages it runs, as plain functions over a ported tree, with a typed report (VerifyReport).
On GPUs: nccl (RCCL on ROCm). Without: CPU proxy on gloo, with the HIP simulation by default."""

from __future__ import annotations

import os
import re
import tempfile
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Literal

from rocmport import output, procs
from rocmport.config import DEFAULT_PP, DEFAULT_TP, Settings
from rocmport.errors import BadInput
from rocmport.gitutil import run_git
from rocmport.inputs import has_control
from rocmport.nvidia_only import blocked
from rocmport.patches.series import load_series
from rocmport.port import worktree as wt
from rocmport.upstream.lock import load_lock
from rocmport.verify import environment, firewall, hip_sim, stages, suite, summary, te_layer
from rocmport.verify.gpt_worker import HEADS, LAYERS  # imports no torch at module level
from rocmport.verify.launcher import Launcher
from rocmport.verify.stages import StageResult
from rocmport.verify.te_layer import TELayer
from rocmport.upstreams import MEGATRON_BRIDGE, MEGATRON_LM

STAGES = ("imports", "gpt-training", "unit-tests", "functional", "bridge")
Mode = Literal["gpu", "cpu-proxy"]


@dataclass(frozen=True)
class UnitOptions:
    """Stage 3: upstream's unit tests."""

    tests: list[str]
    nproc: int
    cache_dir: Path
    base: str | None                                   # the unported commit the baseline runs
    settings: suite.VerifySettings = field(default_factory=suite.VerifySettings)
    reasons: dict[str, str] = field(default_factory=dict)  # test -> why it is in the suite
    selection: str = "series"                          # series | fallback | explicit | all


@dataclass(frozen=True)
class FunctionalOptions:
    """Stage 4: upstream's functional GPT case through pretrain_gpt.py."""

    case: str
    iters: int
    defaulted: bool = True
    data_path: str | None = None
    record: bool = False
    series_dir: Path | None = None
    resume: bool = True


@dataclass(frozen=True)
class VerifyOptions:
    """Everything a verify run is given. ``unit``/``functional``/``bridge_tree`` None: that stage
    does not run and ``skipped`` says why; ``stages`` limits the run to a subset."""

    tree: Path
    tp: int = DEFAULT_TP
    pp: int = DEFAULT_PP
    dp: int | None = None
    nproc: int | None = None
    backend: str = "auto"
    iters: int = 10
    unit: UnitOptions | None = None
    functional: FunctionalOptions | None = None
    bridge_tree: Path | None = None
    launcher: Launcher = field(default_factory=Launcher)
    hip_version: str | None = hip_sim.DEFAULT_VERSION    # CPU proxy: the simulated ROCm (None: the CUDA path)
    hip_arch: str = hip_sim.DEFAULT_ARCH                  # CPU proxy: the simulated GPU's architecture (--hip-arch)
    stages: tuple[str, ...] = STAGES
    skipped: dict[str, str] = field(default_factory=dict)  # stage -> why it does not run here
    te: TELayer | None = None  # Transformer Engine's Python layer on the CPU proxy (None: the local spec)
    pycache: Path | None = None  # where the started processes write bytecode (None: they write none)


@dataclass
class VerifyReport:
    """verify's report (README: "Report"); ``to_dict()`` is the JSON."""

    mode: Mode
    backend: str
    world_size: int
    tp: int
    pp: int
    dp: int
    tree: str
    hip_sim: dict | None
    env: dict
    launcher: dict
    stages: list[StageResult] = field(default_factory=list)
    training: dict = field(default_factory=dict)
    functional: dict = field(default_factory=dict)
    bridge_training: dict = field(default_factory=dict)
    port_sites: dict = field(default_factory=dict)
    bridge_port_sites: dict | None = None
    te: TELayer | None = None
    line: str | None = None      # the release line of the series the tree was ported with ("v0.19"), None for another tree
    commit: str | None = None    # the tree's HEAD when verify ran
    started: str = ""            # when verify ran: UTC, ISO 8601 ("2026-11-26T01:30:00Z")

    def stage(self, name: str) -> StageResult | None:
        return next((s for s in self.stages if s.name == name), None)

    @property
    def failed(self) -> list[str]:
        return [s.name for s in self.stages if s.status == stages.FAIL]

    def to_dict(self) -> dict:
        out = {"mode": self.mode, "backend": self.backend, "world_size": self.world_size, "tp": self.tp, "pp": self.pp, "dp": self.dp,
               "tree": self.tree, "line": self.line, "commit": self.commit, "started": self.started, "hip_sim": self.hip_sim, "env": self.env, "launcher": self.launcher,
               "stages": [s.to_dict() for s in self.stages], "training": self.training, "port_sites": self.port_sites,
               "te": self.te.to_dict() if self.te else None}
        if self.functional:
            out["functional"] = self.functional
        if self.bridge_training:
            out["bridge_training"] = self.bridge_training
        if self.bridge_port_sites is not None:
            out["bridge_port_sites"] = self.bridge_port_sites
        out["verdict"] = summary.verdict(out)  # the summary's first line, for machines and `rocmport status` too
        return out


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


def check_sizes(tp: int, pp: int, iters: int, dp: int | None = None, nproc: int | None = None) -> int:
    """The size and layout checks a run and a --dry-run share, from the options alone: answered before
    any tree is read, the environment probed or torch imported (a bad --tp is told in a fraction of a
    second). Returns dp (from --nproc when given)."""
    for name, value in (("--tp", tp), ("--pp", pp), ("--dp", dp), ("--nproc", nproc)):
        if value is not None and not 1 <= value <= MAX_WORLD:
            raise BadInput(f"{name} {value}: must be between 1 and {MAX_WORLD}")
    if not 2 <= iters <= MAX_ITERS:
        raise BadInput(f"--iters {iters}: must be between 2 and {MAX_ITERS}")
    if HEADS % tp:
        raise BadInput(f"--tp {tp}: the verify model has {HEADS} heads; use a tp that divides {HEADS}")
    if LAYERS % pp:
        raise BadInput(f"--pp {pp}: the verify model has {LAYERS} layers; use a pp that divides {LAYERS}")
    if nproc is not None:
        if nproc % (tp * pp):
            raise BadInput(f"--nproc {nproc} is not a multiple of tp×pp = {tp * pp}")
        if dp is not None and tp * pp * dp != nproc:
            raise BadInput(f"--dp {dp} and --nproc {nproc} disagree: tp {tp} × pp {pp} × dp {dp} = {tp * pp * dp} processes; give one of them")
        dp = nproc // (tp * pp)
    dp = dp or 1
    if tp * pp * dp > MAX_WORLD:
        raise BadInput(f"world size {tp * pp * dp} (tp {tp} × pp {pp} × dp {dp}) is over {MAX_WORLD}; give smaller sizes")
    return dp


def parse_stages(text: str | None) -> tuple[str, ...]:
    """`--stages 1,3` or `--stages imports,unit-tests` (numbers or names) -> stage names, in order.
    None (not given): every stage; a value that names no stage (``''``, ``','``) is bad input."""
    if text is None:
        return STAGES
    numbers = {str(i): name for i, name in enumerate(STAGES, 1)}
    hint = f"use 1-{len(STAGES)} or {', '.join(STAGES)}, comma-separated"
    chosen = set()
    for part in (p.strip() for p in text.split(",") if p.strip()):
        if part in numbers or part in STAGES:
            chosen.add(numbers.get(part, part))
        else:
            raise BadInput(f"--stages {text[:80]!r}: unknown stage {part[:40]!r}; {hint}")
    if not chosen:
        raise BadInput(f"--stages {text[:80]!r}: names no stage; {hint}")
    return tuple(s for s in STAGES if s in chosen)


def check_megatron_tree(tree: Path) -> None:
    """The tree has megatron/core (stage 1 then fails one that holds no code, or that imports as a
    namespace package: a stage that checks nothing does not pass)."""
    if not (tree / MEGATRON_LM.package_dir).is_dir():
        raise BadInput(f"{tree}: not a Megatron-LM tree (no megatron/core); run `rocmport apply` or pass --tree")


def _dp(opts: VerifyOptions) -> int:
    return check_sizes(opts.tp, opts.pp, opts.iters, opts.dp, opts.nproc)


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
    tree, tp, pp, iters, launcher = opts.tree, opts.tp, opts.pp, opts.iters, opts.launcher
    check_megatron_tree(tree)
    dp = _dp(opts)
    world = tp * pp * dp
    environment.check_python(tree)
    env_info = environment.probe()
    backend = opts.backend if opts.backend != "auto" else ("nccl" if env_info.has_gpu else "gloo")
    per_node = launcher.per_node(world)
    if backend == "nccl" and per_node > env_info.device_count:
        raise BadInput(f"world size {world} (tp {tp} × pp {pp} × dp {dp}) over {launcher.nnodes} node(s) needs {per_node} GPUs per node; "
                       f"this machine has {env_info.device_count}")
    mode: Mode = "gpu" if backend == "nccl" else "cpu-proxy"
    profile = "rocm" if mode == "gpu" else "cpu-proxy"
    hip_version = None if mode == "gpu" else opts.hip_version  # a real device: nothing to simulate
    extra: dict[str, str | None] = {"ROCMPORT_BACKEND": backend, **firewall.firewall_env(profile),
                                    "TORCHINDUCTOR_CACHE_DIR": inductor_cache_dir()}
    shut_out = blocked(profile)
    if opts.te is not None:
        if mode != "cpu-proxy":
            raise BadInput("--te runs TE's Python layer on the CPU proxy; on GPUs verify uses the Transformer Engine installed "
                           "(see `rocmport doctor`): drop --te or pass --backend gloo")
        shut_out = tuple(te_layer.unblocked(shut_out))
        extra.update({"ROCMPORT_FIREWALL": ",".join(shut_out), **te_layer.child_env(opts.te)})
    if mode == "cpu-proxy":
        extra["ROCMPORT_PROXY"] = "1"
        if hip_version:
            extra.update(hip_sim.child_env(hip_version, opts.hip_arch))
    applied_launch_env = environment.launcher_env_for(env_info) or hip_sim.launcher_env(hip_version)
    extra.update(applied_launch_env)
    line, commit = tree_identity(tree)
    report = VerifyReport(mode=mode, backend=backend, world_size=world, tp=tp, pp=pp, dp=dp, tree=str(tree), line=line, commit=commit,
                          started=datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                          hip_sim=hip_sim.summary(hip_version, opts.hip_arch),
                          env={**env_info.to_dict(), "launcher_env": applied_launch_env, "firewall_profile": profile,
                               "components": _component_versions(tree)},
                          launcher=launcher.to_dict(), te=opts.te)
    add = report.stages.append
    missing = environment.missing_deps(tree)

    def finished() -> str:
        """What the run had done when it was interrupted (the message of Interrupted)."""
        done = [s for s in report.stages if s.status != stages.SKIPPED or s.reason != "not selected (--stages)"]
        running = next((n for n in opts.stages if n not in {s.name for s in report.stages}), None)
        return ("finished: " + ", ".join(f"{s.name} {s.status}" for s in done) if done else "no stage had finished") + (
            f"; stopped during {running}" if running else "")

    # Ctrl-C or SIGTERM: every process of the run ended (torchrun's workers in their own sessions too),
    # its temporary files (torchelastic_*, the bootstrap) removed, exit 130/143 saying what finished.
    with procs.run_scope("rocmport-verify-", finished, opts.pycache) as scope:
        tmp = scope.tmp
        sites_dir = Path(tmp) / "port-sites"
        sites_dir.mkdir()
        extra["ROCMPORT_PORT_SITES"] = str(sites_dir)
        env = environment.child_env(tree, firewall.write_bootstrap(Path(tmp) / "boot"), extra, opts.pycache)
        if "imports" not in opts.stages:
            add(StageResult("imports", stages.SKIPPED, "not selected (--stages)"))
        elif missing:
            cmd = f"python -m pip install {' '.join(sorted(set(missing.values())))}"
            add(StageResult("imports", stages.FAIL, f"missing dependencies {', '.join(sorted(missing))}: `{cmd}`"))
        else:
            with output.progress("stage 1: imports behind the firewall"):
                add(stages.stage_imports(tree, env, shut_out))
        imports_failed = report.stages[0].status == stages.FAIL

        def gate(name: str, requested: bool) -> bool:
            """Whether stage ``name`` runs; when not, it is listed as skipped with the reason."""
            if name not in opts.stages:
                add(StageResult(name, stages.SKIPPED, "not selected (--stages)"))
            elif not requested:
                add(StageResult(name, stages.SKIPPED, opts.skipped.get(name, "not requested")))
            elif imports_failed:
                add(StageResult(name, stages.SKIPPED, "Megatron-LM imports failed (stage 1)"))
            else:
                return True
            return False

        if gate("gpt-training", True):
            spec = f"Transformer Engine {opts.te.version}" if opts.te else "the local layer spec"
            with output.progress(f"stage 2: GPT training tp{tp}×pp{pp}×dp{dp} on {backend} with {spec}, and the tp1/pp1 reference"):
                training, report.training = stages.stage_training(tree, env, tp, pp, dp, iters, backend, launcher,
                                                                  te=opts.te.describe() if opts.te else None)
            add(training)
        if gate("unit-tests", opts.unit is not None) and opts.unit is not None:
            add(_unit_tests(tree, env, opts.unit, launcher, mode, env_info, profile, bool(hip_version),
                            device_arch(mode, env_info, opts.hip_arch if hip_version else None)))
        if gate("functional", opts.functional is not None) and opts.functional is not None:
            res, report.functional = _functional(tree, env, opts.functional, dp, mode, env_info, launcher, hip_version, opts.te)
            add(res)
        if gate("bridge", opts.bridge_tree is not None) and opts.bridge_tree is not None:
            from rocmport.verify.bridge_stage import stage_bridge

            with output.progress(f"stage 5: Megatron-Bridge imports and GPTModelProvider training tp{tp}×pp{pp}"):
                bridge, report.bridge_training = stage_bridge(opts.bridge_tree, env, tp, pp, dp, iters, launcher,
                                                              te=opts.te.describe() if opts.te else None)
            add(bridge)
        te_version = opts.te.version if opts.te else None
        report.port_sites = _port_sites(tree, sites_dir, te_version)
        if opts.bridge_tree is not None and "bridge" in opts.stages:
            report.bridge_port_sites = _port_sites(opts.bridge_tree, sites_dir, te_version)
    return report


def _port_sites(tree: Path, sites_dir: Path, te_version: str | None = None) -> dict:
    """port_sites of the report: per codemod of the tree's port, the rewritten helper call sites
    that ran in this verify run ({} for a tree `rocmport apply` did not make)."""
    from rocmport.verify import port_sites

    state = wt.read_state(tree)
    if state is None or not state.base:
        return {}
    sites = port_sites.find_sites(tree, state.base)
    calls, modules = port_sites.read_records(sites_dir, tree)
    codemods = {c["name"]: c.get("sites") for c in state.codemods}
    return {name: cov.to_dict() for name, cov in port_sites.coverage(sites, calls, modules, codemods, te_version).items()}


def device_arch(mode: str, env_info: environment.Environment, simulated: str | None) -> str | None:
    """The GPU architecture stage 3's known failures are chosen by: the simulated one under the HIP
    simulation, the first ROCm GPU's (its gcnArchName, e.g. gfx90a) on a GPU, else None."""
    if simulated:
        return simulated
    if mode == "gpu" and env_info.hip:
        from rocmport.verify.doctor import gpu_arch

        return gpu_arch()
    return None


def _unit_tests(tree: Path, env: dict, unit: UnitOptions, launcher: Launcher, mode: str, env_info, profile: str,
                hip_simulated: bool, arch: str | None = None) -> StageResult:
    from rocmport.verify.unit_tests import stage_unit_tests

    known, not_applied = unit.settings.known_for(mode, bool(env_info.hip), hip_sim=hip_simulated, arch=arch)
    files = suite.test_files(tree, unit.tests)
    with output.progress(f"stage 3: upstream unit tests on {unit.nproc} ranks ({len(files)} files) and the unported baseline"):
        return stage_unit_tests(tree, env, unit.tests, unit.nproc, known, unit.cache_dir, unit.base, launcher, blocked=blocked(profile),
                                progress=output.info, reasons=unit.reasons, known_skipped=not_applied)


def device_kind(mode: str, env_info: environment.Environment, te: TELayer | None = None) -> str:
    """Goldens are kept per device kind: `cpu-proxy` (`cpu-proxy-te<version>` with TE's Python layer),
    or the platform and the first GPU's name."""
    if mode == "cpu-proxy" or not env_info.devices:
        return f"cpu-proxy-te{te.version}" if te else "cpu-proxy"
    name = re.sub(r"[^a-z0-9]+", "-", env_info.devices[0].lower()).strip("-")
    return f"{'rocm' if env_info.hip else 'cuda'}-{name}"


def _functional(tree: Path, env: dict, opts: FunctionalOptions, dp: int, mode: str, env_info, launcher: Launcher,
                hip_version: str | None, te: TELayer | None = None) -> tuple[StageResult, dict]:
    from rocmport.verify.functional import stage_functional

    blocked_by = environment.functional_blockers(tree)
    if blocked_by:
        return StageResult("functional", stages.FAIL, blocked_by), {}
    with output.progress(f"stage 4: upstream's functional case {opts.case} (pretrain_gpt.py, {opts.iters} iterations, "
                         f"then resumed from iteration {opts.iters // 2})"):
        return stage_functional(tree, env, case=opts.case, dp=dp, iters=opts.iters, proxy=mode == "cpu-proxy",
                                data_path=opts.data_path, series_dir=opts.series_dir, record=opts.record,
                                device_kind=device_kind(mode, env_info, te), defaulted=opts.defaulted, launcher=launcher,
                                resume=opts.resume, hip=hip_version, rocm=bool(hip_version or env_info.hip))


def _component_versions(tree: Path) -> dict:
    """doctor's view of the line's ROCm components here: {name: {version, status}} for the report's env."""
    from rocmport.verify.doctor import for_verify

    _, series_dir, _ = series_settings(tree)
    return for_verify(series_dir / "series" if series_dir else None)["components"]


def series_settings(tree: Path) -> tuple[suite.VerifySettings, Path | None, str | None]:
    """The series the tree was ported with (verify's settings, its directory) and the base commit."""
    state = wt.read_state(tree)
    series = Path(state.series) if state and state.series else None
    base = state.base if state else None
    if series and series.is_file():
        return suite.parse_settings(load_series(series).verify, str(series)), series.parent, base
    return suite.VerifySettings(), None, base


def unit_options(settings: suite.VerifySettings, base: str | None, cache_dir: Path, tree: Path, wanted: str | bool | None,
                 tests, nproc: int) -> tuple[UnitOptions | None, str]:
    """Stage 3's options, or None and why it does not run. ``wanted``: None (default), False
    (--no-unit-tests), "default" or "all" (--unit-tests [all]); ``tests``: explicit --unit-test paths."""
    if wanted is False:
        return None, "--no-unit-tests"
    if not (tree / "tests" / "unit_tests").is_dir():
        if wanted or tests:
            raise BadInput(f"{tree}: no tests/unit_tests to run (a package-index source ships megatron/core only); drop --unit-tests")
        return None, "the tree has no tests/unit_tests (a package-index source ships megatron/core only)"
    if nproc < 1:
        raise BadInput(f"--unit-nproc {nproc}: must be at least 1")
    for test in tests:
        check_unit_test(tree, test)
    if tests:
        chosen, reasons, how = list(tests), {t: "--unit-test" for t in tests}, "explicit"
    elif wanted == "all":
        chosen, reasons, how = [suite.ALL], {suite.ALL: "--unit-tests all: upstream's whole unit-test suite"}, "all"
    elif settings.unit_tests:
        chosen, reasons, how = list(settings.unit_tests), dict(settings.unit_tests), "series"
    else:
        chosen, reasons, how = list(suite.FALLBACK_TESTS), dict(suite.FALLBACK_TESTS), "fallback"
    return UnitOptions(tests=chosen, nproc=nproc, cache_dir=cache_dir, base=base, settings=settings, reasons=reasons,
                       selection=how), ""


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


def functional_options(tree: Path, series_dir: Path | None, wanted, case, tp: int, pp: int, data_path, record: bool,
                       iters: int, resume: bool = True, te: bool = False) -> tuple[FunctionalOptions | None, str]:
    from rocmport.verify.doctor import for_verify
    from rocmport.verify.functional import CASES, cases_near, check_case, default_case, load_case, missing_data

    if case is not None:  # confined to the tree's cases directory whether or not stage 4 runs
        check_case(tree, case)
    if wanted is False:
        return None, "--no-functional"
    if not (tree / "pretrain_gpt.py").is_file():
        if wanted:
            raise BadInput(f"{tree}: no pretrain_gpt.py to run (a package-index source ships megatron/core only); drop --functional")
        return None, "the tree has no pretrain_gpt.py (a package-index source ships megatron/core only)"
    if case is not None and not (check_case(tree, case) / "model_config.yaml").is_file():
        raise BadInput(f"--case {case!r}: no such case in {tree / CASES} (no model_config.yaml); e.g. {', '.join(cases_near(tree)) or '-'}")
    if record and series_dir is None:
        raise BadInput(f"{tree}: --record-golden needs a tree made by `rocmport apply` (goldens live next to its series)")
    # The TE case where doctor finds Transformer Engine usable (installed, in the line's range, built for the GPU),
    # or where TE's Python layer runs on the CPU proxy (--te).
    te_usable = te or for_verify(series_dir / "series" if series_dir else None)["te_usable"]
    chosen = case or default_case(tp, pp, te_usable, tree)
    if data_path is not None:
        # --data-path is upstream CI's data root ($DATA_PATH; the case names its files under it), taken
        # whole (never split on spaces) and made absolute: pretrain_gpt.py runs in the tree.
        root = Path(data_path).expanduser().resolve()
        if not root.is_dir():
            raise BadInput(f"--data-path {data_path}: not a directory; give upstream CI's data root ($DATA_PATH), "
                           f"under which the case names its dataset and tokenizer files")
        config = check_case(tree, chosen) / "model_config.yaml"
        missing = missing_data(load_case(tree, chosen), root) if config.is_file() else []
        if missing:
            raise BadInput(f"--data-path {data_path}: case {chosen} reads {missing[0]}, which is not there"
                           + (f" (nor {len(missing) - 1} more)" if len(missing) > 1 else "")
                           + "; lay the data out as upstream CI does under that directory")
        data_path = str(root)
    return FunctionalOptions(case=chosen, defaulted=not case, data_path=data_path, record=record, series_dir=series_dir,
                             iters=iters, resume=resume), ""


def launch_plan(opts: VerifyOptions) -> list[dict]:
    """The command line of every launch verify would make (``--dry-run``); temporary paths under $TMP."""
    from rocmport.verify.bridge_stage import bridge_command
    from rocmport.verify.functional import build_args, case_dir, functional_command, load_case
    from rocmport.verify.unit_tests import pytest_command

    tree, tp, pp, iters, launcher, dp = opts.tree, opts.tp, opts.pp, opts.iters, opts.launcher, _dp(opts)
    tmp = Path("$TMP")
    plan = []
    if "imports" in opts.stages:
        plan.append({"stage": "imports", "command": ["python", "-c", "<import probe>"], "cwd": str(tree)})
    if "gpt-training" in opts.stages:
        for name, cmd in stages.training_commands(launcher, tp, pp, dp, iters, tmp, te=opts.te is not None).items():
            plan.append({"stage": f"gpt-training ({name})", "command": cmd, "cwd": str(tree)})
    unit = opts.unit
    if unit is not None and "unit-tests" in opts.stages and launcher.runs_stage(single_node=True):
        plan.append({"stage": "unit-tests", "command": pytest_command(unit.tests, unit.nproc, launcher), "cwd": str(tree)})
        plan.append({"stage": "unit-tests (baseline, unless cached)", "command": pytest_command(unit.tests, unit.nproc, launcher),
                     "cwd": f"{tmp}/baseline at {str(unit.base)[:12]}"})
    fopts = opts.functional
    if fopts is not None and "functional" in opts.stages and (case_dir(tree, fopts.case) / "model_config.yaml").is_file():
        config = load_case(tree, fopts.case)
        args = build_args(config, iters=fopts.iters, proxy=not environment.probe().has_gpu, data_path=fopts.data_path, work=tmp)
        plan.append({"stage": "functional", "command": functional_command(launcher, config, args, dp), "cwd": str(tree)})
    if opts.bridge_tree is not None and "bridge" in opts.stages:
        plan.append({"stage": "bridge", "command": bridge_command(launcher, tp, pp, dp, iters, tmp / "bridge.json", te=opts.te is not None),
                     "cwd": str(opts.bridge_tree)})
    return plan


def _lock_pins(settings: Settings, name: str) -> bool:
    """Whether the project's lock pins ``name`` (True when there is no lock to say otherwise)."""
    return not settings.lock_path.is_file() or name in load_lock(settings.lock_path).upstreams


def prepare(settings: Settings, tree: str | None, *, tp: int = DEFAULT_TP, pp: int = DEFAULT_PP, dp: int | None = None, nproc: int | None = None,
            iters: int = 10, backend: str = "auto", with_unit: str | bool | None = None, unit_tests=(), unit_nproc: int = 8,
            with_functional: bool | None = None, case: str | None = None, data_path: str | None = None,
            record_golden: bool = False, resume: bool = True, with_bridge: bool | None = None, launcher_kind: str = "torchrun",
            nnodes: int = 1, node_rank: int = 0, rdzv_endpoint: str | None = None,
            hip_version: str | None = hip_sim.DEFAULT_VERSION, stages_text: str | None = None, te: str = "none",
            hip_arch: str = hip_sim.DEFAULT_ARCH) -> VerifyOptions:
    """Check the trees and stage options for a run (or a --dry-run) of verify in project ``settings``."""
    check_sizes(tp, pp, iters, dp, nproc)
    if hip_version is not None:  # '' too: an empty version is a typo, never the CUDA path (that is --no-hip-sim)
        hip_sim.parse_version(hip_version)
    hip_sim.parse_arch(hip_arch)
    chosen = parse_stages(stages_text)
    path = Path(tree) if tree else settings.worktree_path(MEGATRON_LM.name)
    if not path.is_dir():
        raise BadInput(f"{path}: no such tree; run `rocmport apply` first or pass --tree")
    check_megatron_tree(path)
    environment.check_python(path)  # before anything imports torch: a 3.12 tree on 3.11 says how to get 3.12
    bridge_tree = settings.worktree_path(MEGATRON_BRIDGE.name)
    skipped = {}
    if with_bridge is None:  # the Bridge tree of the lock: a refresh to a release without a companion unpins it
        pinned = _lock_pins(settings, MEGATRON_BRIDGE.name)
        with_bridge = not tree and bridge_tree.is_dir() and pinned
        if not with_bridge:
            skipped["bridge"] = ("--tree given (stage 5 runs with the project's own work trees; --bridge to ask for it)" if tree
                                 else "no Megatron-Bridge work tree (the lock pins no Bridge)" if not bridge_tree.is_dir()
                                 else "the lock pins no Megatron-Bridge (its old work tree is not verified against this Megatron-LM)")
    elif not with_bridge:
        skipped["bridge"] = "--no-bridge"
    if with_bridge and not bridge_tree.is_dir():
        raise BadInput(f"{bridge_tree}: no Megatron-Bridge work tree; run `rocmport apply` with a Bridge pin or pass --no-bridge")
    launcher = Launcher(kind=launcher_kind, nnodes=nnodes, node_rank=node_rank, rdzv_endpoint=rdzv_endpoint,
                        gpus=backend != "gloo" and environment.probe().has_gpu)
    cfg, series_dir, base = series_settings(path)
    unit, why = unit_options(cfg, base, settings.cache_dir, path, with_unit, unit_tests, unit_nproc)
    if why:
        skipped["unit-tests"] = why
    te_layer_ = te_for(te, series_dir, settings.cache_dir)
    functional, why = functional_options(path, series_dir, with_functional, case, tp, pp, data_path, record_golden, iters, resume,
                                         te=te_layer_ is not None)
    if why:
        skipped["functional"] = why
    return VerifyOptions(tree=path.resolve(), tp=tp, pp=pp, dp=dp, nproc=nproc, backend=backend, iters=iters, unit=unit,
                         functional=functional, bridge_tree=bridge_tree.resolve() if with_bridge else None, launcher=launcher,
                         hip_version=hip_version, hip_arch=hip_arch, stages=chosen, skipped=skipped, te=te_layer_,
                         pycache=settings.cache_dir / "pycache")

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
    wheel = te_layer.choose(spec, line_range, te_layer.list_wheels())
    if wheel is None:
        return None
    with output.progress(f"Transformer Engine {wheel.version}: its Python layer from the package index"):
        return te_layer.fetch(cache_dir, wheel)
