"""JSON state files: typed on the way in, refused in one line naming the file when they cannot be
used, atomic and stable on the way out; and the apply state, the refresh state and the bot's
record read through it from real runs."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from typing import Any, Literal

import pytest

from rocmport.cli import main
from rocmport.config import load_settings
from rocmport.errors import BadInput
from rocmport.refresh.bot import BotRecord, TagRecord, read_record, record_path, write_record
from rocmport.state import Invalid, expect, one_of, read_json, value_of, write_json
from tests.helpers.patches import Project
from tests.helpers.refresh import LAYERS, Ported, edit_line
from tests.helpers.sync import commit, g

Colour = Literal["red", "green"]


def parse(data: Any) -> tuple[str, int]:
    expect(data, dict, "the file")
    return one_of(value_of(data, "colour", str), Colour, "key 'colour'"), value_of(data, "n", int, required=False) or 0


def test_read_gives_the_typed_object_or_none(tmp_path):
    path = tmp_path / "s.json"
    assert read_json(path, parse, "fix it") is None
    write_json(path, {"n": 2, "colour": "red"})
    assert path.read_text() == '{\n  "colour": "red",\n  "n": 2\n}\n'
    assert read_json(path, parse, "fix it") == ("red", 2)
    assert not list(tmp_path.glob(".s.json.*"))  # no temporary file left behind


@pytest.mark.parametrize(
    "text, what",
    [
        ("{not json", r"not valid JSON \(line 1: "),
        ("[1, 2]", r"the file must be an object \(found a list\)"),
        ('{"n": 1}', r"key 'colour' is missing"),
        ('{"colour": 3}', r"key 'colour' must be a string \(found a number\)"),
        ('{"colour": "blue"}', r"key 'colour' is 'blue'; expected one of red, green"),
        ("[" * 100_000, r"nested too deeply to be a state file"),
    ],
)
def test_unusable_files_are_refused_in_one_line_naming_the_file(tmp_path, text, what):
    path = tmp_path / "s.json"
    path.write_text(text)
    with pytest.raises(BadInput, match=rf"^{re.escape(str(path))}: {what}.*; fix it$"):
        read_json(path, parse, "fix it")


def test_a_bot_record_nested_100000_deep_is_exit_2_naming_the_file(tmp_path):
    """Through the real CLI: a RecursionError in the JSON decoder is bad input, not an internal error."""
    root = tmp_path / "project"
    root.mkdir()
    g(root, "init", "-q", "-b", "main")
    commit(root, {"README.md": "x\n"}, "project")
    (root / ".rocmport").mkdir()
    state = root / ".rocmport" / "bot-state.json"
    state.write_text("[" * 100_000)
    proc = subprocess.run(
        [sys.executable, "-m", "rocmport", "-C", str(root), "bot", "--once", "--no-verify"],
        capture_output=True,
        text=True,
        env={**os.environ, "ROCMPORT_CACHE_DIR": str(tmp_path / "cache")},
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert (
        proc.stderr.strip()
        == f"rocmport: error: {state}: nested too deeply to be a state file; fix it, or delete it to have the bot "
        "treat every release newer than the lock as new"
    )


def test_the_bots_record_round_trips_and_is_checked(tmp_path):
    port_settings = load_settings(tmp_path)
    record = BotRecord(
        {
            "core_v0.17.0": TagRecord(
                "ready", "a" * 40, "abc", branch="rocmport/refresh-core_v0.17.0", summary_file="s.md"
            ),
            "core_v0.18.0": TagRecord("needs-a-human", "b" * 40, "def", reason="conflict in 0002.patch"),
        }
    )
    write_record(port_settings, record)
    on_disk = json.loads(record_path(port_settings).read_text())
    assert on_disk["tags"]["core_v0.18.0"] == {
        "status": "needs-a-human",
        "commit": "b" * 40,
        "inputs": "def",
        "reason": "conflict in 0002.patch",
    }
    assert read_record(port_settings) == record
    on_disk["tags"]["core_v0.18.0"]["status"] = "maybe"
    record_path(port_settings).write_text(json.dumps(on_disk))
    with pytest.raises(
        BadInput,
        match=r"bot-state.json: key 'tags.core_v0.18.0.status' is 'maybe'; expected one of ready, not-verified, needs-a-human, up-to-date; ",
    ):
        read_record(port_settings)
    on_disk["tags"]["core_v0.18.0"] = {"status": "done", "commit": "c" * 40, "inputs": "x"}
    record_path(port_settings).write_text(json.dumps(on_disk))
    with pytest.raises(Invalid, match=r"key 'tags.core_v0.18.0.branch' is missing"):
        BotRecord.from_dict(on_disk)
    # An older rocmport's words: done (was it verified? nobody can tell now) and failed.
    old = {
        "tags": {
            "a": {"status": "done", "commit": "c" * 40, "inputs": "x", "branch": "b"},
            "b": {"status": "failed", "commit": "c" * 40, "inputs": "x", "reason": "conflict"},
        }
    }
    assert {n: r.status for n, r in BotRecord.from_dict(old).tags.items()} == {
        "a": "not-verified",
        "b": "needs-a-human",
    }


def test_a_damaged_apply_state_stops_apply_in_one_line(tmp_path, monkeypatch, capsys):
    proj = Project(tmp_path, monkeypatch)
    assert main(["-C", str(proj.root), "apply"]) == 0
    state = proj.tree / ".git" / "rocmport-state.json"
    state.write_text(state.read_text()[:40])
    capsys.readouterr()
    assert main(["-C", str(proj.root), "apply"]) == 2
    error = capsys.readouterr().err.splitlines()[-1]  # after the progress line
    assert error.startswith(f"rocmport: error: {state}: not valid JSON") and "rocmport apply --force" in error
    # The way out the message names: delete it, rebuild with --force.
    state.unlink()
    assert main(["-C", str(proj.root), "apply", "--force"]) == 0


def test_a_damaged_refresh_state_can_still_be_aborted(tmp_path, monkeypatch, capsys):
    port = Ported(tmp_path, monkeypatch)
    port.tag({"megatron/core/layers.py": edit_line(LAYERS, 30, "line 30 upstream")}, "core_v0.17.0", "0.17.0")
    assert port.run("refresh", "--to", "v0.17", "--no-verify") == 1  # stops at the conflict
    state = port.root / "build" / "refresh" / "state.json"
    data = json.loads(state.read_text())
    state.write_text(json.dumps({**data, "status": "paused"}))
    capsys.readouterr()
    assert port.run("refresh", "--continue") == 2
    assert (
        f"{state}: key 'status' is 'paused'; expected one of in-progress, conflict; run `rocmport refresh --abort`"
        in capsys.readouterr().err
    )
    assert port.run("refresh", "--abort") == 0
    assert not state.parent.exists()
