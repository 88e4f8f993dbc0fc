"""What differs between the Python versions rocmport runs on (3.10 to 3.12)."""

from __future__ import annotations

import sys

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser, published as tomli (a dependency there only)
    import tomli as tomllib

__all__ = ["tomllib"]
