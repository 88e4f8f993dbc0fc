"""The container recipe for a ported Megatron on ROCm: a multi-stage Dockerfile on a `rocm/pytorch`
image. One stage per ROCm component of the line's matrix (Transformer Engine, flash-attention, apex,
grouped_gemm) clones its pinned ref and builds a wheel for the chosen archs (clone and build are
separate layers, and each component is its own stage, so changing one rebuilds only that one); one
stage builds the ported packages' wheels from the `rocmport build` sdists with the image's own Python;
the last stage installs them all without letting anything replace the image's ROCm torch (it is
recorded first and compared last: the build fails if it changed) and ends with the smoke imports."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import InvalidSpecifier, SpecifierSet

from rocmport import __version__
from rocmport._compat import tomllib
from rocmport.config import Settings
from rocmport.errors import BadInput
from rocmport.launch_env import LAUNCH_ENV
from rocmport.package.build import needs_torch_to_build
from rocmport import components
from rocmport.components import PLACEHOLDERS, Choice, Matrix
from rocmport.codemods.declared import check_series
from rocmport.patches.series import select_series
from rocmport.port.manifests import canonical, is_cuda_only
from rocmport.upstream.lock import load_lock
from rocmport.upstreams import MEGATRON_LM, NAMES, UPSTREAMS
from rocmport.machine.launch_profile import ARCH_SETTINGS

DEFAULT_BASE_TAG = "rocm7.0_ubuntu24.04_py3.12_pytorch_release_2.7.1"
DEFAULT_ARCH = "gfx942;gfx950"
DEFAULT_MAX_JOBS = 16
# Provided by the image (torch and its ROCm builds) or by the wheels themselves.
NOT_FROM_INDEX = {
    "torch",
    "torchvision",
    "torchaudio",
    "triton",
    "pytorch-triton-rocm",
    *(u.distribution for u in UPSTREAMS.values()),
}
# A ROCm TE image sets these (the matrix's transformer_engine runtime_env says so too); kept in every image.
ROCM_TE_ENV = [
    ("NVTE_FLASH_ATTN", "0", "ROCm TE: flash-attention backend off"),
    ("NVTE_FUSED_ATTN", "1", "ROCm TE: fused (CK/AOTriton) attention on"),
]
TAG_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
TORCH_DISTS = ("torch", "torchvision", "torchaudio", "pytorch-triton-rocm", "triton")
STATE = "/opt/rocmport"
# Every stage says it (the linter reads stages apart): bash for arrays and ${var//;/,}, pipefail for pipes.
SHELL = 'SHELL ["/bin/bash", "-o", "pipefail", "-c"]'


@dataclass(frozen=True)
class Sdist:
    """A ported package the image builds from its `rocmport build` sdist."""

    distribution: str  # megatron-core
    isolation: bool = True  # False: its build needs torch (Bridge), so it builds against the image's

    @property
    def pattern(self) -> str:
        return f"{re.sub(r'[-_.]+', '_', self.distribution)}-*.tar.gz"


def check_base_tag(tag: str) -> str:
    if not tag or not TAG_RE.match(tag):
        raise BadInput(
            f"--base-tag {tag!r}: not a Docker image tag (letters, digits, '_', '.', '-'; e.g. {DEFAULT_BASE_TAG})"
        )
    return tag


def tag_python(tag: str) -> str | None:
    """'rocm7.0_ubuntu24.04_py3.12_pytorch_release_2.7.1' -> '3.12' (None when the tag does not say)."""
    m = re.search(r"(?:^|_)py(3)\.?(\d{1,2})(?:_|$)", tag)
    return f"{m.group(1)}.{m.group(2)}" if m else None


def check_python(tag: str, trees: list[Path]) -> None:
    """A tag whose Python the ported trees do not support would build nothing useful: refuse it."""
    python = tag_python(tag)
    if python is None:
        return
    for tree in trees:
        pyproject = tree / "pyproject.toml"
        if not pyproject.is_file():
            continue
        spec = tomllib.loads(pyproject.read_text(encoding="utf-8")).get("project", {}).get("requires-python")
        try:
            if spec and not SpecifierSet(spec).contains(f"{python}.0"):
                raise BadInput(
                    f"--base-tag {tag}: its Python {python} does not satisfy {tree.name}'s requires-python {spec} "
                    f"({pyproject}); choose a py{spec.lstrip('>=~ ')} image"
                )
        except InvalidSpecifier:
            continue


def remaining_requirements(
    trees: list[Path], extras: dict[str, list[str]], skip: frozenset[str] | set[str] = frozenset()
) -> list[str]:
    """Dependencies of the ported packages (and the chosen extras) the wheels' --no-deps install skips
    (not those the image builds itself: ``skip``)."""
    found: dict[str, Requirement] = {}
    skipped = {canonical(s) for s in skip}
    wanted = {canonical(dist): names for dist, names in extras.items()}
    projects = {}
    for tree in trees:
        pyproject = tree / "pyproject.toml"
        if pyproject.is_file():
            project = tomllib.loads(pyproject.read_text(encoding="utf-8")).get("project", {})
            projects[canonical(project.get("name", ""))] = (tree, project)
    _check_extras(wanted, {name: project for name, (_, project) in projects.items()})
    for tree, project in projects.values():
        reqs = list(project.get("dependencies", []))
        for extra in wanted.get(canonical(project.get("name", "")), []):
            reqs += (project.get("optional-dependencies") or {}).get(extra, [])
        for text in reqs:
            req = Requirement(text)
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
            name = canonical(req.name)
            if name in NOT_FROM_INDEX or name in skipped or is_cuda_only(text):
                continue
            req.marker = None
            if name in found:  # the same dependency of both packages: both bounds hold
                found[name].specifier &= req.specifier
                found[name].extras |= req.extras
            else:
                found[name] = req
    return [str(found[k]) for k in sorted(found)]


def _check_extras(wanted: dict[str, list[str]], projects: dict[str, dict]) -> None:
    """Every --extra DIST:EXTRA names a ported package and one of its extras: one that does not
    would be dropped silently (and, given at all, --extra replaces the default megatron-core:mlm).
    Trees without a pyproject.toml (nothing to install from it) have nothing to check."""
    if not projects:
        return
    for dist, names in wanted.items():
        if dist not in projects:
            raise BadInput(
                f"--extra {dist}:{names[0]}: no ported package is named {dist}; "
                f"the ported packages: {', '.join(sorted(projects)) or 'none'}"
            )
        have = projects[dist].get("optional-dependencies") or {}
        for extra in names:
            if extra not in have:
                raise BadInput(
                    f"--extra {dist}:{extra}: {dist} has no extra {extra!r}; its extras: {', '.join(sorted(have)) or 'none'}"
                )


def _sh(text: str, name: str) -> str:
    """A matrix value with its placeholders as shell expansions (so build args still reach it)."""
    values = {**PLACEHOLDERS, "src": f"{STATE}/src/{name}"}
    return re.sub(r"\{([a-z_]+)\}", lambda m: values.get(m.group(1), m.group(0)), text)


def _stage_name(choice: Choice) -> str:
    return choice.component.name.replace("_", "-")


def _arg_name(choice: Choice) -> str:
    return choice.component.name.upper()


def _component_stage(choice: Choice) -> str:
    c = choice.component
    src = f"{STATE}/src/{c.name}"
    build_env, _ = c.settings(choice.variant)
    # An ENV/ARG of every stage already (PYTORCH_ROCM_ARCH, MAX_JOBS): no self-assignment.
    env = "".join(f'{k}="{_sh(v, c.name)}" ' for k, v in build_env.items() if _sh(v, c.name) != f"${{{k}}}")
    arg = _arg_name(choice)
    dynamic_ref = "{" in (c.ref or "")
    ref = f'"{_sh(c.ref or "", c.name)}"' if dynamic_ref else f'"${{{arg}_REF}}"'
    prepare = "".join(f" \\\n && {_sh(p, c.name)}" for p in c.prepare)
    pip_args = "".join(f" {a}" for a in c.pip_args)
    fetch = (
        f"git init -q {src} \\\n"
        f' && git -C {src} fetch -q --depth 1 "${{{arg}_REPO}}" {ref} \\\n'
        f" && git -C {src} checkout -q FETCH_HEAD \\\n"
        f" && git -C {src} submodule update -q --init --recursive{prepare}"
    )
    build = f"{env}\\\n    pip wheel --no-cache-dir --no-build-isolation --no-deps{pip_args} --wheel-dir {STATE}/wheels {src}"
    variant = f" ({choice.variant} variant)" if choice.variant else ""
    ref_args = f"ARG {arg}_REPO={c.git}\n" + ("" if dynamic_ref else f"ARG {arg}_REF={c.ref}\n")
    # It builds without isolation (against the image's torch): what its build imports, torch pinned.
    needs = " ".join(f'"{r}"' for r in c.build_requires)
    requires = f"pip install --no-cache-dir --constraint {STATE}/torch-constraint.txt {needs}" if needs else ""
    if c.keep_image_build:
        smoke = c.smoke
        return f"""\
# {c.name}{variant}: kept from the image when `{smoke}` passes there, else built from {c.git}@{c.ref}.
FROM base AS {_stage_name(choice)}
{SHELL}
{ref_args}ARG MAX_JOBS
RUN if python -c "{smoke}" 2>/dev/null; then echo "{c.name}: the image's build is kept"; else \\
    {(requires + " && " + chr(92) + chr(10) + "    ") if requires else ""}{fetch.replace(chr(10), chr(10) + "    ")} \\
 && {build}; fi
"""
    return f"""\
# {c.name}{variant}: {c.git}@{c.ref}, a wheel for ${{PYTORCH_ROCM_ARCH}}.
FROM base AS {_stage_name(choice)}
{SHELL}
{("RUN " + requires + chr(10)) if requires else ""}{ref_args}RUN {fetch}
ARG MAX_JOBS
RUN {build}
"""


def dockerfile(
    requirements: list[str],
    *,
    base_tag: str = DEFAULT_BASE_TAG,
    arch: str = DEFAULT_ARCH,
    dist: str = "dist",
    choices: list[Choice] | tuple = (),
    sdists: list[Sdist] | tuple = (Sdist(MEGATRON_LM.distribution),),
    max_jobs: int = DEFAULT_MAX_JOBS,
    matrix: Matrix | None = None,
    file_name: str | None = None,
    repository: str = "rocm/pytorch",
) -> str:
    """The Dockerfile text; ``file_name`` is where it will be written (None: stdout, the header says so)."""
    check_base_tag(base_tag)
    settings = {name: (value, why) for name, value, why in ROCM_TE_ENV}
    for choice in choices:
        for name, value in choice.component.settings(choice.variant)[1].items():
            settings[name] = (value, f"{choice.label} (the series' rocm: matrix)")
    settings.update({name: (value, why) for name, value, why in LAUNCH_ENV})
    # One arch: its launch profile (`rocmport env --arch`) too; an image for several archs keeps the
    # common part, and the launcher adds the device's (`rocmport env --arch auto`).
    archs = components.parse_archs(arch)
    if len(archs) == 1:
        settings.update(
            {s.name: (s.value, f"{archs[0]}: {s.reason} ({s.source})") for s in ARCH_SETTINGS.get(archs[0], [])}
        )
    env = [(name, value, why) for name, (value, why) in settings.items()]
    env_lines = " \\\n    ".join(f"{name}={value}" for name, value, _ in env)
    reasons = "\n".join(f"#   {name}={value}: {reason}" for name, value, reason in env)
    reqs = " \\\n        ".join(f'"{r}"' for r in requirements)
    install_reqs = (
        (
            "# Specifiers come from the ported manifests; the image's packages and the torch constraint decide the rest.\n"
            f"RUN pip install --no-cache-dir --constraint {STATE}/torch-constraint.txt \\\n        {reqs}\n\n"
        )
        if requirements
        else ""
    )
    listing = (
        "".join(
            f"#   {c.label:<22} {c.component.git}@{c.component.ref}  ({c.component.versions or 'any version'}"
            f"{', required' if c.component.required else ''})\n"
            for c in choices
        )
        or "#   none (--components none): the ported packages only\n"
    )
    source = f" for {matrix.where}" if matrix is not None else ""
    stages = "\n".join(_component_stage(c) for c in choices)
    sdist_copy = " ".join(f"{dist}/{s.pattern}" for s in sdists)
    sdist_checks = "".join(
        f' \\\n && files=({STATE}/sdist/{s.pattern}) && [ "${{#files[@]}}" = 1 ]'
        f' || {{ echo "{dist}/ must hold exactly one {s.pattern} (rocmport build writes it)"; exit 1; }}'
        for s in sdists
    )
    sdist_builds = "".join(
        f" \\\n && pip wheel --no-cache-dir --no-deps{'' if s.isolation else ' --no-build-isolation'} --wheel-dir {STATE}/port-wheels {STATE}/sdist/{s.pattern}"
        for s in sdists
    )
    copies = "".join(f"COPY --from={_stage_name(c)} {STATE}/wheels/ /tmp/rocmport-components/\n" for c in choices)
    install_components = (
        (
            "# The components with their own dependencies, under the constraint that pins the image's torch.\n"
            f"RUN shopt -s nullglob && wheels=(/tmp/rocmport-components/*.whl) \\\n"
            f' && if [ "${{#wheels[@]}}" -gt 0 ]; then pip install --no-cache-dir --constraint {STATE}/torch-constraint.txt "${{wheels[@]}}"; fi \\\n'
            f" && rm -rf /tmp/rocmport-components\n\n"
        )
        if choices
        else ""
    )
    smokes = "".join(f' \\\n && python -c "{c.component.smoke}"' for c in choices)
    grep = "|".join(re.escape(d) for d in TORCH_DISTS)
    return f"""\
# syntax=docker/dockerfile:1
# Generated by rocmport {__version__}{source}: the ported Megatron on ROCm, built for {arch}.
# Build it from the project directory once `rocmport build` has put the ported sdists in {dist}/:
#   rocmport build && docker build -f {file_name or "<this file>"} .
# ROCm components (the series' rocm: matrix names the source of each choice):
{listing}# The archs were checked against that matrix: change them with `rocmport emit docker --arch`, not with
# --build-arg PYTORCH_ROCM_ARCH (which skips the check). --build-arg MAX_JOBS=N sets build parallelism.
ARG ROCM_PYTORCH_TAG={base_tag}
ARG MAX_JOBS={max_jobs}
FROM {repository}:${{ROCM_PYTORCH_TAG}} AS base

{SHELL}

# GPU targets for everything compiled in this image.
ARG PYTORCH_ROCM_ARCH="{arch}"
ENV PYTORCH_ROCM_ARCH=${{PYTORCH_ROCM_ARCH}}

# The image's torch is ROCm's: check it, and record it (a constraint for every install, a freeze to
# compare with at the end), so nothing can replace it unnoticed.
RUN python -c "import torch; assert torch.version.hip, 'rocm/pytorch image without a ROCm torch'" \\
 && mkdir -p {STATE}/wheels \\
 && python -c "import torch; print('torch==' + torch.__version__)" > {STATE}/torch-constraint.txt \\
 && pip freeze | grep -i -E '^({grep})( @|==)' | sort > {STATE}/torch-freeze.txt

{stages}
# The ported packages: wheels built here from the `rocmport build` sdists, for the image's own Python.
FROM base AS port
{SHELL}
COPY {sdist_copy} {STATE}/sdist/
RUN true{sdist_checks}{sdist_builds}

FROM base AS image
{SHELL}
{copies}COPY --from=port {STATE}/port-wheels/ /tmp/rocmport-wheels/
{install_components}# The ported packages without their dependencies (pip would otherwise re-resolve torch) ...
RUN pip install --no-cache-dir --no-deps /tmp/rocmport-wheels/*.whl \\
 && rm -rf /tmp/rocmport-wheels

# ... and then those dependencies, the image's torch pinned.
{install_reqs}# Runtime environment: the components' settings and the launcher environment (`rocmport env`):
{reasons}
ENV {env_lines}

# Fails the build if torch changed after all, or a component or the port does not import.
RUN pip freeze | grep -i -E '^({grep})( @|==)' | sort | diff -u {STATE}/torch-freeze.txt - \\
 && python -c "import torch; assert 'torch==' + torch.__version__ == open('{STATE}/torch-constraint.txt').read().strip()"{smokes} \\
 && python -c "import {MEGATRON_LM.module}, {MEGATRON_LM.helper_module} as r; assert r.is_hip()"
"""


@dataclass
class Recipe:
    text: str
    warnings: list[str]
    summary: str


def project_dockerfile(
    settings: Settings,
    extras: dict[str, list[str]],
    *,
    base_tag: str | None = None,
    arch: str = DEFAULT_ARCH,
    spec: str | None = None,
    max_jobs: int = DEFAULT_MAX_JOBS,
    dist: str = "dist",
    file_name: str | None = None,
) -> Recipe:
    """`rocmport emit docker`: the recipe for the project's ported trees, the locked line's ROCm matrix
    (``spec``: all | none | name[:variant],...; None: all, or none without a matrix) and the extras."""
    archs = components.parse_archs(arch)
    if base_tag is not None:
        check_base_tag(base_tag)
    if not dist or Path(dist).is_absolute() or ".." in Path(dist).parts:
        raise BadInput(f"--dist {dist!r}: give a directory inside the build context, e.g. dist")
    present = [n for n in NAMES if settings.worktree_path(n).is_dir()]
    if MEGATRON_LM.name not in present:
        raise BadInput(
            f"{settings.worktree_path(MEGATRON_LM.name)}: no ported tree; run `rocmport apply` (and `rocmport build`) first"
        )
    trees = [settings.worktree_path(n) for n in present]
    lock = load_lock(settings.lock_path)
    series = check_series(
        select_series(settings.patchsets_dir, MEGATRON_LM.name, lock.upstreams[MEGATRON_LM.name].version)
    )
    matrix, warnings = series.rocm, []
    if matrix is None and spec not in (None, "none"):
        raise BadInput(
            f"--components {spec}: {series.path} has no rocm: section to build them from; add one "
            f"(docs/component-matrix.md) or pass --components none"
        )
    choices: list[Choice] = []
    if matrix is None:
        warnings.append(f"{series.path}: no rocm: section: the slim image (the ported packages only)")
    else:
        choices, more = components.choose(matrix, spec or "all", archs)
        warnings += more
    tag = base_tag or (matrix.base_tag if matrix is not None else DEFAULT_BASE_TAG)
    check_python(tag, trees)
    skip = {d for c in choices for d in (*c.component.distributions, *c.component.replaces)}
    sdists = [
        Sdist(
            UPSTREAMS[n].distribution,
            isolation=not ((tree / "pyproject.toml").is_file() and needs_torch_to_build(tree)),
        )
        for n, tree in zip(present, trees)
    ]
    text = dockerfile(
        remaining_requirements(trees, extras, skip),
        base_tag=tag,
        arch=";".join(archs),
        dist=dist.rstrip("/"),
        choices=choices,
        sdists=sdists,
        max_jobs=max_jobs,
        matrix=matrix,
        file_name=file_name,
        repository=matrix.base_repository if matrix is not None else "rocm/pytorch",
    )
    summary = f"{', '.join(c.label for c in choices) or 'no components'} for {';'.join(archs)} on rocm/pytorch:{tag}"
    return Recipe(text, warnings, summary)
