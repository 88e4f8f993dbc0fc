"""Transformer Engine's own Python layer for verify: chosen per line, fetched from the package index
into rocmport's cache, and run on the CPU proxy with only its compiled parts replaced.

`--te VERSION|auto|none`: ``auto`` takes the newest release in the line's component-matrix range
(``components.transformer_engine.versions`` in the series) that the index has as a pure-Python
wheel; ``none`` keeps Megatron's local layer spec. ``auto`` on a tree whose line verify cannot
place (no series) is refused: it would pick a release no line admits. The wheel (NVIDIA's Python
layer: ROCm TE's sources cannot be had whole here) runs as the run's TE flavour says
(``te_flavour``: ``rocm``, NVIDIA's layer plus the declared ROCm TE deltas, the default under the HIP
simulation; ``nvidia``, as released, where the report says ROCm TE differences are not simulated)
and is verified by its sha256, unpacked under the cache (``<cache>/te/<version>/``) and put on the
started processes' path: nothing is installed into the user's environment.

In those processes ``install()`` (called by verify's bootstrap when ``ROCMPORT_TE`` is set) skips
TE's loading of its shared libraries (``NVTE_PROJECT_BUILDING``, TE's own switch for that) and
makes ``transformer_engine.common.load_framework_extension("torch")`` install
``rocmport.verify.te_cpu`` as ``transformer_engine_torch``. Everything else is TE's code."""

from __future__ import annotations

import importlib.abc
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
from rocmport.verify.te_flavour import TEFlavour

DISTRIBUTION = "transformer-engine"
MODULES = ("transformer_engine", "transformer_engine_torch")
PYTHON_LAYER = "NVIDIA's Python layer"
NOT_SIMULATED = "ROCm TE differences not simulated"
ENV = "ROCMPORT_TE"


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

    @property
    def note(self) -> str:
        return NOT_SIMULATED if self.flavour.name == "nvidia" else self.flavour.describe()

    def describe(self) -> str:
        return f"TE {self.version}, {self.python_layer}: {self.note}"

    def to_dict(self) -> dict:
        return {
            "version": self.version,
            "python_layer": self.python_layer,
            "source": self.source,
            "note": self.note,
            "flavour": self.flavour.to_dict(),
        }


def list_wheels(index: str | None = None) -> list[WheelFile]:
    """TE's pure-Python wheels on the index, oldest first (final releases only)."""
    from rocmport.upstream.package_index import index_files, is_final

    out = []
    for name, url, sha in index_files(DISTRIBUTION, index):
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
    try:
        want = Version(spec)
    except InvalidVersion:
        raise BadInput(f"--te {spec!r}: give a Transformer Engine version, auto or none") from None
    for wheel in wheels:
        if wheel.version == want:
            return wheel
    raise BadInput(f"--te {spec}: the package index has no Transformer Engine {spec} Python wheel; it has: {have}")


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
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{wheel.version}-", dir=dest.parent))
        try:
            with zipfile.ZipFile(whl) as archive:
                for member in archive.namelist():
                    target = (tmp / member).resolve()
                    if not target.is_relative_to(tmp.resolve()):
                        raise BadInput(f"{whl}: member {member!r} escapes the unpack directory")
                archive.extractall(tmp)
            if dest.exists():
                shutil.rmtree(dest)
            os.replace(tmp, dest)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return layer


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
    return {ENV: layer.version, "ROCMPORT_TE_PATH": str(layer.path), **layer.flavour.env()}


# ---- in the started processes ----


class _PatchCommon(importlib.abc.MetaPathFinder):
    """When ``transformer_engine.common`` is imported, replace its loader of the compiled extension."""

    def find_spec(self, name, path=None, target=None):
        if name != "transformer_engine.common":
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is None:
            return spec
        inner: importlib.abc.Loader = spec.loader

        class Loader(importlib.abc.Loader):
            def create_module(self, spec):
                return inner.create_module(spec)

            def exec_module(self, module):
                inner.exec_module(module)
                _replace_loader(module)

        spec.loader = Loader()
        return spec


def _replace_loader(common) -> None:
    import functools

    @functools.lru_cache(maxsize=None)
    def load_framework_extension(framework: str) -> None:
        if framework != "torch":
            raise ImportError(f"rocmport's CPU proxy provides TE's torch extension only, not {framework}")
        from rocmport.verify import te_cpu

        sys.modules["transformer_engine_torch"] = te_cpu

    common.load_framework_extension = load_framework_extension


def install() -> None:
    if ENV not in os.environ:
        return
    # TE's own switch for "building, do not load the shared libraries" (transformer_engine/common).
    os.environ.setdefault("NVTE_PROJECT_BUILDING", "1")
    # TE's own switch for its torch.compile'd fusions (bias-GELU, dropout-add): compiled on the
    # proxy, dynamo would ask its CUDA device interface about a device that is the CPU; uncompiled,
    # the same Python functions run eagerly.
    os.environ.setdefault("NVTE_TORCH_COMPILE", "0")
    path = os.environ.get("ROCMPORT_TE_PATH")
    if path and path not in sys.path:
        sys.path.insert(0, path)
    sys.meta_path.insert(0, _PatchCommon())
    from rocmport.verify import te_rocm

    te_rocm.install()  # the rocm flavour's deltas (nothing under nvidia)
