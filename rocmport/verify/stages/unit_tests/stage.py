"""Stage 3, unit-tests: its options (the one place they are checked), and the stage itself: the
selection (the series' suite, --unit-test paths, all, or the impacted files), the run on the port
and on the unported baseline (runner), each failure labelled, and the full suite's record."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from rocmport.gitutil import run_git
from rocmport.machine.cpu_meter import task_limit, task_limit_phrase
from rocmport.verify.orchestration.launcher import Launcher

from collections.abc import Mapping

import click

from rocmport import output
from rocmport.errors import BadInput
from rocmport.inputs import has_control
from rocmport.nvidia_only import blocked
from rocmport.port import worktree as wt
from rocmport.verify.analyses import impact
from rocmport.verify.orchestration.contract import NotRequested, RunSetup, Stage, StageRun, VerifyContext, VerifyOptions
from rocmport.verify.orchestration.sizes import SIZE
from rocmport.verify.orchestration.stage_result import (
    FAIL,
    PASS,
    SKIPPED,
    UNSUPPORTED,
    StageResult,
    skipped,
    tree_lacks,
)
from rocmport.verify.stages.unit_tests import NAME, suite
from rocmport.verify.stages.unit_tests.baseline import baseline, to_label
from rocmport.verify.stages.unit_tests.command import _file
from rocmport.verify.stages.unit_tests.labels import _missing_ordinary, _on_baseline, label
from rocmport.verify.stages.unit_tests.results import (
    BLOCKING,
    FileRun,
    LABELS,
    RESTARTS_PER_FILE,
    SuiteRun,
    UnitBaseline,
    UnitTestsRun,
    UnitTestsStopped,
    _counts,
    _share_phrase,
)
from rocmport.verify.stages.unit_tests.runner import Progress, rerun_alone, run_tests
from rocmport.verify.stages.unit_tests.command import config_args, pytest_command

if TYPE_CHECKING:
    from rocmport.verify.analyses.impact import Selection


@dataclass(frozen=True)
class UnitOptions:
    """Stage 3: upstream's unit tests."""

    tests: list[str]
    nproc: int
    cache_dir: Path
    base: str | None  # the unported commit the baseline runs
    settings: suite.VerifySettings = field(default_factory=suite.VerifySettings)
    reasons: dict[str, str] = field(default_factory=dict)  # test -> why it is in the suite
    selection: str = "series"  # series | fallback | explicit | all | impacted | reach
    impact: Selection | None = None  # impacted: since, until, changed files, test files selected of the total
    reach_why: str = ""  # reach: what the set cover chose, or why it fell back to the default files


CLI_OPTIONS = (
    click.Option(
        ["--unit-tests", "with_unit"],
        is_flag=False,
        flag_value="default",
        default=None,
        type=click.Choice(["default", "all", "impacted", "reach"]),
        help="Stage 3, upstream's unit tests: the line's default suite (bare flag), `all` of tests/unit_tests "
        "(nightly; each run's per-file seconds and last pass are recorded), `impacted`: the test files whose "
        "imports reach a file upstream changed since --since, plus a smoke set, or `reach`: the test files that "
        "run the most port sites within --unit-reach-budget, by the line's reach record (none: the default suite) "
        "(default: the suite, when the tree has tests/unit_tests).",
    ),
    click.Option(
        ["--unit-reach-budget"],
        type=click.FloatRange(min=1.0),
        default=None,
        metavar="SECONDS",
        help="With --unit-tests reach: the recorded wall seconds the selected test files may take "
        "(default: 480, 8 minutes; the reach cases get 12: 20 minutes in all on 2 cores).",
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
            series_dir=setup.series_dir,
            reach_budget=given.get("unit_reach_budget"),
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
                "stage": f"{self.name} (baseline: the files of what the port did not pass, unless cached or none)",
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
            else f"{len(files)} files by reach"
            if unit.selection == "reach"
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
        if unit.reach_why:  # which files reach chose and why (or that it fell back), first in the stage's reason
            result.reason = f"{unit.reach_why}; {result.reason}"
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
    # the tests the selection holds: the port's test ids, and those only the unported tree ran (a module
    # that does not import on the port hides its tests there: the baseline runs that file whole)
    tests = sum("::" in k for k in details.outcomes) + details.baseline.tests_not_on_port
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
    *,
    series_dir: Path | None = None,
    reach_budget: float | None = None,
) -> tuple[UnitOptions | None, str]:
    """Stage 3's options, or None and why it does not run. ``wanted``: None (default), False
    (--no-unit-tests), "default", "all" or "impacted" (--unit-tests ...); ``tests``: explicit
    --unit-test paths; ``since``: the upstream commit an impacted selection diffs from (with
    ``impact_extra``, more changed files: those whose port rewrite changed in a refresh hop);
    ``series_dir``: where the line's reach record is (`reach`), ``reach_budget`` its seconds."""
    _check_pairs(wanted, tests, since, reach_budget)
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
    picked: Selection | None = None  # the impacted selection's figures
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
    elif settings.unit_tests:
        chosen, reasons, how = list(settings.unit_tests), dict(settings.unit_tests), "series"
    else:
        chosen, reasons, how = list(suite.FALLBACK_TESTS), dict(suite.FALLBACK_TESTS), "fallback"
    reach_why = ""
    if wanted == "reach":
        chosen, reasons, how, reach_why = _by_reach(series_dir, tree, reach_budget, chosen, reasons, how)
    return UnitOptions(
        tests=chosen,
        nproc=nproc,
        cache_dir=cache_dir,
        base=base,
        settings=settings,
        reasons=reasons,
        selection=how,
        impact=picked,
        reach_why=reach_why,
    ), ""


def _check_pairs(wanted: str | bool | None, tests, since: str | None, reach_budget: float | None) -> None:
    """The options stage 3 takes only together, or never together (exit 2 naming both)."""
    if since is not None and wanted != "impacted":
        raise BadInput(f"--since {since[:80]}: only with --unit-tests impacted (the selection it diffs from)")
    if wanted == "impacted" and since is None:
        raise BadInput(
            "--unit-tests impacted: give --since COMMIT, the upstream commit the port was last verified at "
            "(the tests that reach what changed since then run)"
        )
    if wanted == "impacted" and tests:
        raise BadInput("--unit-test: not with --unit-tests impacted (it selects the files itself); give one of them")
    if reach_budget is not None and wanted != "reach":
        raise BadInput(
            f"--unit-reach-budget {reach_budget:g}: only with --unit-tests reach (the budget of its selection)"
        )
    if wanted == "reach" and tests:
        raise BadInput("--unit-test: not with --unit-tests reach (it selects the files itself); give one of them")


def _by_reach(
    series_dir: Path | None,
    tree: Path,
    reach_budget: float | None,
    chosen: list[str],
    reasons: dict[str, str],
    how: str,
) -> tuple[list[str], dict[str, str], str, str]:
    """`--unit-tests reach`: the line's recorded files the set cover picks, or the default files
    (``chosen``) where the line has no record, with the one line that says which."""
    from rocmport.verify.analyses import reach

    budget = reach.UNIT_TESTS_BUDGET_S if reach_budget is None else reach_budget
    by_reach = reach.reach_unit_tests(series_dir, tree, budget)
    if by_reach is None:  # the default files, saying so
        where = reach.record_path(series_dir) if series_dir else "this tree (not made by `rocmport apply`)"
        return (
            chosen,
            reasons,
            how,
            f"reach: no recorded test file in {where}: the default {len(chosen)} files (--record-reach records them)",
        )
    names, why = by_reach
    return names, {n: "reach: runs port sites the other chosen files do not" for n in names}, "reach", why


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


def stage_unit_tests(
    tree: Path,
    env: dict,
    tests: list[str],
    nproc: int,
    known: dict[str, str],
    cache_dir: Path,
    base: str | None,
    launcher: Launcher = Launcher(),
    blocked: tuple[str, ...] = (),
    progress: Progress | None = None,
    reasons: dict[str, str] | None = None,
    known_skipped: dict[str, str] | None = None,
    restarts: int = RESTARTS_PER_FILE,
) -> StageResult:
    start = time.monotonic()
    if not launcher.runs_stage(single_node=True):
        return StageResult(NAME, SKIPPED, "upstream's unit tests run on one node, like upstream CI: node 0 runs them")
    if not (tree / "tests" / "unit_tests").is_dir():
        return skipped(NAME, tree_lacks("tests/unit_tests"))
    absent = [t for t in tests if not (tree / _file(t)).exists()]
    if absent:
        return StageResult(
            NAME,
            FAIL,
            f"not in the tree: {', '.join(absent)}; fix --unit-test or the series' verify.unit_tests",
        )
    files = suite.test_files(tree, tests)
    need = suite.missing_dependencies(tree, files, blocked)
    if need:
        return StageResult(
            NAME,
            FAIL,
            f"the selected test files need {', '.join(sorted(need))}, which this Python lacks: "
            f"`{suite.pip_command(need)}`",
            time.monotonic() - start,
            UnitTestsStopped(tests, missing_dependencies=need),
        )
    say = (lambda line: progress(f"port {line}")) if progress else None
    port = run_tests(tree, tests, env, nproc, launcher, restarts=restarts, progress=say)
    if port.unsupported:
        return StageResult(NAME, UNSUPPORTED, f"proxy shim hook missing: {port.unsupported}", time.monotonic() - start)
    if not port.ranks:
        return StageResult(
            NAME,
            FAIL,
            f"pytest under torchrun produced no results (none of the {len(port.files)} selected "
            f"files ran): {port.crash}",
            time.monotonic() - start,
            UnitTestsStopped(tests, files=port.files),
        )
    port.alone = rerun_alone(tree, sorted(set(port.hung)), env, nproc, launcher, say)
    # the unported tree runs only what the labels read: the port's non-passing tests (none: no run)
    wanted = to_label(tree, tests, port) if base else []
    base_result, cached = _unported(tree, base, tests, env, nproc, cache_dir, launcher, progress, wanted)
    labels, why = label(port, base_result, known, blocked)
    # A file with tests that have no outcome is never counted as run: it is listed, with why, and fails the stage.
    not_run = {f: a for f, a in port.files.items() if a.status == "not-run"}
    for f, a in not_run.items():
        labels[f], why[f] = "not-run", a.reason
    by_label = _counts(labels, LABELS)
    details = _details(
        tests, nproc, port, base_result, base, cached, labels, why, known, reasons, known_skipped, wanted
    )
    summary = _summary(port, nproc, by_label, not_run, base, cached, wanted)
    ran_out = task_limit_phrase(port.peak["threads"], nproc, task_limit()) if not_run else None
    if ran_out:
        summary += f"; {ran_out}"
    lacking = {
        str(_missing_ordinary(k, port, blocked)).split(".")[0] for k, v in labels.items() if v == "missing-dependency"
    }
    if lacking:
        cmd = suite.pip_command({m: suite.PIP_NAMES.get(m, m.replace("_", "-")) for m in lacking})
        summary += f"; missing dependencies: `{cmd}`"
    status = FAIL if any(by_label[k] for k in BLOCKING) else PASS
    return StageResult(NAME, status, summary, time.monotonic() - start, details)


def _unported(
    tree: Path,
    base: str | None,
    tests: list[str],
    env: dict,
    nproc: int,
    cache_dir: Path,
    launcher: Launcher,
    progress: Progress | None,
    wanted: list[str],
) -> tuple[SuiteRun, bool]:
    """The unported baseline's run of ``wanted`` (baseline.to_label), and whether from the cache; an empty
    run where there is nothing to run (no base commit, nothing to label)."""
    if not (base and wanted):
        return SuiteRun(), False
    bsay = (lambda line: progress(f"unported tree {line}")) if progress else None
    return baseline(tree, base, tests, env, nproc, cache_dir, launcher, bsay, only=wanted)


def _details(
    tests: list[str],
    nproc: int,
    port: SuiteRun,
    base_result: SuiteRun,
    base: str | None,
    cached: bool,
    labels: dict[str, str],
    why: dict[str, str],
    known: dict[str, str],
    reasons: dict[str, str] | None,
    known_skipped: dict[str, str] | None,
    ran: list[str] | None = None,
) -> UnitTestsRun:
    """The stage's details (its entry in the report): the port's run, the labels, the baseline."""
    details = UnitTestsRun(
        tests=tests,
        why={t: (reasons or {}).get(t, "") for t in tests},
        nproc=nproc,
        counts=_counts(port.outcomes),
        outcomes=dict(sorted(port.outcomes.items())),
        labels=labels,
        label_reasons=why,
        failures={k: port.details.get(k, "") for k in labels},
        files=port.files,
        restarts_per_file=port.restarts_per_file,
        on_baseline={k: _on_baseline(k, base_result, port) for k in labels},
        swaps=port.swaps,
        hung=port.hung,
        rerun_alone=port.alone,
        local_spec_instead_of_te=port.local_spec,
        restarts=port.restarts,
        peak=port.peak,
        deselected={
            k: f"marked {m}: upstream's CI deselects it (tests/unit_tests/run_ci_test.sh, dev environment)"
            for k, m in port.deselected.items()
        },
        baseline=UnitBaseline(
            commit=base,
            cached=cached,
            counts=_counts(base_result.outcomes),
            tests=sum("::" in k for k in base_result.outcomes),
            ran=list(ran or []),
            # a module error on the port hides these there; a not-run file's tests never ran
            tests_not_on_port=sum("::" in k and k not in port.outcomes for k in base_result.outcomes),
            guards=base_result.guards,
            overlay=base_result.overlay,
            peak=base_result.peak,
        ),
        known_failures=known,
        known_failures_not_applied=known_skipped or {},
        port_seconds=port.seconds,
        file_seconds=port.file_seconds,
        # no baseline (no base commit): None; cached, or nothing to label: it took no time now
        baseline_seconds=0.0 if cached else base_result.seconds if base else None,
        slow=port.slow,
        machine=port.machine,
    )
    return details


def _summary(
    port: SuiteRun,
    nproc: int,
    by_label: dict[str, int],
    not_run: dict[str, FileRun],
    base: str | None,
    cached: bool,
    ran: list[str] | None = None,
) -> str:
    """The stage's reason: the counts by outcome and label, what did not run, the budget and the baseline."""
    counts = _counts(port.outcomes)
    machine = port.machine or {}
    summary = (
        f"{counts['passed']} passed, {counts['skipped']} skipped, {counts['failed'] + counts['error']} failed ("
        + ", ".join(f"{by_label[k]} {k}" for k in LABELS if by_label[k] or k in ("port-regression", "upstream-known"))
        + f") in {_files_phrase(port.files)} on {nproc} ranks; "
        + ("not run: " + "; ".join(f"{f} ({a.reason})" for f, a in not_run.items()) + "; " if not_run else "")
        + f"restart budget {port.restarts_per_file} per test file ({port.restarts} used); "
        + (
            f"{len(port.deselected)} deselected as upstream's CI does ({', '.join(sorted(set(port.deselected.values())))}); "
            if port.deselected
            else ""
        )
        + _baseline_phrase(base, cached, ran or [], sum("::" in k for k in port.outcomes))
        + f"peak {port.peak['threads']} threads, {port.peak['rss_mb']:.0f} MB per rank"
        + (
            f"; {len(port.slow)} slow test(s) given more time, their ranks still computing after the "
            f"{port.watchdog_seconds:g} s timeout"
            if port.slow
            else ""
        )
        + (
            f"; this machine was overloaded: {_share_phrase(machine)}: hang and time-limit verdicts may be the machine's"
            if machine.get("overloaded")
            else ""
        )
    )
    return summary


def _baseline_phrase(base: str | None, cached: bool, ran: list[str], tests: int) -> str:
    """The unported baseline in the stage's reason: what it ran of the port's tests, or that it did not."""
    if not base:
        return "no baseline (no unported commit); "
    if not ran:
        return f"no baseline run at {base[:12]}: nothing to label; "
    ids = sum("::" in t for t in ran)
    what = " and ".join(
        p
        for p in (
            f"{ids} of its {tests} tests" if ids else "",
            output.plural(len(ran) - ids, "file") if len(ran) > ids else "",
        )
        if p
    )
    return f"baseline {'cached' if cached else 'run'} at {base[:12]} on what the port did not pass ({what}); "


def _files_phrase(files: dict[str, FileRun]) -> str:
    """ "7 files", or "2 of 7 files" when some did not run (a file is counted only if it ran)."""
    accounted = {f: a for f, a in files.items() if a.status != "not-collected"}
    done = sum(a.status != "not-run" for a in accounted.values())
    return f"{len(accounted)} files" if done == len(accounted) else f"{done} of {len(accounted)} files"
