"""The one place the HTML report reads verify's JSON report (README: "Report"; the keys tests/
test_result_shapes.py holds). Nothing here imports verify: the page depends on the JSON alone, so a
report from an older rocmport, a run cut short or one written on another machine reads the same way.

Every key is optional here. What a report lacks is not guessed: it is left empty and named in
``RunReport.missing`` in words, which the page prints ("what this report does not have")."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rocmport import inputs
from rocmport.errors import BadInput

# The stage names verify has written since its first report (its registry's order), and the JSON keys
# of the training data each one fills. A report is read by these keys: the page never imports verify.
STAGE_ORDER = ("imports", "gpt-training", "unit-tests", "functional", "bridge")
STAGE_TWO, STAGE_THREE, STAGE_FOUR, STAGE_FIVE = STAGE_ORDER[1:]
# Stage 3's labels that fail the stage (verify's BLOCKING, as the JSON spells them).
BLOCKING_LABELS = ("port-regression", "unverified", "missing-dependency", "not-run")


@dataclass
class Stage:
    name: str
    status: str
    reason: str
    seconds: float | None


@dataclass
class Curve:
    """One loss curve: ``steps`` (1-based iterations) and ``losses`` of the same length."""

    label: str
    steps: list[int]
    losses: list[float]


@dataclass
class TrainingRun:
    """A training case of the report with its curves, the facts verify checked, and what it lacks."""

    key: str  # a stable id for the page and for comparing two reports ("training", "functional", ...)
    title: str
    curves: list[Curve] = field(default_factory=list)
    facts: list[tuple[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass
class CodemodCoverage:
    name: str
    exercised: int
    total: int
    rewrites: int | None
    unreached: dict[str, str]  # "path:line helper" -> why it did not run
    explanation: str
    # "path:line helper" -> the stages that ran it; None: the report does not record it (a report
    # from before the 'ran' key names only the sites that did not run)
    ran: dict[str, list[str]] | None = None


@dataclass
class CoverageGroup:
    title: str  # "Megatron-LM", "Megatron-Bridge"
    key: str  # the report's key: port_sites, bridge_port_sites
    codemods: list[CodemodCoverage]

    @property
    def exercised(self) -> int:
        return sum(c.exercised for c in self.codemods)

    @property
    def total(self) -> int:
        return sum(c.total for c in self.codemods)

    @property
    def records_ran(self) -> bool:
        """Whether the report names each site that ran and the stages that ran it."""
        return bool(self.codemods) and all(c.ran is not None for c in self.codemods)


@dataclass
class UnitTest:
    nodeid: str
    label: str  # "" when the test passed (or was skipped by itself) and needed no label
    outcome: str  # on the port: passed, failed, error, skipped, not-run
    reason: str
    failure: str  # the port's message
    on_baseline: str  # what the unported tree did

    @property
    def blocking(self) -> bool:
        return self.label in BLOCKING_LABELS


@dataclass
class UnitTests:
    tests: list[UnitTest]
    counts: dict[str, int]
    baseline_commit: str | None
    files: dict[str, dict[str, Any]]

    def by_label(self) -> dict[str, list[UnitTest]]:
        """Labelled tests by label, the blocking labels first (in their order), then the rest by name."""
        out: dict[str, list[UnitTest]] = {}
        for t in self.tests:
            if t.label:
                out.setdefault(t.label, []).append(t)
        order = [lab for lab in BLOCKING_LABELS if lab in out] + sorted(set(out) - set(BLOCKING_LABELS))
        return {lab: out[lab] for lab in order}


@dataclass
class Environment:
    python: str | None = None
    torch: str | None = None
    hip: str | None = None
    cuda: str | None = None
    devices: list[str] = field(default_factory=list)
    hip_sim: dict[str, str] | None = None  # {version, arch, device}: the simulation, not a GPU
    te: dict[str, str] | None = None  # {version, python_layer, source}
    components: dict[str, dict[str, Any]] = field(default_factory=dict)
    launcher_env: dict[str, str] = field(default_factory=dict)
    firewall_profile: str | None = None

    @property
    def hip_kind(self) -> str:
        """HIP simulated, a real ROCm GPU, a CUDA GPU, or neither (in words)."""
        if self.hip_sim:
            return f"simulated: ROCm {self.hip_sim.get('version')} on an {self.hip_sim.get('device')} (no GPU here)"
        if self.hip and self.devices:
            return f"real ROCm GPU: HIP {self.hip}"
        if self.cuda and self.devices:
            return f"none: an NVIDIA GPU (CUDA {self.cuda}); the port's HIP branches did not run"
        return "none: the CUDA path on CPU (HIP simulation off)"

    @property
    def arch(self) -> str | None:
        if self.hip_sim:
            return self.hip_sim.get("arch")
        return None


@dataclass
class RunReport:
    """A verify report as the page shows it."""

    path: str | None
    sha256: str | None
    raw: dict[str, Any]
    verdict: str
    verdict_recorded: bool  # False: the report has none (older rocmport); ``verdict`` derived here
    mode: str | None
    tree: str | None
    line: str | None
    commit: str | None
    started: str | None
    sizes: dict[str, int]  # world_size, tp, pp, dp where recorded
    stages: list[Stage]
    training: list[TrainingRun]
    coverage: list[CoverageGroup]
    unit: UnitTests | None
    env: Environment
    missing: list[str] = field(default_factory=list)

    def stage(self, name: str) -> Stage | None:
        return next((s for s in self.stages if s.name == name), None)

    @property
    def failed(self) -> list[str]:
        return [s.name for s in self.stages if s.status == "fail"]

    @property
    def outcome(self) -> str:
        """pass / fail / incomplete (no stage ran to a result): the verdict element's class."""
        if self.failed:
            return "fail"
        return "pass" if any(s.status == "pass" for s in self.stages) else "incomplete"


def load(path: str | Path) -> RunReport:
    """Read a verify report file; BadInput (exit 2) naming the file when it is not one."""
    p = Path(path)
    # The one checked reader (rocmport.inputs): a size and a depth limit, UTF-8 named by byte; the
    # report's sha256 is of its bytes (a strictly decoded text encodes back to them).
    fix = "give a file `rocmport verify` wrote (build/verify/last.json)"
    if not p.exists() and not p.is_symlink():
        raise BadInput(f"{p}: no such report; `rocmport verify` writes build/verify/last.json")
    text = inputs.read_text(p, "report", max_bytes=inputs.MAX_JSON_BYTES, fix=fix)
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise BadInput(
            f"{p}: not a verify report: not JSON ({str(exc)[:120]}); a report cut while it was copied cannot be "
            "rendered, use the run's build/verify/ copy"
        ) from None
    if inputs.json_depth(data) > inputs.MAX_JSON_DEPTH:
        raise BadInput(f"{p}: not a verify report: nested more than {inputs.MAX_JSON_DEPTH} levels; {fix}")
    if not isinstance(data, dict) or not isinstance(data.get("stages"), list):
        raise BadInput(f"{p}: not a verify report (no 'stages' list); give a file `rocmport verify` wrote")
    return from_dict(data, path=str(p), sha256=hashlib.sha256(text.encode("utf-8")).hexdigest())


def from_dict(data: dict[str, Any], path: str | None = None, sha256: str | None = None) -> RunReport:
    missing: list[str] = []
    stages = [_stage(s) for s in data.get("stages") or [] if isinstance(s, dict)]
    for key, what in (
        ("started", "when it ran"),
        ("line", "the release line"),
        ("commit", "the tree's commit"),
    ):
        if key not in data:
            missing.append(f"{what}: not recorded (the report's '{key}' key is absent: an older rocmport wrote it)")
    verdict = data.get("verdict")
    recorded = isinstance(verdict, str) and bool(verdict)
    if not recorded:
        verdict = _derived_verdict(data, stages)
        missing.append(
            "the verdict line: not recorded (an older rocmport); the one shown is derived here from the stage table"
        )
    ran = [s.name for s in stages]
    absent = [n for n in STAGE_ORDER if n not in ran]
    if absent and stages:
        missing.append(
            "stages absent from the report: " + ", ".join(absent) + " (an older rocmport without them, or a cut run)"
        )
    sizes = {k: data[k] for k in ("world_size", "tp", "pp", "dp") if isinstance(data.get(k), int)}
    report = RunReport(
        path=path,
        sha256=sha256,
        raw=data,
        verdict=str(verdict),
        verdict_recorded=recorded,
        mode=_str(data.get("mode")),
        tree=_str(data.get("tree")),
        line=_str(data.get("line")),
        commit=_str(data.get("commit")),
        started=_str(data.get("started")),
        sizes=sizes,
        stages=stages,
        training=[],
        coverage=[],
        unit=None,
        env=_environment(data, missing),
        missing=missing,
    )
    report.training = _training_runs(data, report, missing)
    report.coverage = _coverage(data, missing)
    report.unit = _unit_tests(report, data, missing)
    return report


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _floats(value: Any) -> list[float]:
    return [float(v) for v in value if _num(v) is not None] if isinstance(value, list) else []


def _stage(s: dict[str, Any]) -> Stage:
    return Stage(
        name=str(s.get("name", "?")),
        status=str(s.get("status", "?")),
        reason=str(s.get("reason", "")),
        seconds=_num(s.get("seconds")),
    )


def _derived_verdict(data: dict[str, Any], stages: list[Stage]) -> str:
    who = f"{data['line']} port" if data.get("line") else f"tree {data.get('tree', '?')}"
    mode = " (CPU proxy, not a GPU result)" if data.get("mode") == "cpu-proxy" else ""
    passed = sum(s.status == "pass" for s in stages)
    out = f"{who}{mode}: {passed} of {len(stages)} stages pass"
    failed = [s.name for s in stages if s.status == "fail"]
    return out + (f"; failed: {', '.join(failed)}" if failed else "")


def _environment(data: dict[str, Any], missing: list[str]) -> Environment:
    env = data.get("env")
    if not isinstance(env, dict):
        missing.append("the environment: not recorded (no 'env' key)")
        env = {}
    te = data.get("te")
    if "te" not in data:
        missing.append("Transformer Engine: not recorded (the report predates the 'te' key)")
    hip_sim = data.get("hip_sim")
    return Environment(
        python=_str(env.get("python")),
        torch=_str(env.get("torch")),
        hip=_str(env.get("hip")),
        cuda=_str(env.get("cuda")),
        devices=[str(d) for d in env.get("devices") or []],
        hip_sim={k: str(v) for k, v in hip_sim.items()} if isinstance(hip_sim, dict) else None,
        te={k: str(v) for k, v in te.items() if k != "note"} if isinstance(te, dict) else None,
        components=_dict(env.get("components")),
        launcher_env=_dict(env.get("launcher_env")),
        firewall_profile=_str(env.get("firewall_profile")),
    )


def _curve(label: str, losses: list[float], first_step: int = 1) -> Curve:
    return Curve(label, list(range(first_step, first_step + len(losses))), losses)


def _fmt(value: Any) -> str:
    n = _num(value)
    return f"{n:.3g}" if n is not None else str(value)


def _training_runs(data: dict[str, Any], report: RunReport, missing: list[str]) -> list[TrainingRun]:
    runs: list[TrainingRun] = []
    sizes = report.sizes
    port = f"port tp{sizes.get('tp', '?')}×pp{sizes.get('pp', '?')}" + (
        f"×dp{sizes['dp']}" if sizes.get("dp", 1) != 1 else ""
    )
    training = data.get("training")
    stage2 = report.stage(STAGE_TWO)
    if isinstance(training, dict) and training.get("losses"):
        run = TrainingRun("training", "Stage 2: GPT training against its tp1/pp1 reference")
        run.curves.append(_curve(port, _floats(training.get("losses"))))
        ref = _floats(training.get("reference_losses"))
        if ref:
            run.curves.append(_curve("tp1/pp1 reference", ref))
        else:
            run.notes.append("no tp1/pp1 reference curve in the report")
        if "max_abs_diff" in training:
            bound = f" (tolerance {_fmt(training['tolerance'])})" if "tolerance" in training else ""
            run.facts.append(("max |Δ| vs tp1/pp1", _fmt(training["max_abs_diff"]) + bound))
        if "tied_embeddings_equal" in training:
            run.facts.append(("tied embeddings equal across pipeline stages", str(training["tied_embeddings_equal"])))
        runs.append(run)
        moe = training.get("moe")
        if isinstance(moe, dict) and moe.get("losses"):
            m = TrainingRun("training.moe", "Stage 2: the MoE case (TE's GroupedLinear) against its tp1/pp1 run")
            m.curves.append(_curve(f"port, expert parallel {moe.get('ep', '?')}", _floats(moe.get("losses"))))
            if moe.get("reference_losses"):
                m.curves.append(_curve("tp1/pp1 reference", _floats(moe.get("reference_losses"))))
            for key in ("first_abs_diff", "max_abs_diff", "tolerance", "experts"):
                if key in moe:
                    m.facts.append((key.replace("_", " "), _fmt(moe[key])))
            runs.append(m)
        elif isinstance(moe, dict) and moe.get("not_run"):
            run.notes.append(f"MoE case not run: {moe['not_run']}")
    elif stage2 is not None and stage2.status in ("pass", "fail"):
        missing.append(
            f"stage 2's loss curves: the report has no losses although the stage ran ({stage2.status}): "
            "it stopped before logging an iteration"
        )
    elif "training" not in data:
        missing.append("stage 2's loss curves: the report has no 'training' key")
    functional = data.get("functional")
    cases = functional.get("cases") if isinstance(functional, dict) else None
    if isinstance(cases, list) and any(isinstance(c, dict) and c.get("losses") for c in cases):
        # stage 4's data version 2: an entry per case (the first run case's keys also at the top, for version 1's readers)
        ran = [c for c in cases if isinstance(c, dict) and c.get("losses")]
        for c in ran:
            runs.append(_functional(c, port, "functional" if len(ran) == 1 else f"functional.{c.get('case', '?')}"))
    elif isinstance(functional, dict) and functional.get("losses"):
        runs.append(_functional(functional, port))
    else:
        stage4 = report.stage(STAGE_FOUR)
        if stage4 is not None and stage4.status in ("pass", "fail"):
            missing.append(f"stage 4's loss curve: the stage ran ({stage4.status}) but the report has none")
    bridge = data.get("bridge_training")
    if isinstance(bridge, dict) and bridge.get("losses"):
        b = TrainingRun("bridge_training", "Stage 5: a GPT built by Megatron-Bridge's GPTModelProvider")
        b.curves.append(_curve("port (Megatron-Bridge)", _floats(bridge.get("losses"))))
        if "tied_embeddings_equal" in bridge:
            b.facts.append(("tied embeddings equal", str(bridge["tied_embeddings_equal"])))
        runs.append(b)
    return runs


def _functional(f: dict[str, Any], port: str, key: str = "functional") -> TrainingRun:
    run = TrainingRun(key, f"Stage 4: upstream's functional case {f.get('case', '?')}")
    if f.get("label"):
        run.facts.append((f"label ({f.get('status', '?')})", f"{f['label']}: {f.get('label_reason') or '-'}"))
    losses = _floats(f.get("losses"))
    run.curves.append(_curve(port, losses))
    resume = f.get("resume")
    if isinstance(resume, dict) and resume.get("losses"):
        start = int(_num(resume.get("from_iteration")) or 0) + 1
        run.curves.append(_curve(f"resumed from iteration {start - 1}", _floats(resume["losses"]), start))
        run.facts.append(
            ("resume max |Δ|", f"{_fmt(resume.get('max_abs_diff'))} (tolerance {_fmt(resume.get('tolerance'))})")
        )
    elif isinstance(resume, dict) and resume.get("skipped"):
        run.notes.append(f"checkpoint resume not checked: {resume['skipped']}")
    else:
        run.notes.append("no checkpoint resume in the report")
    golden = f.get("golden")
    if isinstance(golden, dict):
        gpath = str(golden.get("path", ""))
        values, why = _golden_losses(gpath)
        if values:
            run.curves.append(_curve("committed golden", values))
        else:
            run.notes.append(f"the committed golden's curve: {why}")
        if "other_args" in golden:
            run.facts.append(("committed golden", f"not compared: {golden['other_args']}"))
        else:
            run.facts.append(
                (
                    "max relative drift vs the committed golden",
                    f"{_fmt(golden.get('max_rel_drift'))} (tolerance {_fmt(golden.get('tolerance'))})",
                )
            )
    else:
        run.notes.append("no committed golden for this device kind in the report")
    twin = f.get("cuda_twin")
    if isinstance(twin, dict):  # an FP8 case whose golden could not decide: the port's own CUDA path
        if twin.get("losses"):
            run.curves.append(_curve("CUDA-path twin (reference)", _floats(twin["losses"])))
        if _num(twin.get("max_rel_drift")) is not None:
            run.facts.append(
                (
                    "max relative drift vs its CUDA-path twin",
                    f"{_fmt(twin.get('max_rel_drift'))} (tolerance {_fmt(twin.get('tolerance'))}; {twin.get('te', '?')})",
                )
            )
        else:
            run.notes.append(f"its CUDA-path twin did not train the case: {twin.get('reason', '?')}")
    upstream = f.get("upstream_golden_a100")
    if isinstance(upstream, dict) and upstream.get("steps"):
        steps = [s for s in upstream["steps"] if isinstance(s, dict) and _num(s.get("a100")) is not None]
        run.curves.append(
            Curve(
                "upstream's DGX A100 golden (reference only)",
                [int(s["step"]) for s in steps],
                [float(s["a100"]) for s in steps],
            )
        )
    else:
        run.notes.append("upstream's GPU golden: the case has none in the report")
    return run


def _golden_losses(path: str) -> tuple[list[float], str]:
    """The committed golden's losses: the file the report names, or the same patchsets/ path under
    the current directory (a report written on another machine); why not when neither is here."""
    if not path:
        return [], "the report names no file"
    candidates = [Path(path)]
    if "patchsets/" in path:
        candidates.append(Path.cwd() / ("patchsets/" + path.split("patchsets/", 1)[1]))
    for p in candidates:
        try:
            values = _floats(json.loads(p.read_text(encoding="utf-8")).get("losses"))
        except (OSError, ValueError, AttributeError):
            continue
        if values:
            return values, ""
    return [], f"its file {path} is not on this machine (the drift verify measured is below)"


def _coverage(data: dict[str, Any], missing: list[str]) -> list[CoverageGroup]:
    groups = []
    for key, title in (("port_sites", "Megatron-LM"), ("bridge_port_sites", "Megatron-Bridge")):
        sites = data.get(key)
        if key == "port_sites" and not isinstance(sites, dict):
            missing.append("port-site coverage: not in the report (an older rocmport, before port coverage)")
            continue
        if not isinstance(sites, dict):
            continue
        codemods = []
        for name, c in sites.items():
            if not isinstance(c, dict):
                continue
            unreached = _dict(c.get("unreached"))
            rewrites = c.get("rewrites")
            ran = c.get("ran")
            codemods.append(
                CodemodCoverage(
                    name=str(name),
                    exercised=int(_num(c.get("exercised")) or 0),
                    total=int(_num(c.get("total")) or 0),
                    rewrites=int(rewrites) if isinstance(rewrites, int) else None,
                    unreached={str(k): str(v) for k, v in unreached.items()},
                    explanation=str(c.get("explanation", "")),
                    ran={str(k): [str(n) for n in v] for k, v in ran.items() if isinstance(v, list)}
                    if isinstance(ran, dict)
                    else None,
                )
            )
        groups.append(CoverageGroup(title, key, codemods))
    return groups


def _unit_tests(report: RunReport, data: dict[str, Any], missing: list[str]) -> UnitTests | None:
    raw = next((s for s in data.get("stages") or [] if isinstance(s, dict) and s.get("name") == STAGE_THREE), None)
    if raw is None or raw.get("status") in ("skipped", "unsupported-in-proxy"):
        return None
    labels = _dict(raw.get("labels"))
    outcomes = _dict(raw.get("outcomes"))
    if not labels and not outcomes:
        missing.append("stage 3's tests: the stage ran but the report lists no test outcomes or labels")
        return None
    reasons = _dict(raw.get("label_reasons"))
    failures = _dict(raw.get("failures"))
    baseline = _dict(raw.get("on_baseline"))
    tests = [
        UnitTest(
            nodeid=str(nodeid),
            label=str(labels.get(nodeid, "")),
            outcome=str(outcomes.get(nodeid, "not-run" if labels.get(nodeid) == "not-run" else "?")),
            reason=str(reasons.get(nodeid, "")),
            failure=str(failures.get(nodeid, "")),
            on_baseline=str(baseline.get(nodeid, "")),
        )
        for nodeid in sorted(set(outcomes) | set(labels))
    ]
    counts = _dict(raw.get("counts"))
    base = _dict(raw.get("baseline"))
    files = _dict(raw.get("files"))
    return UnitTests(
        tests=tests,
        counts={str(k): int(v) for k, v in counts.items() if isinstance(v, int)},
        baseline_commit=_str(base.get("commit")),
        files=files,
    )
