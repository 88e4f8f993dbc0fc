"""The options a series may give a codemod, declared by the codemod (`OPTIONS`) and checked before
apply touches anything: a codemod's options end up in the code it writes, so each value is held to
what it means (a module name, a distribution name), not just to a type.

A spec is `str`, `int`, `bool`, a `Text` (a string matching a pattern), `[spec]` (a list of spec)
or `{key spec: value spec}` (a mapping)."""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Text:
    pattern: str
    what: str

    def matches(self, value) -> bool:
        return isinstance(value, str) and re.fullmatch(self.pattern, value) is not None


MODULE = Text(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*", "a Python module name")
DISTRIBUTION = Text(r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?", "a distribution name")
_NAMES = {str: "a string", int: "a number", bool: "true or false"}


def describe(spec) -> str:
    if isinstance(spec, Text):
        return spec.what
    if isinstance(spec, list):
        return f"a list of {describe(spec[0])}"
    if isinstance(spec, dict):
        ((k, v),) = spec.items()
        return f"a mapping of {describe(k)} to {describe(v)}"
    return _NAMES.get(spec, getattr(spec, "__name__", str(spec)))


def fits(value, spec) -> bool:
    """Does ``value`` (from YAML) have the shape and meaning ``spec`` declares?"""
    if isinstance(spec, Text):
        return spec.matches(value)
    if spec is bool:
        return isinstance(value, bool)
    if spec is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if spec is str:
        return isinstance(value, str)
    if isinstance(spec, list):
        return isinstance(value, list) and all(fits(v, spec[0]) for v in value)
    if isinstance(spec, dict):
        ((k, v),) = spec.items()
        return isinstance(value, dict) and all(fits(a, k) and fits(b, v) for a, b in value.items())
    raise TypeError(f"not an option spec: {spec!r}")


def problems(declared: dict, options: dict) -> list[str]:
    """What is wrong with ``options`` for a codemod that declares ``declared`` (empty: nothing)."""
    out = []
    for key, value in options.items():
        if key not in declared:
            known = ", ".join(sorted(declared)) or "none"
            out.append(f"unknown option {key!r} (it takes: {known})")
        elif not fits(value, declared[key]):
            out.append(f"option {key!r} must be {describe(declared[key])}")
    return out
