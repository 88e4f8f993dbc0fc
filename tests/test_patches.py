"""`rocmport patches list|export|check` on real branches and patch files."""

from __future__ import annotations

import json

import pytest

from rocmport.cli import main
from tests.helpers.patches import Project, make_patch
from tests.helpers.sync import g


@pytest.fixture()
def applied(tmp_path, monkeypatch):
    proj = Project(tmp_path, monkeypatch)
    proj.write_series(
        {
            "0001-f.patch": make_patch(
                proj.up, {"megatron/core/utils.py": "def f():\n    return 2\n"}, desc="f returns 2"
            )
        }
    )
    # A comment in the series must survive an export.
    series = proj.series_dir / "series"
    series.write_text("# hand-written comment\n" + series.read_text())
    assert main(["-C", str(proj.root), "apply"]) == 0
    return proj


def cli(proj, *args):
    return main(["-C", str(proj.root), "patches", *args])


def user_commit(proj, rel="megatron/core/new.py", text="hello = 1\n", msg="Add hello\n\nBecause ROCm needs it."):
    (proj.tree / rel).write_text(text)
    g(proj.tree, "add", rel)
    g(proj.tree, "commit", "-qm", msg)


def test_export_is_byte_stable_and_appends_to_series(applied, tmp_path):
    user_commit(applied)
    assert cli(applied, "check") == 1  # drift: a commit not in the series
    assert cli(applied, "export", "--upstream-status", "ROCm-only") == 0
    out = applied.series_dir / "0002-add-hello.patch"
    first = out.read_bytes()
    text = first.decode()
    assert text.startswith(
        "Description: Add hello\n Because ROCm needs it.\nUpstream-Status: ROCm-only\n---\ndiff --git a/megatron/core/new.py"
    )
    assert "Date:" not in text and "From " not in text and g(applied.tree, "rev-parse", "HEAD") not in text
    series = (applied.series_dir / "series").read_text()
    assert series.startswith("# hand-written comment\n") and "- 0001-f.patch\n- 0002-add-hello.patch\n" in series
    assert cli(applied, "check") == 0
    # Exporting again writes nothing and leaves the file untouched.
    mtime = out.stat().st_mtime_ns
    assert cli(applied, "export") == 0
    assert out.read_bytes() == first and out.stat().st_mtime_ns == mtime
    # Re-applying with the exported patch is accepted (the commit is explained) and reproduces it.
    assert main(["-C", str(applied.root), "apply"]) == 0
    assert (applied.tree / "megatron/core/new.py").read_text() == "hello = 1\n"
    assert g(applied.tree, "log", "-1", "--format=%s") == "Add hello"


def test_export_twice_from_two_clones_is_identical(applied, tmp_path):
    user_commit(applied)
    assert cli(applied, "export", "--dry-run") == 0
    assert not (applied.series_dir / "0002-add-hello.patch").exists()
    assert cli(applied, "export") == 0
    a = (applied.series_dir / "0002-add-hello.patch").read_bytes()
    (applied.series_dir / "0002-add-hello.patch").unlink()
    (applied.series_dir / "series").write_text(
        (applied.series_dir / "series").read_text().replace("- 0002-add-hello.patch\n", "")
    )
    assert cli(applied, "export") == 0
    assert (applied.series_dir / "0002-add-hello.patch").read_bytes() == a


def test_check_detects_edited_patch_and_bad_header(applied, capsys):
    patch = applied.series_dir / "0001-f.patch"
    patch.write_text(patch.read_text().replace("+    return 2", "+    return 3"))
    assert cli(applied, "check") == 1
    assert "0001-f.patch: differs from its commit" in capsys.readouterr().err
    patch.write_text(patch.read_text().replace("+    return 3", "+    return 2").replace("ROCm-only", "Maybe"))
    assert cli(applied, "check", "--json") == 2  # a malformed header is bad input when the series loads


def test_export_rejects_bad_status(applied, capsys):
    user_commit(applied)
    assert cli(applied, "export", "--upstream-status", "Someday") == 2
    assert "Upstream-Status 'Someday' must be" in capsys.readouterr().err


def test_list_json(applied, capsys):
    assert cli(applied, "list", "--json") == 0
    data = json.loads(capsys.readouterr().out)["series"]
    assert data[0]["line"] == "v0.16" and data[0]["patches"][0]["description"] == "f returns 2"


def _errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("rocmport: error:")]


@pytest.mark.parametrize(
    "codemods",
    [["no-such-codemod"], [{"name": "apex-to-torch", "options": {"no_such_option": 1}}]],
    ids=["unknown codemod", "undeclared option"],
)
def test_every_reader_of_a_series_refuses_what_apply_refuses(tmp_path, monkeypatch, capsys, codemods):
    """A series apply refuses passes no read-only check either (the CI drift gate included): the same
    message, exit 2, from patches check / list, status, emit docker, build and doctor."""
    proj = Project(tmp_path, monkeypatch)
    root = str(proj.root)
    assert main(["-C", root, "apply"]) == 0
    proj.write_series({}, codemods=codemods)
    capsys.readouterr()
    assert main(["-C", root, "apply"]) == 2
    refused = _errors(capsys.readouterr().err)
    assert len(refused) == 1 and "series: key 'codemods[0]'" in refused[0]
    for args in (
        ["patches", "check"],
        ["patches", "list"],
        ["status"],
        ["status", "--json"],
        ["emit", "docker", "--components", "none"],
        ["build", "--no-check-deps"],
        ["doctor"],
    ):
        assert main(["-C", root, *args]) == 2, args
        assert _errors(capsys.readouterr().err) == refused, args
