"""Which of upstream's GPT cases stage 4 runs (`--cases reach|all|NAME[,NAME...]`).

- ``reach`` (the default): the line's recorded reach set — the cases that together run the most
  port sites within a time budget, recorded per line (`patchsets/<upstream>/<line>/reach.json`) and
  chosen by `rocmport.verify.analyses.reach.reach_cases`. Until the line has a record (or where that
  module is absent), today's default case: upstream's case for --tp/--pp, its TE case where TE is
  usable, and the selection says so in one line.
- ``all``: every case directory of the tree with a model_config.yaml (case_plan.training_cases);
  the ones the proxy cannot run are reported unsupported with their kind and reason.
- names: those cases, each a directory name under the tree's cases directory (exit 2 naming the
  name and near matches otherwise)."""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rocmport.errors import BadInput
from rocmport.verify.stages import case_plan
from rocmport.verify.stages.functional.case_args import CASES, cases_near, check_case, default_case

REACH, ALL, NAMED = "reach", "all", "named"
NO_REACH_RECORD = "no reach record for this line: today's default case"
NO_TE_FOR_RECORD = "the reach record's cases ({}) need Transformer Engine, not usable here (--te): today's default case"


@dataclass(frozen=True)
class FunctionalOptions:
    """Stage 4: upstream's functional GPT cases through pretrain_gpt.py. ``cases`` in order, how they
    were chosen (``selection``, ``note``); ``base`` and ``cache_dir``: where a failing case's run on
    the unported tree comes from and is kept (no base: failures are not labelled); ``fork_ranks``: on
    the proxy a rank server forks each case's ranks (rank_servers)."""

    cases: tuple[str, ...]
    iters: int
    defaulted: bool = True
    data_path: str | None = None
    record: bool = False
    series_dir: Path | None = None
    resume: bool = True
    selection: str = REACH
    note: str | None = None
    base: str | None = None
    cache_dir: Path | None = None
    fork_ranks: bool = True

    @property
    def case(self) -> str:
        """The first selected case (a one-case run's case)."""
        return self.cases[0]


@dataclass(frozen=True)
class Selection:
    """The cases to run and how they were chosen (``how``: reach | all | named; ``note``: one line
    on the choice, for the report; ``defaulted``: today's default case stands in, so a tree without
    it skips the stage instead of failing it)."""

    how: str
    cases: tuple[str, ...]
    note: str | None = None
    defaulted: bool = False


def reach_cases(
    series_dir: Path | None, tree: Path, device_kind: Callable[[], str] | None = None
) -> tuple[list[str], str] | None:
    """The line's recorded reach set and a line on it (rocmport.verify.analyses.reach); None where the
    tree has no series or the line no recorded case (the caller falls back). ``device_kind``: the
    run's (stage.run_golden_kind; asked only where the series has goldens): its cases with a golden
    are picked first."""
    if series_dir is None:
        return None
    from rocmport.verify.analyses import reach

    return reach.reach_cases(series_dir, tree, golden=with_golden(series_dir, device_kind))


def with_golden(series_dir: Path, device_kind: Callable[[], str] | None) -> list[str]:
    """The cases with a golden for the run's device kind in the series' goldens/ (golden_path's names)."""
    goldens = sorted((series_dir / "goldens").glob("*.json")) if device_kind is not None else []
    if not goldens or device_kind is None:
        return []
    suffix = f".{device_kind()}.json"
    return sorted(p.name[: -len(suffix)] for p in goldens if p.name.endswith(suffix) and p.is_file())


def near(tree: Path, name: str) -> list[str]:
    """The tree's case names closest to ``name`` (for a hint), else a few with a layout in their name."""
    return difflib.get_close_matches(name, case_plan.training_cases(tree), n=4, cutoff=0.6) or cases_near(tree)


def _named(tree: Path, given: str, option: str) -> tuple[str, ...]:
    names: list[str] = []
    for raw in given.split(","):
        name = raw.strip()
        cdir = check_case(tree, name, option)  # an empty name too: not a case name
        if not (cdir / "model_config.yaml").is_file():
            raise BadInput(
                f"{option} {name!r}: no such case in {tree / CASES} (no model_config.yaml); "
                f"near: {', '.join(near(tree, name)) or '-'}"
            )
        if name not in names:
            names.append(name)
    return tuple(names)


def select(
    tree: Path,
    series_dir: Path | None,
    given: str | None,
    option: str,
    tp: int,
    pp: int,
    te_usable: bool,
    device_kind: Callable[[], str] | None = None,
) -> Selection:
    """The cases ``given`` (``option``'s value: reach, all or names; None is reach) selects
    (``device_kind``: the run's, for reach's cases with a golden)."""
    word = REACH if given is None else given.strip()
    if word == ALL:
        cases = tuple(case_plan.training_cases(tree))
        return Selection(ALL, cases, f"all {len(cases)} GPT cases of the tree")
    if word != REACH:
        return Selection(NAMED, _named(tree, word, option))
    recorded = reach_cases(series_dir, tree, device_kind)
    if recorded:
        names, line = recorded
        there = tuple(n for n in names if (tree / CASES / n / "model_config.yaml").is_file())
        gone = [n for n in names if n not in there]
        runnable = there if te_usable else tuple(n for n in there if not _needs_te(tree, n))
        if runnable:
            line += f" ({len(gone)} recorded cases not in this tree: {', '.join(gone)})" if gone else ""
            dropped = [n for n in there if n not in runnable]
            line += f" (without Transformer Engine here, not: {', '.join(dropped)})" if dropped else ""
            return Selection(REACH, runnable, line)
        # A record made with TE's layer picks TE cases; a run without TE keeps today's default case.
        return Selection(
            REACH, (default_case(tp, pp, te_usable, tree),), NO_TE_FOR_RECORD.format(", ".join(there)), defaulted=True
        )
    return Selection(REACH, (default_case(tp, pp, te_usable, tree),), NO_REACH_RECORD, defaulted=True)


def _needs_te(tree: Path, case: str) -> bool:
    """The case builds Transformer Engine's layers (upstream's default --transformer-impl)."""
    args = case_plan.load_config(tree, case).get("MODEL_ARGS") or {}
    return str(args.get("--transformer-impl") or "transformer_engine") == "transformer_engine"
