"""verify's stages, in the order they run: the one list `--stages`, the run, `--dry-run`, the
summary and refresh read. Each entry keeps the Stage contract (contract.py) over its module's plain
functions; a new stage is its module plus one class here, appended to STAGES."""

from __future__ import annotations

from pathlib import Path

from rocmport import output
from rocmport.machine import probe
from rocmport.verify.orchestration import environment
from rocmport.verify.stages import gpt_training as stages
from rocmport.verify.orchestration.contract import Stage, StageRun, VerifyContext, VerifyOptions
from rocmport.verify.stages.gpt_training import StageResult


class Imports(Stage):
    name = "imports"
    summary = "megatron.core, megatron.training, pretrain_gpt's imports, behind the firewall"
    after_imports = False

    def launches(self, opts: VerifyOptions, tmp: Path) -> list[dict]:
        return [{"stage": self.name, "command": ["python", "-c", "<import probe>"], "cwd": str(opts.tree)}]

    def run(self, ctx: VerifyContext) -> StageRun:
        missing = environment.missing_deps(ctx.tree)
        if missing:
            cmd = f"python -m pip install {' '.join(sorted(set(missing.values())))}"
            return StageRun(
                StageResult(self.name, stages.FAIL, f"missing dependencies {', '.join(sorted(missing))}: `{cmd}`")
            )
        with output.progress("stage 1: imports behind the firewall"):
            return StageRun(stages.stage_imports(ctx.tree, ctx.env, ctx.blocked))


class Training(Stage):
    name = "gpt-training"
    summary = (
        "megatron's schedule/DDP/optimizer via torchrun; the loss falls, tied embeddings stay equal, and losses "
        "match a tp1/pp1 run from the same weights (with --te, a MoE case too)"
    )
    report_key = "training"

    def launches(self, opts: VerifyOptions, tmp: Path) -> list[dict]:
        cmds = stages.training_commands(
            opts.launcher, opts.tp, opts.pp, opts.dp, opts.iters, tmp, te=opts.te is not None, moe=opts.moe
        )
        return [{"stage": f"{self.name} ({name})", "command": cmd, "cwd": str(opts.tree)} for name, cmd in cmds.items()]

    def run(self, ctx: VerifyContext) -> StageRun:
        o = ctx.opts
        spec = f"Transformer Engine {o.te.version}" if o.te else "the local layer spec"
        with output.progress(
            f"stage 2: GPT training tp{o.tp}×pp{o.pp}×dp{o.dp} on {ctx.backend} with {spec}, and the tp1/pp1 reference"
        ):
            result, training = stages.stage_training(
                ctx.tree,
                ctx.env,
                o.tp,
                o.pp,
                o.dp,
                o.iters,
                ctx.backend,
                o.launcher,
                te=o.te.describe() if o.te else None,
                moe_case=o.moe,
            )
        return StageRun(result, training)


class UnitTests(Stage):
    name = "unit-tests"
    summary = "upstream's unit tests under torchrun, each failure labelled against the unported tree"

    def requested(self, opts: VerifyOptions) -> bool:
        return opts.unit is not None

    def launches(self, opts: VerifyOptions, tmp: Path) -> list[dict]:
        from rocmport.verify.stages.unit_tests.runner import config_args, pytest_command

        unit = opts.unit
        if unit is None or not opts.launcher.runs_stage(single_node=True):
            return []
        cmd = pytest_command(unit.tests, unit.nproc, opts.launcher)
        n = len(unit.tests)

        # as each run pins pytest to its tree (unit_tests._attempt): the tree's own config, else an empty
        # one; the unported tree's checkout has the port tree's config at the same place
        baseline = tmp / "baseline"
        args = config_args(opts.tree, list(unit.tests), tmp / "pytest.ini")

        def pinned(tree: Path) -> list[str]:
            here = [a.replace(str(opts.tree), str(tree), 1) if a.startswith(str(opts.tree)) else a for a in args]
            return cmd[:-n] + here + cmd[-n:] if n else cmd

        return [
            {"stage": self.name, "command": pinned(opts.tree), "cwd": str(opts.tree)},
            {
                "stage": f"{self.name} (baseline, unless cached)",
                "command": pinned(baseline),
                "cwd": f"{baseline} at {str(unit.base)[:12]}",
            },
        ]

    def run(self, ctx: VerifyContext) -> StageRun:
        from rocmport.nvidia_only import blocked
        from rocmport.verify.stages.unit_tests import suite
        from rocmport.verify.stages.unit_tests.runner import stage_unit_tests

        unit = ctx.opts.unit
        assert unit is not None
        known, not_applied = unit.settings.known_for(
            ctx.mode, bool(ctx.machine.hip), hip_sim=bool(ctx.hip_version), arch=ctx.device_arch
        )
        files = suite.test_files(ctx.tree, unit.tests)
        chosen = (
            f"{len(files)} files of {unit.impact.total_files}, impacted since {unit.impact.since[:12]}"
            if unit.impact
            else f"{len(files)} files"
        )
        with output.progress(
            f"stage 3: upstream unit tests on {unit.nproc} ranks ({chosen}) and the unported baseline"
        ):
            result = stage_unit_tests(
                ctx.tree,
                ctx.env,
                unit.tests,
                unit.nproc,
                known,
                unit.cache_dir,
                unit.base,
                ctx.launcher,
                blocked=blocked(ctx.profile),
                progress=output.info,
                reasons=unit.reasons,
                known_skipped=not_applied,
            )
        return StageRun(_full_suite_record(ctx, result))


def _full_suite_record(ctx: VerifyContext, result: StageResult) -> StageResult:
    """`--unit-tests all`: record the run (per-file seconds, tests, and the pass) in the cache;
    `impacted`: its figures against that record, the summary's line first in the stage's reason."""
    from rocmport.port import worktree as wt
    from rocmport.verify.analyses import impact
    from rocmport.verify.stages.unit_tests import suite

    from rocmport.verify.stages.unit_tests.runner import UnitTestsRun

    unit = ctx.opts.unit
    details = result.details
    if unit is None or unit.selection not in ("all", "impacted") or not isinstance(details, UnitTestsRun):
        return result
    state = wt.read_state(ctx.tree)
    line = Path(state.series).parent.name if state and state.series else f"tree {ctx.tree}"
    # the tests the selection holds: the port's test ids, or the unported tree's where more (a module
    # that does not import on the port hides its tests there)
    tests = max(sum("::" in k for k in details.outcomes), details.baseline.tests or 0)
    if unit.selection == "all":
        head = impact.head_commit(ctx.tree)
        try:
            impact.record_full_run(
                unit.cache_dir,
                line,
                passed=result.status == stages.PASS,
                commit=head,
                base=unit.base,
                tests=tests,
                file_seconds=details.file_seconds,
                seconds=details.port_seconds,
            )
        except OSError as exc:  # the run's result stands; only the next impacted run's figures miss it
            output.warn(f"the full suite's run could not be recorded in {unit.cache_dir}: {exc.strerror or exc}")
        return result
    assert unit.impact is not None
    full = impact.read_full_runs(unit.cache_dir).get(line, {})
    details.impact = impact.impact_summary(
        unit.impact, suite.test_files(ctx.tree, unit.tests), tests, details.port_seconds, full
    )
    result.reason = f"{details.impact.line}; {result.reason}"
    return result


class Functional(Stage):
    name = "functional"
    summary = (
        "upstream's GPT case (pretrain_gpt.py with its MODEL_ARGS; mock data), a checkpoint saved half way and "
        "resumed with equal losses, and this device kind's golden"
    )
    report_key = "functional"

    def requested(self, opts: VerifyOptions) -> bool:
        return opts.functional is not None

    def launches(self, opts: VerifyOptions, tmp: Path) -> list[dict]:
        from rocmport.verify.stages import case_plan
        from rocmport.verify.stages.functional import build_args, case_dir, functional_command, load_case, world_size

        f = opts.functional
        if f is None or not (case_dir(opts.tree, f.case) / "model_config.yaml").is_file():
            return []
        config = load_case(opts.tree, f.case)
        proxy = not probe.probe().has_gpu
        plan = case_plan.plan_case(f.case, config, data_path=bool(f.data_path)) if proxy else None
        if isinstance(plan, case_plan.Unsupported):
            return []
        args = build_args(config, iters=f.iters, proxy=proxy, data_path=f.data_path, work=tmp, plan=plan)
        return [
            {
                "stage": self.name,
                "command": functional_command(opts.launcher, world_size(config, opts.dp, plan), args),
                "cwd": str(opts.tree),
            }
        ]

    def run(self, ctx: VerifyContext) -> StageRun:
        from rocmport.verify.stages.functional import stage_functional

        f = ctx.opts.functional
        assert f is not None
        blocked_by = environment.functional_blockers(ctx.tree)
        if blocked_by:
            return StageRun(StageResult(self.name, stages.FAIL, blocked_by))
        with output.progress(
            f"stage 4: upstream's functional case {f.case} (pretrain_gpt.py, {f.iters} iterations, "
            f"then resumed from iteration {f.iters // 2})"
        ):
            result, details = stage_functional(
                ctx.tree,
                ctx.env,
                case=f.case,
                dp=ctx.opts.dp,
                iters=f.iters,
                proxy=ctx.mode == "cpu-proxy",
                data_path=f.data_path,
                series_dir=f.series_dir,
                record=f.record,
                device_kind=device_kind(ctx),
                defaulted=f.defaulted,
                launcher=ctx.launcher,
                resume=f.resume,
                hip=ctx.hip_version,
                rocm=bool(ctx.hip_version or ctx.machine.hip),
            )
        return StageRun(result, details)


class Bridge(Stage):
    name = "bridge"
    summary = "Megatron-Bridge's modules import; a GPT built by its GPTModelProvider trains"
    report_key = "bridge_training"

    def requested(self, opts: VerifyOptions) -> bool:
        return opts.bridge_tree is not None

    def launches(self, opts: VerifyOptions, tmp: Path) -> list[dict]:
        from rocmport.verify.stages.bridge import bridge_command

        if opts.bridge_tree is None:
            return []
        return [
            {
                "stage": self.name,
                "command": bridge_command(
                    opts.launcher, opts.tp, opts.pp, opts.dp, opts.iters, tmp / "bridge.json", te=opts.te is not None
                ),
                "cwd": str(opts.bridge_tree),
            }
        ]

    def run(self, ctx: VerifyContext) -> StageRun:
        from rocmport.verify.stages.bridge import stage_bridge

        o = ctx.opts
        assert o.bridge_tree is not None
        with output.progress(f"stage 5: Megatron-Bridge imports and GPTModelProvider training tp{o.tp}×pp{o.pp}"):
            result, training = stage_bridge(
                o.bridge_tree, ctx.env, o.tp, o.pp, o.dp, o.iters, o.launcher, te=o.te.describe() if o.te else None
            )
        return StageRun(result, training)


def device_kind(ctx: VerifyContext) -> str:
    """Goldens are kept per device kind: `cpu-proxy` (`cpu-proxy-te<version>` with TE's Python layer),
    or the platform and the first GPU's name."""
    import re

    te = ctx.opts.te
    if ctx.mode == "cpu-proxy" or not ctx.machine.devices:
        return f"cpu-proxy-te{te.version}" if te else "cpu-proxy"
    name = re.sub(r"[^a-z0-9]+", "-", ctx.machine.devices[0].lower()).strip("-")
    return f"{'rocm' if ctx.machine.hip else 'cuda'}-{name}"


STAGES: tuple[Stage, ...] = (Imports(), Training(), UnitTests(), Functional(), Bridge())
NAMES: tuple[str, ...] = tuple(s.name for s in STAGES)
