"""The ROCm component matrix of a release line: the `rocm:` section of a series.

For the base image and each accelerated component (Transformer Engine, flash-attention, apex,
grouped_gemm): where it comes from (a git URL and ref, or the image itself), the version range the
line needs, how to build it for a list of GPU archs, which archs it builds for (and what to use
instead where it does not), a smoke import, and the distribution names `doctor` looks up.

One typed model and one validator: `validate(data, where)` returns every problem as
`<file>: key 'rocm.<path>': <what is wrong>`; `parse(data, where)` raises the first one as bad input
(exit 2). `emit docker`, `doctor`, `verify` and the manifest rewrite read the model, never the YAML."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from rocmport.errors import BadInput

COMPONENTS = ("transformer_engine", "flash_attn", "apex", "grouped_gemm")
ARCH_RE = re.compile(r"^gfx[0-9]{2,3}[0-9a-f]$")
# Placeholders a build setting or command may use; the Dockerfile turns them into shell expansions so
# `--build-arg PYTORCH_ROCM_ARCH=...` and `--build-arg MAX_JOBS=...` still reach every build.
PLACEHOLDERS = {
    "archs": "${PYTORCH_ROCM_ARCH}",  # gfx942;gfx950 (what torch and flash-attention read)
    "archs_comma": "$(echo \"${PYTORCH_ROCM_ARCH}\" | tr ';' ',')",  # gfx942,gfx950 (ROCm TE's NVTE_ROCM_ARCH)
    "max_jobs": "${MAX_JOBS}",
    "src": "/opt/rocmport/src/{name}",
    "torch_minor": "$(python -c 'import torch; print(torch.__version__.split(\".\")[1])')",
}
_PLACEHOLDER_RE = re.compile(r"\{([a-z_]+)\}")
_ENV_NAME_RE = re.compile(r"^[A-Z_][A-Z0-9_]*$")
_GIT_URL_RE = re.compile(r"^https://[A-Za-z0-9.-]+/[\w.-]+/[\w.-]+?(\.git)?$")
_REF_RE = re.compile(r"^[A-Za-z0-9][\w./{}-]*$")
_DIST_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_TAG_RE = re.compile(r"^[\w][\w.-]{0,127}$")


@dataclass(frozen=True)
class ArchSupport:
    """What a component does on one GPU arch."""

    status: str  # builds | refuses | unverified
    reason: str = ""
    instead: str = ""  # refuses: what to use instead (a variant name `flash_attn:triton`, or advice)


@dataclass
class Variant:
    """Another build of the same component (flash-attention's Triton backend): its own settings and archs."""

    name: str
    description: str
    build_env: dict[str, str] = field(default_factory=dict)
    runtime_env: dict[str, str] = field(default_factory=dict)
    builds: list[str] = field(default_factory=list)
    unverified: list[str] = field(default_factory=list)


@dataclass
class Component:
    name: str
    required: bool
    versions: SpecifierSet
    distributions: list[str]
    smoke: str
    git: str | None = None
    ref: str | None = None
    keep_image_build: bool = False  # the image's own build is kept when its smoke import passes (apex)
    package: str | None = None  # a distribution a ROCm package index serves (manifests, with --rocm-index)
    replaces: list[str] = field(default_factory=list)  # upstream requirements it stands in for (manifests)
    prepare: list[str] = field(default_factory=list)  # shell commands run on the checkout before building
    build_requires: list[str] = field(default_factory=list)  # what its build imports (it builds without isolation)
    pip_args: list[str] = field(default_factory=list)
    build_env: dict[str, str] = field(default_factory=dict)
    runtime_env: dict[str, str] = field(default_factory=dict)
    builds: list[str] = field(default_factory=list)
    unverified: list[str] = field(default_factory=list)
    refuses: dict[str, ArchSupport] = field(default_factory=dict)
    variants: dict[str, Variant] = field(default_factory=dict)

    @property
    def source(self) -> str:
        """Where it comes from, in words: its git repository at the ref, or the base image's own."""
        return f"{self.git}@{self.ref}" if self.git else "the image"

    def support(self, arch: str, variant: str | None = None) -> ArchSupport:
        """builds / refuses (with reason and what instead) / unverified, for one arch."""
        if variant:
            v = self.variants[variant]
            if arch in v.builds:
                return ArchSupport("builds")
            if arch in v.unverified:
                return ArchSupport("unverified", f"{self.name}:{variant} on {arch} is not verified by any source")
            return ArchSupport("refuses", f"{self.name}:{variant} is not known to build for {arch}")
        if arch in self.builds:
            return ArchSupport("builds")
        if arch in self.refuses:
            return self.refuses[arch]
        return ArchSupport(
            "unverified",
            self.refuses.get("*", ArchSupport("unverified")).reason
            or f"no source says whether {self.name} builds for {arch}",
        )

    def settings(self, variant: str | None = None) -> tuple[dict[str, str], dict[str, str]]:
        """(build_env, runtime_env) of the component or one of its variants."""
        if variant:
            v = self.variants[variant]
            return {**self.build_env, **v.build_env}, {**self.runtime_env, **v.runtime_env}
        return dict(self.build_env), dict(self.runtime_env)

    @property
    def module(self) -> str:
        """The top-level module its smoke import starts with (what doctor looks for)."""
        for node in ast.walk(ast.parse(self.smoke)):
            if isinstance(node, ast.Import):
                return node.names[0].name.split(".")[0]
            if isinstance(node, ast.ImportFrom) and node.module:
                return node.module.split(".")[0]
        return self.name

    def admits(self, version: str) -> bool:
        try:
            return self.versions.contains(Version(version), prereleases=True)
        except InvalidVersion:
            return False

    def install_command(self, archs: str = "gfx942;gfx950", variant: str | None = None) -> str:
        """The exact shell command that installs it from source on a ROCm machine (manifests' comment)."""
        if not self.git:
            return f"(provided by the rocm/pytorch image; `{self.smoke}` checks it)"
        build_env, _ = self.settings(variant)
        values = {
            "archs": archs,
            "archs_comma": archs.replace(";", ","),
            "max_jobs": "$(nproc)",
            "src": self.name,
            "torch_minor": PLACEHOLDERS["torch_minor"],
        }
        env = " ".join(f"{k}={_shell_value(_fill(v, values))}" for k, v in build_env.items())
        ref = _fill(self.ref or "", values)
        extra = " ".join(self.pip_args)
        needs = " ".join(f"'{r}'" for r in self.build_requires)
        return (
            (f"pip install {needs} && " if needs else "")
            + f"git clone --recursive --branch {ref} {self.git} {self.name} && "
            + "".join(f"{_fill(p, values)} && " for p in self.prepare)
            + f"{env + ' ' if env else ''}pip install --no-build-isolation {extra + ' ' if extra else ''}./{self.name}"
        )


@dataclass
class Matrix:
    where: Path
    base_repository: str
    base_tag: str
    python: str
    components: dict[str, Component]
    package_index: str | None = None  # a package index serving ROCm builds: the manifests require its `package`s

    @property
    def base_image(self) -> str:
        return f"{self.base_repository}:{self.base_tag}"

    @property
    def python_tag(self) -> str:
        return "cp" + self.python.replace(".", "")

    def to_dict(self) -> dict:
        return {
            "base_image": self.base_image,
            "python": self.python,
            "package_index": self.package_index,
            "components": {
                n: {
                    "required": c.required,
                    "versions": str(c.versions) or "any",
                    "source": c.source,
                    "builds": c.builds,
                    "refuses": sorted(c.refuses),
                    "variants": sorted(c.variants),
                }
                for n, c in self.components.items()
            },
        }


def _fill(text: str, values: dict[str, str]) -> str:
    return _PLACEHOLDER_RE.sub(lambda m: values.get(m.group(1), m.group(0)), text)


# ---------------------------------------------------------------------------------------------------
# validation: every problem with its file and key

_TOP_KEYS = {"base_image", "components", "package_index"}
_BASE_KEYS = {"repository", "tag", "python"}
_COMPONENT_KEYS = {
    "required",
    "versions",
    "distributions",
    "smoke",
    "source",
    "package",
    "replaces",
    "prepare",
    "pip_args",
    "build_requires",
    "build_env",
    "runtime_env",
    "archs",
    "variants",
}
_SOURCE_KEYS = {"git", "ref", "image"}
_ARCH_KEYS = {"builds", "unverified", "refuses"}
_VARIANT_KEYS = {"description", "build_env", "runtime_env", "archs"}


def _requirement(text: str) -> bool:
    try:
        Requirement(text)
    except InvalidRequirement:
        return False
    return canonical_name(text) not in ("torch", "torchvision", "torchaudio")  # never a second torch


def canonical_name(requirement: str) -> str:
    return re.sub(r"[-_.]+", "-", Requirement(requirement).name).lower()


def _str_list(value, key, errors, check=None, what="strings") -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        errors.append((key, f"must be a list of {what}"))
        return []
    for v in value:
        if check and not check(v):
            errors.append((key, f"{v!r} is not valid here ({what})"))
    return value


def _env(value, key, errors) -> dict[str, str]:
    if not isinstance(value, dict):
        errors.append((key, "must be a mapping of VARIABLE: value"))
        return {}
    out = {}
    for k, v in value.items():
        if not isinstance(k, str) or not _ENV_NAME_RE.match(k):
            errors.append((f"{key}.{k}", "is not an environment variable name (A-Z, 0-9, _)"))
        elif isinstance(v, bool) or not isinstance(v, (str, int)):
            errors.append((f"{key}.{k}", "must be a string or an integer (quote true/false/1.5)"))
        else:
            for ph in _PLACEHOLDER_RE.findall(str(v)):
                if ph not in PLACEHOLDERS:
                    errors.append(
                        (
                            f"{key}.{k}",
                            f"unknown placeholder {{{ph}}}; known: {', '.join('{' + p + '}' for p in PLACEHOLDERS)}",
                        )
                    )
            out[k] = str(v)
    return out


def _archs(value, key, errors) -> tuple[list[str], list[str], dict[str, ArchSupport]]:
    if not isinstance(value, dict) or set(value) - _ARCH_KEYS or "builds" not in value:
        errors.append(
            (
                key,
                "must be a mapping with 'builds' ([gfx...]) and optional 'unverified' ([gfx...]) and "
                "'refuses' ({gfx...: {reason, instead}})",
            )
        )
        return [], [], {}
    is_arch = ARCH_RE.match
    builds = _str_list(value.get("builds"), f"{key}.builds", errors, is_arch, "gfx arch names")
    unverified = _str_list(value.get("unverified", []), f"{key}.unverified", errors, is_arch, "gfx arch names")
    refuses: dict[str, ArchSupport] = {}
    raw = value.get("refuses", {})
    if not isinstance(raw, dict):
        errors.append((f"{key}.refuses", "must map gfx archs to {reason, instead}"))
        raw = {}
    for arch, why in raw.items():
        k = f"{key}.refuses.{arch}"
        if not isinstance(arch, str) or not ARCH_RE.match(arch):
            errors.append((k, "is not a gfx arch name"))
        elif (
            not isinstance(why, dict)
            or set(why) != {"reason", "instead"}
            or not all(isinstance(v, str) and v for v in why.values())
        ):
            errors.append((k, "must be {reason: <why it does not build>, instead: <what to use>}"))
        else:
            refuses[arch] = ArchSupport("refuses", why["reason"], why["instead"])
    for arch in set(builds) & (set(unverified) | set(refuses)):
        errors.append(
            (key, f"{arch} is listed both as building and as {'unverified' if arch in unverified else 'refused'}")
        )
    return builds, unverified, refuses


def _component(name: str, value, errors) -> Component | None:
    key = f"rocm.components.{name}"
    if name not in COMPONENTS:
        errors.append((key, f"unknown component; known: {', '.join(COMPONENTS)}"))
        return None
    if not isinstance(value, dict):
        errors.append((key, "must be a mapping"))
        return None
    for k in sorted(set(value) - _COMPONENT_KEYS):
        errors.append((f"{key}.{k}", f"unknown key; known: {', '.join(sorted(_COMPONENT_KEYS))}"))
    for k in ("required", "versions", "distributions", "smoke", "source", "archs"):
        if k not in value:
            errors.append((f"{key}.{k}", "is missing"))
    if not isinstance(value.get("required", False), bool):
        errors.append((f"{key}.required", "must be true or false"))
    raw_versions = value.get("versions", "")
    versions = SpecifierSet()
    if raw_versions is not None and not isinstance(raw_versions, str):
        # YAML reads `versions: 5` or `2.9` as a number: SpecifierSet(5) is a TypeError, not bad input
        errors.append(
            (f"{key}.versions", f'must be a quoted PEP 440 specifier set such as ">=2.9", not {raw_versions!r}')
        )
    else:
        try:
            versions = SpecifierSet(raw_versions or "")
        except InvalidSpecifier:
            errors.append((f"{key}.versions", f"is not a PEP 440 specifier set: {raw_versions!r}"))
    dists = _str_list(
        value.get("distributions", []), f"{key}.distributions", errors, _DIST_RE.match, "distribution names"
    )
    smoke = value.get("smoke", "")
    if not isinstance(smoke, str) or not smoke.strip():
        errors.append((f"{key}.smoke", "must be Python statements (an import) as a string"))
        smoke = ""
    else:
        try:
            compile(smoke, f"{key}.smoke", "exec")
        except SyntaxError as exc:
            errors.append((f"{key}.smoke", f"is not valid Python: {exc.msg}"))
        else:
            if not smoke.lstrip().startswith(("import ", "from ")):
                errors.append((f"{key}.smoke", "must start with the import of the component's module"))
        if '"' in smoke:
            errors.append((f"{key}.smoke", 'must not contain double quotes (it runs as python -c "...")'))
    source = value.get("source", {})
    git = ref = None
    keep_image = False
    if not isinstance(source, dict) or set(source) - _SOURCE_KEYS or not source:
        errors.append(
            (f"{key}.source", "must be {git: <https URL>, ref: <branch, tag or commit>} and optionally image: true")
        )
    else:
        keep_image = source.get("image", False)
        if not isinstance(keep_image, bool):
            errors.append((f"{key}.source.image", "must be true or false"))
        git, ref = source.get("git"), source.get("ref")
        if not isinstance(git, str) or not _GIT_URL_RE.match(git):
            errors.append((f"{key}.source.git", f"must be an https git URL, got {git!r}"))
        if not isinstance(ref, str) or not _REF_RE.match(ref) or ".." in ref:
            errors.append((f"{key}.source.ref", f"must be a branch, tag or commit, got {ref!r}"))
        else:
            for ph in _PLACEHOLDER_RE.findall(ref):
                if ph != "torch_minor":
                    errors.append((f"{key}.source.ref", f"only {{torch_minor}} may appear in a ref, not {{{ph}}}"))
    package = value.get("package")
    if package is not None and (not isinstance(package, str) or not _DIST_RE.match(package)):
        errors.append((f"{key}.package", "must be a distribution name"))
    replaces = _str_list(value.get("replaces", []), f"{key}.replaces", errors, _DIST_RE.match, "distribution names")
    prepare = _str_list(value.get("prepare", []), f"{key}.prepare", errors, None, "shell commands")
    for p in prepare:
        for ph in _PLACEHOLDER_RE.findall(p):
            if ph not in PLACEHOLDERS:
                errors.append((f"{key}.prepare", f"unknown placeholder {{{ph}}}"))
    pip_args = _str_list(value.get("pip_args", []), f"{key}.pip_args", errors, None, "pip arguments")
    build_requires = _str_list(
        value.get("build_requires", []), f"{key}.build_requires", errors, _requirement, "PEP 508 requirements"
    )
    build_env = _env(value.get("build_env", {}), f"{key}.build_env", errors)
    runtime_env = _env(value.get("runtime_env", {}), f"{key}.runtime_env", errors)
    builds, unverified, refuses = _archs(value.get("archs", {}), f"{key}.archs", errors)
    variants = {}
    raw_variants = value.get("variants", {})
    if not isinstance(raw_variants, dict):
        errors.append((f"{key}.variants", "must map variant names to {description, build_env, runtime_env, archs}"))
        raw_variants = {}
    for vname, v in raw_variants.items():
        vkey = f"{key}.variants.{vname}"
        if not isinstance(vname, str) or not re.match(r"^[a-z][a-z0-9-]*$", vname):
            errors.append((vkey, "variant names are lower-case words"))
            continue
        if (
            not isinstance(v, dict)
            or set(v) - _VARIANT_KEYS
            or "archs" not in v
            or not isinstance(v.get("description"), str)
        ):
            errors.append((vkey, "must be {description, build_env, runtime_env, archs: {builds, unverified}}"))
            continue
        vb, vu, vr = _archs(v["archs"], f"{vkey}.archs", errors)
        if vr:
            errors.append((f"{vkey}.archs.refuses", "a variant lists what it builds; refusals belong to the component"))
        variants[vname] = Variant(
            vname,
            v["description"],
            _env(v.get("build_env", {}), f"{vkey}.build_env", errors),
            _env(v.get("runtime_env", {}), f"{vkey}.runtime_env", errors),
            vb,
            vu,
        )
    for arch, why in refuses.items():
        m = re.match(r"^" + re.escape(name) + r":([a-z][a-z0-9-]*)\b", why.instead)
        if m and m.group(1) not in variants:
            errors.append(
                (f"{key}.archs.refuses.{arch}.instead", f"names variant {m.group(1)!r}, which {key}.variants lacks")
            )
    return Component(
        name,
        bool(value.get("required", False)),
        versions,
        dists,
        smoke,
        git,
        ref,
        keep_image,
        package,
        replaces,
        prepare,
        build_requires,
        pip_args,
        build_env,
        runtime_env,
        builds,
        unverified,
        refuses,
        variants,
    )


def validate(data, where: Path | str) -> tuple[Matrix | None, list[str]]:
    """The matrix and every problem, each as '<file>: key 'rocm.…': <what is wrong>'."""
    errors: list[tuple[str, str]] = []
    matrix = None
    if not isinstance(data, dict):
        errors.append(("rocm", "must be a mapping with base_image and components"))
    else:
        for k in sorted(set(data) - _TOP_KEYS):
            errors.append((f"rocm.{k}", f"unknown key; known: {', '.join(sorted(_TOP_KEYS))}"))
        base = data.get("base_image")
        repo: Any = ""
        tag: Any = ""
        python: Any = ""
        if not isinstance(base, dict) or set(base) - _BASE_KEYS or not {"tag", "python"} <= set(base):
            errors.append(("rocm.base_image", "must be {tag: <rocm/pytorch tag>, python: 'X.Y'} (repository optional)"))
        else:
            repo = base.get("repository", "rocm/pytorch")
            tag, python = base.get("tag"), base.get("python")
            if not isinstance(repo, str) or not re.match(r"^[a-z0-9][a-z0-9._/-]*$", repo):
                errors.append(("rocm.base_image.repository", f"is not an image repository name: {repo!r}"))
            if not isinstance(tag, str) or not _TAG_RE.match(tag):
                errors.append(("rocm.base_image.tag", f"is not a Docker tag: {tag!r}"))
            if not isinstance(python, str) or not re.match(r"^3\.[0-9]{1,2}$", python):
                errors.append(("rocm.base_image.python", f"must be a quoted 'X.Y' Python version, got {python!r}"))
            elif (
                isinstance(tag, str)
                and re.search(r"py3\.?\d+", tag)
                and f"py{python}" not in tag
                and f"py{python.replace('.', '')}" not in tag
            ):
                errors.append(("rocm.base_image.python", f"{python} disagrees with the tag {tag!r}"))
        comps = data.get("components")
        parsed: dict[str, Component] = {}
        if not isinstance(comps, dict) or not comps:
            errors.append(("rocm.components", f"must map component names ({', '.join(COMPONENTS)}) to their settings"))
        else:
            for name, value in comps.items():
                c = _component(str(name), value, errors)
                if c is not None:
                    parsed[c.name] = c
        index = data.get("package_index")
        if index is not None and (not isinstance(index, str) or not re.match(r"^https://[^\s]+$", index)):
            errors.append(("rocm.package_index", f"must be an https URL of a package index, got {index!r}"))
        if not errors:
            matrix = Matrix(Path(where), repo, tag, python, parsed, index)
    return matrix, [f"{where}: key '{k}': {msg}" for k, msg in errors]


def parse(data, where: Path | str) -> Matrix:
    """The matrix, or BadInput (exit 2) naming the file and the first bad key."""
    matrix, errors = validate(data, where)
    if errors:
        more = f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})" if len(errors) > 1 else ""
        raise BadInput(errors[0] + more)
    assert matrix is not None
    return matrix


# ---------------------------------------------------------------------------------------------------
# choosing components for a build


@dataclass(frozen=True)
class Choice:
    component: Component
    variant: str | None = None

    @property
    def label(self) -> str:
        return f"{self.component.name}:{self.variant}" if self.variant else self.component.name


def parse_archs(text: str) -> list[str]:
    archs = [a.strip() for a in re.split(r"[;,]", text or "") if a.strip()]
    if not archs:
        raise BadInput("--arch: give one or more GPU archs, e.g. gfx942;gfx950")
    for a in archs:
        if not ARCH_RE.match(a):
            raise BadInput(
                f"--arch: {a!r} is not a gfx arch name (e.g. gfx90a, gfx942, gfx950, gfx1100, gfx1201, gfx906)"
            )
    return list(dict.fromkeys(archs))


def choose(matrix: Matrix, spec: str, archs: list[str]) -> tuple[list[Choice], list[str]]:
    """`--components` (all | none | name[:variant],...) for these archs: the choices and warnings.
    A component that refuses one of the archs is refused (bad input) naming what to use instead."""
    spec = (spec or "all").strip()
    if spec == "none":
        return [], []
    wanted = list(matrix.components) if spec == "all" else [s.strip() for s in spec.split(",") if s.strip()]
    choices, warnings = [], []
    seen: dict[str, str] = {}
    for item in wanted:
        name, _, variant = item.partition(":")
        if name in seen:  # two stages of one name (FROM base AS apex twice) build one of them for nothing
            raise BadInput(f"--components: {name} is named twice ({seen[name]}, {item}); name each component once")
        seen[name] = item
        comp = matrix.components.get(name)
        if comp is None:
            raise BadInput(
                f"--components: {name!r} is not in the {matrix.where} matrix; known: {', '.join(matrix.components)}, or all, none"
            )
        if variant and variant not in comp.variants:
            raise BadInput(
                f"--components: {name} has no variant {variant!r}; known: {', '.join(comp.variants) or 'none'}"
            )
        for arch in archs:
            s = comp.support(arch, variant or None)
            if s.status == "refuses":
                raise BadInput(
                    f"--arch {arch}: {item} does not build there ({s.reason}); "
                    + _alternative(matrix, wanted, item, arch, s.instead)
                    + f" [{matrix.where}]"
                )
            if s.status == "unverified":
                warnings.append(f"{item} on {arch}: unverified ({s.reason}); the image build will tell")
        choices.append(Choice(comp, variant or None))
    return choices, warnings


def _alternative(matrix: Matrix, wanted: list[str], item: str, arch: str, instead: str) -> str:
    """What to pass instead of a refused component: its variant, or the list without it plus the advice."""
    name = item.partition(":")[0]
    variant = re.match(r"^" + re.escape(name) + r":([a-z][a-z0-9-]*)", instead or "")
    if variant is None and not instead:
        variant = next(
            (
                re.match(r"(.*)", f"{name}:{v}")
                for v, var in matrix.components[name].variants.items()
                if arch in var.builds + var.unverified
            ),
            None,
        )
    if variant is not None:
        swapped = [variant.group(0) if w == item else w for w in wanted]
        return f"use --components {','.join(swapped)} ({instead or variant.group(0)})"
    rest = [w for w in wanted if w != item]
    left_out = f"--components {','.join(rest)}" if rest else "--components none"
    return f"leave it out ({left_out}) and train with {instead}" if instead else f"leave it out ({left_out})"


def _shell_value(value: str) -> str:
    return f'"{value}"' if re.search(r"[;\s|&<>]", value) else value


# ---------------------------------------------------------------------------------------------------
# what each arch is and what works there (sources in the comments; facts the series do not vary)


@dataclass(frozen=True)
class ArchFacts:
    gpus: str
    family: str  # CDNA2/3/4, RDNA3/4, GCN5
    fp8: bool  # Transformer Engine FP8 execution
    env: tuple[tuple[str, str, str], ...] = ()  # (variable, value, why)
    note: str = ""


ARCHS: dict[str, ArchFacts] = {
    # FP8: ROCm TE refuses FP8 below gfx94x ("Device arch gfx94x or gfx95x required for FP8 execution",
    # ROCm/TransformerEngine#359); AMD's fork marks its fp8 tests failing_on_rocm_mi250.
    "gfx942": ArchFacts("MI300X/MI300A/MI325X", "CDNA3", True),
    "gfx950": ArchFacts(
        "MI350X/MI355X",
        "CDNA4",
        True,
        note="MXFP8 recipes need NVTE_ROCM_ENABLE_MXFP8=1 (gfx95x only; Primus runner/helpers/envs/base_env.sh)",
    ),
    "gfx90a": ArchFacts("MI210/MI250/MI250X", "CDNA2", False),
    "gfx1100": ArchFacts(
        "Radeon RX 7900 XTX/XT, PRO W7900",
        "RDNA3",
        False,
        note="Megatron reads the gfx major (11) as a compute capability >= 10 (Blackwell-and-later branches)",
    ),
    "gfx1201": ArchFacts(
        "Radeon RX 9070/AI PRO R9700",
        "RDNA4",
        False,
        note="Megatron reads the gfx major (12) as a compute capability >= 10 (Blackwell-and-later branches)",
    ),
    # gfx906: the users run MI50s with HSA_OVERRIDE_GFX_VERSION=9.0.6 on Python 3.10 rocm/pytorch
    # images (community images mixa3607/rocm-gfx906); official ROCm support for gfx906 is UNVERIFIED here.
    "gfx906": ArchFacts(
        "MI50/MI60, Radeon VII",
        "GCN5 (Vega 20)",
        False,
        env=(
            (
                "HSA_OVERRIDE_GFX_VERSION",
                "9.0.6",
                "run gfx906 code objects on MI50/MI60 (community setups; UNVERIFIED)",
            ),
        ),
        note="Python 3.10 images only: Megatron-LM v0.17+ require Python >= 3.12",
    ),
}


def known_archs(matrix: Matrix | None) -> list[str]:
    """The archs rocmport can say something about: its arch table's and every arch the matrix names."""
    named = set(ARCHS)
    for comp in matrix.components.values() if matrix else ():
        named |= {a for a in comp.builds + comp.unverified + list(comp.refuses) if a != "*"}
        for v in comp.variants.values():
            named |= set(v.builds + v.unverified)
    return sorted(named)


def base_arch(name: str | None) -> str | None:
    """'gfx942:sramecc+:xnack-' -> 'gfx942'."""
    return name.split(":", 1)[0].strip() if name else None


def recommend(
    matrix: Matrix | None, arch: str | None, installed_ok: dict[str, bool], other_gpu: str | None = None
) -> list[tuple[str, str, str]]:
    """(topic, recommendation, why) for training on this arch with what is installed. ``other_gpu``:
    the name of a GPU this machine has that is not an AMD one (a CUDA build's), which has no arch here."""
    out: list[tuple[str, str, str]] = []
    if not arch and other_gpu:
        return [
            (
                "gpu",
                f"{other_gpu}: not an AMD GPU",
                "doctor recommends per AMD GPU arch: pass --arch (e.g. --arch gfx942) to read one's recommendations",
            )
        ]
    if not arch:
        return [("gpu", "none found", "doctor recommends per GPU arch: run it on the GPU machine, or pass --arch")]
    facts = ARCHS.get(arch)
    if facts is None:
        out.append(("gpu", f"{arch}: not in rocmport's arch table", f"known: {', '.join(ARCHS)}"))
    else:
        out.append(("gpu", f"{arch} ({facts.family}: {facts.gpus})", facts.note or "-"))
    comps = matrix.components if matrix else {}
    te = comps.get("transformer_engine")
    te_arch = te.support(arch) if te else None
    if installed_ok.get("transformer_engine"):
        out.append(
            (
                "layers",
                "--transformer-impl transformer_engine",
                "ROCm Transformer Engine is installed, in range and built for this arch",
            )
        )
        out.append(
            (
                "attention",
                "--attention-backend auto with NVTE_FUSED_ATTN=1 NVTE_FLASH_ATTN=0",
                "ROCm TE's fused attention (CK/AOTriton); its flash-attention path is off on ROCm",
            )
        )
    else:
        why = (
            f"ROCm TE does not build for {arch}: {te_arch.reason}"
            if te_arch and te_arch.status == "refuses"
            else "ROCm Transformer Engine is not usable here (see the table)"
        )
        out.append(
            ("layers", "--transformer-impl local", why + "; Megatron's own layers (upstream's *_uninstall_te cases)")
        )
        out.append(("attention", "--attention-backend unfused", "what upstream's TE-less functional case uses"))
    fa = comps.get("flash_attn")
    if fa is not None:
        s = fa.support(arch)
        if s.status == "builds":
            # one verdict per row: what to use says whether it is usable here, as the why does
            if installed_ok.get("flash_attn"):
                use, have = "the CK build (default backend)", "installed and usable here"
            else:
                use, have = (
                    "not usable here yet: install the CK build",
                    "install or rebuild it for this arch (see the table)",
                )
            out.append(("flash-attention", use, f"CK flash-attention targets {', '.join(fa.builds)}; {have}"))
        else:
            alt = next((v for v in fa.variants.values() if arch in v.builds + v.unverified), None)
            if alt is not None:
                env = " ".join(f"{k}={v}" for k, v in alt.runtime_env.items())
                out.append(
                    (
                        "flash-attention",
                        f"the {alt.name} backend ({env})",
                        f"{s.reason or 'CK does not target ' + arch}; {alt.description}",
                    )
                )
            else:
                out.append(
                    ("flash-attention", "none", s.reason or f"no flash-attention backend is known to build for {arch}")
                )
    if facts is not None:
        fp8_why = "ROCm TE runs FP8 on gfx94x/gfx95x only (ROCm/TransformerEngine#359)"
        if not facts.fp8:
            fp8 = ("not available: train in bf16/fp16", fp8_why)
        elif installed_ok.get("transformer_engine"):
            fp8 = ("available (ROCm TE)", fp8_why)
        else:  # the arch could, but FP8 goes through TE, which the layers row says is not usable here
            fp8 = (
                "not usable here yet: train in bf16/fp16",
                fp8_why + "; it needs ROCm TE, not usable here (see the table)",
            )
        out.append(("fp8", *fp8))
        for name, value, why in facts.env:
            out.append(("environment", f"{name}={value}", why))
    return out
