"""Upstream's GPT functional cases as the tests lay them out and read them back: each case's
model_config.yaml at its place in a Megatron-LM-shaped git repository, committed (the canned trees
stage 4 runs in tests/test_functional_cases.py, the mirror scripts/case_table.py reads in
tests/test_case_table.py), and stage 4's entry in a verify report's JSON (one a run wrote, or a
sweep's report made from a real one)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tests.helpers.sync import commit, init

# Upstream's layout, spelled here rather than imported from rocmport: a wrong path there fails the tests.
GPT_CASES = "tests/functional_tests/test_cases/gpt"


def case_dir(name: str) -> str:
    """The directory of the GPT case ``name`` in an upstream tree."""
    return f"{GPT_CASES}/{name}"


def case_files(cases: Mapping[str, str]) -> dict[str, str]:
    """Each case (name -> its model_config.yaml text) at its path in an upstream tree."""
    return {f"{case_dir(name)}/model_config.yaml": text for name, text in cases.items()}


def commit_cases(repo: Path, cases: Mapping[str, str], message: str, files: Mapping[str, str] = {}) -> str:
    """Commit ``cases`` (name -> model_config.yaml) and any other ``files`` (path -> text) to
    ``repo``; the commit (its date fixed: the same content is the same commit)."""
    return commit(repo, {**files, **case_files(cases)}, message)


def case_repo(root: Path, cases: Mapping[str, str], message: str, files: Mapping[str, str] = {}) -> str:
    """A new git repository at ``root`` whose first commit holds ``cases`` and ``files``; that commit."""
    return commit_cases(init(root), cases, message, files)


def stage_four(report: dict[str, Any]) -> dict[str, Any]:
    """Stage 4's entry (named `functional`) among a verify report's stages."""
    return next(s for s in report["stages"] if s["name"] == "functional")
