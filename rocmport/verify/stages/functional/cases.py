"""Stage 4 over many cases: each selected case planned (an unsupported one listed with its kind and
reason, never skipped silently), run one after another as run_case runs one (its own ranks,
checkpoint round trip and golden), a failing one run again on the unported tree and labelled
(case_labels), and the stage's verdict from them all: it fails only on a port-regression, an
unverified run stopped on a NaN, Inf or spiky loss (case_labels.NUMERICS_BLOCK), or a failure nothing
could label."""

from __future__ import annotations

import time

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rocmport import output
from rocmport.verify.orchestration.device_kind import DeviceKind
from rocmport.verify.orchestration.stage_result import FAIL, PASS, SKIPPED, UNSUPPORTED
from rocmport.verify.stages import case_plan
from rocmport.verify.stages.functional.case_labels import (
    BaselineRun,
    blocks_on_numerics,
    label_case,
    run_baseline,
    twin_differs,
)
from rocmport.verify.stages.functional.case_args import PROXY_TRAINING, load_case
from rocmport.verify.stages.functional.case_run import CaseOutcome, case_sites_env, note_case_seconds, run_case
from rocmport.verify.stages.functional.details import CaseFailure, FunctionalRun

if TYPE_CHECKING:
    from rocmport.verify.orchestration.contract import VerifyContext
    from rocmport.verify.stages.functional.selection import FunctionalOptions

# The report's shape of stage 4's data: 2 adds `cases` (one entry per selected case), `selection`,
# `selection_note` and `counts` beside the first run case's keys, which stay where version 1 had them.
VERSION = 2


@dataclass
class CaseEntry:
    """One selected case in the report: its status (pass | fail | unsupported-in-proxy | skipped),
    reason and seconds; its run's details (FunctionalRun's keys); for an unsupported one its kind;
    for a failing one its failure, the unported tree's run (``baseline``) and its label with why."""

    case: str
    status: str
    reason: str
    seconds: float = 0.0
    run: FunctionalRun | None = None
    kind: str | None = None
    failure: CaseFailure | None = None
    baseline: BaselineRun | None = None
    label: str | None = None
    label_reason: str | None = None

    @property
    def outcome(self) -> str:
        """What the verdict counts: pass, the label of a failure (fail when unlabelled), unsupported, skipped."""
        if self.status == FAIL:
            return self.label or "fail"
        return "unsupported" if self.status == UNSUPPORTED else self.status

    @property
    def blocks(self) -> bool:
        """A failure fails the stage when unlabelled, a port-regression, or unverified where its loss failed
        Megatron's result validation (case_labels.NUMERICS_BLOCK)."""
        if self.status != FAIL:
            return False
        return self.label in (None, "port-regression") or blocks_on_numerics(self.label, self.failure)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {**(self.run.to_dict() if self.run else {}), "case": self.case}
        out.update({"status": self.status, "reason": self.reason, "seconds": round(self.seconds, 2)})
        for key in ("kind", "label", "label_reason"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.failure is not None:
            out["failure"] = self.failure.to_dict()
        if self.baseline is not None:
            out["baseline"] = self.baseline.to_dict()
        return out


@dataclass
class FunctionalCases:
    """Stage 4's data: the selection (how, and a line on it) and an entry per selected case. Its
    JSON (`functional` of the report, and the stage's own keys) keeps the first run case's keys
    where version 1 had them, for readers of one case."""

    selection: str
    note: str | None
    entries: list[CaseEntry] = field(default_factory=list)

    @property
    def primary(self) -> FunctionalRun | None:
        return next((e.run for e in self.entries if e.run is not None), None)

    @property
    def redirects(self) -> dict[str, int] | None:
        """Every case's torch.cuda call sites answered on the CPU, summed (None: no case ran on the proxy)."""
        runs = [e.run.redirects for e in self.entries if e.run is not None and e.run.redirects is not None]
        if not runs:
            return None
        total: Counter[str] = Counter()
        for r in runs:
            total.update(r)
        return dict(total)

    def counts(self) -> dict[str, int]:
        return dict(Counter(e.outcome for e in self.entries))

    def report_entries(self) -> dict[str, Any]:
        return {"functional": self.to_dict()}

    def to_dict(self) -> dict[str, Any]:
        primary = self.primary
        out: dict[str, Any] = primary.to_dict() if primary else {}
        out.update(
            {
                "version": VERSION,
                "selection": self.selection,
                "counts": self.counts(),
                "cases": [e.to_dict() for e in self.entries],
            }
        )
        if self.note:
            out["selection_note"] = self.note
        return out


def verdict(data: FunctionalCases) -> tuple[str, str]:
    """The stage's status and one-line reason (see the module docstring)."""
    entries = data.entries
    if len(entries) == 1 and entries[0].status != FAIL:
        return entries[0].status, entries[0].reason
    if any(e.blocks for e in entries):
        status = FAIL
    elif any(e.status in (PASS, FAIL) for e in entries):
        status = PASS
    elif entries and all(e.status == UNSUPPORTED for e in entries):
        status = UNSUPPORTED
    else:
        status = SKIPPED
    if len(entries) == 1:
        e = entries[0]
        return status, (f"{e.label}: {e.reason} ({e.label_reason})" if e.label else e.reason)
    return status, _counts_line(entries)


def _counts_line(entries: list[CaseEntry]) -> str:
    """ "3 cases: 2 pass, 1 upstream-known; 140 unsupported (120 not-on-proxy, 20 gpu-only); port-regression: c"."""
    ran = [e for e in entries if e.status != UNSUPPORTED]
    unsupported = [e for e in entries if e.status == UNSUPPORTED]
    by = Counter(e.outcome for e in ran)
    line = f"{len(ran)} case{'s' if len(ran) != 1 else ''}: " + (
        ", ".join(f"{n} {k}" for k, n in by.most_common()) or "none ran"
    )
    if unsupported:
        kinds = Counter(e.kind or "?" for e in unsupported)
        line += f"; {len(unsupported)} unsupported ({', '.join(f'{n} {k}' for k, n in kinds.most_common())})"
    blocking = [e.case for e in entries if e.blocks]
    if blocking:
        line += f"; blocking: {', '.join(blocking)}"
    return line


def run_cases(ctx: VerifyContext, options: FunctionalOptions) -> FunctionalCases:
    """Each selected case, one after another, with progress per case."""
    data = FunctionalCases(options.selection, options.note)
    if options.note:
        output.info(f"stage 4: {options.note}")
    n = len(options.cases)
    for i, case in enumerate(options.cases, 1):
        entry = _unsupported(ctx, options, case)
        if entry is None:
            with output.progress(
                f"stage 4 case {i}/{n}: {case} ({options.iters} iterations, resumed from {options.iters // 2})"
            ):
                entry = _run_one(ctx, options, case)
        output.info(f"stage 4 case {i}/{n}: {case}: {entry.outcome} ({entry.seconds:.0f} s)")
        data.entries.append(entry)
    return data


def _unsupported(ctx: VerifyContext, options: FunctionalOptions, case: str) -> CaseEntry | None:
    """The case's entry when the proxy cannot run it (its plan's kind and reason), before any launch."""
    if ctx.mode != "cpu-proxy" or not (ctx.tree / case_plan.CASES / case / "model_config.yaml").is_file():
        return None
    plan = case_plan.plan_case(case, load_case(ctx.tree, case), data_path=bool(options.data_path), te=proxy_te(ctx))
    if isinstance(plan, case_plan.Unsupported):
        return CaseEntry(case, UNSUPPORTED, f"{case} ({plan.kind}): {plan.reason}", kind=plan.kind)
    return None


def _run_kwargs(ctx: VerifyContext, options: FunctionalOptions, defaulted: bool) -> dict[str, Any]:
    return dict(
        dp=ctx.opts.dp,
        iters=options.iters,
        proxy=ctx.mode == "cpu-proxy",
        data_path=options.data_path,
        series_dir=options.series_dir,
        record=options.record,
        device_kind=DeviceKind.of_run(ctx.mode, ctx.machine, ctx.opts.te),
        defaulted=defaulted,
        launcher=ctx.launcher,
        resume=options.resume,
        hip=ctx.hip_version,
        rocm=bool(ctx.hip_version or ctx.machine.hip),
        te=proxy_te(ctx),
        fork_ranks=options.fork_ranks,
        cuda_twin_env=ctx.cuda_twin_env,
    )


def proxy_te(ctx: VerifyContext) -> case_plan.ProxyTE | None:
    """TE's layer on the proxy and the simulated arch, for the FP8 cases' plans."""
    return case_plan.ProxyTE.of(ctx.opts.te, ctx.device_arch if ctx.hip_version else None)


def _run_one(ctx: VerifyContext, options: FunctionalOptions, case: str) -> CaseEntry:
    """One runnable case: its run, and for a failure, the unported tree's run and the label."""
    kwargs = _run_kwargs(ctx, options, options.defaulted)
    env = case_sites_env(ctx.env, case)  # its own port-site records (the report's ran-by, --record-reach)
    start = time.monotonic()
    out = run_case(ctx.tree, env, case=case, **kwargs)
    # the port's run only: the baseline's is not the case's cost; its status: reach selects passing cases only
    note_case_seconds(env, time.monotonic() - start, out.result.status)
    entry = _entry(out)
    if out.result.status != FAIL or out.failure is None:
        return entry
    if twin_differs(out.failure):  # the port's own two paths differ: decided without the unported tree
        entry.label, entry.label_reason = label_case(out, None, ctx.blocked)
        return entry
    if not options.base or options.cache_dir is None:
        # nothing to compare with: the failure stays a failure, as a one-case stage 4 always had it
        entry.label_reason = (
            "not labelled: no unported commit to compare with (the tree was not made by rocmport apply)"
        )
        return entry
    again = {**kwargs, "record": False, "defaulted": False, "cuda_twin_env": None}
    base_commit, cache_dir = options.base, options.cache_dir
    with output.progress(f"stage 4 case {case}: again on the unported tree at {base_commit[:12]}"):
        base = run_baseline(
            ctx.tree,
            base_commit,
            out,
            ctx.env,
            cache_dir,
            lambda checkout, env: run_case(checkout, env, case=case, **again),
        )
    entry.baseline = base
    entry.label, entry.label_reason = label_case(out, base, ctx.blocked, shrink_changes(ctx, options, case))
    return entry


def shrink_changes(ctx: VerifyContext, options: FunctionalOptions, case: str) -> list[case_plan.ShrinkChange]:
    """What verify changed about ``case`` to run it on the proxy (its plan's shrink, the mock data, the
    proxy's training and iterations), for the label; [] off the proxy (a GPU runs the case as it is)."""
    if ctx.mode != "cpu-proxy":
        return []
    plan = case_plan.plan_case(case, load_case(ctx.tree, case), data_path=bool(options.data_path), te=proxy_te(ctx))
    if not isinstance(plan, case_plan.CasePlan):
        return []
    training = {**PROXY_TRAINING, "--train-iters": options.iters}
    return case_plan.shrink_changes(plan, mock_data=not options.data_path, training=training)


def _entry(out: CaseOutcome) -> CaseEntry:
    res = out.result
    kind = "not-on-proxy" if res.status == UNSUPPORTED else None  # stopped at run time by a CPU blocker
    return CaseEntry(out.case, res.status, res.reason, res.seconds, out.run, kind, out.failure)
