"""verify's stages, in the order they run: the one list `--stages`, the command line's options, the
run, `--dry-run`, the report, the summary and refresh read. Each stage module keeps the Stage
contract (contract.py) and exposes its STAGE; adding a stage is its module plus one line here."""

from __future__ import annotations

from rocmport.verify.orchestration.contract import Stage
from rocmport.verify.stages import bridge, functional, gpt_training, imports, variants
from rocmport.verify.stages.unit_tests import stage as unit_tests

STAGES: tuple[Stage, ...] = (
    imports.STAGE,
    gpt_training.STAGE,
    unit_tests.STAGE,
    functional.STAGE,
    bridge.STAGE,
    variants.STAGE,
)
NAMES: tuple[str, ...] = tuple(s.name for s in STAGES)
