"""Port coverage: which call sites the codemods rewrote ran during verify.

The sites. Every codemod is one commit of the port branch (`codemod: <name> <version>`), and a
rewritten site that acts at run time calls a helper of the generated module (`megatron/core/_rocm.py`,
`megatron/bridge/_rocm.py`): a site is a call of one of its public names (or of an alias imported
from it) on a line of the tree that `git blame` gives to that codemod's commit. Nothing has to be
recorded at apply time. Rewrites that call no helper (e.g. `torch.amp.custom_fwd` spelled out) have
nothing to count: `rewrites` (the codemod's own site count from the apply state) says how many
rewrites the codemod made in all.

What ran. With protocol.PORT_SITES (rocmport.verify.runtime.protocol) set to a directory, the helper records each call site once per
process (`<file>:<line> <helper>`, see the end of rocmport/codemods/runtime/core.py) and the bootstrap
writes the tree's modules a process imported (`modules-<pid>-<ns>.txt`). Verify gives each stage a
directory of its own (`<dir>/<stage>/`), so a record says which stage ran it. A site ran when a
recorded line falls within its call; the report's `ran` names the stages that ran it. An unreached
site gets a reason: its module was never imported (and why, by where it lives), or it was imported
and that branch did not run here."""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rocmport.gitutil import run_git
from rocmport.upstreams import UPSTREAMS

HELPER_MODULES = tuple(u.helper_module for u in UPSTREAMS.values())
HELPER_FILES = tuple(u.helper_path for u in UPSTREAMS.values())
_SUBJECT = re.compile(r"^codemod: (\S+) \S+$")

# Why a site in a module verify never imported stays unreached, by where the module lives (first match).
NOT_IMPORTED = [
    ("examples/", "an example script: verify runs none"),
    ("tests/", "an upstream test file outside the selected unit tests (--unit-tests all runs them)"),
    ("megatron/legacy/", "legacy model code: pretrain_gpt.py's mcore path and the selected tests never import it"),
    ("megatron/post_training/", "ModelOpt post-training (NVIDIA-only): not on verify's paths"),
    ("megatron/core/extensions/transformer_engine", "Transformer Engine's wrappers: {te}"),
    ("megatron/core/transformer/moe/", "MoE layers: {moe}"),
    ("megatron/core/inference/", "the inference engines: verify trains"),
    ("megatron/rl/", "RL training: not on verify's paths"),
]
# Why a site in an imported module did not run, by the helper it calls.
NOT_RUN = {
    "te_gate": "a TE version gate on a TE code path: {te}",
    "te_has": "a TE feature probe on a TE code path: {te}",
    # The hint is an assert's message: evaluated only when GroupedMLP is built without grouped_gemm, and on
    # HIP the port's own disable_missing_fusions (validate_args) turns --moe-grouped-gemm off exactly then.
    "grouped_gemm_hint": (
        "only where the legacy GroupedMLP is built without the grouped_gemm package: on HIP the port's "
        "disable_missing_fusions (validate_args) turns --moe-grouped-gemm off then (sequential experts), so "
        "only code building GroupedMLP past validate_args reaches it; verify's MoE case takes TE's GroupedLinear"
    ),
    "MissingPackage": "only when the NVIDIA-only package is absent and the guarded import runs",
    "te_accepts": "a TE call-site probe on a TE code path: {te}",
    "save_original_input_ok": "only with FP8 on Transformer Engine layers: {te}",
    "nccl_ldflags": "only with --use-nccl-ub (the NCCL allocator extension is built then): verify does not use it",
    "nvidia_hopper_or_newer": (
        "only in the inference-optimized layers' symmetric-memory collectives (--transformer-impl "
        "inference_optimized, tensor parallel): verify trains"
    ),
    "empty_cache_on_interval": "only with --empty-unused-memory-level 1 or 2 (upstream's RL cases set it)",
    "async_start_method": (
        "only in TemporalAsyncCaller: --async-save without the persistent checkpoint worker "
        "(v0.16+ turn --async-save off without it) or a direct dist-checkpointing caller"
    ),
}
# Why a site did not run, by the function it is in, where the function says what takes it better than
# its helper does (a generic device probe, a TE probe): (file, function) -> the flag that calls it.
NOT_RUN_IN = {
    ("megatron/core/pipeline_parallel/utils.py", "set_ideal_affinity_for_current_gpu"): (
        "only with --fine-grained-activation-offloading (training.py pins each rank's CPU affinity to its GPU then)"
    ),
    ("megatron/training/yaml_arguments.py", "validate_yaml"): (
        "only with --yaml-cfg (initialize.py validates a YAML config's arguments there instead of validate_args)"
    ),
    ("megatron/core/fp4_utils.py", "get_fp4_recipe"): "only with FP4 (--fp4-format: config.fp4), its recipe made then",
}
NOT_RUN_DEFAULT = "its module was imported; this branch did not run in the stages verify ran"
# A site's condition (Site.when) leaves out what only asks for a version: the flag is what takes it.
_VERSION_CHECK = re.compile(r"\b(?:is_te_min_version|is_torch_min_version|te_gate|te_has|te_accepts)\(")


def moe_why(te_version: str | None) -> str:
    """Why a MoE module did not run: stage 2's MoE case runs with TE only, through TE's GroupedLinear."""
    if te_version:
        return (
            "not on the path of stage 2's MoE case (TE's GroupedLinear experts, the all-to-all dispatcher; "
            "the grouped_gemm package's GroupedMLP and the other dispatchers are not taken)"
        )
    return "stage 2's MoE case runs with TE (verify --te): without it verify's GPT cases are dense"


def te_why(te_version: str | None) -> str:
    """Why a TE code path did not run: TE absent (the local spec), or not taken with the TE that ran."""
    if te_version:
        return f"not taken by the cases and test files verify ran with TE {te_version}"
    return "Transformer Engine is not installed here (verify --te runs TE's Python layer; a ROCm image with ROCm TE runs them)"


@dataclass(frozen=True)
class Site:
    codemod: str
    path: str  # relative to the tree
    line: int  # the call's first line in the ported tree
    end: int  # its last line
    helper: str  # the helper's own name in _rocm.py
    scope: str = "<module>"  # the qualified name of the function or class the call is in
    nth: int = 1  # its place among the same codemod's calls of the same helper in that scope
    # What must hold for the call to run, as the source says it (the enclosing `if` tests and the
    # operands before it in an `and`, within its function; version checks left out): its flag.
    when: str = ""

    @property
    def key(self) -> str:
        return f"{self.path}:{self.line} {self.helper}"

    @property
    def stable_key(self) -> str:
        """The site's name in a reach record (rocmport.verify.analyses.reach): the file, the enclosing
        function, the helper, its place there and the codemod, without line numbers. A record is made
        once per line and read against later trees of the line (patch releases, a refreshed series): an
        upstream edit above a site moves its line, not its function; a site added in the same function
        before it shifts its place only."""
        return f"{self.path}::{self.scope} {self.helper}#{self.nth} [{self.codemod}]"


@dataclass
class Coverage:
    """`port_sites` of the report for one codemod."""

    exercised: int = 0
    total: int = 0
    rewrites: int | None = None  # the codemod's own count of rewritten sites (apply state)
    unreached: dict[str, str] = field(default_factory=dict)
    explanation: str = ""  # why none ran, when none did
    # Each site that ran -> the stages that ran it, in run order ([] for a record outside any
    # stage's directory: a caller that set one flat directory).
    ran: dict[str, list[str]] = field(default_factory=dict)
    # Each site that ran in a case's or test file's own records -> those cases and test files.
    ran_by: dict[str, list[str]] = field(default_factory=dict)
    # Each unreached site -> its class and why (reach.classify): `gpu-only (...)`, `not-on-proxy (...)`,
    # `reachable, not selected (...)`; by_class: how many of each ({} when not classified).
    classified: dict[str, str] = field(default_factory=dict)
    by_class: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict:
        out: dict[str, Any] = {
            "exercised": self.exercised,
            "total": self.total,
            "unreached": dict(sorted(self.unreached.items())),
            "ran": dict(sorted(self.ran.items())),
        }
        if self.rewrites is not None:
            out["rewrites"] = self.rewrites
        if self.explanation:
            out["explanation"] = self.explanation
        if self.ran_by:
            out["ran_by"] = dict(sorted(self.ran_by.items()))
        if self.by_class:
            out["by_class"] = self.by_class
            out["classified"] = dict(sorted(self.classified.items()))
        return out


def helper_names(tree: Path) -> set[str]:
    """The public names the generated helper defines (what rewritten sites call)."""
    for rel in HELPER_FILES:
        path = tree / rel
        if path.is_file():
            body = ast.parse(path.read_text(encoding="utf-8")).body
            return {
                n.name for n in body if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and not n.name.startswith("_")
            }
    return set()


def codemod_commits(tree: Path, base: str) -> dict[str, str]:
    """commit -> codemod name, for the port branch's codemod commits since ``base``."""
    out = run_git("log", "--format=%H %s", f"{base}..HEAD", cwd=tree, check=False).stdout
    commits = {}
    for line in out.splitlines():
        sha, _, subject = line.partition(" ")
        m = _SUBJECT.match(subject)
        if m:
            commits[sha] = m.group(1)
    return commits


def _condition(test: ast.expr, negate: bool = False) -> str:
    if negate and isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        test, negate = test.operand, False  # `if not x: return` guards what follows with x
    text = " ".join(ast.unparse(test).split())
    if _VERSION_CHECK.search(text):
        return ""
    text = text if len(text) <= 100 else text[:97] + "..."
    return f"not ({text})" if negate else text


def _guard(stmt: ast.AST) -> ast.expr | None:
    """The test of a guard clause (`if x: return / continue / pytest.skip(...)`, no else): what
    follows it in the same block runs only when the test is false. A clause that raises rejects a
    bad input (argument validation), which no run takes: not a condition worth saying."""
    if not isinstance(stmt, ast.If) or stmt.orelse or not stmt.body:
        return None
    last = stmt.body[-1]
    if isinstance(last, (ast.Return, ast.Continue)):
        return stmt.test
    if isinstance(last, ast.Expr) and isinstance(last.value, ast.Call):
        f = last.value.func
        if isinstance(f, ast.Attribute) and f.attr in ("skip", "exit"):
            return stmt.test
    return None


def _calls(text: str, names: set[str]) -> list[tuple[int, int, str, str, str]]:
    """(first line, last line, helper, enclosing scope, condition) of each call of a helper name, or
    of an alias imported from a helper module, in ``text``; the condition: Site.when."""
    tree = ast.parse(text)
    alias = {n: n for n in names}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in HELPER_MODULES:
            for a in node.names:
                if a.name in names:
                    alias[a.asname or a.name] = a.name
    out = []

    def visit(node: ast.AST, scope: tuple[str, ...], conds: tuple[str, ...]) -> None:
        for field_name, value in ast.iter_fields(node):
            children = value if isinstance(value, list) else [value]
            for index, child in enumerate(children):
                if not isinstance(child, ast.AST):
                    continue
                inner, held = scope, conds
                if isinstance(node, (ast.If, ast.While, ast.IfExp)) and field_name in ("body", "orelse"):
                    # an `elif` says its own test; the tests before it are not the site's flag
                    elif_ = field_name == "orelse" and len(children) == 1 and isinstance(child, ast.If)
                    held = conds if elif_ else (*conds, _condition(node.test, negate=field_name == "orelse"))
                elif isinstance(node, ast.BoolOp) and isinstance(node.op, ast.And) and field_name == "values":
                    held = (*conds, *(_condition(v) for v in children[:index]))
                if isinstance(value, list) and isinstance(child, ast.stmt):
                    # the guard clauses before it in its block: it runs only past them
                    guards = (_guard(prev) for prev in children[:index])
                    held = (*held, *(_condition(g, negate=True) for g in guards if g is not None))
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    inner, held = (*scope, child.name), ()
                if isinstance(child, ast.Call):
                    f = child.func
                    name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
                    if name in alias:
                        where = ".".join(scope) or "<module>"
                        when = " and ".join(dict.fromkeys(c for c in held if c))
                        out.append((child.lineno, child.end_lineno or child.lineno, alias[name], where, when))
                visit(child, inner, held)

    visit(tree, (), ())
    return sorted(out)


def _blame(tree: Path, rel: str, lines: list[int]) -> dict[int, str]:
    """line -> the commit that last wrote it (one `git blame` per file)."""
    ranges = [a for n in sorted(set(lines)) for a in ("-L", f"{n},{n}")]
    out = run_git("blame", "--porcelain", *ranges, "HEAD", "--", rel, cwd=tree, check=False).stdout
    found = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 3 and re.fullmatch(r"[0-9a-f]{40}", parts[0]):
            found[int(parts[2])] = parts[0]
    return found


def find_sites(tree: Path, base: str) -> list[Site]:
    """Every helper call site the codemods wrote in the ported tree."""
    commits = codemod_commits(tree, base)
    names = helper_names(tree)
    if not commits or not names:
        return []
    touched: dict[str, set[str]] = {}
    for sha, name in commits.items():
        files = run_git("show", "--format=", "--name-only", sha, cwd=tree, check=False).stdout.split()
        for rel in files:
            if rel.endswith(".py") and rel not in HELPER_FILES:
                touched.setdefault(rel, set()).add(name)
    sites = []
    for rel in sorted(touched):
        path = tree / rel
        if not path.is_file():
            continue
        try:
            calls = _calls(path.read_text(encoding="utf-8"), names)
        except SyntaxError:
            continue
        if not calls:
            continue
        blame = _blame(tree, rel, [c[0] for c in calls])
        places: dict[tuple[str, str, str], int] = {}
        for first, last, helper, scope, when in calls:
            codemod = commits.get(blame.get(first, ""))
            if codemod:
                nth = places[codemod, scope, helper] = places.get((codemod, scope, helper), 0) + 1
                sites.append(Site(codemod, rel, first, last, helper, scope, nth, when))
    return sites


def tree_sites(tree: Path) -> list[Site]:
    """find_sites for a tree `rocmport apply` made (from its state's base commit); [] for any other tree."""
    from rocmport.port import worktree as wt

    state = wt.read_state(tree)
    return find_sites(tree, state.base) if state is not None and state.base else []


def read_records(
    directory: Path, tree: Path, order: Sequence[str] = ()
) -> tuple[dict[tuple[str, int], list[str]], set[str]]:
    """What the processes recorded: (path relative to the tree, line) of every helper call -> the
    stages that ran it, and the tree's module files they imported. A stage's records are in its own
    subdirectory (named after it; listed in ``order``, the others after them by name), and in that
    subdirectory's own subdirectories (one per case or test file: read_units); records in
    ``directory`` itself (one flat directory, as callers before per-stage directories set) ran in
    no named stage."""
    root = str(tree.resolve()) + "/"
    rank = {name: i for i, name in enumerate(order)}
    stage_dirs = sorted(
        (d for d in directory.iterdir() if d.is_dir()), key=lambda d: (rank.get(d.name, len(rank)), d.name)
    )
    calls: dict[tuple[str, int], list[str]] = {}
    modules: set[str] = set()
    for where_dir, stage in [(directory, None), *((d, d.name) for d in stage_dirs)]:
        # A stage's own directory and its per-unit subdirectories (the flat top directory: itself only).
        unit_dirs = [where_dir] if stage is None else [where_dir, *sorted(d for d in where_dir.iterdir() if d.is_dir())]
        for found in unit_dirs:
            for line in _site_lines(found, root):
                stages = calls.setdefault(line, [])
                if stage is not None and stage not in stages:
                    stages.append(stage)
            modules |= _module_lines(found, root)
    return calls, modules


def _site_lines(where_dir: Path, root: str) -> set[tuple[str, int]]:
    """(path relative to the tree, line) of each helper call recorded directly in ``where_dir``."""
    out = set()
    for path in sorted(where_dir.glob("sites-*.txt")):
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            where, _, _helper = line.rpartition(" ")
            file, _, lineno = where.rpartition(":")
            if file.startswith(root) and lineno.isdigit():
                out.add((file[len(root) :], int(lineno)))
    return out


def _module_lines(where_dir: Path, root: str) -> set[str]:
    """The tree's module files recorded as imported directly in ``where_dir``."""
    out = set()
    for path in where_dir.glob("modules-*.txt"):
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith(root):
                out.add(line[len(root) :])
    return out


@dataclass
class UnitRecord:
    """What one case or test file ran (its own subdirectory of its stage's records): the helper call
    lines, the tree's modules imported, and its wall seconds and outcome where the stage noted them."""

    calls: set[tuple[str, int]] = field(default_factory=set)
    modules: set[str] = field(default_factory=set)
    seconds: float | None = None
    stopped: str | None = None  # an `import` unit: why stage 1's import of its file stopped
    outcome: str | None = None  # a case's status in the run (stage 4 notes it beside its seconds)


# A unit's subdirectory of its stage's records: `case=<name>`, `test=<path>` or `import=<path>` (stage
# 1's import of a file holding guarded imports, rocmport.verify.stages.guarded_imports), the name
# quoted into one path component (a test file's path has slashes).
UNIT_KINDS = ("case", "test", "import", "variant")
SECONDS_FILE = "seconds.txt"
OUTCOME_FILE = "outcome.txt"  # a case: its status in the run
STOPPED_FILE = "stopped.txt"  # an import unit: why its file's import stopped (absent: it imported)


def write_stopped(unit_dir: Path, why: str) -> None:
    """Note beside an import unit's records why its file's import stopped (the reason its sites after
    that point give)."""
    from rocmport.fsutil import write_file

    unit_dir.mkdir(parents=True, exist_ok=True)
    write_file(unit_dir / STOPPED_FILE, why + "\n", durable=False)


def unit_dir_name(kind: str, name: str) -> str:
    """The subdirectory of a stage's records that holds one case's (``kind`` "case") or one test
    file's ("test") records."""
    from urllib.parse import quote

    assert kind in UNIT_KINDS, kind
    return f"{kind}={quote(name, safe='')}"


def read_units(directory: Path, tree: Path) -> dict[tuple[str, str], UnitRecord]:
    """Each case's and test file's own records under ``directory`` (a run's records: one
    subdirectory per stage, in it one per unit, unit_dir_name): (kind, name) -> what it ran. Records a
    stage made outside any unit's subdirectory (a pytest session's start, before its first test
    file) are under (``"stage"``, the stage's name)."""
    from urllib.parse import unquote

    root = str(tree.resolve()) + "/"
    out: dict[tuple[str, str], UnitRecord] = {}
    for stage_dir in sorted(d for d in directory.iterdir() if d.is_dir()):
        for where in [stage_dir, *sorted(d for d in stage_dir.iterdir() if d.is_dir())]:
            kind, sep, quoted = where.name.partition("=")
            key = (
                (kind, unquote(quoted))
                if where != stage_dir and sep and kind in UNIT_KINDS
                else ("stage", stage_dir.name)
            )
            if where != stage_dir and key[0] == "stage":
                continue  # not a unit's directory
            unit = out.setdefault(key, UnitRecord())
            unit.calls |= _site_lines(where, root)
            unit.modules |= _module_lines(where, root)
            stopped = where / STOPPED_FILE
            if where != stage_dir and stopped.is_file():
                unit.stopped = stopped.read_text(encoding="utf-8", errors="replace").strip()
            seconds = where / SECONDS_FILE
            if where != stage_dir and seconds.is_file():
                try:
                    unit.seconds = (unit.seconds or 0.0) + float(seconds.read_text(encoding="utf-8").strip())
                except ValueError:
                    pass  # a torn write: the unit's seconds come from the stage's report instead
            outcome = where / OUTCOME_FILE
            if where != stage_dir and outcome.is_file():
                unit.outcome = outcome.read_text(encoding="utf-8").strip() or None
    return out


def sites_ran(sites: Sequence[Site], calls: Collection[tuple[str, int]]) -> list[Site]:
    """The sites a recorded call line falls within."""
    by_file: dict[str, list[int]] = {}
    for rel, line in calls:
        by_file.setdefault(rel, []).append(line)
    return [s for s in sites if any(s.line <= n <= s.end for n in by_file.get(s.path, ()))]


def _not_imported(rel: str, te_version: str | None = None) -> str:
    for prefix, why in NOT_IMPORTED:
        if rel.startswith(prefix):
            return f"module never imported: {why.format(te=te_why(te_version), moe=moe_why(te_version))}"
    return "module never imported by verify's stages"


def _not_run(site: Site, te_version: str | None) -> str:
    """Why a site in an imported module did not run: what takes it (its condition), by its helper."""
    why = NOT_RUN_IN.get((site.path, site.scope)) or NOT_RUN.get(site.helper)
    if why is None and not site.when:
        called = site.scope.rpartition(".")[2]
        why = (
            NOT_RUN_DEFAULT
            if site.scope == "<module>"
            else f"its module was imported; its call in {called}() did not run in the stages verify ran"
        )
    why = (why or NOT_RUN_DEFAULT).format(te=te_why(te_version))
    return f"taken only when `{site.when}`; {why}" if site.when else why


def coverage(
    sites: list[Site],
    calls: Mapping[tuple[str, int], Sequence[str]] | Collection[tuple[str, int]],
    modules: set[str],
    codemods: dict[str, int | None],
    te_version: str | None = None,
) -> dict[str, Coverage]:
    """Per codemod (``codemods``: name -> its own rewrite count, in series order): sites exercised,
    total, each site that ran with the stages that ran it (``calls``: a recorded line -> its stages, as
    read_records gives them; a bare collection of lines names none) and each unreached site with its
    reason (``te_version``: the TE Python layer that ran)."""
    by_file: dict[str, dict[int, Sequence[str]]] = {}
    for rel, line in calls:
        by_file.setdefault(rel, {})[line] = calls[rel, line] if isinstance(calls, Mapping) else ()
    out = {name: Coverage(rewrites=n) for name, n in codemods.items()}
    for site in sites:
        cov = out.setdefault(site.codemod, Coverage())
        cov.total += 1
        recorded = [stages for n, stages in by_file.get(site.path, {}).items() if site.line <= n <= site.end]
        if recorded:
            cov.exercised += 1
            # A call spanning several lines may be recorded at more than one: their stages, once each.
            cov.ran[site.key] = list(dict.fromkeys(s for stages in recorded for s in stages))
        elif site.path not in modules:
            cov.unreached[site.key] = _not_imported(site.path, te_version)
        else:
            cov.unreached[site.key] = _not_run(site, te_version)
    for name, cov in out.items():
        if cov.total == 0 and cov.rewrites == 0:
            cov.explanation = "nothing to rewrite at this release"
        elif cov.total == 0:
            cov.explanation = "no rewritten site calls a runtime helper (its rewrites act by themselves)"
        elif cov.exercised == 0:
            cov.explanation = "none ran: " + reasons_once(sorted(set(cov.unreached.values()))[:3])
    return out


def reasons_once(reasons: list[str]) -> str:
    """Reasons joined with each part said once: several that end in the same cause ("module never
    imported: TE's wrappers: <TE absent>", "a TE version gate on a TE code path: <TE absent>") give
    "module never imported: TE's wrappers; a TE version gate on a TE code path: <TE absent>"."""
    causes = {r.rpartition(": ")[2] for r in reasons}
    if len(reasons) > 1 and len(causes) == 1 and all(": " in r for r in reasons):
        return "; ".join(r.rpartition(": ")[0] for r in reasons) + ": " + causes.pop()
    return "; ".join(reasons)


# An unreached site in a file stage 1 imported for its guarded imports, whose import stopped first.
IMPORT_STOPPED = "stage 1 imported {path} with the guarded packages absent; it stopped before this site: {why}"


def _unit_name(kind: str, name: str) -> str:
    """A unit as ran_by names it: a case or a test file by its name, stage 1's import of a file as such."""
    return f"imports: {name}" if kind == "import" else f"variant: {name}" if kind == "variant" else name


def tree_coverage(
    tree: Path,
    sites_dir: Path,
    stages: Sequence[str] = (),
    te_version: str | None = None,
    explain: Callable[[dict[str, Coverage], list[Site]], None] | None = None,
    sites: list[Site] | None = None,
) -> dict[str, Coverage]:
    """The report's port_sites of ``tree``: per codemod of the tree's port, the rewritten helper call sites
    that ran in this verify run ({} for a tree `rocmport apply` did not make); ``stages``: the run's
    stage names in order (read_records' order of the stages that ran each site); each site that ran
    with the cases and test files that ran it; ``explain``: given the coverage and the sites, it
    classifies each unreached site (rocmport.verify.analyses.reach.classify); ``sites``: the tree's
    sites as the run found them (tree_sites; None: found here)."""
    from rocmport.port import worktree as wt

    state = wt.read_state(tree)
    if state is None or not state.base:
        return {}
    if sites is None:
        sites = find_sites(tree, state.base)
    calls, modules = read_records(sites_dir, tree, stages)
    codemods = {c["name"]: c.get("sites") for c in state.codemods}
    out = coverage(sites, calls, modules, codemods, te_version)
    by_key = {s.key: s for s in sites}
    for (kind, name), unit in sorted(read_units(sites_dir, tree).items()):
        if kind == "stage":
            continue
        for site in sites_ran(sites, unit.calls):
            out[by_key[site.key].codemod].ran_by.setdefault(site.key, []).append(_unit_name(kind, name))
        if kind == "import" and unit.stopped:
            for site in sites:
                if site.path == name and site.key in out[site.codemod].unreached:
                    out[site.codemod].unreached[site.key] = IMPORT_STOPPED.format(path=name, why=unit.stopped)
    if explain is not None:
        explain(out, sites)
    return out
