"""Dependency manifests of a ported tree, rewritten for ROCm without disturbing anything else.

`[project] dependencies` and `optional-dependencies` of `pyproject.toml` (format-preserving, with
tomlkit) and installation requirements files lose the distributions that only exist as CUDA builds;
every removal is recorded with its reason and the ROCm replacement to install. Megatron-Bridge's
`[tool.uv.sources]` path to its `3rdparty/Megatron-LM` gitlink (empty in a checkout) points at the
ported Megatron-LM work tree instead. Idempotent: a rewritten manifest rewrites to itself."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import tomlkit
from packaging.requirements import InvalidRequirement, Requirement

from rocmport.fsutil import tree_files, tree_is_file, tree_read_text
from rocmport.components import Component, Matrix
from rocmport.upstreams import MANIFEST_GLOBS, MEGATRON_LM

VERSION = "2"

# Distribution (PEP 503 name) -> why it goes and what to install on ROCm instead.
DEFAULT_DROP: dict[str, str] = {
    "transformer-engine": "no ROCm Transformer Engine on PyPI; install ROCm's build: pip install --no-build-isolation git+https://github.com/ROCm/TransformerEngine.git",
    "transformer-engine-torch": "part of Transformer Engine; comes with ROCm's build (ROCm/TransformerEngine)",
    "transformer-engine-cu12": "CUDA 12 build of Transformer Engine; use ROCm/TransformerEngine",
    "transformer-engine-cu13": "CUDA 13 build of Transformer Engine; use ROCm/TransformerEngine",
    "nvidia-modelopt": "NVIDIA Model Optimizer is CUDA-only; its imports are guarded by the guard-nvidia-only-imports codemod",
    "nvidia-resiliency-ext": "NVIDIA fault tolerance (NVML, CUDA checkpointing) is CUDA-only; its imports are guarded",
    "nv-grouped-gemm": "CUDA grouped-GEMM kernels; install ROCm's grouped_gemm build, or Megatron falls back to sequential GEMMs",
    "grouped-gemm": "CUDA grouped-GEMM kernels; install ROCm's grouped_gemm build, or Megatron falls back to sequential GEMMs",
    "flashinfer-python": "FlashInfer ships CUDA kernels only",
    "flashinfer-cubin": "FlashInfer's CUDA binaries",
    "mamba-ssm": "PyPI's mamba-ssm builds CUDA kernels; for SSM models install ROCm's build (ROCm/mamba)",
    "causal-conv1d": "PyPI's causal-conv1d builds CUDA kernels; for SSM models install the ROCm build",
    "fast-hadamard-transform": "a CUDA extension (Dao-AILab); no ROCm build on PyPI",
    "flash-mla": "FlashMLA is a Hopper (SM90) CUDA kernel",
    "nvidia-cudnn-frontend": "cuDNN is NVIDIA-only",
    "nvidia-mathdx": "NVIDIA math device extensions (CUDA)",
}
# Where a dropped distribution has a ROCm build, the rewritten array says how to install it.
ROCM_INSTALL = {
    "transformer-engine": "pip install --no-build-isolation git+https://github.com/ROCm/TransformerEngine.git",
    "mamba-ssm": "pip install --no-build-isolation git+https://github.com/ROCm/mamba.git",
    "nv-grouped-gemm": "pip install --no-build-isolation git+https://github.com/ROCm/grouped_gemm.git",
}
# The archs a manifest's install hint builds for (the MI300/MI350 default of `emit docker --arch`).
DEFAULT_ARCHS = "gfx942;gfx950"
# Names no rule above lists but that are CUDA builds all the same.
CUDA_ONLY_PATTERNS = (
    r"nvidia-.*",
    r"transformer-engine.*",
    r"flashinfer.*",
    r"cupy-cuda.*",
    r"cuda-python",
    r"pynvml",
    r"nvidia-ml-py",
    r".*-cu1[0-9]+",
)
_CUDA_ONLY = re.compile("|".join(f"(?:{p})" for p in CUDA_ONLY_PATTERNS))
_CUDA_EXTRA = re.compile(r"^(core_)?cu(da)?\d+$")
# Packages named nvidia-* that are not CUDA builds.
NOT_CUDA = {"nvidia-sphinx-theme"}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _rocm_build(name: str) -> bool:
    """A ROCm build by its name (transformer-engine-rocm-torch): never a CUDA one."""
    return "rocm" in name.split("-")


def is_cuda_only(requirement: str) -> bool:
    try:
        name = canonical(Requirement(requirement).name)
    except InvalidRequirement:
        return False
    return name not in NOT_CUDA and not _rocm_build(name) and (name in DEFAULT_DROP or bool(_CUDA_ONLY.fullmatch(name)))


@dataclass
class Policy:
    """Per-series settings (`manifests:` in the series), on top of the defaults."""

    drop: dict[str, str] = field(default_factory=dict)  # extra distributions to drop, with reasons
    keep: list[str] = field(default_factory=list)  # distributions never dropped here
    megatron_lm_path: str | None = None  # Bridge: where the ported Megatron-LM tree is
    rocm: Matrix | None = None  # the line's ROCm component matrix (`rocm:` in the series)

    def component(self, name: str) -> Component | None:
        """The matrix component that stands in for an upstream distribution (transformer-engine -> ROCm TE)."""
        if self.rocm is None:
            return None
        return next((c for c in self.rocm.components.values() if name in {canonical(r) for r in c.replaces}), None)

    @property
    def package_index(self) -> str | None:
        return self.rocm.package_index if self.rocm is not None else None

    def replacement(self, requirement: str) -> str | None:
        """The real requirement on the ROCm build, where the matrix names a package index that serves one."""
        req = Requirement(requirement)
        comp = self.component(canonical(req.name))
        if comp is None or not comp.package or not self.package_index:
            return None
        return f"{comp.package}{comp.versions}" + (f"; {req.marker}" if req.marker else "")

    def reason(self, requirement: str) -> str | None:
        try:
            req = Requirement(requirement)
        except InvalidRequirement:
            return None
        name = canonical(req.name)
        if name in {canonical(k) for k in self.keep} or name in NOT_CUDA or _rocm_build(name):
            return None
        drops = {**DEFAULT_DROP, **{canonical(k): v for k, v in self.drop.items()}}
        if name in drops:
            return drops[name]
        if _CUDA_ONLY.fullmatch(name):
            return "a CUDA build (CUDA-only distribution name)"
        return None


@dataclass
class Change:
    file: str
    where: str  # dependencies | optional-dependencies.<extra> | tool.uv.sources | line N
    requirement: str
    action: str  # dropped | replaced | extras-trimmed | repointed
    reason: str

    def to_dict(self) -> dict:
        return self.__dict__.copy()


def _trim_cuda_extras(requirement: str) -> str | None:
    """`pkg[torch,cu12]>=1` -> `pkg[torch]>=1` (None when nothing to trim)."""
    req = Requirement(requirement)
    cuda = sorted(e for e in req.extras if _CUDA_EXTRA.match(e))
    if not cuda:
        return None
    keep = sorted(set(req.extras) - set(cuda))
    return re.sub(r"\[[^\]]*\]", f"[{','.join(keep)}]" if keep else "", requirement, count=1)


def _rewrite_array(array, policy: Policy, file: str, where: str, out: list[Change]) -> None:
    changes: list[Change] = []
    for i in reversed(range(len(array))):  # bottom-up so indices stay valid
        text = str(array[i])
        why = policy.reason(text)
        if why:
            replacement = policy.replacement(text)
            if replacement:
                array[i] = replacement
                changes.append(
                    Change(file, where, text, "replaced", f"the ROCm build {replacement} from {policy.package_index}")
                )
            else:
                del array[i]
                comp = policy.component(canonical(Requirement(text).name))
                if comp is not None and comp.git:
                    why = f"no ROCm build on PyPI; the line's ROCm matrix builds {comp.name} from {comp.git}@{comp.ref}"
                changes.append(Change(file, where, text, "dropped", why))
            continue
        trimmed = _trim_cuda_extras(text) if text.strip() else None
        if trimmed:
            array[i] = trimmed
            changes.append(Change(file, where, text, "extras-trimmed", f"CUDA-specific extras removed: now {trimmed}"))
    out += reversed(changes)
    hinted = set()
    for change in reversed(changes):
        if change.action not in ("dropped", "replaced"):
            continue
        name = canonical(Requirement(change.requirement).name)
        comp = policy.component(name)
        key = comp.name if comp is not None else name
        if key in hinted:
            continue
        if change.action == "replaced" and comp is not None:
            hinted.add(key)
            array.add_line(
                comment=f"rocmport: {comp.package} is on the ROCm package index: pip install --extra-index-url "
                f"{policy.package_index} ...",
                indent="    ",
            )
        elif comp is not None:
            hinted.add(key)
            array.add_line(
                comment=f"rocmport: {name} has no ROCm build on PyPI; on ROCm ({DEFAULT_ARCHS}; set the archs "
                f"for your GPUs): {comp.install_command(DEFAULT_ARCHS)}",
                indent="    ",
            )
        elif name in ROCM_INSTALL:
            hinted.add(key)
            array.add_line(
                comment=f"rocmport: {name} has no ROCm build on PyPI; on ROCm: {ROCM_INSTALL[name]}", indent="    "
            )


def rewrite_pyproject(text: str, policy: Policy, file: str = "pyproject.toml") -> tuple[str, list[Change]]:
    doc = tomlkit.parse(text)
    changes: list[Change] = []
    project = doc.get("project")
    if project is not None:
        if "dependencies" in project:
            _rewrite_array(project["dependencies"], policy, file, "dependencies", changes)
        for extra, array in (project.get("optional-dependencies") or {}).items():
            _rewrite_array(array, policy, file, f"optional-dependencies.{extra}", changes)
    sources = doc.get("tool", {}).get("uv", {}).get("sources", {})
    core = sources.get(MEGATRON_LM.distribution) if hasattr(sources, "get") else None
    if (
        policy.megatron_lm_path
        and core is not None
        and hasattr(core, "get")
        and core.get("path") not in (None, policy.megatron_lm_path)
    ):
        before = core["path"]
        core["path"] = policy.megatron_lm_path
        changes.append(
            Change(
                file,
                f"tool.uv.sources.{MEGATRON_LM.distribution}",
                f"path = {before!r}",
                "repointed",
                f"the gitlinked 3rdparty/Megatron-LM is empty in a checkout; use the ported tree {policy.megatron_lm_path}",
            )
        )
    return tomlkit.dumps(doc), changes


def rewrite_requirements(text: str, policy: Policy, file: str) -> tuple[str, list[Change]]:
    out, changes = [], []
    for n, line in enumerate(text.splitlines(keepends=True), 1):
        body = line.split("#", 1)[0].strip()
        why = policy.reason(body) if body and not body.startswith("-") else None
        if why:
            replacement = policy.replacement(body)
            if replacement:
                out.append(line.replace(body, replacement, 1))
                changes.append(
                    Change(
                        file, f"line {n}", body, "replaced", f"the ROCm build {replacement} from {policy.package_index}"
                    )
                )
            else:
                changes.append(Change(file, f"line {n}", body, "dropped", why))
            continue
        out.append(line)
    return "".join(out), changes


def requirement_files(tree: Path) -> list[Path]:
    """Requirements files used to install the package (not examples', tests' or docs'): regular
    files reached without following a link (a link is never read or rewritten)."""
    return [
        tree / rel for pattern in MANIFEST_GLOBS if pattern != "pyproject.toml" for rel in tree_files(tree, pattern)
    ]


def rewrite_tree(tree: Path, policy: Policy) -> tuple[dict[str, str], list[Change]]:
    """New texts of the manifests that change, and every change; writes nothing."""
    texts: dict[str, str] = {}
    changes: list[Change] = []
    if tree_is_file(tree, "pyproject.toml"):
        old = tree_read_text(tree, "pyproject.toml")
        new, found = rewrite_pyproject(old, policy)
        if new != old:
            texts["pyproject.toml"] = new
        changes += found
    for path in requirement_files(tree):
        rel = path.relative_to(tree).as_posix()
        old = tree_read_text(tree, rel)
        new, found = rewrite_requirements(old, policy, rel)
        if new != old:
            texts[rel] = new
        changes += found
    return texts, changes


def cuda_only_requirements(tree: Path) -> list[tuple[str, str]]:
    """(file, requirement) for every CUDA-only requirement left in the tree's install manifests."""
    from rocmport._compat import tomllib

    found = []
    if tree_is_file(tree, "pyproject.toml"):
        project = tomllib.loads(tree_read_text(tree, "pyproject.toml")).get("project", {})
        reqs = list(project.get("dependencies", []))
        for extra in (project.get("optional-dependencies") or {}).values():
            reqs += extra
        found += [("pyproject.toml", r) for r in reqs if is_cuda_only(r)]
    for path in requirement_files(tree):
        for line in tree_read_text(tree, path.relative_to(tree)).splitlines():
            body = line.split("#", 1)[0].strip()
            if body and not body.startswith("-") and is_cuda_only(body):
                found.append((path.relative_to(tree).as_posix(), body))
    return found


def policy_from_series(
    options: dict | bool | None, megatron_lm_path: str | None = None, rocm: Matrix | None = None
) -> Policy | None:
    """None when the series turns the rewrite off (`manifests: false`)."""
    if options is False:
        return None
    options = options if isinstance(options, dict) else {}
    return Policy(
        drop=dict(options.get("drop") or {}),
        keep=list(options.get("keep") or []),
        megatron_lm_path=megatron_lm_path,
        rocm=rocm,
    )


def pip_dry_run(
    requirements: list[str], index_url: str | None = None, extra_args: tuple[str, ...] = (), python: str | None = None
) -> tuple[list[str], str]:
    """What `pip install --dry-run --report` would install into this environment (or ``python``'s;
    torch and everything already installed count as satisfied: that is the point on a ROCm image),
    and pip's error text."""
    import json
    import subprocess
    import sys
    import tempfile

    with tempfile.TemporaryDirectory(prefix="rocmport-dry-") as tmp:
        report = Path(tmp) / "report.json"
        cmd = [
            python or sys.executable,
            "-m",
            "pip",
            "install",
            "--dry-run",
            "--report",
            str(report),
            "--no-build-isolation",
            *(["--index-url", index_url] if index_url else []),
            *extra_args,
            *requirements,
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
        if proc.returncode != 0 or not report.is_file():
            return [], _pip_error(proc.stdout, proc.stderr)
        data = json.loads(report.read_text())
    return sorted(canonical(item["metadata"]["name"]) for item in data.get("install", [])), ""


def _pip_error(stdout: str, stderr: str) -> str:
    """pip's failure in one line: its ERROR: line, or, when a dependency's own build failed (pip then
    ends on "hint: See above for details."), what failed, the build's last exception and the
    distribution pip was collecting (or processing, for a local file)."""
    errors = [ln for ln in stderr.splitlines() if ln.startswith("ERROR:")]
    if errors:
        return errors[-1]
    kind = next((ln[len("error: ") :].strip() for ln in stderr.splitlines() if ln.startswith("error: ")), None)
    # The build's own last words: an exception, or a setuptools "error: ..." inside pip's box.
    raised = [
        ln.strip()
        for ln in stderr.splitlines()
        if re.match(r"^\s*\w+(Error|Exception): |^\s+error: (?!subprocess-exited)", ln)
    ]
    collecting = [ln.strip() for ln in stdout.splitlines() if ln.startswith(("Collecting ", "Processing "))]
    if kind or raised:
        text = ": ".join(x for x in (kind, raised[-1] if raised else None) if x)
        return text + (f" ({collecting[-1][0].lower()}{collecting[-1][1:]})" if collecting else "")
    lines = stderr.strip().splitlines()
    return lines[-1] if lines else "pip failed"


def cuda_only_installs(names: list[str]) -> list[str]:
    return [n for n in names if is_cuda_only(n)]
