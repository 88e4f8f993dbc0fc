"""Series for a refresh: pick the one that admits the new version, or start a new release line from
the nearest existing one. Refresh works on a staged copy and promotes it only when it succeeded."""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from packaging.version import InvalidVersion, Version

from rocmport.errors import BadInput
from rocmport.fsutil import atomic_write_text
from rocmport.patches.series import Series, all_series, load_series


def line_of(version: str) -> str:
    v = Version(version)
    return f"v{v.major}.{v.minor}"


def line_range(version: str) -> str:
    v = Version(version)
    return f">={v.major}.{v.minor}.0rc0,<{v.major}.{v.minor + 1}.0rc0"


def _line_key(series: Series) -> Version:
    try:
        return Version(series.line.lstrip("v"))
    except InvalidVersion:
        return Version("0")


@dataclass
class StagedSeries:
    upstream: str
    source_dir: Path      # the project series it was copied from
    target_dir: Path      # where it lands in the project on success
    staged_dir: Path      # the copy refresh edits
    created: bool         # a new release line (target_dir did not exist)

    @property
    def series(self) -> Series:
        return load_series(self.staged_dir / "series")

    def to_dict(self) -> dict:
        return {k: str(v) if isinstance(v, Path) else v for k, v in self.__dict__.items()}

    @classmethod
    def from_dict(cls, data: dict) -> "StagedSeries":
        return cls(data["upstream"], Path(data["source_dir"]), Path(data["target_dir"]), Path(data["staged_dir"]), data["created"])


def stage_series(patchsets_dir: Path, staging_root: Path, upstream: str, version: str, from_ref: str, to_ref: str) -> StagedSeries:
    found = all_series(patchsets_dir, upstream)
    if not found:
        raise BadInput(f"{patchsets_dir / upstream}: no series to refresh from; create one (see README 'Patch sets')")
    admitting = [s for s in found if s.admits(version)]
    staged_dir = staging_root / upstream
    shutil.rmtree(staged_dir, ignore_errors=True)
    if len(admitting) > 1:
        raise BadInput(f"{upstream} {version}: several series admit this version ({', '.join(str(s.path) for s in admitting)}); make their ranges disjoint")
    if admitting:
        src = admitting[0]
        shutil.copytree(src.dir, staged_dir)
        return StagedSeries(upstream, src.dir, src.dir, staged_dir, created=False)
    new_line = line_of(version)
    below = [s for s in found if _line_key(s) <= Version(new_line.lstrip("v"))]
    src = max(below, key=_line_key) if below else min(found, key=_line_key)
    target = patchsets_dir / upstream / new_line
    if target.exists():
        raise BadInput(f"{target}: exists but its series does not admit {version}; fix its 'versions' range or move it away")
    shutil.copytree(src.dir, staged_dir)
    text = (staged_dir / "series").read_text(encoding="utf-8")
    atomic_write_text(staged_dir / "series", renamed_series_text(text, src.line, new_line, line_range(version), from_ref, to_ref))
    return StagedSeries(upstream, src.dir, target, staged_dir, created=True)


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


def promote(staged: StagedSeries, series_text: str, files: dict[str, str], removed: list[str]) -> list[str]:
    """Write the refreshed series into the project: only files whose bytes change; returns them."""
    target = staged.target_dir
    target.mkdir(parents=True, exist_ok=True)
    changed = []
    everything = {**{p.name: p.read_text(encoding="utf-8") for p in staged.staged_dir.iterdir() if p.is_file()}, **files, "series": series_text}
    for name, text in sorted(everything.items()):
        if name in removed:
            continue
        dest = target / name
        if not dest.is_file() or dest.read_text(encoding="utf-8") != text:
            atomic_write_text(dest, text)
            changed.append(str(dest))
    for name in removed:
        if (target / name).is_file():
            (target / name).unlink()
            changed.append(str(target / name))
    return changed
