"""Series for a refresh: pick the one that admits the new version, or start a new release line from
the nearest existing one. Refresh works on a staged copy and promotes it only when it succeeded."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from rocmport.errors import BadInput
from rocmport.fsutil import atomic_write_text
from rocmport.patches.series import Series, all_series, load_series
from rocmport.patches.series_edit import renamed_series_text
from rocmport.release_line import ReleaseLine


def _line_key(series: Series) -> ReleaseLine:
    return ReleaseLine.match(series.line) or ReleaseLine(0, 0)


@dataclass
class StagedSeries:
    upstream: str
    source_dir: Path  # the project series it was copied from
    target_dir: Path  # where it lands in the project on success
    staged_dir: Path  # the copy refresh edits
    created: bool  # a new release line (target_dir did not exist)

    @property
    def series(self) -> Series:
        return load_series(self.staged_dir / "series")

    def to_dict(self) -> dict:
        return {k: str(v) if isinstance(v, Path) else v for k, v in self.__dict__.items()}

    @classmethod
    def from_dict(cls, data: dict) -> "StagedSeries":
        return cls(
            data["upstream"],
            Path(data["source_dir"]),
            Path(data["target_dir"]),
            Path(data["staged_dir"]),
            data["created"],
        )


def stage_series(
    patchsets_dir: Path, staging_root: Path, upstream: str, version: str, from_ref: str, to_ref: str
) -> StagedSeries:
    found = all_series(patchsets_dir, upstream)
    if not found:
        raise BadInput(f"{patchsets_dir / upstream}: no series to refresh from; create one (see docs/patch-sets.md)")
    admitting = [s for s in found if s.admits(version)]
    staged_dir = staging_root / upstream
    shutil.rmtree(staged_dir, ignore_errors=True)
    if len(admitting) > 1:
        raise BadInput(
            f"{upstream} {version}: several series admit this version ({', '.join(str(s.path) for s in admitting)}); make their ranges disjoint"
        )
    if admitting:
        src = admitting[0]
        shutil.copytree(src.dir, staged_dir)
        return StagedSeries(upstream, src.dir, src.dir, staged_dir, created=False)
    new_line = ReleaseLine.of(version)
    below = [s for s in found if _line_key(s) <= new_line]
    src = max(below, key=_line_key) if below else min(found, key=_line_key)
    target = patchsets_dir / upstream / str(new_line)
    if target.exists():
        raise BadInput(
            f"{target}: exists but its series does not admit {version}; fix its 'versions' range or move it away"
        )
    shutil.copytree(src.dir, staged_dir)
    text = (staged_dir / "series").read_text(encoding="utf-8")
    atomic_write_text(
        staged_dir / "series", renamed_series_text(text, src.line, str(new_line), new_line.versions, from_ref, to_ref)
    )
    return StagedSeries(upstream, src.dir, target, staged_dir, created=True)


def promote(staged: StagedSeries, series_text: str, files: dict[str, str], removed: list[str]) -> list[str]:
    """Write the refreshed series into the project: only files whose bytes change; returns them."""
    target = staged.target_dir
    target.mkdir(parents=True, exist_ok=True)
    changed = []
    everything = {
        **{p.name: p.read_text(encoding="utf-8") for p in staged.staged_dir.iterdir() if p.is_file()},
        **files,
        "series": series_text,
    }
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
