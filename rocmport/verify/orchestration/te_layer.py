"""Transformer Engine's own Python layer for verify: chosen per line, fetched from the package index
into rocmport's cache, and run on the CPU proxy with only its compiled parts replaced.

`--te VERSION|auto|none`: ``auto`` takes the newest release in the line's component-matrix range
(``components.transformer_engine.versions`` in the series) that the index has as a pure-Python
wheel; ``none`` keeps Megatron's local layer spec. ``auto`` on a tree whose line verify cannot
place (no series) is refused: it would pick a release no line admits. The wheel (NVIDIA's Python
layer: ROCm TE's sources cannot be had whole here) runs as the run's TE flavour says
(``flavour``: ``rocm``, NVIDIA's layer plus the declared ROCm TE deltas, the default under the HIP
simulation; ``nvidia``, as released, where the report says ROCm TE differences are not simulated)
and is verified by its sha256, unpacked under the cache (``<cache>/te/<version>/``) and put on the
started processes' path: nothing is installed into the user's environment.

In those processes ``rocmport.verify.runtime.te_loader`` (installed by verify's bootstrap when
``protocol.TE`` is set) puts the wheel on the path and makes TE load
``rocmport.verify.runtime.te_cpu`` as its compiled extension. Everything else is TE's code."""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from rocmport.errors import BadInput
from rocmport.fsutil import move_dir, naming_disk_full
from rocmport.verify.runtime import protocol
from rocmport.verify.runtime.te_flavour import TEFlavour

DISTRIBUTION = "transformer-engine"
MODULES = ("transformer_engine", "transformer_engine_torch")
PYTHON_LAYER = "NVIDIA's Python layer"
NOT_SIMULATED = "ROCm TE differences not simulated"


@dataclass(frozen=True)
class WheelFile:
    version: Version
    filename: str
    url: str
    sha256: str


@dataclass(frozen=True)
class TELayer:
    """The TE Python layer a verify run uses."""

    version: str
    path: Path  # the unpacked wheel: transformer_engine/ and its .dist-info
    python_layer: str
    source: str
    flavour: TEFlavour = TEFlavour("nvidia")
    outside_range: str | None = None  # the line's range, when asked for a release outside it (--te ==X)

    @property
    def note(self) -> str:
        return NOT_SIMULATED if self.flavour.name == "nvidia" else self.flavour.describe()

    def describe(self) -> str:
        return f"TE {self.version}, {self.python_layer}: {self.note}" + (
            f"; outside the line's range {self.outside_range}" if self.outside_range else ""
        )

    def to_dict(self) -> dict:
        out = {
            "version": self.version,
            "python_layer": self.python_layer,
            "source": self.source,
            "note": self.note,
            "flavour": self.flavour.to_dict(),
        }
        if self.outside_range:
            out["outside_range"] = self.outside_range
        return out


# How long verify waits for the index's page of TE releases (ROCMPORT_INDEX_TIMEOUT seconds): a stalled
# index was 127 s of silence, and verify has a way on without it (a cached release, --te none).
INDEX_TIMEOUT = 30.0
WHEEL_MEMBER = "transformer_engine/__init__.py"  # TE's Python layer: a wheel without it has none


def index_timeout() -> float:
    try:
        value = float(os.environ.get("ROCMPORT_INDEX_TIMEOUT", INDEX_TIMEOUT))
    except ValueError:
        raise BadInput(f"ROCMPORT_INDEX_TIMEOUT={os.environ['ROCMPORT_INDEX_TIMEOUT']!r}: give seconds") from None
    if not 0 < value <= 3600:
        raise BadInput(f"ROCMPORT_INDEX_TIMEOUT={value:g}: give seconds above 0, at most 3600")
    return value


def cached_versions(cache_root: Path) -> list[Version]:
    """The TE releases whose Python layer is unpacked in the cache (verified when fetched), oldest first."""
    out = []
    for d in (cache_root / "te").iterdir() if (cache_root / "te").is_dir() else ():
        try:
            version = Version(d.name)
        except InvalidVersion:
            continue
        if (d / WHEEL_MEMBER).is_file():
            out.append(version)
    return sorted(out)


def _offline_hint(cache_root: Path | None) -> str:
    have = ", ".join(map(str, cached_versions(cache_root))) if cache_root else ""
    return (
        "verify --te: set ROCMPORT_INDEX_URL to an index that answers, "
        + (f"give a --te release already in the cache ({have}), " if have else "")
        + "or run without TE (--te none)"
    )


def list_wheels(index: str | None = None, cache_root: Path | None = None) -> list[WheelFile]:
    """TE's pure-Python wheels on the index, oldest first (final releases only)."""
    from rocmport.upstream.package_index import index_files, is_final

    out = []
    for name, url, sha in index_files(DISTRIBUTION, index, timeout=index_timeout(), hint=_offline_hint(cache_root)):
        if not (name.startswith("transformer_engine-") and name.endswith("-py3-none-any.whl")):
            continue
        try:
            version = Version(name[len("transformer_engine-") : -len("-py3-none-any.whl")])
        except InvalidVersion:
            continue
        if is_final(version):
            out.append(WheelFile(version, name, url, sha))
    return sorted(out, key=lambda w: w.version)


def choose(spec: str, line_range: str | None, wheels: list[WheelFile]) -> WheelFile | None:
    """``none`` -> None; ``auto`` -> the newest wheel in ``line_range``; a version -> exactly that
    wheel. A version the index lacks, or no wheel in range, is bad input listing what exists."""
    spec = spec.strip()
    have = ", ".join(str(w.version) for w in wheels) or "none"
    if spec == "none":
        return None
    if spec == "auto":
        if line_range is None:
            raise BadInput(
                "--te auto: verify cannot place this tree in a release line (no series: a tree `rocmport apply` "
                f"did not make), so it has no Transformer Engine range to choose from; pass --te VERSION (the index has: {have})"
            )
        try:
            allowed = SpecifierSet(line_range or "")
        except InvalidSpecifier:
            raise BadInput(f"the series' transformer_engine versions {line_range!r} is not a version range") from None
        inside = [w for w in wheels if allowed.contains(w.version, prereleases=True)]
        if not inside:
            raise BadInput(
                f"--te auto: the package index has no Transformer Engine wheel in this line's range "
                f"{line_range or '(any)'}; it has: {have}"
            )
        return inside[-1]
    want = parse_version(spec, line_range)
    for wheel in wheels:
        if wheel.version == want:
            return wheel
    raise BadInput(f"--te {spec}: the package index has no Transformer Engine {spec} Python wheel; it has: {have}")


def parse_version(spec: str, line_range: str | None) -> Version:
    """``--te X`` or ``--te ==X`` as a version. X outside the line's range is refused naming the range;
    ``==X`` asks for it anyway (the verdict then says "outside the line's range")."""
    exact = spec.startswith("==")
    try:
        want = Version(spec.removeprefix("=="))
    except InvalidVersion:
        raise BadInput(f"--te {spec!r}: give a Transformer Engine version, auto or none") from None
    if not exact and outside(want, line_range):
        raise BadInput(
            f"--te {spec}: outside this line's Transformer Engine range {line_range} (the series' "
            f"rocm.components.transformer_engine.versions); give a release in it or auto, or --te =={want} to run it anyway"
        )
    return want


def outside(version: Version, line_range: str | None) -> bool:
    try:
        return bool(line_range) and not SpecifierSet(line_range or "").contains(version, prereleases=True)
    except InvalidSpecifier:
        raise BadInput(f"the series' transformer_engine versions {line_range!r} is not a version range") from None


def resolve(spec: str, line_range: str | None, cache_root: Path, progress=None) -> TELayer | None:
    """``--te VERSION|==VERSION|auto|none``: the TE Python layer for a run. An exact release already
    unpacked in the cache is used as it is (no index needed: offline works); ``auto`` asks the index
    and, when it does not answer, takes the newest cached release in the line's range, said so."""
    from rocmport import output
    from rocmport.upstream.package_index import IndexUnreachable

    spec = spec.strip()
    if spec == "none":
        return None

    def listed() -> list[WheelFile]:  # said while it waits: a slow index is not silence
        if progress is None:
            return list_wheels(cache_root=cache_root)
        with progress("Transformer Engine: the releases on the package index"):
            return list_wheels(cache_root=cache_root)

    layer: TELayer | None
    if spec != "auto":
        want = parse_version(spec, line_range)
        if want in cached_versions(cache_root):
            layer = _cached(cache_root, want)
        else:
            layer = _fetched(choose(spec, line_range, listed()), cache_root, progress)
    else:
        try:
            wheels = listed()
        except IndexUnreachable as exc:
            inside = [v for v in cached_versions(cache_root) if not outside(v, line_range)]
            if not inside:
                raise
            output.warn(f"--te auto: {exc}; using Transformer Engine {inside[-1]}, the newest in the cache")
            layer = _cached(cache_root, inside[-1])
        else:
            layer = _fetched(choose(spec, line_range, wheels), cache_root, progress)
    if layer is not None and outside(Version(layer.version), line_range):
        layer = dataclasses.replace(layer, outside_range=line_range)
    return layer


def _cached(cache_root: Path, version: Version) -> TELayer:
    return TELayer(
        str(version), cache_root / "te" / str(version), PYTHON_LAYER, f"Transformer Engine {version}'s wheel, cached"
    )


def _fetched(wheel: WheelFile | None, cache_root: Path, progress) -> TELayer | None:
    if wheel is None:
        return None
    if progress is None:
        return fetch(cache_root, wheel)
    with progress(f"Transformer Engine {wheel.version}: its Python layer from the package index"):
        return fetch(cache_root, wheel)


def fetch(cache_root: Path, wheel: WheelFile) -> TELayer:
    """The wheel verified and unpacked under ``cache_root/te/<version>`` (once; atomic)."""
    from rocmport.upstream.package_index import _get
    from rocmport.upstream.store import Store

    dest = cache_root / "te" / str(wheel.version)
    layer = TELayer(str(wheel.version), dest, PYTHON_LAYER, f"{wheel.filename} from the package index")
    unpacked = dest / "transformer_engine" / "__init__.py"
    if unpacked.is_file():
        return layer
    with Store(cache_root).locked() as store:  # two verify runs unpacking the same release wait for each other
        if unpacked.is_file():
            return layer
        whl = store.sdist(wheel.filename, wheel.sha256, lambda: _get(wheel.url, timeout=600))
        _check_wheel(whl, wheel)
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{wheel.version}-", dir=dest.parent))
        try:
            with zipfile.ZipFile(whl) as archive:
                for member in archive.namelist():
                    target = (tmp / member).resolve()
                    if not target.is_relative_to(tmp.resolve()):
                        raise BadInput(f"{whl}: member {member!r} escapes the unpack directory")
                with naming_disk_full(dest):  # a write's ENOSPC names no file: this one names the cache entry
                    archive.extractall(tmp)
            if dest.exists():
                shutil.rmtree(dest)
            move_dir(tmp, dest)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return layer


def _check_wheel(whl: Path, wheel: WheelFile) -> None:
    """A wheel is a zip holding TE's Python layer (transformer_engine/__init__.py), else bad input
    before any stage: its hash matching the index's proves only that the index served it. A wheel
    that is not one leaves the cache (a later index may serve a good one under that name)."""
    try:
        with zipfile.ZipFile(whl) as archive:
            names = set(archive.namelist())
    except (zipfile.BadZipFile, OSError) as exc:
        whl.unlink(missing_ok=True)
        raise BadInput(
            f"{wheel.filename} from the package index is not a wheel (not a zip archive: {exc}); "
            "choose another release with --te, or --te none"
        ) from None
    for member in sorted(names):  # the unpack checks each member again; a hostile archive is named first
        parts = Path(member).parts
        if Path(member).is_absolute() or ".." in parts:
            raise BadInput(f"{whl}: member {member!r} escapes the unpack directory")
    if WHEEL_MEMBER not in names:
        raise BadInput(
            f"--te {wheel.version}: {wheel.filename} holds no transformer_engine package (no Python layer to "
            "run; TE before 2.x shipped it elsewhere); choose a release in the line's range, or --te auto"
        )


# What TE's Python layer imports at import time besides torch (the dependencies of TE's torch
# extension package, which the CPU proxy replaces): module -> pip name.
IMPORT_DEPS = {"onnxscript": "onnxscript", "onnx": "onnx", "einops": "einops", "packaging": "packaging"}


def check_deps() -> None:
    """Bad input, with the pip command, when this interpreter lacks what TE's Python layer imports."""
    import importlib.util

    missing = sorted({dist for mod, dist in IMPORT_DEPS.items() if importlib.util.find_spec(mod) is None})
    if missing:
        raise BadInput(
            f"--te: Transformer Engine's Python layer imports {', '.join(missing)}, which this Python lacks: "
            f"`{sys.executable} -m pip install {' '.join(missing)}` (rocmport's [proxy] extra has them)"
        )


def unblocked(blocked: tuple[str, ...] | list[str]) -> list[str]:
    """The firewall's list with TE's own modules let through (flash_attn stays blocked: TE then takes
    its own unfused attention, as on a build without flash-attention)."""
    return [m for m in blocked if m not in MODULES]


def child_env(layer: TELayer) -> dict[str, str | None]:
    return {**protocol.TE.entry(layer.version), **protocol.TE_PATH.entry(str(layer.path)), **layer.flavour.env()}
