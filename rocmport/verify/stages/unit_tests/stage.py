"""Stage 3, unit-tests: its options (the one place they are checked), and the stage itself: the
selection (the series' suite, --unit-test paths, all, or the impacted files), the run on the port
and on the unported baseline (runner), each failure labelled, and the full suite's record."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from rocmport import output
from rocmport.errors import BadInput
from rocmport.gitutil import run_git
from rocmport.inputs import has_control
from rocmport.nvidia_only import blocked
from rocmport.port import worktree as wt
from rocmport.verify.analyses import impact
from rocmport.verify.orchestration.contract import NotRequested, RunSetup, Stage, StageRun, VerifyContext, VerifyOptions
from rocmport.verify.orchestration.sizes import SIZE
from rocmport.verify.orchestration.stage_result import PASS, StageResult, tree_lacks
from rocmport.verify.stages.unit_tests import suite
from rocmport.verify.stages.unit_tests.runner import UnitTestsRun, config_args, pytest_command, stage_unit_tests

if TYPE_CHECKING:
    from rocmport.verify.analyses.impact import Selection

NAME = "unit-tests"


@dataclass(frozen=True)
class UnitOptions:
    """Stage 3: upstream's unit tests."""

    tests: list[str]
    nproc: int
    cache_dir: Path
    base: str | None  # the unported commit the baseline runs
    settings: suite.VerifySettings = field(default_factory=suite.VerifySettings)
    reasons: dict[str, str] = field(default_factory=dict)  # test -> why it is in the suite
    selection: str = "series"  # series | fallback | explicit | all | impacted
    impact: Selection | None = None  # impacted: since, until, changed files, test files selected of the total


CLI_OPTIONS = (
    click.Option(
        ["--unit-tests", "with_unit"],
        is_flag=False,
        flag_value="default",
        default=None,
        type=click.Choice(["default", "all", "impacted"]),
        help="Stage 3, upstream's unit tests: the line's default suite (bare flag), `all` of tests/unit_tests "
        "(nightly; each run's per-file seconds and last pass are recorded), or `impacted`: the test files whose "
        "imports reach a file upstream changed since --since, plus a smoke set "
        "(default: the suite, when the tree has tests/unit_tests).",
    ),
    click.Option(
        ["--since"],
        default=None,
        metavar="COMMIT",
        help="With --unit-tests impacted: the upstream commit the port was last verified at (a refresh hop's old pin).",
    ),
    click.Option(["--no-unit-tests", "no_unit"], is_flag=True, help="Skip stage 3."),
    click.Option(
        ["--unit-test", "unit_tests"],
        multiple=True,
        metavar="PATH",
        help="A test file, directory or id under the tree's tests/unit_tests to run instead of the suite "
        "(repeatable; a path that leads out of tests/unit_tests is exit 2).",
    ),
    click.Option(
        ["--unit-nproc"], type=SIZE, default=8, show_default=True, help="Ranks for the unit tests (upstream CI uses 8)."
    ),
)


class UnitTestsStage(Stage[UnitOptions]):
    name = NAME
    summary = "upstream's unit tests under torchrun, each failure labelled against the unported tree"
    cli_options = CLI_OPTIONS

    def check(self, given: Mapping[str, Any], setup: RunSetup) -> UnitOptions | NotRequested:
        unit, why = unit_options(
            setup.series,
            setup.base,
            setup.settings.cache_dir,
            setup.tree,
            False if given["no_unit"] else given["with_unit"],
            given["unit_tests"],
            given["unit_nproc"],
            given["since"],
            tuple(given.get("impact_extra", ())),
        )
        return unit if unit is not None else NotRequested(why)

    def launches(self, opts: VerifyOptions, options: UnitOptions, tmp: Path) -> list[dict]:
        unit = options
        if not opts.launcher.runs_stage(single_node=True):
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

    def run(self, ctx: VerifyContext, options: UnitOptions) -> StageRun:
        unit = options
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
        return StageRun(_full_suite_record(ctx, unit, result))


STAGE = UnitTestsStage()


def _full_suite_record(ctx: VerifyContext, unit: UnitOptions, result: StageResult) -> StageResult:
    """`--unit-tests all`: record the run (per-file seconds, tests, and the pass) in the cache;
    `impacted`: its figures against that record, the summary's line first in the stage's reason."""
    details = result.details
    if unit.selection not in ("all", "impacted") or not isinstance(details, UnitTestsRun):
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
                passed=result.status == PASS,
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
        return None, tree_lacks("tests/unit_tests")
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
