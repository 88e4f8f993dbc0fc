"""verify's human summary, as text from the typed report (result.VerifyReport): one verdict line first
(result.verdict, re-exported: the report's JSON holds it too), then (the command prints the stage
table) what blocks, each with why in words, then the rest folded behind a count (the full list is in
the report)."""

from __future__ import annotations

from rocmport.verify.stages import bridge
from rocmport.verify.stages.functional.cases import FunctionalCases
from rocmport.verify.stages.unit_tests.stage import NAME as UNIT_TESTS
from rocmport.verify.orchestration.result import VerifyReport, unit_blocking, verdict
from rocmport.verify.stages.gpt_training import FAIL
from rocmport.verify.stages.unit_tests.results import BLOCKING, UnitTestsRun

__all__ = ["WHY_IT_BLOCKS", "blocking_lines", "coverage_lines", "folded_line", "verdict"]

# Why a test with this label fails the stage, in words a newcomer reads.
WHY_IT_BLOCKS = {
    "port-regression": "it passes on the unported tree at the same commit: the port broke it",
    "unverified": (
        "the unported tree did not fail it the same way, so it cannot be called upstream's own failure: "
        "fix the port, or name it in the series' known_failures with the reason"
    ),
    "missing-dependency": "an ordinary package it needs is not installed here (the stage's reason has the pip command)",
    "not-run": "a selected test file whose tests did not all run is never counted as passed",
}


def blocking_lines(r: VerifyReport) -> list[str]:
    """Each blocking item, with why it blocks in words and what the unported tree did."""
    lines: list[str] = []
    for s in r.stages:
        if s.status != FAIL:
            continue
        items = unit_blocking(s) if s.name == UNIT_TESTS else {}
        if isinstance(s.details, FunctionalCases) and any(e.blocks for e in s.details.entries):
            lines += _functional_blocking(s.details)
            continue
        if not items:
            lines += [f"{s.name}: stage failed", f"    {s.reason}"]
            continue
        d = s.details  # stage 3's labels, their reasons, failures and the unported tree's outcomes
        assert isinstance(d, UnitTestsRun)  # unit_blocking found items: it labelled
        local = set(d.local_spec_instead_of_te)
        for lab, ids in items.items():
            for nodeid in ids:
                lines.append(
                    f"{s.name}: {lab}: {nodeid}"
                    + ("  (ran with the local spec in place of TE's)" if nodeid in local else "")
                )
                lines.append(f"    why it blocks: {WHY_IT_BLOCKS.get(lab, lab)}")
                lines.append(f"    what happened: {d.label_reasons.get(nodeid) or '-'}")
                failure = d.failures.get(nodeid)
                if failure:
                    lines.append(f"    its failure: {failure}")
                lines.append(f"    the unported tree: {' '.join(str(d.on_baseline.get(nodeid) or 'not run').split())}")
    return lines


def _functional_blocking(data: FunctionalCases) -> list[str]:
    """Stage 4's blocking cases, each with why it blocks and what the unported tree did."""
    lines: list[str] = []
    for e in data.entries:
        if not e.blocks:
            continue
        lines.append(f"functional: {e.label or 'fail'}: {e.case}")
        lines.append(
            "    why it blocks: "
            + (
                WHY_IT_BLOCKS["port-regression"]
                if e.label == "port-regression"
                else (e.label_reason or "it failed and nothing labelled it")
            )
        )
        lines.append(f"    what happened: {e.reason}")
        if e.baseline is not None:
            lines.append(f"    the unported tree: {e.baseline.status}: {e.baseline.reason}")
    return lines


def folded_line(r: VerifyReport, where: str) -> str | None:
    """The labelled tests that do not block, as one count ("+47 more ... in the report: PATH")."""
    unit = r.unit_run()
    if unit is None or not unit.labels:
        return None
    rest: dict[str, int] = {}
    for lab in unit.labels.values():
        if lab not in BLOCKING:
            rest[lab] = rest.get(lab, 0) + 1
    if not rest:
        return None
    total = sum(rest.values())
    kinds = ", ".join(f"{n} {lab}" for lab, n in sorted(rest.items(), key=lambda kv: -kv[1]))
    return f"+{total} more labelled tests that do not block ({kinds}): each with why in {where}"


def coverage_lines(r: VerifyReport) -> list[str]:
    """Port coverage in plain words: per codemod, how many of the call sites it rewrote ran in these
    stages, and one example of a site that did not, with why. The site count is the codemod's own
    (apply's table, ``rewrites``); where its rewritten sites and the runtime-helper calls they wrote
    (what a run can see) differ in number, the line gives both. Codemods with nothing to count share one line."""
    lines: list[str] = []
    bridge_run = r.data_of(bridge.NAME, bridge.BridgeReport)
    bridge_sites = bridge_run.port_sites if bridge_run else None
    for sites, title in ((r.port_sites, "Megatron-LM"), (bridge_sites, "Megatron-Bridge")):
        if not sites:
            continue
        lines.append(f"port coverage ({title}): of the call sites each codemod rewrote, how many ran in these stages")
        nothing: dict[str, list[str]] = {}  # explanation -> the codemods with no site to count
        for name, c in sites.items():
            if c.total == 0:
                nothing.setdefault(c.explanation or "nothing to count", []).append(name)
                continue
            if c.rewrites is None or c.rewrites == c.total:
                line = f"  {name}: {c.exercised} of {c.total} rewritten sites ran"
            else:
                # a run sees helper calls: fewer than the sites where some rewrites act by themselves,
                # more where one rewrite wrote several calls (a guarded import of several names)
                calls = "runtime-helper call" if c.total == 1 else "runtime-helper calls"
                line = f"  {name}: {c.rewrites} sites rewritten; {c.exercised} of their {c.total} {calls} ran"
            if c.explanation:
                line += f" ({c.explanation})"
            elif c.unreached:
                site, why = sorted(c.unreached.items())[0]
                line += f"; e.g. {site} did not: {c.classified.get(site) or why}" + (
                    f" (+{len(c.unreached) - 1} more in the report)" if len(c.unreached) > 1 else ""
                )
            if c.by_class:  # each unreached site's class (reach.classify): how many of each
                line += " [unreached: " + ", ".join(f"{n} {k}" for k, n in c.by_class.items() if n) + "]"
            lines.append(line)
        if nothing:
            lines.append(
                "  nothing to count: " + "; ".join(f"{', '.join(names)} ({why})" for why, names in nothing.items())
            )
        if any(c.by_class for c in sites.values()):
            from rocmport.verify.analyses.reach import share_run

            ran, eligible = share_run(sites)
            lines.append(
                f"  {ran} of the {eligible} sites that are not gpu-only ran ({100 * ran / eligible:.0f}%)"
                if eligible
                else "  every unreached site is gpu-only"
            )
    return lines
