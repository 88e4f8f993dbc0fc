"""One way to read the files a user edits (upstream.lock, series, .patch files) and the files a run
reads back (build/verify/last.json, tuning tables).

Every byte is decoded as strict UTF-8 (a bad byte is named with its file and offset), YAML is
parsed by a safe loader that refuses duplicate keys, JSON with size and depth limits, a link that
leads out of the directory it was found in is refused (``root``), and values are type-checked by
the callers with the helpers here, so bad input is one line and exit 2, before anything is touched."""

from __future__ import annotations

import os
from pathlib import Path

import yaml

from rocmport.errors import BadInput, is_control


def decode(data: bytes, where: str | os.PathLike, fix: str = "save it as UTF-8") -> str:
    """``data`` as text, or BadInput naming the file, the byte offset and the line of the first bad byte."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise BadInput(
            f"{where}: not UTF-8 at byte {exc.start} (line {line}, byte 0x{data[exc.start]:02x}); {fix}"
        ) from None


def confined(path: str | os.PathLike, root: str | os.PathLike, what: str) -> Path:
    """``path`` when it (a link followed) stays under ``root``; BadInput naming it when it leads out."""
    path, root = Path(path), Path(root)
    real, real_root = path.resolve(), root.resolve()
    if not real.is_relative_to(real_root):
        raise BadInput(f"{path}: the {what} is a link that leads out of {root} (to {real}); replace it with a file")
    return path


def read_text(
    path: str | os.PathLike,
    what: str,
    *,
    max_bytes: int | None = None,
    fix: str = "save it as UTF-8",
    root: str | os.PathLike | None = None,
) -> str:
    """A user file as text: missing, unreadable, too large, a link out of ``root`` or not UTF-8 is
    BadInput naming it."""
    path = Path(path)
    if root is not None:
        confined(path, root, what)
    try:
        if max_bytes is not None:
            size = path.stat().st_size
            if size > max_bytes:
                raise BadInput(f"{path}: {what} is {size} bytes, over the limit of {max_bytes}")
        data = path.read_bytes()
    except FileNotFoundError:
        raise BadInput(f"{path}: no such {what}") from None
    except IsADirectoryError:
        raise BadInput(f"{path}: is a directory, expected a {what}") from None
    except OSError as exc:
        raise BadInput(f"{path}: cannot read the {what} ({exc.strerror})") from None
    return decode(data, path, fix)


# libyaml's parser when PyYAML has it (its wheels do): the same documents, the same marks, a tenth of
# the time of the pure-Python one (the series files are read on every apply, status and verify).
_SafeLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _Loader(_SafeLoader):  # type: ignore[valid-type,misc]
    """SafeLoader that refuses duplicate mapping keys instead of keeping the last one."""


def _construct_mapping(loader: _Loader, node: yaml.MappingNode, deep: bool = False):
    seen: dict = {}
    for key_node, _ in node.value:  # explicit keys only: a `<<` merge may be overridden, as YAML means
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node, deep=deep)
        try:
            hash(key)
        except TypeError:
            raise yaml.constructor.ConstructorError(
                None, None, "a mapping key must be a plain value", key_node.start_mark
            ) from None
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r} (first at line {seen[key] + 1})", key_node.start_mark
            )
        seen[key] = key_node.start_mark.line
    return loader.construct_mapping(node, deep=deep)


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def parse_yaml(text: str, where: str | os.PathLike, fix: str = "fix the file", *, last_key_wins: bool = False):
    """The YAML document in ``text``; any YAML problem is one BadInput line naming file and line.
    ``last_key_wins``: for upstream's own files, read as upstream's CI reads them (a functional case's
    MODEL_ARGS repeats a flag now and then; its runner passes both and argparse keeps the last)."""
    try:
        return yaml.load(text, Loader=_SafeLoader if last_key_wins else _Loader)  # noqa: S506 - SafeLoaders
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        what = exc.problem or exc.context or "invalid YAML"
        if "maximum nesting depth" in what:  # libyaml's word for what the pure-Python parser hits as RecursionError
            raise BadInput(f"{where}: not valid YAML (nested too deeply); {fix}") from None
        raise BadInput(
            f"{where}: not valid YAML{f' at line {mark.line + 1}' if mark else ''} ({what}); {fix}"
        ) from None
    except yaml.YAMLError as exc:
        raise BadInput(
            f"{where}: not valid YAML ({str(exc).splitlines()[0] if str(exc) else 'invalid'}); {fix}"
        ) from None
    except RecursionError:
        raise BadInput(f"{where}: not valid YAML (nested too deeply); {fix}") from None


def type_name(value) -> str:
    return {
        bool: "a boolean",
        int: "a number",
        float: "a number",
        str: "a string",
        list: "a list",
        dict: "a mapping",
        type(None): "empty",
    }.get(type(value), f"a {type(value).__name__}")


def is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_str_list(value) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def is_str_map(value) -> bool:
    return isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())


def has_control(text: str) -> bool:
    """A control character (newline, tab, NUL, DEL ...) that has no place in a name or ref."""
    return any(map(is_control, text))


_REF_FORBIDDEN = set(" ~^:?*[\\")


def ref_problem(ref: str) -> str | None:
    """Why ``ref`` is not a safe git ref name (git check-ref-format's rules), or None."""
    if not ref:
        return "is empty"
    if has_control(ref) or any(c in _REF_FORBIDDEN for c in ref):
        return "holds whitespace, a control character or one of ~^:?*[\\"
    if ref.startswith(("-", "/")) or ref.endswith(("/", ".", ".lock")) or ref == "@":
        return "starts with '-' or '/', or ends with '/', '.' or '.lock'"
    if ".." in ref or "//" in ref or "@{" in ref:
        return "holds '..', '//' or '@{'"
    if any(part.startswith(".") or part.endswith(".lock") for part in ref.split("/")):
        return "has a path component starting with '.' or ending in '.lock'"
    return None


# No file rocmport reads back is nested deeper than this (a report: stages, details, outcomes ...).
MAX_JSON_DEPTH = 64
MAX_JSON_BYTES = 256 * 1024 * 1024


def json_depth(data) -> int:
    """How deeply ``data`` nests (a scalar: 0), counted without recursion."""
    deepest, stack = 0, [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict):
            value = list(value.values())
        if isinstance(value, list):
            deepest = max(deepest, depth)
            stack.extend((v, depth + 1) for v in value if isinstance(v, (dict, list)))
    return deepest


def read_json(
    path: str | os.PathLike,
    what: str,
    *,
    fix: str,
    max_bytes: int = MAX_JSON_BYTES,
    max_depth: int = MAX_JSON_DEPTH,
    root: str | os.PathLike | None = None,
):
    """The JSON value in ``path``: not UTF-8, not JSON, too large or nested deeper than ``max_depth``
    (100,000 ``[`` is a RecursionError in the parser) is one BadInput line naming the file."""
    import json

    text = read_text(path, what, max_bytes=max_bytes, fix=fix, root=root)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadInput(f"{path}: not valid JSON (line {exc.lineno}: {exc.msg}); {fix}") from None
    except RecursionError:
        raise BadInput(f"{path}: nested too deeply to be a {what}; {fix}") from None
    if json_depth(data) > max_depth:
        raise BadInput(f"{path}: nested more than {max_depth} levels, too deeply to be a {what}; {fix}")
    return data
