"""Reach: which port sites each functional case and each unit-test file runs, and the selections
made from it (`--unit-tests reach`, stage 4's `reach` cases, a refresh hop's cases).

The record. `patchsets/<upstream>/<line>/reach.json`, committed with the series so a fresh clone has
it, made by `rocmport verify --record-reach` (each case and each test file records its port sites in
its own subdirectory of its stage's records: port_sites.unit_dir_name). For every case and test
file recorded: the port sites it ran (port_sites.Site.stable_key: file, enclosing function, helper,
place and codemod, never a line number, so one record serves the line's later trees), its wall
seconds, and for cases the tree's modules it imported (a refresh hop's selection). The record says
what it was made on (the upstream commit, a digest of the recipe: the series file and its patches,
the TE layer) and whether it holds every case and test file (``partial``); each entry, the codemods
the tree's apply ran and their versions (a codemod's bump can add, move or remove sites without the
series file changing). Recording again adds to the record: the entries this run recorded are
replaced, the others kept. A record is one port's (one upstream commit, recipe and TE layer): a run
on another is refused, before it starts, naming what differs (a record mixing two ports would weigh
sites one of them may not have). A codemod's version is not refused but kept per entry: the
selection's line names the entries recorded on another version than the recipe runs now
(codemod_notes), until they are recorded again.

The selection. A greedy set cover under a time budget: one case with a golden for the run's device
kind first (of those that fit, the one running the most sites per second), then the entry with the most not-yet-covered sites per second
(ties by name), while it fits what is left of the budget; deterministic. Sites every run of the stage
reaches anyway (a pytest session's start) count as covered from the start. A case whose recorded run
did not pass, or a test file some of whose tests stage 3 labelled to fail it (its outcome `blocks`),
is not selected (its sites still explain); one recorded without an outcome (a record made before
outcomes were) is unknown, selectable, and the selection's line says so.

Every site run or explained (classify). A rewritten site no stage of a run ran is `reachable, not
selected` when some recorded case or test file ran it, `gpu-only` when only a GPU feature reaches it
(the GPU-only cases of case_plan name the flag and kernel), else `not-on-proxy` with port_sites'
reason (the module, the branch)."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rocmport.errors import BadInput
from rocmport.line_records import LineRecordFile

if TYPE_CHECKING:
    from rocmport.port.worktree import ApplyState
    from rocmport.verify.analyses.port_sites import Site

RECORD_FILE = "reach.json"
KINDS = ("cases", "unit_tests", "variants")
# The target: `--cases reach --unit-tests reach` with TE within 20 minutes on 2 cores. The
# budgets are the entries' recorded wall seconds: 12 minutes of cases, 8 of unit-test files.
CASES_BUDGET_S = 720.0
UNIT_TESTS_BUDGET_S = 480.0
# An entry recorded at under a second still costs its launch: per-second scores divide by at least this.
MIN_SECONDS = 1.0
# The file (rocmport/line_records.py reads and writes it, as it does case-results.json). Its upstream
# commit is any string: it is only compared with the tree's (a hand-made record may give a short one).
RECORD = LineRecordFile(
    RECORD_FILE,
    "reach record",
    fix=f"re-record it (`rocmport verify --record-reach`) or restore it from git ({RECORD_FILE})",
)

REACHABLE = "reachable, not selected"
GPU_ONLY = "gpu-only"
NOT_ON_PROXY = "not-on-proxy"
CLASSES = (GPU_ONLY, NOT_ON_PROXY, REACHABLE)


# A recorded run's outcome that lets the selection pick the entry (a stage result's status: stage_result.PASS).
PASSED = "pass"
# A test file's outcome in the recording run, from stage 3's labels of its tests: `clean` (no label
# that fails the stage) or `blocks` (some did: its `blocking` labels). Only a clean file is selected.
CLEAN = "clean"
BLOCKS = "blocks"
UNIT_OUTCOMES = (CLEAN, BLOCKS)
SELECTABLE = (None, PASSED, CLEAN)


@dataclass(frozen=True)
class Entry:
    """One recorded case or unit-test file: the port sites it ran (stable keys), its wall seconds,
    (cases) the tree's module files it imported, and its outcome in the recording run. A case's is
    its status (pass, fail, unsupported-in-proxy); a test file's is `clean` or `blocks`, with
    ``labels`` (stage 3's label -> how many of its tests got it) and ``blocking`` (those of them that
    fail the stage). None: not recorded (records made before outcomes were): unknown, selectable.
    ``codemods``: the codemods the recording tree's apply ran, (name, version) pairs sorted by name;
    None: not recorded (records made before they were)."""

    sites: frozenset[str]
    seconds: float
    modules: frozenset[str] = frozenset()
    outcome: str | None = None
    labels: tuple[tuple[str, int], ...] = ()  # sorted (label, count) pairs: hashable, as the entry is frozen
    blocking: tuple[str, ...] = ()
    codemods: tuple[tuple[str, str], ...] | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"sites": sorted(self.sites), "seconds": round(self.seconds, 2)}
        if self.modules:
            out["modules"] = sorted(self.modules)
        if self.outcome is not None:
            out["outcome"] = self.outcome
        if self.outcome in UNIT_OUTCOMES:
            out["labels"] = dict(self.labels)
            out["blocking"] = list(self.blocking)
        if self.codemods is not None:
            out["codemods"] = dict(self.codemods)
        return out

    def blocked_by(self) -> str:
        """The blocking labels with their counts, in words ('3 unverified, 1 port-regression')."""
        counts = dict(self.labels)
        return ", ".join(f"{counts.get(b, 0)} {b}" for b in self.blocking)


def unit_entry(
    sites: frozenset[str], seconds: float, labels: Mapping[str, int] | None, blocking: Collection[str]
) -> Entry:
    """A test file's entry: its outcome from stage 3's ``labels`` of its tests (None: stage 3 did not
    label them, the outcome is unknown); ``blocking``: the labels that fail the stage."""
    if labels is None:
        return Entry(sites, seconds)
    blocked = tuple(sorted(k for k, n in labels.items() if n and k in blocking))
    return Entry(
        sites,
        seconds,
        outcome=BLOCKS if blocked else CLEAN,
        labels=tuple(sorted((k, n) for k, n in labels.items() if n)),
        blocking=blocked,
    )


@dataclass
class ReachRecord:
    """A line's reach.json."""

    line: str
    upstream: str  # the upstream commit the port was made from
    recipe: str  # recipe_digest of the series directory
    te: str | None = None  # the TE Python layer of the recording run (None: the local spec)
    cases: dict[str, Entry] = field(default_factory=dict)
    unit_tests: dict[str, Entry] = field(default_factory=dict)
    # Sites every run of a kind reaches whichever entries run (the pytest session's start: conftest.py).
    shared: dict[str, frozenset[str]] = field(default_factory=dict)
    # Reach variants (stages/variant_list.py): stage 2's small GPT with a few Megatron flags each.
    variants: dict[str, Entry] = field(default_factory=dict)
    partial: bool = True
    holds: str = ""  # what the record holds, in words

    def entries(self, kind: str) -> dict[str, Entry]:
        return self.cases if kind == "cases" else self.variants if kind == "variants" else self.unit_tests

    def ran_by(self) -> dict[str, list[str]]:
        """Each recorded site -> the cases and test files that ran it (sorted; shared ones: the stage)."""
        out: dict[str, list[str]] = {}
        for kind in KINDS:
            for name, entry in sorted(self.entries(kind).items()):
                for site in entry.sites:
                    out.setdefault(site, []).append(f"variant: {name}" if kind == "variants" else name)
            for site in self.shared.get(kind, ()):
                out.setdefault(site, []).append(f"every {kind.replace('_', '-')[:-1]} run")
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": RECORD.schema,
            "line": self.line,
            "recorded_on": {"upstream": self.upstream, "recipe": self.recipe, "te": self.te},
            "partial": self.partial,
            "holds": self.holds,
            "shared": {k: sorted(v) for k, v in sorted(self.shared.items())},
            "cases": {n: e.to_dict() for n, e in sorted(self.cases.items())},
            "unit_tests": {n: e.to_dict() for n, e in sorted(self.unit_tests.items())},
            **({"variants": {n: e.to_dict() for n, e in sorted(self.variants.items())}} if self.variants else {}),
        }


def record_path(series_dir: Path) -> Path:
    return RECORD.path(series_dir)


def recipe_digest(series_dir: Path) -> str:
    """sha256 of what makes the port: the series file and the patches beside it (a record made on
    another recipe may name sites the port no longer has, or miss new ones)."""
    h = hashlib.sha256()
    for path in [series_dir / "series", *sorted(series_dir.glob("*.patch"))]:
        if path.is_file():
            h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def recipe_codemods(series_dir: Path) -> dict[str, str] | None:
    """Each codemod the line's series runs -> the version an apply of it runs now (codemods/declared.py),
    in the series' order; None when the directory has no series file."""
    from rocmport.codemods.declared import DECLARED, check_recipe
    from rocmport.patches.series import load_head

    path = series_dir / "series"
    if not path.is_file():
        return None
    listed = load_head(path).codemod_entries()
    check_recipe(listed, path)
    return {entry["name"]: DECLARED[entry["name"]].version for entry in listed}


def tree_codemods(state: ApplyState) -> tuple[tuple[str, str], ...] | None:
    """The codemods a tree's apply ran with their versions (its state's layers: port/apply.py writes
    each codemod's name and version), as Entry holds them; None when the state does not say them all."""
    out = []
    for layer in state.codemods:
        name, version = layer.get("name"), layer.get("version")
        if not (isinstance(name, str) and name and isinstance(version, str) and version):
            return None
        out.append((name, version))
    return tuple(sorted(out))


def _str_list(value: Any, path: Path, where: str) -> frozenset[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise RECORD.problem(path, f"{where} is not a list of strings")
    return frozenset(value)


def _codemod_versions(value: Any, path: Path, where: str) -> tuple[tuple[str, str], ...] | None:
    """An entry's codemods (name -> version), as Entry holds them; None when absent (recorded before
    records held them)."""
    if value is None:
        return None
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and k and isinstance(v, str) and v for k, v in value.items()
    ):
        raise RECORD.problem(path, f"{where}.codemods is not a mapping of codemod names to versions (strings)")
    return tuple(sorted(value.items()))


def _entries(data: Any, path: Path, kind: str) -> dict[str, Entry]:
    data = RECORD.mapping(data, path, kind)
    out = {}
    for name, raw in data.items():
        where = f"{kind}[{name[:80]!r}]"
        raw = RECORD.mapping(raw, path, where)
        seconds = RECORD.seconds(raw.get("seconds"), path, where)
        RECORD.known_keys(
            raw,
            {"sites", "seconds", "modules", "outcome", "codemods", *(UNIT_KEYS if kind == "unit_tests" else ())},
            path,
            where,
        )
        codemods = _codemod_versions(raw.get("codemods"), path, where)
        outcome = raw.get("outcome")  # absent in records made before outcomes were: unknown
        if outcome is not None and not (isinstance(outcome, str) and outcome):
            raise RECORD.problem(path, f"{where}.outcome is not a stage status (pass, fail, ...)")
        sites = _str_list(raw.get("sites"), path, f"{where}.sites")
        modules = _str_list(raw.get("modules", []), path, f"{where}.modules")
        if kind == "unit_tests":
            out[name] = replace(_unit_outcome(raw, sites, seconds, modules, path, where), codemods=codemods)
        else:
            out[name] = Entry(sites, seconds, modules, outcome, codemods=codemods)
    return out


# A test file's outcome keys (Entry.to_dict); its modules are not recorded.
UNIT_KEYS = ("labels", "blocking")


def _unit_outcome(
    raw: dict[str, Any], sites: frozenset[str], seconds: float, modules: frozenset[str], path: Path, where: str
) -> Entry:
    """A test file's entry with its outcome checked: none at all (recorded before outcomes were), or
    `clean` / `blocks` with its label counts and the blocking labels among them, consistent."""
    outcome = raw.get("outcome")
    if outcome is None:
        if any(k in raw for k in UNIT_KEYS):
            raise RECORD.problem(path, f"{where} has labels or blocking but no outcome")
        return Entry(sites, seconds, modules)
    if outcome not in UNIT_OUTCOMES:
        raise RECORD.problem(path, f"{where}.outcome is {outcome!r}, a test file's is {' or '.join(UNIT_OUTCOMES)}")
    labels = raw.get("labels")
    if not isinstance(labels, dict) or not all(
        isinstance(k, str) and k and isinstance(n, int) and not isinstance(n, bool) and n > 0 for k, n in labels.items()
    ):
        raise RECORD.problem(path, f"{where}.labels is not a mapping of stage 3's labels to test counts (above 0)")
    blocking = raw.get("blocking")
    if not isinstance(blocking, list) or not all(isinstance(b, str) and b in labels for b in blocking):
        raise RECORD.problem(path, f"{where}.blocking is not a list of labels among its labels")
    if (outcome == BLOCKS) != bool(blocking):
        raise RECORD.problem(path, f"{where}.outcome {outcome} disagrees with its blocking labels {blocking}")
    return Entry(
        sites,
        seconds,
        modules,
        outcome=outcome,
        labels=tuple(sorted(labels.items())),
        blocking=tuple(sorted(set(blocking))),
    )


def parse_record(data: Any, path: Path) -> ReachRecord:
    """A reach record from its JSON, or BadInput naming ``path`` and the first thing wrong."""
    head = RECORD.header(data, path)
    if not isinstance(head.recorded_on.get("recipe"), str):
        raise RECORD.problem(path, "recorded_on.recipe is not a recipe digest (a string)")
    if not isinstance(data.get("partial"), bool):
        raise RECORD.problem(path, "partial is not true or false")
    shared = data.get("shared", {})
    if not isinstance(shared, dict) or set(shared) - set(KINDS):
        raise RECORD.problem(path, f"shared is not a mapping of {' / '.join(KINDS)}")
    return ReachRecord(
        line=head.line,
        upstream=head.upstream,
        recipe=head.recorded_on["recipe"],
        te=head.te,
        cases=_entries(data.get("cases", {}), path, "cases"),
        unit_tests=_entries(data.get("unit_tests", {}), path, "unit_tests"),
        shared={k: _str_list(v, path, f"shared.{k}") for k, v in shared.items()},
        variants=_entries(data.get("variants", {}), path, "variants"),
        partial=data["partial"],
        holds=str(data.get("holds", "")),
    )


def read_record(series_dir: Path | None) -> ReachRecord | None:
    """The line's reach record (None: the series has none); a broken one is BadInput naming the file."""
    if series_dir is None:
        return None
    loaded = RECORD.load(series_dir)
    return None if loaded is None else parse_record(loaded[1], loaded[0])


def record_to_extend(series_dir: Path, upstream: str, te: str | None) -> ReachRecord | None:
    """The line's record a --record-reach run at ``upstream`` with TE ``te`` adds to (None: the line
    has none yet, the run starts it); BadInput, one line naming the file, what differs and what to do,
    when the record was made on another upstream commit, recipe or TE layer."""
    old = read_record(series_dir)
    if old is None:
        return None
    path = record_path(series_dir)
    differs = []
    if old.upstream != upstream:
        differs.append(f"upstream {old.upstream[:12]} (this run: {upstream[:12]})")
    if old.recipe != recipe_digest(series_dir):
        differs.append("another recipe (the series file or its patches changed since)")
    if old.te != te:
        differs.append(f"TE {old.te or 'none'} (this run: {te or 'none'})")
    if differs:
        raise BadInput(
            f"{path}: --record-reach adds to this record, made on {'; '.join(differs)}; record on the port "
            f"and --te it was made on, or move {RECORD_FILE} aside (git rm) to start a new record"
        )
    return old


def write_record(series_dir: Path, record: ReachRecord) -> Path:
    return RECORD.write(series_dir, record.to_dict())


# --- the selection -----------------------------------------------------------------------------


def greedy_cover(
    entries: Mapping[str, Entry], budget: float, covered: Collection[str] = (), first: Sequence[str] = ()
) -> list[str]:
    """The entries a greedy set cover picks within ``budget`` seconds: ``first`` (in order, each while
    it fits: the cases with a golden), then at each step the one with the most sites not yet covered
    per second (ties: the first name), among those that still fit; ``covered``: sites covered before
    any pick. Entries that add no site are never picked by the cover."""
    have = set(covered)
    chosen: list[str] = []
    spent = 0.0
    for name in first:
        if name in entries and name not in chosen and spent + entries[name].seconds <= budget:
            chosen.append(name)
            spent += entries[name].seconds
            have |= entries[name].sites
    while True:
        best: tuple[float, str] | None = None
        for name in sorted(entries):
            entry = entries[name]
            if name in chosen or spent + entry.seconds > budget:
                continue
            new = len(entry.sites - have)
            score = new / max(entry.seconds, MIN_SECONDS)
            if new and (best is None or score > best[0]):
                best = (score, name)
        if best is None:
            return chosen
        chosen.append(best[1])
        spent += entries[best[1]].seconds
        have |= entries[best[1]].sites


def _first_golden(
    entries: Mapping[str, Entry], goldens: Sequence[str], budget: float, covered: Collection[str]
) -> list[str]:
    """The one case with a golden that the selection takes first: of those that fit the budget, the one
    running the most not-yet-covered sites per second (ties: the first name). One, not all: on a line
    whose sweep recorded goldens for dozens of cases, taking them all (by name) filled the budget with
    cases that add no site; comparing one case with its golden is the check a golden gives."""
    fits = [n for n in goldens if entries[n].seconds <= budget]
    if not fits:
        return []
    have = set(covered)
    return [max(fits, key=lambda n: len(entries[n].sites - have) / max(entries[n].seconds, MIN_SECONDS))]


# What the notes call a kind's entries.
WHAT = {"cases": "cases", "unit_tests": "test files", "variants": "variants"}


def codemod_notes(record: ReachRecord, series_dir: Path, kind: str | None = None) -> list[str]:
    """Where the codemods the ``kind`` entries (None: all) were recorded with differ from what the
    line's series runs now (recipe_codemods): each codemod at another version, added or dropped since,
    with how many entries (when not all); and entries recorded before versions were recorded."""
    entries = list(record.entries(kind).values()) if kind else [e for k in KINDS for e in record.entries(k).values()]
    what = WHAT.get(kind or "", "entries")
    notes = []
    unknown = sum(e.codemods is None for e in entries)
    if unknown:
        some = "" if unknown == len(entries) else f" for {unknown} of {len(entries)} recorded {what}"
        notes.append(
            f"codemod versions not recorded{some} (recorded before records held them; a codemod changed since "
            "may have added, moved or removed port sites): re-record with --record-reach to know them"
        )
    now = recipe_codemods(series_dir)
    ran = [dict(e.codemods) for e in entries if e.codemods is not None]
    if now is None or not ran:
        return notes
    dropped = sorted({name for versions in ran for name in versions} - set(now))
    for name in [*now, *dropped]:
        differ: dict[str | None, int] = {}  # the version recorded (None: not run) -> how many entries
        for versions in ran:
            if versions.get(name) != now.get(name):
                differ[versions.get(name)] = differ.get(versions.get(name), 0) + 1
        for old, count in sorted(differ.items(), key=lambda kv: str(kv[0])):
            who, them = ("", "") if count == len(entries) else (f"{count} of {len(entries)} {what} were ", " them")
            if old is None:
                said = f"{who}recorded without {name}, the recipe now runs it ({now[name]})"
            elif name in now:
                said = f"{who}recorded with {name} {old}, the recipe now runs {now[name]}"
            else:
                said = f"{who}recorded with {name} {old}, which the recipe no longer runs"
            notes.append(f"{said}: re-record{them} with --record-reach")
    return notes


def _stale(record: ReachRecord, series_dir: Path, kind: str | None = None) -> str:
    """Why the record (its ``kind`` entries: None, all) may not match this recipe (another series or
    patches, other codemod versions), or ''."""
    notes = []
    if record.recipe != recipe_digest(series_dir):
        notes.append("recorded on another recipe (series or patches changed since): re-record with --record-reach")
    notes += codemod_notes(record, series_dir, kind)
    return "; ".join(notes)


def select(
    series_dir: Path | None,
    kind: str,
    budget: float,
    have: Collection[str] | None = None,
    golden: Collection[str] = (),
) -> tuple[list[str], str] | None:
    """The ``kind`` ("cases" or "unit_tests") entries reach selects within ``budget`` seconds, and a
    one-line why; None when the line has no record of that kind. ``have``: the names that exist here
    (the tree's cases or test files); recorded ones that do not are left out. ``golden``: the cases with
    a golden for this run's device kind; one of them is picked first (_first_golden): comparing with a
    golden is the strongest check a case gives. An entry whose recorded run did not pass is not selected (a
    selection that rests on a case that always stops, at argument validation say, proves nothing); its
    sites still count among those the record ran (the explanation of an unreached site names it)."""
    record = read_record(series_dir)
    if record is None or not record.entries(kind):
        return None
    assert series_dir is not None
    present = {n: e for n, e in record.entries(kind).items() if have is None or n in have}
    failed = {n: e for n, e in sorted(present.items()) if e.outcome not in SELECTABLE}
    entries = {n: e for n, e in present.items() if n not in failed}
    shared = record.shared.get(kind, frozenset())
    goldens = sorted(n for n in golden if n in entries)
    first = _first_golden(entries, goldens, budget, shared)
    chosen = greedy_cover(entries, budget, shared, first)
    if not chosen and entries:  # nothing adds a site (or nothing fits): the cheapest still runs, as a smoke test
        chosen = [min(entries, key=lambda n: (entries[n].seconds, n))]
    every = set(shared).union(*(e.sites for e in present.values())) if present else set(shared)
    got = set(shared).union(*(entries[n].sites for n in chosen))
    seconds = sum(entries[n].seconds for n in chosen)
    what = "cases" if kind == "cases" else "test files"
    why = (
        f"reach: {len(chosen)} of {len(record.entries(kind))} recorded {what} run {len(got)} of the "
        f"{len(every)} port sites they ran when recorded, in {seconds:.0f} s recorded (budget {budget:.0f} s)"
    )
    gone = len(record.entries(kind)) - len(present)
    if gone:
        why += f"; {gone} recorded {what} not in this tree"
    if first and len(goldens) == 1:
        why += f"; {first[0]} first: it has a golden for this run's device kind"
    elif first:
        why += (
            f"; {first[0]} first: of the {len(goldens)} cases with a golden for this run's device kind, it runs "
            "the most port sites per second (the others only for the sites they add)"
        )
    elif len(goldens) == 1:
        why += f"; {goldens[0]} has a golden but does not fit the budget"
    elif goldens:
        why += f"; none of the {len(goldens)} cases with a golden fits the budget"
    if failed:
        why += _left_out_phrase(failed, what)
    unknown = [n for n, e in present.items() if e.outcome is None]
    if unknown:
        one = what[:-1] if len(unknown) == 1 else what
        why += (
            f"; {len(unknown)} recorded {one} {'has' if len(unknown) == 1 else 'have'} no recorded outcome "
            "(recorded before outcomes were): treated as unknown, selectable; re-record to know"
        )
    if record.partial:
        why += f"; partial record ({record.holds or 'not every case and test file'})"
    stale = _stale(record, series_dir, kind)
    return chosen, why + (f"; {stale}" if stale else "")


# How many left-out entries the selection's line names (the rest counted).
SHOWN_LEFT_OUT = 5


def _left_out_phrase(failed: Mapping[str, Entry], what: str) -> str:
    """The selection line's part on the entries left out for their recorded outcome: a case that did
    not pass (its status), a test file whose tests got labels that fail stage 3 (those labels)."""
    one = what[:-1] if len(failed) == 1 else what
    if what == "cases":
        shown = ", ".join(f"{n}: {e.outcome}" for n, e in list(failed.items())[:SHOWN_LEFT_OUT])
        said = f"did not pass when recorded ({shown}"
    else:
        shown = "; ".join(f"{n}: {e.blocked_by()}" for n, e in list(failed.items())[:SHOWN_LEFT_OUT])
        said = f"had tests labelled to fail stage 3 when recorded ({shown}"
    more = len(failed) - SHOWN_LEFT_OUT
    return f"; {len(failed)} recorded {one} {said}{f' +{more} more' if more > 0 else ''}): not selected"


# --- reach variants ------------------------------------------------------------------------------

# `--variants reach`: the variants' recorded seconds within this budget (a variant is one short run of
# stage 2's small GPT: about 20-40 s on 2 cores).
VARIANTS_BUDGET_S = 240.0
# A variant's outcomes that keep it selectable: it passed, or it ran its sites and then stopped where
# its declaration says the proxy stops (the FP4 kernel TE's CPU layer lacks: stage_result.UNSUPPORTED).
VARIANT_SELECTABLE = (None, PASSED, "unsupported-in-proxy")


def reach_variants(
    series_dir: Path | None,
    declared: Sequence[str],
    covered: Collection[str],
    budget: float = VARIANTS_BUDGET_S,
) -> tuple[list[str], str]:
    """`--variants reach`: of the ``declared`` variants (their order), each never recorded (its sites
    unknown: it runs, and a --record-reach run records them), then the recorded ones the greedy cover
    picks within what is left of ``budget`` for the sites not in ``covered`` (the sites of the cases
    and test files the run's reach selection runs, and the shared ones); a variant whose recorded run
    was refused by the parser (not-applicable) or failed is not selected. With a one-line why."""
    record = read_record(series_dir)
    recorded = record.variants if record else {}
    unknown = [n for n in declared if n not in recorded]
    left_out = {n: recorded[n] for n in declared if n in recorded and recorded[n].outcome not in VARIANT_SELECTABLE}
    entries = {n: recorded[n] for n in declared if n in recorded and n not in left_out}
    have = set(covered)
    chosen = greedy_cover(entries, budget, have)
    got = set().union(*(entries[n].sites for n in chosen)) - have if chosen else set()
    seconds = sum(entries[n].seconds for n in chosen)
    picked = set(chosen) | set(unknown)
    why = (
        f"reach: {len(picked)} of {len(declared)} variants; {len(chosen)} recorded run {len(got)} port sites the "
        f"selected cases and test files do not, in {seconds:.0f} s recorded (budget {budget:.0f} s)"
    )
    if unknown:
        why += f"; {len(unknown)} never recorded (their sites unknown): run ({', '.join(unknown)})"
    if left_out:
        shown = ", ".join(f"{n}: {e.outcome}" for n, e in left_out.items())
        why += f"; {len(left_out)} ended neither pass nor unsupported-in-proxy when recorded ({shown}): not selected"
    return [n for n in declared if n in picked], why


# Where a tree's GPT cases are (case_plan.CASES; an analysis reads no stage's module).
GPT_CASES = Path("tests/functional_tests/test_cases/gpt")


def reach_cases(
    series_dir: Path | None, tree: Path, budget: float = CASES_BUDGET_S, golden: Collection[str] = ()
) -> tuple[list[str], str] | None:
    """Stage 4's `reach` cases: the recorded GPT cases the set cover picks within ``budget`` seconds
    (those the tree has; ``golden``: those with a golden for the run's device kind, first), and a
    one-line why; None when the line has no case in its record."""
    recorded = read_record(series_dir)
    have = {n for n in (recorded.cases if recorded else {}) if (tree / GPT_CASES / n / "model_config.yaml").is_file()}
    return _with_tree_note(select(series_dir, "cases", budget, have, golden), series_dir, tree)


def reach_unit_tests(
    series_dir: Path | None, tree: Path, budget: float = UNIT_TESTS_BUDGET_S
) -> tuple[list[str], str] | None:
    """`--unit-tests reach`: the recorded test files the set cover picks within ``budget`` seconds
    (those the tree has), and a one-line why; None when the line has no test file in its record."""
    recorded = read_record(series_dir)
    have = {n for n in (recorded.unit_tests if recorded else {}) if (tree / n).is_file()}
    return _with_tree_note(select(series_dir, "unit_tests", budget, have), series_dir, tree)


def _with_tree_note(
    out: tuple[list[str], str] | None, series_dir: Path | None, tree: Path
) -> tuple[list[str], str] | None:
    """``out`` with the one staleness select cannot know: the tree at another upstream commit than the
    record's (select already said the recipe's and the codemods')."""
    from rocmport.port import worktree as wt

    if out is None or series_dir is None:
        return out
    record = read_record(series_dir)
    assert record is not None
    state = wt.read_state(tree)
    if state is None or not state.base or state.base == record.upstream:
        return out
    names, why = out
    return names, f"{why}; recorded at upstream {record.upstream[:12]}, the tree is at {state.base[:12]}"


def hop_cases(series_dir: Path | None, changed: Collection[str]) -> tuple[list[str], str] | None:
    """A refresh hop's cases: the recorded cases that imported a file upstream changed, or ran a
    port site in one (``changed``: paths relative to the tree), sorted; None when the line has no
    recorded case. As `--unit-tests impacted` does for tests, from the record instead of a static
    import graph (a case's imports are what pretrain_gpt.py loaded for it)."""
    record = read_record(series_dir)
    if record is None or not record.cases:
        return None
    files = set(changed)
    picked = []
    for name, entry in sorted(record.cases.items()):
        site_files = {s.split("::", 1)[0] for s in entry.sites}
        if files & (entry.modules | site_files):
            picked.append(name)
    why = (
        f"{len(picked)} of {len(record.cases)} recorded cases import a file or run a port site of the "
        f"{len(files)} files this hop changed"
    )
    return picked, why


# --- every site run or explained ---------------------------------------------------------------

# GPU features, each the one thing that reaches some rewritten sites: (codemod, file prefix or None,
# helper or None) -> the flag whose cases case_plan finds GPU-only, and what it needs when the tree
# has no such case to quote.
GPU_FEATURES: tuple[tuple[str | None, str | None, str | None, str, str], ...] = (
    ("flash-attention-hooks", None, None, "--use-flash-attn", "the flash-attn package's CUDA kernels"),
    (None, "megatron/core/transformer/cuda_graphs.py", None, "--enable-cuda-graph", "CUDA graph capture"),
    ("tp-comm-overlap", None, "te_userbuffers_available", "--tp-comm-overlap", "TE's userbuffers (CUDA IPC)"),
    (None, None, "nccl_ldflags", "--use-nccl-ub", "the NCCL allocator extension built and registered on a GPU"),
    (None, None, "hip_runtime_ldflags", "", "the unified-memory allocator's extension, linked to the GPU runtime"),
    (None, "megatron/legacy/fused_kernels/", None, "", "the legacy fused kernels, CUDA extensions built with nvcc"),
    (None, "megatron/core/ssm/ops/", None, "", "Mamba's Triton kernels, launched on a GPU"),
)


# A site whose condition (port_sites.Site.when) asks for one of these runs only on a GPU:
# (a pattern of the condition, the flag, what it needs). A negated condition (`not (...)`) is not it.
GPU_CONDITIONS: tuple[tuple[str, str, str], ...] = (
    (r"\btp_comm_overlap\b", "--tp-comm-overlap", "TE's userbuffers (CUDA IPC)"),
    (r"\.type == 'cuda'", "", "a tensor on a GPU (the proxy's tensors are on the CPU)"),
)

# A site whose condition asks what the proxy could answer but does not where the site lies: not a GPU
# feature, so not gpu-only (a ROCm GPU takes it, and so could a proxy run that answered it): (a pattern
# of the condition, why the proxy's runs do not take it).
PROXY_CONDITIONS: tuple[tuple[str, str], ...] = (
    (
        r"torch\.cuda\.is_available\(\)",
        "stage 3's processes see no device: torch.cuda.is_available() is False there (stage 4's shim answers "
        "True; upstream's unit tests run without it, so a module-level check takes its CPU branch)",
    ),
)


def site_class(
    codemod: str,
    path: str,
    helper: str,
    stable_key: str,
    reason: str,
    ran_by: Mapping[str, Sequence[str]],
    gpu_reasons: Mapping[str, str],
    record: ReachRecord | None,
    when: str = "",
) -> str:
    """One unreached site's class and why, as the report writes it: `reachable, not selected (...)`,
    `gpu-only (...)` or `not-on-proxy (...)` (``reason``: port_sites' reason for it)."""
    if stable_key in ran_by:
        names = list(ran_by[stable_key])
        return f"{REACHABLE} (ran by {', '.join(names[:3])}{f' +{len(names) - 3} more' if len(names) > 3 else ''} when recorded)"
    for mod, prefix, fn, flag, needs in GPU_FEATURES:
        if (
            # a test file's rewrite runs when the file is collected, whichever codemod made it
            not path.startswith("tests/")
            and (mod is None or mod == codemod)
            and (prefix is None or path.startswith(prefix))
            and (fn is None or fn == helper)
        ):
            return f"{GPU_ONLY} ({gpu_reasons.get(flag) or (f'{flag}: ' if flag else '') + needs})"
    for pattern, flag, needs in GPU_CONDITIONS:
        if any(re.search(pattern, part) for part in when.split(" and ") if not part.startswith("not (")):
            what = gpu_reasons.get(flag) or (f"{flag}: " if flag else "") + needs
            return f"{GPU_ONLY} ({what}; taken only when `{when}`)"
    parts = [part for part in when.split(" and ") if not part.startswith("not (")]
    proxy_why = next((why for pattern, why in PROXY_CONDITIONS if any(re.search(pattern, p) for p in parts)), None)
    why = f"{proxy_why}; taken only when `{when}`" if proxy_why else reason
    if record is not None:
        why += (
            f"; no recorded case or test file ran it ({len(record.cases)} cases, {len(record.unit_tests)} "
            f"test files{', a partial record' if record.partial else ''})"
        )
    return f"{NOT_ON_PROXY} ({why})"


def classify(
    coverage: Mapping[str, Any], sites: Sequence[Any], series_dir: Path | None, gpu: Mapping[str, str]
) -> None:
    """Give each codemod's unreached sites their class (port_sites.Coverage.classified, by_class):
    the reach record of the line says which a recorded case or test file reached; ``gpu``: flag ->
    the reason the tree's GPU-only cases give (case_plan.gpu_only_reasons)."""
    record = read_record(series_dir)
    ran_by = record.ran_by() if record else {}
    by_key = {s.key: s for s in sites}
    for cov in coverage.values():
        cov.classified = {}
        for key, reason in sorted(cov.unreached.items()):
            site = by_key.get(key)
            if site is None:
                continue
            cov.classified[key] = site_class(
                site.codemod, site.path, site.helper, site.stable_key, reason, ran_by, gpu, record, site.when
            )
        counts = {c: 0 for c in CLASSES}
        for text in cov.classified.values():
            counts[next(c for c in CLASSES if text.startswith(c))] += 1
        cov.by_class = counts if cov.classified else {}


def share_run(coverage: Mapping[str, Any]) -> tuple[int, int]:
    """(sites run, sites that are not gpu-only) over every codemod of a classified coverage."""
    ran = sum(c.exercised for c in coverage.values())
    gpu = sum(c.by_class.get(GPU_ONLY, 0) for c in coverage.values())
    return ran, sum(c.total for c in coverage.values()) - gpu


# --- making the record -------------------------------------------------------------------------


def files_run_in_part(selected: Sequence[str]) -> set[str]:
    """The test files stage 3 ran only some tests of: named by a test id (`file::Class::test`) and
    neither named whole nor under a directory named whole. A record's entry is a whole file's (its
    sites and seconds are what `--unit-tests reach` runs it for), so these are not recorded."""
    whole = [t.rstrip("/") for t in selected if "::" not in t]
    ids = {t.split("::", 1)[0] for t in selected if "::" in t}
    return {f for f in ids if not any(f == w or f.startswith(w + "/") for w in whole)}


# The stages whose units the record holds, and which entries their records outside any unit's
# directory are shared by (stages 1, 2 and 5 run whatever reach selects: not recorded).
SHARED_BY_STAGE = {"unit-tests": "unit_tests", "functional": "cases"}


def record_run(
    series_dir: Path,
    tree: Path,
    sites_dir: Path,
    seconds: Mapping[tuple[str, str], float],
    te: str | None,
    totals: tuple[int, int],
    sites: list[Site] | None = None,
    file_labels: Mapping[str, Mapping[str, int]] | None = None,
    blocking: Collection[str] = (),
    in_part: Collection[str] = (),
) -> tuple[Path, ReachRecord]:
    """Add what this run's cases and test files ran (their records under ``sites_dir``: one
    subdirectory per stage, one per unit in it) to the line's reach record, and write it: an entry
    this run recorded replaces the record's, the others stay (record_to_extend: one port's record).
    ``seconds``: (kind "case"/"test", name) -> wall seconds, where the unit did not note its own;
    ``totals``: the tree's GPT cases and unit-test files (whether the record holds them all); ``sites``:
    the tree's port sites as the run found them (port_sites.tree_sites; None: found here);
    ``file_labels``: each test file stage 3 labelled -> its tests' label counts (a file with none:
    empty), which with ``blocking`` (the labels that fail stage 3) gives its outcome; None, or a file
    not in it: stage 3 did not label its tests, its outcome is not recorded; ``in_part``: test files
    the run ran only some tests of (files_run_in_part): not recorded, their entries kept as they were."""
    from rocmport.port import worktree as wt
    from rocmport.verify.analyses import port_sites

    state = wt.read_state(tree)
    if state is None or not state.base:
        raise BadInput(f"{tree}: --record-reach needs a tree made by `rocmport apply` (the record lives by its series)")
    if sites is None:
        sites = port_sites.find_sites(tree, state.base)
    units = port_sites.read_units(sites_dir, tree)
    # checked again here (verify checked it before the run): the series may have changed meanwhile
    record = record_to_extend(series_dir, state.base, te) or ReachRecord(
        line=series_dir.name, upstream=state.base, recipe=recipe_digest(series_dir), te=te
    )
    # what made this tree's sites: each entry this run records keeps them (the others keep theirs)
    codemods = tree_codemods(state)
    for (kind, name), unit in units.items():
        keys = frozenset(s.stable_key for s in port_sites.sites_ran(sites, unit.calls))
        if kind == "stage":
            target = SHARED_BY_STAGE.get(name)
            if target is not None:
                record.shared[target] = record.shared.get(target, frozenset()) | keys
            continue
        if kind == "variant":
            if unit.seconds is not None:  # a variant notes its seconds and outcome beside its records
                record.variants[name] = Entry(keys, unit.seconds, frozenset(), unit.outcome, codemods=codemods)
            continue
        if kind not in ("case", "test") or (kind == "test" and name in in_part):
            continue  # stage 1's import units run every time (not selected): the report counts them, the record does not
        secs = unit.seconds if unit.seconds is not None else seconds.get((kind, name))
        if secs is None:
            continue  # a unit that never finished has no cost to weigh: not recorded
        if kind == "case":
            record.cases[name] = Entry(keys, float(secs), frozenset(unit.modules), unit.outcome, codemods=codemods)
        else:
            labels = file_labels.get(name) if file_labels is not None else None
            record.unit_tests[name] = replace(unit_entry(keys, float(secs), labels, blocking), codemods=codemods)
    all_cases, all_files = totals
    record.partial = len(record.cases) < all_cases or len(record.unit_tests) < all_files
    every = set().union(*(e.sites for k in KINDS for e in record.entries(k).values()), *record.shared.values())
    variants = f", {len(record.variants)} reach variants" if record.variants else ""
    record.holds = (
        f"{len(record.cases)} of {all_cases} GPT cases and {len(record.unit_tests)} of {all_files} "
        f"unit-test files{variants}, {len(every)} of the {len(sites)} port sites run"
    )
    return write_record(series_dir, record), record
