"""The one reader of the records committed beside a line's series (rocmport/line_records.py): the
file loaded with its JSON errors, the versioned header (schema, line, recorded_on with its upstream
commit and TE layer) and the field checks both records use, each problem one line naming the file,
what is wrong and what to do; for a made-up record and for the two the project commits (reach.json,
case-results.json), which read their files through it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rocmport.errors import BadInput
from rocmport.line_records import LineRecordFile, opt_str
from rocmport.report import case_results
from rocmport.verify.analyses import reach

DEMO = LineRecordFile("demo.json", "demo record", fix="record it again (demo --record)")
RECORDS = [DEMO, reach.RECORD, case_results.RECORD]
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def header(spec: LineRecordFile) -> dict:
    return {"schema": spec.schema, "line": "v0.16", "recorded_on": {"upstream": COMMIT, "te": "2.12.0"}}


def one_line(spec: LineRecordFile, path: Path, what: str) -> str:
    return f"{path}: not a {spec.what} ({what}); {spec.fix}"


def test_the_two_committed_records_are_read_through_it():
    assert (reach.RECORD.name, reach.RECORD.what) == ("reach.json", "reach record")
    assert (case_results.RECORD.name, case_results.RECORD.what) == ("case-results.json", "case-results record")
    assert reach.RECORD.path(Path("s")) == reach.record_path(Path("s")) == Path("s/reach.json")
    assert case_results.record_path(Path("s")) == Path("s/case-results.json")


@pytest.mark.parametrize("spec", RECORDS, ids=lambda s: s.name)
def test_broken_json_is_one_line_naming_the_file_and_what_to_do(tmp_path, spec):
    path = spec.path(tmp_path)
    path.write_text('{"schema": 1,\n "line": ')
    with pytest.raises(BadInput) as err:
        spec.load(tmp_path)
    message = str(err.value)
    assert message.startswith(f"{path}: not valid JSON (line 2: ") and message.endswith(f"); {spec.fix}")
    assert "\n" not in message
    path.write_bytes(b'{"line": "v0.16\xff"}')
    with pytest.raises(BadInput, match=r"not UTF-8 at byte 15 \(line 1, byte 0xff\)") as err:
        spec.load(tmp_path)
    assert str(err.value).startswith(f"{path}: ")


@pytest.mark.parametrize("spec", RECORDS, ids=lambda s: s.name)
def test_no_file_is_no_record_and_a_written_one_reads_back(tmp_path, spec):
    assert spec.load(tmp_path) is None
    data = {**header(spec), "cases": {"gpt3_é": {"seconds": 1.5}}}
    assert spec.write(tmp_path, data) == spec.path(tmp_path)
    text = spec.path(tmp_path).read_text(encoding="utf-8")
    assert text.endswith("}\n") and "gpt3_é" in text  # written as itself, not \u00e9
    path, loaded = spec.load(tmp_path)
    assert (path, loaded) == (spec.path(tmp_path), data)
    got = spec.header(loaded, path)
    assert (got.line, got.upstream, got.te, got.recorded_on) == ("v0.16", COMMIT, "2.12.0", data["recorded_on"])


def without(data: dict, dotted: str) -> dict:
    """``data`` (a copy) without the key ``dotted`` names (``recorded_on.te``)."""
    data = json.loads(json.dumps(data))
    *parents, key = dotted.split(".")
    inner = data
    for part in parents:
        inner = inner[part]
    del inner[key]
    return data


@pytest.mark.parametrize("spec", RECORDS, ids=lambda s: s.name)
@pytest.mark.parametrize(
    "break_it, what",
    [
        (lambda d: [], "not a JSON object"),
        (lambda d: {**d, "schema": 2}, "schema 2, this rocmport reads schema 1"),
        (lambda d: without(d, "schema"), "schema None, this rocmport reads schema 1"),
        (lambda d: without(d, "recorded_on"), "recorded_on is not a mapping"),
        (lambda d: {**d, "recorded_on": ["x"]}, "recorded_on is not a mapping"),
        (lambda d: without(d, "line"), "line is not a line name (a string such as v0.16)"),
        (lambda d: {**d, "line": ""}, "line is not a line name (a string such as v0.16)"),
        (
            lambda d: {**d, "recorded_on": {**d["recorded_on"], "te": 2.12}},
            "recorded_on.te is not a version string or null",
        ),
        (
            lambda d: {**d, "recorded_on": {**d["recorded_on"], "te": ""}},
            "recorded_on.te is not a version string or null",
        ),
    ],
)
def test_a_bad_header_is_one_line_naming_the_file_what_is_wrong_and_what_to_do(tmp_path, spec, break_it, what):
    path = spec.path(tmp_path)
    with pytest.raises(BadInput) as err:
        spec.header(break_it(header(spec)), path)
    assert str(err.value) == one_line(spec, path, what)


def test_the_upstream_commit_is_a_full_one_where_the_record_says_so(tmp_path):
    """case-results.json names the commit the page reads the cases at: 40 hex digits. reach.json
    takes any commit string (a short one in a hand-made record still compares with the tree's)."""
    path = tmp_path / "r.json"
    for spec in RECORDS:
        data = without(header(spec), "recorded_on.upstream")
        with pytest.raises(BadInput) as err:
            spec.header(data, path)
        whole = "recorded_on.upstream is not a full commit (40 hex digits)"
        assert str(err.value) == one_line(
            spec, path, whole if spec.full_commit else "recorded_on.upstream is not a commit (a string)"
        )
        short = {**header(spec), "recorded_on": {"upstream": "c0ffee"}}
        if spec.full_commit:
            with pytest.raises(BadInput, match=r"not a full commit \(40 hex digits\)"):
                spec.header(short, path)
        else:
            assert spec.header(short, path).upstream == "c0ffee"
    assert case_results.RECORD.full_commit and not reach.RECORD.full_commit


def test_the_field_checks_name_where_in_the_record(tmp_path):
    path = tmp_path / "demo.json"
    assert DEMO.mapping({"a": 1}, path, "cases['x']") == {"a": 1}
    with pytest.raises(BadInput) as err:
        DEMO.mapping([1], path, "cases['x']")
    assert str(err.value) == one_line(DEMO, path, "cases['x'] is not a mapping")
    assert DEMO.seconds(0, path, "cases['x']") == 0.0 and isinstance(DEMO.seconds(3, path, "w"), float)
    for bad in (-1, True, "3", None, float("nan")):
        with pytest.raises(BadInput) as err:
            DEMO.seconds(bad, path, "cases['x']")
        assert str(err.value) == one_line(DEMO, path, "cases['x'].seconds is not a number of seconds")
    DEMO.known_keys({"a": 1}, {"a", "b"}, path, "w")
    with pytest.raises(BadInput) as err:
        DEMO.known_keys({"a": 1, "log": 2, "z": 3}, {"a"}, path, "cases['x']")
    assert str(err.value) == one_line(DEMO, path, "cases['x'] has unknown keys ['log', 'z']")
    assert opt_str({"k": None}, "k") and opt_str({}, "k") and opt_str({"k": "v"}, "k")
    assert not opt_str({"k": ""}, "k") and not opt_str({"k": 1}, "k")
