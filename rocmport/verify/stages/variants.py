"""Stage 6, variants: the reach variants (stages/variant_list.py), each a short run of stage 2's small
GPT with a few Megatron flags through the tree's own argument parser, so that port sites no upstream
case or unit test takes run on the proxy. Each variant ends pass (its iterations trained, the loss
finite), unsupported-in-proxy (a stop its declaration names as the proxy's, after its sites ran),
not-applicable (the line's parser refuses its flag) or fail; its sites are recorded in its own
directory (`variant=<name>`) as stage 4's cases are, and `--record-reach` adds them to the record.

A stage of its own, after the others: `--variants reach` picks the variants whose sites the run's
reach selection of cases and test files does not run, which needs the record, not stage 2's
comparison; and stage 2's pass or fail stays what it was (its tp×pp against tp1/pp1)."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click

from rocmport import output
from rocmport.errors import BadInput
from rocmport.verify.orchestration.contract import NotRequested, RunSetup, Stage, StageRun, VerifyContext, VerifyOptions
from rocmport.verify.orchestration.stage_result import FAIL, PASS, UNSUPPORTED, StageResult, tree_lacks
from rocmport.verify.stages.functional.case_run import case_sites_env, note_case_seconds
from rocmport.verify.stages.functional.stage import run_golden_kind
from rocmport.verify.stages.gpt_training import _last_error, launch
from rocmport.verify.stages.variant_list import BY_NAME, VARIANTS, Variant

NAME = "variants"
NOT_APPLICABLE = "not-applicable"
ITERS = 3  # a variant proves its sites ran and the model trains: a few iterations
TIMEOUT_S = 300.0


@dataclass
class VariantRun:
    """One variant as it ran: its status and why, its seconds, its flags, the sites it aims at and
    those of them that ran (None: the run recorded no sites), its losses."""

    status: str
    reason: str
    seconds: float
    flags: tuple[str, ...]
    aimed: tuple[str, ...]
    ran: list[str] | None = None
    losses: list[float] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "status": self.status,
            "reason": self.reason,
            "seconds": round(self.seconds, 2),
            "flags": list(self.flags),
            "aimed": list(self.aimed),
            "losses": self.losses,
        }
        if self.ran is not None:
            out["aimed_ran"] = self.ran
        return out


@dataclass
class VariantsRun:
    """The stage's report data (`variants`): the selection's line and each variant's run."""

    selection: str
    runs: dict[str, VariantRun] = field(default_factory=dict)

    def report_entries(self) -> dict[str, Any]:
        return {"variants": {"selection": self.selection, "runs": {n: r.to_dict() for n, r in self.runs.items()}}}


@dataclass(frozen=True)
class VariantsOptions:
    """What `--variants` asked: `reach`, `all` or names (``names``), and the series directory (the record)."""

    how: str
    names: tuple[str, ...] = ()
    series_dir: Path | None = None
    golden_kind: str | None = None  # the run's (stage.run_golden_kind): its goldens put stage 4's cases first


def parse_variants(value: str) -> tuple[str, tuple[str, ...]]:
    """`--variants reach|all|none|NAME,...` -> (how, names); BadInput naming an unknown variant."""
    value = value.strip()
    if value in ("reach", "all", "none"):
        return value, ()
    names = tuple(n.strip() for n in value.split(",") if n.strip())
    unknown = [n for n in names if n not in BY_NAME]
    if unknown or not names:
        raise BadInput(
            f"--variants: no variant {', '.join(unknown) or repr(value)}; give reach, all, none or names among "
            f"{', '.join(BY_NAME)}"
        )
    return "names", names


def outcome(
    variant: Variant, returncode: int, data: Mapping[str, Any] | None, stderr: str, iters: int
) -> tuple[str, str, list[float]]:
    """A variant's status, its reason and its losses from its run: the parser's refusal
    (not-applicable), TE's CPU layer's refusal or a declared stop (unsupported-in-proxy), its
    iterations with finite losses (pass), else fail with the first exception."""
    data = data or {}
    if "not_applicable" in data:
        return (
            NOT_APPLICABLE,
            f"the tree's argument parser refuses {variant.name}'s flags: {data['not_applicable']}",
            [],
        )
    if "unsupported" in data:
        return UNSUPPORTED, str(data["unsupported"]), []
    losses = [float(x) for x in data.get("losses", [])]
    if returncode == 0 and len(losses) == iters and all(math.isfinite(x) for x in losses):
        if variant.forward_only:  # an inference-only model: forward steps, the same loss each time
            return PASS, f"{iters} forward-only iterations, loss {losses[0]:.4f}", losses
        return PASS, f"{iters} iterations, loss {losses[0]:.4f} -> {losses[-1]:.4f}", losses
    raised = _last_error_text(stderr)
    for text, why in variant.stops:
        if text in raised:  # the exception's own line: a flag or a log line naming the text is not the stop
            return UNSUPPORTED, f"{why} ({raised})", losses
    if returncode == 0 and losses:
        return FAIL, f"losses not finite or too few: {losses}", losses
    return FAIL, raised, losses


def _last_error_text(stderr: str) -> str:
    import subprocess

    return _last_error(subprocess.CompletedProcess([], 1, "", stderr))


def variant_command(ctx_opts: VerifyOptions, variant: Variant, out: Path) -> list[str]:
    worker = ["-m", "rocmport.verify.runtime.gpt_worker", "--te", "--iters", str(ITERS)]
    args = [*worker, "--megatron-flags", json.dumps(list(variant.flags)), "--out", str(out)]
    if variant.forward_only:
        args.append("--forward-only")
    return ctx_opts.launcher.command(variant.ranks, args, f"variant-{variant.name}")


def _selected(options: VariantsOptions, tree: Path) -> tuple[list[str], str]:
    declared = [v.name for v in VARIANTS]
    if options.how == "all":
        return declared, f"all {len(declared)} variants (--variants all)"
    if options.how == "names":
        return list(options.names), f"--variants {','.join(options.names)}"
    from rocmport.verify.analyses import reach
    from rocmport.verify.stages.functional.selection import reach_cases

    record = reach.read_record(options.series_dir)
    covered: set[str] = set()
    if record is not None:
        covered |= set().union(*record.shared.values()) if record.shared else set()
        # the cases stage 4's reach runs in this run: those with a golden for its device kind first
        golden = options.golden_kind
        for kind, picked in (
            ("cases", reach_cases(options.series_dir, tree, (lambda: golden) if golden else None)),
            ("unit_tests", reach.reach_unit_tests(options.series_dir, tree)),
        ):
            for name in picked[0] if picked else ():
                covered |= record.entries(kind)[name].sites
    return reach.reach_variants(options.series_dir, declared, covered)


def _aimed_ran(ctx: VerifyContext, variant: Variant) -> list[str] | None:
    """The variant's aimed sites that its run recorded (None: no records)."""
    from rocmport.verify.analyses import port_sites

    if ctx.sites_dir is None:
        return None
    units = port_sites.read_units(ctx.sites_dir, ctx.tree)
    unit = units.get(("variant", variant.name))
    if unit is None:
        return []
    ran = {s.stable_key for s in port_sites.sites_ran(ctx.port_sites, unit.calls)}
    return [s for s in variant.sites if s in ran]


def run_variants(ctx: VerifyContext, options: VariantsOptions) -> StageRun:
    start = time.monotonic()
    names, why = _selected(options, ctx.tree)
    data = VariantsRun(why)
    for name in names:
        variant = BY_NAME[name]
        env = case_sites_env(ctx.env, name, kind="variant")  # its own port-site records, as a case's
        began = time.monotonic()
        out = ctx.tmp / f"variant-{name}.json"
        with output.progress(f"stage 6: variant {name} ({' '.join(variant.flags)})"):
            try:
                proc = launch(variant_command(ctx.opts, variant, out), env, ctx.tree, timeout=TIMEOUT_S)
                rc, stderr = proc.returncode, proc.stderr
            except Exception as exc:  # a timeout: the variant failed, the others still run
                rc, stderr = 1, f"RuntimeError: {type(exc).__name__}: {exc}"
        loaded = json.loads(out.read_text()) if out.is_file() else None
        status, reason, losses = outcome(variant, rc, loaded, stderr, ITERS)
        seconds = time.monotonic() - began
        note_case_seconds(env, seconds, status)
        data.runs[name] = VariantRun(
            status, reason, seconds, variant.flags, variant.sites, _aimed_ran(ctx, variant), losses
        )
    counts: dict[str, int] = {}
    for r in data.runs.values():
        counts[r.status] = counts.get(r.status, 0) + 1
    said = ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "none run"
    failed = [f"{n}: {r.reason}" for n, r in data.runs.items() if r.status == FAIL]
    status = FAIL if failed else PASS
    reason = f"{len(data.runs)} variants: {said}; {why}" + (f"; failed: {'; '.join(failed)}" if failed else "")
    return StageRun(StageResult(NAME, status, reason, time.monotonic() - start), data)


class VariantsStage(Stage[VariantsOptions]):
    name = NAME
    summary = (
        "reach variants: stage 2's small GPT with a few Megatron flags each (delayed wgrad, softmax type, FP8 "
        "tensorwise, FP4, MLA, the legacy grouped GEMM), for port sites no upstream case or unit test takes"
    )
    cli_options = (
        click.Option(
            ["--variants", "variants"],
            default="reach",
            show_default=True,
            metavar="reach|all|none|NAME,...",
            help="Stage 6's reach variants (with --te): reach runs those whose recorded sites the run's reach "
            "selection of cases and test files does not (and those never recorded); all, none, or names.",
        ),
    )

    def check(self, given: Mapping[str, Any], setup: RunSetup) -> VariantsOptions | NotRequested:
        how, names = parse_variants(str(given.get("variants") or "reach"))
        if how == "none":
            return NotRequested("--variants none")
        if not (setup.tree / "megatron" / "training").is_dir():
            # a variant's flags go through megatron.training's parse_args and validate_args: a
            # package-index tree cannot have them (not applicable, as stage 4 without pretrain_gpt.py)
            return NotRequested(tree_lacks("megatron/training"))
        if setup.te is None:
            return NotRequested("the reach variants take Transformer Engine's sites: pass --te")
        return VariantsOptions(how, names, setup.series_dir, run_golden_kind(setup.te))

    def launches(self, opts: VerifyOptions, options: VariantsOptions, tmp: Path) -> list[dict]:
        names, _ = _selected(options, opts.tree)
        return [
            {
                "stage": f"{self.name} ({n})",
                "command": variant_command(opts, BY_NAME[n], tmp / f"variant-{n}.json"),
                "cwd": str(opts.tree),
            }
            for n in names
        ]

    def run(self, ctx: VerifyContext, options: VariantsOptions) -> StageRun:
        return run_variants(ctx, options)


STAGE = VariantsStage()
