"""The one release-line parser: the forms users and upstream tags use, and what a line admits."""

from __future__ import annotations

import pytest
from packaging.version import Version

from rocmport.errors import BadInput
from rocmport.release_line import ReleaseLine


@pytest.mark.parametrize("text", ["v0.16", "0.16", "core_v0.16", "v00.016"])
def test_the_forms_of_a_line(text):
    assert ReleaseLine.match(text) == ReleaseLine(0, 16) and str(ReleaseLine.match(text)) == "v0.16"


@pytest.mark.parametrize("text", ["v0.16.1", "core_v0.16.1", "main", "v0", "sixteen", " v0.16"])
def test_what_is_not_a_line(text):
    assert ReleaseLine.match(text) is None


def test_user_input_is_stripped_or_refused():
    assert ReleaseLine.parse(" v0.17 ") == ReleaseLine(0, 17)
    with pytest.raises(BadInput, match=r"release line 'sixteen': expected the form v0\.16"):
        ReleaseLine.parse("sixteen")


def test_a_versions_line_and_the_range_of_its_series():
    line = ReleaseLine.of("0.16.2")
    assert line == ReleaseLine.of(Version("0.16.0rc1")) == ReleaseLine(0, 16)
    assert line.admits(Version("0.16.0rc0")) and not line.admits(Version("0.17.0"))
    assert line.versions == ">=0.16.0rc0,<0.17.0rc0"
    assert sorted([ReleaseLine(0, 17), ReleaseLine(1, 0), ReleaseLine(0, 9)]) == [
        ReleaseLine(0, 9),
        ReleaseLine(0, 17),
        ReleaseLine(1, 0),
    ]
