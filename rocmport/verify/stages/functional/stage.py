"""Stage 4 as verify runs it: its options (`--cases`, the hidden `--case` alias, `--data-path`,
`--record-golden`, `--resume`), checked once (functional_options), its launches for --dry-run,
and its run over the selected cases (cases.run_cases)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from rocmport import output
from rocmport.errors import BadInput
from rocmport.machine import probe
from rocmport.verify.orchestration import environment
from rocmport.verify.orchestration.device_kind import PROXY, DeviceKind
from rocmport.verify.orchestration.contract import NotRequested, RunSetup, Stage, StageRun, VerifyContext, VerifyOptions
from rocmport.verify.orchestration.stage_result import FAIL, StageResult, tree_lacks
from rocmport.verify.stages import case_plan
from rocmport.verify.stages.after_script import AfterScript
from rocmport.verify.stages.case_plan import CasePlan
from rocmport.verify.stages.functional import selection
from rocmport.verify.stages.functional.selection import FunctionalOptions
from rocmport.verify.stages.functional.case_args import (
    NAME,
    build_args,
    case_dir,
    check_case,
    functional_command,
    load_case,
    missing_data,
    world_size,
)
from rocmport.verify.stages.functional.cases import run_cases, verdict
from rocmport.verify.stages.functional.rank_servers import applies, server_command

if TYPE_CHECKING:
    from rocmport.verify.orchestration.te_layer import TELayer


CLI_OPTIONS = (
    click.Option(
        ["--functional/--no-functional", "with_functional"],
        default=None,
        help="Stage 4, upstream's functional GPT cases with pretrain_gpt.py (default: when the tree has pretrain_gpt.py).",
    ),
    click.Option(
        ["--cases"],
        default=None,
        metavar="reach|all|NAME[,NAME...]",
        help="Stage 4's cases: the line's recorded reach set (reach, the default; today's case by tp/pp and TE "
        "until the line has a record), every GPT case of the tree (all), or directory names under "
        "tests/functional_tests/test_cases/gpt. A failing case runs again on the unported tree and is labelled; "
        "only a port-regression (or an unverified run stopped on a NaN, Inf or spiky loss) fails the stage.",
    ),
    click.Option(["--case"], default=None, metavar="NAME", hidden=True, help="--cases NAME (kept for scripts)."),
    click.Option(
        ["--data-path"],
        default=None,
        metavar="DIR",
        help="Real data for the functional cases: upstream CI's data root ($DATA_PATH), under which a case names its "
        "dataset and tokenizer files (default: mock data, NullTokenizer).",
    ),
    click.Option(
        ["--record-golden"],
        is_flag=True,
        help="Store each functional case's loss curve (and its args) as its golden for this device kind.",
    ),
    click.Option(
        ["--resume/--no-resume"],
        default=True,
        show_default=True,
        help="Stage 4's checkpoint round trip: resume from the mid-run checkpoint and compare the remaining losses.",
    ),
    click.Option(
        ["--fork-ranks/--no-fork-ranks"],
        default=True,
        show_default=True,
        help="CPU proxy, torchrun on one node: a case's ranks are forked from one process that imported torch, "
        "megatron and TE once (for its run and its resumed run), not started by torchrun each importing them.",
    ),
)


class FunctionalStage(Stage[FunctionalOptions]):
    name = NAME
    summary = (
        "upstream's GPT cases (pretrain_gpt.py with their MODEL_ARGS; mock data), each with a checkpoint saved "
        "half way and resumed with equal losses and this device kind's golden; a failing case labelled against "
        "the unported tree"
    )
    cli_options = CLI_OPTIONS

    def check(self, given: Mapping[str, Any], setup: RunSetup) -> FunctionalOptions | NotRequested:
        cases, option = given_cases(given.get("cases"), given.get("case"))
        options, why = functional_options(
            setup.tree,
            setup.series_dir,
            given["with_functional"],
            cases,
            setup.tp,
            setup.pp,
            given["data_path"],
            given["record_golden"],
            setup.iters,
            given["resume"],
            te=setup.te,
            option=option,
            base=setup.base,
            cache_dir=setup.settings.cache_dir,
            fork_ranks=given.get("fork_ranks", True),
        )
        return options if options is not None else NotRequested(why)

    def launches(self, opts: VerifyOptions, options: FunctionalOptions, tmp: Path) -> list[dict]:
        proxy = not probe.probe().has_gpu
        out = []
        for case in options.cases:
            if not (case_dir(opts.tree, case) / "model_config.yaml").is_file():
                continue
            config = load_case(opts.tree, case)
            te = case_plan.ProxyTE.of(opts.te, opts.hip_arch if opts.hip_version else None)
            plan = case_plan.plan_case(case, config, data_path=bool(options.data_path), te=te) if proxy else None
            if isinstance(plan, case_plan.Unsupported):
                continue
            work = tmp / case
            args = build_args(
                config, iters=options.iters, proxy=proxy, data_path=options.data_path, work=work, plan=plan
            )
            forked = options.fork_ranks and applies(opts.launcher, proxy)
            sock = str(tmp / "rank-server" / "ranks.sock") if forked else None
            command = functional_command(opts.launcher, world_size(config, opts.dp, plan), args, rank_server=sock)
            env = dict(plan.fp8.env) if isinstance(plan, CasePlan) and plan.fp8 else {}
            server = {"rank_server": server_command(sock)} if sock else {}
            checks = plan.after_script if isinstance(plan, CasePlan) else case_plan.upstream_checks(case, config)
            decided = (
                {"decided_by": f"{checks.describe()}: " + "; ".join(c.describe() for c in checks.checks)}
                if isinstance(checks, AfterScript)
                else {}
            )
            out.append(
                {
                    "stage": self.name,
                    "command": command,
                    "cwd": str(opts.tree),
                    **server,
                    **({"env": env} if env else {}),
                    **decided,
                }
            )
        return out

    def run(self, ctx: VerifyContext, options: FunctionalOptions) -> StageRun:
        blocked_by = environment.functional_blockers(ctx.tree)
        if blocked_by:
            return StageRun(StageResult(self.name, FAIL, blocked_by))
        n = len(options.cases)
        with output.progress(
            f"stage 4: {n} functional case{'s' if n != 1 else ''} ({options.selection}; pretrain_gpt.py, "
            f"{options.iters} iterations, then resumed from iteration {options.iters // 2})"
        ):
            data = run_cases(ctx, options)
        status, reason = verdict(data)
        seconds = sum(
            e.seconds + (e.baseline.seconds if e.baseline and not e.baseline.cached else 0.0) for e in data.entries
        )
        return StageRun(StageResult(self.name, status, reason, seconds, data), data)


STAGE = FunctionalStage()


def run_device_kind(te: TELayer | None) -> DeviceKind:
    """The device kind this run's goldens are kept for (DeviceKind.of_run, before the run): TE's layer
    runs on the CPU proxy only (--te); without it, the proxy unless this machine has a GPU."""
    if te is not None:
        return DeviceKind(PROXY, te=te.version)
    machine = probe.probe()
    return DeviceKind.of_run("gpu" if machine.has_gpu else PROXY, machine, None)


def run_golden_kind(te: TELayer | None) -> str:
    """The device kind whose goldens reach's golden-first pick reads: run_device_kind's, never an FP8
    case's (``cpu-proxy-te<v>-fp8-fnuz`` / ``-ocp``, DeviceKind.for_fp8). Measured across two machines
    of the same kind, an FP8 case's losses drifted from its golden by 2.5e-4 (v0.16's nondet tp1/pp1
    FP8 case) and 4.0e-4 (v0.19's current-scaling case), where a case without FP8 drifted 1.5e-7
    (FP8's rounding turns a last-bit difference of a CPU kernel into a flipped code): a first case
    picked for its golden must be one whose golden holds on another machine."""
    return str(run_device_kind(te))


def given_cases(cases: str | None, case: str | None) -> tuple[str | None, str]:
    """The cases asked for and the option that asked (``--case NAME`` is ``--cases NAME``)."""
    if cases is not None and case is not None and cases != case:
        raise BadInput(f"--case {case!r} and --cases {cases!r}: --case NAME is --cases NAME; give one")
    return (cases, "--cases") if cases is not None else (case, "--case")


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
    te: TELayer | None = None,
    *,
    option: str = "--case",
    base: str | None = None,
    cache_dir: Path | None = None,
    fork_ranks: bool = True,
) -> tuple[FunctionalOptions | None, str]:
    """Stage 4's options checked: ``case`` is ``option``'s value (reach, all or names; None: reach)."""
    from rocmport.machine.doctor import for_verify

    if case is not None and case.strip() not in (selection.REACH, selection.ALL):
        for name in case.split(","):  # confined to the tree's cases directory whether or not stage 4 runs
            check_case(tree, name.strip(), option)
    if wanted is False:
        return None, "--no-functional"
    if not (tree / "pretrain_gpt.py").is_file():
        if wanted:
            raise BadInput(
                f"{tree}: no pretrain_gpt.py to run (a package-index source ships megatron/core only); drop --functional"
            )
        return None, tree_lacks("pretrain_gpt.py")
    if record and series_dir is None:
        raise BadInput(
            f"{tree}: --record-golden needs a tree made by `rocmport apply` (goldens live next to its series)"
        )
    # The TE case where doctor finds Transformer Engine usable (installed, in the line's range, built for the GPU),
    # or where TE's Python layer runs on the CPU proxy (--te).
    te_usable = te is not None or for_verify(series_dir / "series" if series_dir else None).te_usable
    chosen = selection.select(tree, series_dir, case, option, tp, pp, te_usable, lambda: run_golden_kind(te))
    if data_path is not None:
        data_path = _data_root(tree, data_path, chosen.cases)
    return FunctionalOptions(
        cases=chosen.cases,
        defaulted=chosen.defaulted,
        data_path=data_path,
        record=record,
        series_dir=series_dir,
        iters=iters,
        resume=resume,
        selection=chosen.how,
        note=chosen.note,
        base=base,
        cache_dir=cache_dir,
        fork_ranks=fork_ranks,
    ), ""


def _data_root(tree: Path, data_path: str, cases: tuple[str, ...]) -> str:
    """--data-path as an absolute directory under which every selected case finds its files."""
    # upstream CI's data root ($DATA_PATH; a case names its files under it), taken whole (never split
    # on spaces) and made absolute: pretrain_gpt.py runs in the tree.
    root = Path(data_path).expanduser().resolve()
    if not root.is_dir():
        raise BadInput(
            f"--data-path {data_path}: not a directory; give upstream CI's data root ($DATA_PATH), "
            f"under which the case names its dataset and tokenizer files"
        )
    for case in cases:
        config = case_dir(tree, case) / "model_config.yaml"
        missing = missing_data(load_case(tree, case), root) if config.is_file() else []
        if missing:
            raise BadInput(
                f"--data-path {data_path}: case {case} reads {missing[0]}, which is not there"
                + (f" (nor {len(missing) - 1} more)" if len(missing) > 1 else "")
                + "; lay the data out as upstream CI does under that directory"
            )
    return str(root)
