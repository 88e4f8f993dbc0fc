"""The manual's "How to add …" checklists (docs/adding.md, once the README's), kept honest where a
test can: every catalogued codemod has a row in the codemod table (docs/commands/codemod.md) and an
item in docs/coverage/items.yaml, every Megatron-LM line is
counted by scripts/port_coverage.py, every ROCm component is used by some line, and every file the
checklists name exists."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import yaml

from rocmport.codemods import registry
from rocmport.components import COMPONENTS
from rocmport.patches.series import load_series

REPO = Path(__file__).resolve().parents[1]
HOWTO_PAGE = (REPO / "docs" / "adding.md").read_text(encoding="utf-8")
CODEMOD_PAGE = (REPO / "docs" / "commands" / "codemod.md").read_text(encoding="utf-8")


def howto() -> str:
    return HOWTO_PAGE[HOWTO_PAGE.index("# How to add …") :]


def codemod_table_rows() -> list[str]:
    """The codemods named in the first column of the codemod table (`rocmport codemod`'s page)."""
    start = CODEMOD_PAGE.index("| codemod | what it does")
    table = CODEMOD_PAGE[start : CODEMOD_PAGE.index("\n\n", start)]
    return re.findall(r"^\| `([a-z0-9-]+)` \|", table, re.M)


def test_every_catalogued_codemod_has_one_row_in_the_codemod_table():
    rows = codemod_table_rows()
    assert sorted(rows) == sorted(registry) and len(rows) == len(set(rows))


def test_every_catalogued_codemod_is_a_coverage_item():
    items = yaml.safe_load((REPO / "docs" / "coverage" / "items.yaml").read_text())
    named = {m["codemod"] for item in items for m in item.get("rocmport_by", []) if "codemod" in m}
    assert set(registry) <= named, set(registry) - named


def test_every_megatron_lm_line_is_counted_by_the_coverage_document():
    spec = importlib.util.spec_from_file_location("port_coverage", REPO / "scripts" / "port_coverage.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    lines = {p.parent.name for p in (REPO / "patchsets" / "megatron-lm").glob("*/series")}
    assert lines and set(module.RELEASES) == lines


def test_every_component_is_used_by_some_line():
    used = set()
    for path in (REPO / "patchsets").glob("*/*/series"):
        series = load_series(path)
        if series.rocm is not None:
            used |= set(series.rocm.components)
    assert set(COMPONENTS) <= used, set(COMPONENTS) - used


def test_the_files_the_checklists_name_exist():
    named = set(re.findall(r"`((?:rocmport|scripts|tests|benchmarks|docs)/[\w./-]+)`", howto()))
    placeholders = ("my_thing", "<", "test_<name>")
    real = {p for p in named if not any(x in p for x in placeholders)}
    assert len(real) > 15
    assert sorted(p for p in real if not (REPO / p).exists()) == []


def test_every_verify_stage_keeps_the_stage_contract(tmp_path):
    """A stage is its module plus one line in verify/orchestration/registry.py: each keeps the contract,
    its number is its place, its options' names are its own (no two stages, nor the run, declare the
    same), and --stages, the dry-run plan and the report read that list."""
    import inspect

    from rocmport.verify.orchestration import options, registry
    from rocmport.verify.orchestration.contract import Stage, VerifyOptions
    from rocmport.verify.orchestration.run import parse_stages

    assert len(set(registry.NAMES)) == len(registry.STAGES) and registry.NAMES[0] == "imports"
    for number, stage in enumerate(registry.STAGES, 1):
        assert isinstance(stage, Stage) and not inspect.isabstract(type(stage))
        assert stage.name and stage.summary and parse_stages(str(number)) == (stage.name,)
    names = [o.name for o in options.all_options()]
    flags = [f for o in options.all_options() for f in (*o.opts, *o.secondary_opts)]
    assert len(names) == len(set(names)) and len(flags) == len(set(flags))
    assert [s.after_imports for s in registry.STAGES] == [False] + [True] * (len(registry.STAGES) - 1)
    opts = VerifyOptions(tree=tmp_path, stages=registry.NAMES)
    assert all(
        step["stage"].split(" ")[0] in registry.NAMES
        for s in registry.STAGES[:2]  # stages 1 and 2 need no more than their defaults
        for step in s.launches(opts, s.check(options.defaults(), None), tmp_path)
    )
