"""Edits of a series file that keep its comments and layout: append patches, drop patches (saying
why above the list), and rename it for a new release line."""

from __future__ import annotations

import re

from rocmport.errors import BadInput


def add_to_series(text: str, names: list[str]) -> str:
    """Append patch names to the `patches:` list, keeping the file's comments and layout."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if re.match(r"^patches:\s*(\[\s*\])?\s*(#.*)?$", line):
            lines[i] = "patches:"
            j, indent = i + 1, "  "
            while j < len(lines) and re.match(r"^\s*(- |#)", lines[j]):
                if lines[j].lstrip().startswith("- "):
                    indent = lines[j][: len(lines[j]) - len(lines[j].lstrip())]
                j += 1
            lines[j:j] = [f"{indent}- {n}" for n in names]
            return "\n".join(lines) + "\n"
    raise BadInput("series file has no 'patches:' list to append to")


def renamed_series_text(text: str, old_line: str, new_line: str, versions: str, from_ref: str, to_ref: str) -> str:
    """The series file for a new release line: line and versions rewritten, comments kept."""
    out = []
    for line in text.splitlines():
        if re.match(r"^line:\s", line):
            line = f"line: {new_line}"
        elif re.match(r"^versions:\s", line):
            line = f'versions: "{versions}"'
        elif line.startswith("#"):
            line = re.sub(rf"\b{re.escape(old_line)}\b", new_line, line)
        out.append(line)
    note = f"# Started by `rocmport refresh` from {old_line} ({from_ref} -> {to_ref})."
    first_key = next(i for i, ln in enumerate(out) if ln and not ln.startswith("#"))
    out.insert(first_key, note)
    return "\n".join(out) + "\n"


_ITEM_RE = re.compile(r"^\s*-\s*(\S+\.patch)\s*(#.*)?$")


def drop_from_series_text(text: str, dropped: dict[str, str]) -> str:
    """Remove patch names from `patches:` and record why above the list, keeping everything else."""
    lines = text.splitlines()
    remaining = [m.group(1) for ln in lines if (m := _ITEM_RE.match(ln)) and m.group(1) not in dropped]
    out = []
    for line in lines:
        m = _ITEM_RE.match(line)
        if m and m.group(1) in dropped:
            continue
        if re.match(r"^patches:", line):
            out += [f"# dropped {name}: {why}" for name, why in dropped.items()]
            if not remaining:
                line = "patches: []"
        out.append(line)
    return "\n".join(out) + "\n"
