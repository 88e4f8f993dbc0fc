"""A verify stage owns its options and its data: a toy stage, a real module written here and
registered with one line (the registry's list), gets its option from the real `rocmport verify`
command line (checked by its own ``check``: a bad value is exit 2 naming the option), runs with
its typed options, and its data lands in the JSON report under its own key. No other file of
rocmport is touched to add it; docs/adding-a-stage.md shows the same module."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import pytest

from rocmport.cli import main
from rocmport.verify.orchestration import registry

TOY_STAGE = '''
"""A toy stage: it greets, and reports how often."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import click

from rocmport.errors import BadInput
from rocmport.verify.orchestration.contract import NotRequested, Stage, StageRun
from rocmport.verify.orchestration.stage_result import PASS, StageResult

NAME = "toy"


@dataclass(frozen=True)
class ToyOptions:
    greeting: str
    times: int


@dataclass
class ToyData:
    said: list[str]

    def report_entries(self) -> dict[str, Any]:
        return {"toy": {"said": self.said}}


class ToyStage(Stage[ToyOptions]):
    name = NAME
    summary = "says hello to the tree"
    cli_options = (
        click.Option(["--toy-greeting"], default=None, metavar="TEXT", help="What the toy stage says."),
        click.Option(["--toy-times"], type=int, default=1, show_default=True, help="How often."),
    )

    def check(self, given, setup):
        if given["toy_greeting"] is None:
            return NotRequested("no --toy-greeting")
        if not 1 <= given["toy_times"] <= 3:
            raise BadInput(f"--toy-times {given['toy_times']}: between 1 and 3")
        return ToyOptions(given["toy_greeting"], given["toy_times"])

    def launches(self, opts, options, tmp):
        return [{"stage": self.name, "command": ["echo", options.greeting], "cwd": str(opts.tree)}]

    def run(self, ctx, options):
        said = [f"{options.greeting}, {ctx.tree.name}"] * options.times
        return StageRun(StageResult(self.name, PASS, f"said it {options.times} times"), ToyData(said))


STAGE = ToyStage()
'''


@pytest.fixture()
def toy(tmp_path, monkeypatch):
    """The toy module importable, and registered: the one line a new stage adds to the registry."""
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "toy_stage.py").write_text(TOY_STAGE)
    monkeypatch.syspath_prepend(str(tmp_path / "mods"))
    module = importlib.import_module("toy_stage")
    stages = (*registry.STAGES, module.STAGE)
    monkeypatch.setattr(registry, "STAGES", stages)
    monkeypatch.setattr(registry, "NAMES", tuple(s.name for s in stages))
    yield module
    sys.modules.pop("toy_stage", None)


@pytest.fixture()
def tree(tmp_path) -> Path:
    """A Megatron-LM-shaped tree with megatron/core and nothing else (stages 3-5 do not apply)."""
    root = tmp_path / "tree"
    (root / "megatron" / "core").mkdir(parents=True)
    (root / "megatron" / "__init__.py").write_text("")
    (root / "megatron" / "core" / "__init__.py").write_text("X = 1\n")
    return root


def test_a_toy_stage_s_option_reaches_it_and_its_data_reaches_the_json_report(toy, tree, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    report = tmp_path / "report.json"
    args = ["verify", "--tree", str(tree), "--stages", "toy", "--report", str(report)]
    rc = main([*args, "--toy-greeting", "hello", "--toy-times", "2"])
    assert rc == 0, capsys.readouterr()
    data = json.loads(report.read_text())
    assert data["toy"] == {"said": ["hello, tree", "hello, tree"]}
    toy_entry = [s for s in data["stages"] if s["name"] == "toy"]
    assert toy_entry == [
        {"name": "toy", "status": "pass", "reason": "said it 2 times", "seconds": 0.0, "applicable": True}
    ]
    others = len(registry.STAGES) - 1
    assert [s["status"] for s in data["stages"][:others]] == ["skipped"] * others  # the others: not selected
    # --stages knows it by name and by number, --dry-run asks it for its launches, --help lists its options
    capsys.readouterr()
    number = str(registry.NAMES.index("toy") + 1)  # after the registry's own stages
    assert main(["verify", "--tree", str(tree), "--stages", number, "--toy-greeting", "hi", "--dry-run"]) == 0
    assert "# toy (in " in capsys.readouterr().out
    assert main(["verify", "--help"]) == 0
    assert "--toy-greeting TEXT" in capsys.readouterr().out


def test_a_toy_stage_checks_its_own_options_and_says_why_it_did_not_run(toy, tree, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    rc = main(["verify", "--tree", str(tree), "--stages", "toy", "--toy-greeting", "hi", "--toy-times", "9"])
    assert rc == 2 and "--toy-times 9: between 1 and 3" in capsys.readouterr().err
    report = tmp_path / "r.json"
    assert main(["verify", "--tree", str(tree), "--stages", "toy", "--report", str(report)]) == 0
    data = json.loads(report.read_text())
    assert "toy" not in data  # no data: no entry
    assert [s for s in data["stages"] if s["name"] == "toy"][0]["reason"] == "no --toy-greeting"
