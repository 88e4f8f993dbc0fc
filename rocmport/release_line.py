"""Release lines: `v0.16` names every 0.16.x release. The one parser of the form (`v0.16`, `0.16`,
`core_v0.16`), the line a version belongs to, and the version range a line's series admits."""

from __future__ import annotations

import re
from dataclasses import dataclass

from packaging.version import Version

from rocmport.errors import BadInput

_LINE_RE = re.compile(r"^(?:core_)?v?(\d+)\.(\d+)$")


@dataclass(frozen=True, order=True)
class ReleaseLine:
    major: int
    minor: int

    def __str__(self) -> str:
        return f"v{self.major}.{self.minor}"

    @classmethod
    def match(cls, text: str) -> ReleaseLine | None:
        """The line ``text`` names (`v0.16`, `0.16`, `core_v0.16`), or None when it names something else."""
        m = _LINE_RE.match(text)
        return cls(int(m.group(1)), int(m.group(2))) if m else None

    @classmethod
    def parse(cls, text: str, what: str = "release line") -> ReleaseLine:
        """A line given by a user: surrounding blanks ignored; anything else is bad input."""
        line = cls.match(str(text).strip())
        if line is None:
            raise BadInput(f"{what} {text!r}: expected the form v0.16")
        return line

    @classmethod
    def of(cls, version: str | Version) -> ReleaseLine:
        """The line of a release: 0.16.2 and 0.16.0rc1 are both on v0.16."""
        v = version if isinstance(version, Version) else Version(version)
        return cls(v.major, v.minor)

    def admits(self, version: Version) -> bool:
        return version.release[:2] == (self.major, self.minor)

    @property
    def versions(self) -> str:
        """The PEP 440 range of the line's series, pre-releases included."""
        return f">={self.major}.{self.minor}.0rc0,<{self.major}.{self.minor + 1}.0rc0"
