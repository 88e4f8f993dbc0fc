"""verify's human summary, as text from the typed report (result.VerifyReport): one verdict line first,
then (the command prints the stage table) what blocks, each with why in words, then the rest
folded behind a count (the full list is in the report)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rocmport.verify.stages import FAIL, PASS, SKIPPED, UNSUPPORTED, StageResult
from rocmport.verify.unit_tests import BLOCKING

if TYPE_CHECKING:
    from rocmport.verify.result import VerifyReport

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


def _short(reason: str, width: int = 70) -> str:
    """A stage's reason cut to its first clause ("the tree has no tests/unit_tests (a package-index
    source ...)" -> "the tree has no tests/unit_tests")."""
    text = reason.split(";")[0].split(" (")[0].strip()
    return text if len(text) <= width else text[: width - 1] + "…"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _unit_blocking(stage: StageResult) -> dict[str, list[str]]:
    """Stage 3's blocking items by label: test ids (and not-run test files)."""
    out: dict[str, list[str]] = {lab: [] for lab in BLOCKING}
    for nodeid, lab in sorted(stage.details.get("labels", {}).items()):
        if lab in BLOCKING:
            out[lab].append(nodeid)
    return {lab: ids for lab, ids in out.items() if ids}


def _count(lab: str, n: int) -> str:
    """ "1 unverified test", "2 test files not run"."""
    return _plural(n, "test file") + " not run" if lab == "not-run" else f"{n} {lab} test" + ("" if n == 1 else "s")


def verdict(r: VerifyReport) -> str:
    """One line: what this run proved. "v0.19 port (CPU proxy): 3 of 5 stages pass; blocking: unit-tests
    (1 unverified test); not run here: functional (the tree has no pretrain_gpt.py), bridge (--tree given)"."""
    stages = r.stages
    who = f"{r.line} port" if r.line else f"tree {r.tree}"
    with_te = f", TE {r.te.version}'s Python layer" if r.te else ""
    mode = f" (CPU proxy{with_te}, not a GPU result)" if r.mode == "cpu-proxy" else ""
    passed = sum(s.status == PASS for s in stages)
    parts = [f"{who}{mode}: {passed} of {len(stages)} stages pass"]
    blocking = []
    for s in stages:
        if s.status != FAIL:
            continue
        items = _unit_blocking(s) if s.name == "unit-tests" else {}
        if items:
            blocking.append(f"{s.name} (" + ", ".join(_count(lab, len(ids)) for lab, ids in items.items()) + ")")
        else:
            blocking.append(f"{s.name} ({_short(s.reason)})")
    if blocking:
        parts.append("blocking: " + ", ".join(blocking))
    unsupported = [f"{s.name} ({_short(s.reason)})" for s in stages if s.status == UNSUPPORTED]
    if unsupported:
        parts.append("unsupported on the CPU proxy: " + ", ".join(unsupported))
    skipped = [f"{s.name} ({_short(s.reason)})" for s in stages if s.status == SKIPPED]
    if skipped:
        parts.append("not run here: " + ", ".join(skipped))
    return "; ".join(parts)


def blocking_lines(r: VerifyReport) -> list[str]:
    """Each blocking item, with why it blocks in words and what the unported tree did."""
    lines: list[str] = []
    for s in r.stages:
        if s.status != FAIL:
            continue
        items = _unit_blocking(s) if s.name == "unit-tests" else {}
        if not items:
            lines += [f"{s.name}: stage failed", f"    {s.reason}"]
            continue
        d = s.details  # stage 3's labels, their reasons, failures and the unported tree's outcomes
        local = set(d.get("local_spec_instead_of_te", []))
        for lab, ids in items.items():
            for nodeid in ids:
                lines.append(
                    f"{s.name}: {lab}: {nodeid}"
                    + ("  (ran with the local spec in place of TE's)" if nodeid in local else "")
                )
                lines.append(f"    why it blocks: {WHY_IT_BLOCKS.get(lab, lab)}")
                lines.append(f"    what happened: {d.get('label_reasons', {}).get(nodeid) or '-'}")
                failure = d.get("failures", {}).get(nodeid)
                if failure:
                    lines.append(f"    its failure: {failure}")
                lines.append(
                    f"    the unported tree: {' '.join(str(d.get('on_baseline', {}).get(nodeid) or 'not run').split())}"
                )
    return lines


def folded_line(r: VerifyReport, where: str) -> str | None:
    """The labelled tests that do not block, as one count ("+47 more ... in the report: PATH")."""
    unit = next((s for s in r.stages if s.name == "unit-tests" and s.details.get("labels")), None)
    if not unit:
        return None
    rest: dict[str, int] = {}
    for lab in unit.details["labels"].values():
        if lab not in BLOCKING:
            rest[lab] = rest.get(lab, 0) + 1
    if not rest:
        return None
    total = sum(rest.values())
    kinds = ", ".join(f"{n} {lab}" for lab, n in sorted(rest.items(), key=lambda kv: -kv[1]))
    return f"+{total} more labelled tests that do not block ({kinds}): each with why in {where}"


def coverage_lines(r: VerifyReport) -> list[str]:
    """Port coverage in plain words: per codemod, how many of the call sites it rewrote ran in these
    stages, and one example of a site that did not, with why."""
    lines: list[str] = []
    for sites, title in ((r.port_sites, "Megatron-LM"), (r.bridge_port_sites, "Megatron-Bridge")):
        if not sites:
            continue
        lines.append(f"port coverage ({title}): of the call sites each codemod rewrote, how many ran in these stages")
        for name, c in sites.items():
            line = f"  {name}: {c.exercised} of {c.total} rewritten sites ran"
            if c.explanation:
                line += f" ({c.explanation})"
            elif c.unreached:
                site, why = sorted(c.unreached.items())[0]
                line += f"; e.g. {site} did not: {why}" + (
                    f" (+{len(c.unreached) - 1} more in the report)" if len(c.unreached) > 1 else ""
                )
            lines.append(line)
    return lines
