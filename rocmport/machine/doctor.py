"""What this machine has for running a ported Megatron (`rocmport doctor`): torch and its HIP/CUDA
build, ROCm and RCCL, the devices and their arch, the launcher variables, and each ROCm component of
the line's matrix — installed or not, version in range, built for this GPU's arch where its shared
libraries record it — with what to use on this arch. `verify` asks `component_report` too."""

from __future__ import annotations

import glob
import importlib.metadata
import importlib.util
import os
import re
import dataclasses
from dataclasses import dataclass, field
from typing import Any
from pathlib import Path

from rocmport.config import load_settings
from rocmport.errors import BadInput
from rocmport.launch_env import DETERMINISTIC_ENV, LAUNCH_ENV
from rocmport.components import Matrix, base_arch, recommend
from rocmport.machine.probe import gpu_arch
from rocmport.codemods.catalog import check_series
from rocmport.patches.series import all_series, load_series, select_series
from rocmport.upstream.lock import load_lock
from rocmport.upstreams import MEGATRON_LM

# Code objects in a HIP fat binary are named by their offload target: hipv4-amdgcn-amd-amdhsa--gfx942[:features].
_OFFLOAD_RE = re.compile(rb"amdgcn-amd-amdhsa--(gfx[0-9a-f]+)")
_CHUNK = 1 << 22

OK, MISSING, OUT_OF_RANGE, WRONG_ARCH, NOT_HERE = "ok", "missing", "out-of-range", "wrong-arch", "not-for-this-arch"
NOT_IMPORTABLE, VERSION_UNKNOWN = "not-importable", "version-unknown"
PROBLEMS = (MISSING, OUT_OF_RANGE, WRONG_ARCH, NOT_IMPORTABLE)


@dataclass
class ComponentRow:
    name: str
    required: bool
    wanted: str
    status: str  # ok | missing | out-of-range | wrong-arch | not-importable | version-unknown | not-for-this-arch
    distribution: str | None = None
    version: str | None = None
    built_for: list[str] | None = None  # archs its shared libraries carry code for; None: none recorded
    detail: str = ""

    @property
    def problem(self) -> bool:
        """A required component that is not usable here (doctor exits 1)."""
        return self.required and self.status in PROBLEMS

    def to_dict(self) -> dict:
        return {**self.__dict__, "problem": self.problem}


@dataclass
class ComponentReport:
    series: str | None
    arch: str | None
    arch_source: str  # gpu | --arch | none
    rows: list[ComponentRow] = field(default_factory=list)
    recommendations: list[tuple[str, str, str]] = field(default_factory=list)

    @property
    def problems(self) -> list[ComponentRow]:
        return [r for r in self.rows if r.problem]

    def usable(self, name: str) -> bool:
        return any(r.name == name and r.status == OK for r in self.rows)

    def versions(self) -> dict[str, str | None]:
        return {r.name: r.version for r in self.rows}

    def to_dict(self) -> dict:
        return {
            "series": self.series,
            "arch": self.arch,
            "arch_source": self.arch_source,
            "components": [r.to_dict() for r in self.rows],
            "recommendations": [{"topic": t, "use": u, "why": w} for t, u, w in self.recommendations],
        }


def offload_archs(path: Path) -> set[str]:
    """The gfx targets whose code objects a shared library carries (uncompressed offload bundles;
    a compressed bundle hides them, and the result is empty)."""
    found: set[str] = set()
    tail = b""
    try:
        with open(path, "rb") as fh:
            while chunk := fh.read(_CHUNK):
                data = tail + chunk
                found.update(m.decode() for m in _OFFLOAD_RE.findall(data))
                tail = data[-64:]
    except OSError:
        return set()
    return found


def _installed(names: list[str]) -> importlib.metadata.Distribution | None:
    for name in names:
        try:
            return importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _built_for(dist: importlib.metadata.Distribution) -> list[str] | None:
    archs: set[str] = set()
    libraries = [f for f in dist.files or [] if f.name.endswith(".so") or ".so." in f.name]
    for f in libraries:
        archs |= offload_archs(Path(str(dist.locate_file(f))))
    return sorted(archs) if archs else None


def component_report(matrix: Matrix | None, arch: str | None = None, other_gpu: str | None = None) -> ComponentReport:
    """Each component of the matrix against what is installed: one row each, and what to use on the arch.
    ``arch`` None: the GPU's (none without one); a given arch stands in for it (planning, tests)."""
    source = "--arch" if arch else "gpu"
    arch = base_arch(arch) or gpu_arch()
    report = ComponentReport(str(matrix.where) if matrix else None, arch, source if arch else "none")
    for comp in matrix.components.values() if matrix else ():
        support = comp.support(arch) if arch else None
        row = ComponentRow(comp.name, comp.required, str(comp.versions) or "any", MISSING)
        if support is not None and support.status == "refuses":
            row.required = False  # not required where it cannot be built
        dist = _installed(comp.distributions)
        importable = importlib.util.find_spec(comp.module) is not None
        if dist is None and importable:
            row.status, row.detail = (
                VERSION_UNKNOWN,
                f"{comp.module} imports but no distribution ({', '.join(comp.distributions)}) records its version",
            )
            report.rows.append(row)
            continue
        if dist is None:
            row.detail = (
                "not installed"
                if support is None or support.status != "refuses"
                else f"not installed; does not build for {arch}: use {support.instead}"
            )
            if support is not None and support.status == "refuses":
                row.status = NOT_HERE
            report.rows.append(row)
            continue
        row.distribution, row.version = dist.metadata["Name"], dist.version
        row.built_for = _built_for(dist)
        if not importable:
            row.status, row.detail = (
                NOT_IMPORTABLE,
                f"{row.distribution} is installed but its module {comp.module} is not found",
            )
        elif not comp.admits(dist.version):
            row.status, row.detail = OUT_OF_RANGE, f"{row.distribution} {dist.version} is outside {row.wanted}"
        elif arch and row.built_for is not None and arch not in row.built_for:
            row.status, row.detail = (
                WRONG_ARCH,
                f"built for {', '.join(row.built_for)}, not {arch}; rebuild with PYTORCH_ROCM_ARCH={arch}",
            )
        else:
            row.status = OK
            row.detail = (
                "arch not recorded in its libraries"
                if row.built_for is None
                else ("no GPU to compare with" if not arch else f"built for {arch}")
            )
        if support is not None and support.status == "refuses" and row.status == OK:
            row.detail += f"; note: the matrix says it does not build for {arch} ({support.reason})"
        report.rows.append(row)
    report.recommendations = recommend(matrix, arch, {r.name: r.status == OK for r in report.rows}, other_gpu)
    return report


def _none_installed(report: ComponentReport) -> list[str]:
    """A machine with none of the line's components (this project's CI) cannot run the port as the
    line ships it, whatever the arch excuses: a problem (exit 1), as docs/commands/env-doctor.md says."""
    if not report.rows or any(r.version or r.status == VERSION_UNKNOWN for r in report.rows):
        return []
    return [f"none of the components of {report.series} is installed here ({', '.join(r.name for r in report.rows)})"]


@dataclass
class Device:
    index: int
    name: str
    arch: str  # gcnArchName on ROCm, sm_<major><minor> on CUDA


@dataclass
class Doctor:
    """`rocmport doctor`: torch and HIP, ROCm and RCCL, the devices, the line's components (the
    report), the problems (exit 1) and the launch environment variables as set here."""

    torch: str | None
    hip: str | None
    cuda: str | None
    rocm_path: str | None
    rccl: str | None
    devices: list[Device]
    report: ComponentReport
    problems: list[str]
    env: dict[str, str | None]
    rocm_version: str | None = None  # from the ROCm directory's .info/version (or rocm_version.h)

    def header(self) -> str:
        """The first line, in words for what is absent (the JSON keeps its nulls): "torch 2.13.0+cpu
        (a CPU build: no HIP, no CUDA); ROCm: not found (ROCM_PATH unset, no /opt/rocm); RCCL: not found"."""
        if self.torch is None:
            torch = "torch: not installed"
        elif self.hip:
            torch = f"torch {self.torch} (HIP {self.hip})"
        elif self.cuda:
            torch = f"torch {self.torch} (CUDA {self.cuda}: not a ROCm build)"
        else:
            torch = f"torch {self.torch} (a CPU build: no HIP, no CUDA)"
        if self.rocm_path is None:
            rocm = "ROCm: not found (ROCM_PATH unset, no /opt/rocm)"
        else:
            rocm = f"ROCm {self.rocm_version or '(version not recorded)'} at {self.rocm_path}"
        rccl = (
            f"RCCL {self.rccl}"
            if self.rccl
            else "RCCL: not found" + (f" in {self.rocm_path}/lib" if self.rocm_path else "")
        )
        return f"{torch}; {rocm}; {rccl}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "torch": self.torch,
            "hip": self.hip,
            "cuda": self.cuda,
            "rocm_path": self.rocm_path,
            "rocm_version": self.rocm_version,
            "rccl": self.rccl,
            "devices": [dataclasses.asdict(d) for d in self.devices],
            **self.report.to_dict(),
            "problems": self.problems,
            "env": self.env,
        }


def rocm_version(rocm_path: str) -> str | None:
    """The ROCm release of a ROCm directory: .info/version ("6.2.0-66"), else rocm-core's
    rocm_version.h (ROCM_VERSION_MAJOR/MINOR/PATCH); None when neither records it."""
    root = Path(rocm_path)
    try:
        text = (root / ".info" / "version").read_text(encoding="utf-8").strip()
        if text:
            return text.split()[0]
    except OSError:
        pass
    try:
        header = (root / "include" / "rocm-core" / "rocm_version.h").read_text(encoding="utf-8")
    except OSError:
        return None
    parts = [re.search(rf"#define\s+ROCM_VERSION_{k}\s+(\d+)", header) for k in ("MAJOR", "MINOR", "PATCH")]
    return ".".join(m.group(1) for m in parts if m) if all(parts) else None


def doctor(matrix: Matrix | None = None, arch: str | None = None) -> Doctor:
    try:
        import torch
    except ImportError:
        torch = None
    hip = getattr(torch.version, "hip", None) if torch else None
    count = torch.cuda.device_count() if torch and torch.cuda.is_available() else 0
    devices = []
    for i in range(count):
        props = torch.cuda.get_device_properties(i)
        devices.append(
            Device(
                i,
                torch.cuda.get_device_name(i),
                # a CUDA build's properties carry gcnArchName too, holding the device's name (torch 2.11 on an H100)
                (getattr(props, "gcnArchName", None) if hip else None) or f"sm_{props.major}{props.minor}",
            )
        )
    rocm_path = os.environ.get("ROCM_PATH") or ("/opt/rocm" if os.path.isdir("/opt/rocm") else None)
    rccl = sorted(glob.glob(os.path.join(rocm_path, "lib", "librccl.so*")))[:1] if rocm_path else []
    names = [n for n, _, _ in LAUNCH_ENV + DETERMINISTIC_ENV] + [
        "NVTE_FLASH_ATTN",
        "NVTE_FUSED_ATTN",
        "FLASH_ATTENTION_TRITON_AMD_ENABLE",
        "PYTORCH_ROCM_ARCH",
        "HSA_OVERRIDE_GFX_VERSION",
        "HIP_VISIBLE_DEVICES",
        "CUDA_VISIBLE_DEVICES",
    ]
    report = component_report(matrix, arch, devices[0].name if devices and not hip else None)
    return Doctor(
        torch=torch.__version__ if torch else None,
        hip=hip,
        cuda=getattr(torch.version, "cuda", None) if torch else None,
        rocm_path=rocm_path,
        rocm_version=rocm_version(rocm_path) if rocm_path else None,
        rccl=rccl[0] if rccl else None,
        devices=devices,
        report=report,
        problems=[f"{r.name}: {r.detail}" for r in report.problems] + _none_installed(report),
        env={n: os.environ.get(n) for n in names},
    )


def matrix_for(project: str | Path, line: str | None) -> Matrix | None:
    """The Megatron-LM line's matrix: --line's series, else the series of the version upstream.lock pins,
    else None (no lock here). Bad input: an unknown line, a series without rocm:, a malformed one."""
    settings = load_settings(project)
    if line:
        path = settings.patchsets_dir / MEGATRON_LM.name / line / "series"
        if not path.is_file():
            have = ", ".join(s.line for s in all_series(settings.patchsets_dir, MEGATRON_LM.name)) or "none"
            raise BadInput(f"--line {line}: no {path}; lines with a series: {have}")
        series = check_series(load_series(path))
    elif settings.lock_path.is_file():
        lock = load_lock(settings.lock_path)
        if MEGATRON_LM.name not in lock.upstreams:
            return None
        series = check_series(
            select_series(settings.patchsets_dir, MEGATRON_LM.name, lock.upstreams[MEGATRON_LM.name].version)
        )
        return series.rocm  # None when the locked line's series has no rocm: section (doctor says so)
    else:
        return None
    if series.rocm is None:
        raise BadInput(f"{series.path}: no rocm: section to check against (docs/component-matrix.md)")
    return series.rocm


@dataclass
class VerifyFacts:
    """What verify asks doctor: is Transformer Engine usable here (then upstream's TE functional case),
    the GPU's arch, and the line's components here ({name: {version, status}}, the report's env)."""

    te_usable: bool
    arch: str | None = None
    components: dict[str, dict[str, str | None]] = field(default_factory=dict)


def for_verify(series_path: Path | None) -> VerifyFacts:
    """doctor's answer for verify; without a matrix: whether TE imports."""
    matrix = load_series(series_path).rocm if series_path is not None and Path(series_path).is_file() else None
    if matrix is None:
        return VerifyFacts(te_usable=importlib.util.find_spec("transformer_engine") is not None)
    report = component_report(matrix)
    return VerifyFacts(
        te_usable=report.usable("transformer_engine"),
        arch=report.arch,
        components={r.name: {"version": r.version, "status": r.status} for r in report.rows},
    )
