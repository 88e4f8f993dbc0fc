"""JSON state files (an apply's, a refresh's, the bot's record): read into a typed object or refused
in one line naming the file and what to do; written atomically, sorted, so a kill never leaves half
a file and the same state is the same bytes.

A reader passes a ``parse`` function that builds its object from the decoded JSON and raises
`Invalid` (with `expect`, `value_of` and `one_of` to check shapes) for anything it cannot use."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar, get_args

from rocmport.errors import BadInput
from rocmport.fsutil import atomic_write_text

T = TypeVar("T")
_JSON_NAMES = {
    dict: "an object",
    list: "a list",
    str: "a string",
    int: "a number",
    float: "a number",
    bool: "true or false",
    type(None): "null",
}


class Invalid(ValueError):
    """The decoded JSON does not have the shape the reader needs (the message names the key)."""


def read_json(path: Path, parse: Callable[[Any], T], fix: str) -> T | None:
    """The object ``parse`` builds from the JSON in ``path``; None when there is no such file.
    Not JSON, or not the shape ``parse`` needs: BadInput ``<path>: <what is wrong>; <fix>``."""
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise BadInput(f"{path}: not valid JSON (line {exc.lineno}: {exc.msg}); {fix}") from None
    except UnicodeDecodeError:
        raise BadInput(f"{path}: not UTF-8 text; {fix}") from None
    except RecursionError:  # e.g. 100,000 nested [: no state rocmport writes is nested more than a few levels
        raise BadInput(f"{path}: nested too deeply to be a state file; {fix}") from None
    try:
        return parse(data)
    except Invalid as exc:
        raise BadInput(f"{path}: {exc}; {fix}") from None
    except RecursionError:
        raise BadInput(f"{path}: nested too deeply to be a state file; {fix}") from None


def write_json(path: Path, data: Any) -> None:
    """``data`` (JSON types) as sorted, indented JSON, atomically."""
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


def expect(data: Any, kind: type | tuple[type, ...], where: str) -> Any:
    """``data`` when it is a ``kind``, else Invalid naming ``where``."""
    if not isinstance(data, kind):
        names = " or ".join(_JSON_NAMES.get(k, k.__name__) for k in (kind if isinstance(kind, tuple) else (kind,)))
        raise Invalid(f"{where} must be {names} (found {_JSON_NAMES.get(type(data), type(data).__name__)})")
    return data


def value_of(
    data: Mapping[str, Any], key: str, kind: type | tuple[type, ...], where: str = "", *, required: bool = True
) -> Any:
    """``data[key]`` checked to be a ``kind``; a missing optional key (or null) gives None."""
    name = f"{where}.{key}" if where else key
    if data.get(key) is None:
        if required:
            raise Invalid(f"key '{name}' is missing")
        return None
    return expect(data[key], kind, f"key '{name}'")


def one_of(value: Any, literal: Any, where: str) -> Any:
    """``value`` when it is one of the strings of the ``Literal`` type ``literal``, else Invalid."""
    allowed = get_args(literal)
    if value not in allowed:
        raise Invalid(f"{where} is {value!r}; expected one of {', '.join(allowed)}")
    return value
