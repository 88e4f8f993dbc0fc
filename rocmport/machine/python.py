"""Pythons on this machine against what a tree declares: `requires-python`, its declared dependency
ranges, an interpreter that satisfies a range, and how to get one when none does."""

from __future__ import annotations

import os
import platform
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from packaging.specifiers import InvalidSpecifier, SpecifierSet

from rocmport._compat import tomllib
from rocmport.errors import BadInput


def requires_python(tree: Path) -> str | None:
    """The tree's declared `requires-python` (pyproject.toml), None when it declares none or it cannot be read."""
    pyproject = tree / "pyproject.toml"
    if not pyproject.is_file():
        return None
    try:
        spec = tomllib.loads(pyproject.read_text(encoding="utf-8")).get("project", {}).get("requires-python")
        SpecifierSet(spec or "")
    except (tomllib.TOMLDecodeError, InvalidSpecifier):
        return None
    return spec or None


def unmet_python(tree: Path) -> str | None:
    """The tree's `requires-python` when this interpreter does not satisfy it, else None."""
    spec = requires_python(tree)
    return spec if spec and not SpecifierSet(spec).contains(platform.python_version()) else None


def declared_unmet(tree: Path, provided: tuple[str, ...] = ()) -> dict[str, dict[str, str]]:
    """The tree's declared dependencies (pyproject.toml `[project] dependencies`, markers evaluated here)
    that this interpreter has installed at a version outside the declared range: distribution ->
    {installed, declared}. Absent ones are not listed (the import probe names what is missing), nor
    the distributions in `provided` (what verify puts on the path itself: the trees, the user's torch)."""
    from importlib import metadata

    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name

    pyproject = tree / "pyproject.toml"
    try:
        declared = tomllib.loads(pyproject.read_text(encoding="utf-8")).get("project", {}).get("dependencies", [])
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return {}
    skip = {canonicalize_name(name) for name in provided}
    unmet: dict[str, dict[str, str]] = {}
    for text in declared if isinstance(declared, list) else []:
        try:
            req = Requirement(str(text))
        except InvalidRequirement:
            continue
        if canonicalize_name(req.name) in skip or not req.specifier or (req.marker and not req.marker.evaluate()):
            continue
        try:
            installed = metadata.version(req.name)
        except metadata.PackageNotFoundError:
            continue
        if not req.specifier.contains(installed, prereleases=True):
            unmet[canonicalize_name(req.name)] = {"installed": installed, "declared": str(req)}
    return unmet


def distributions_of(module: str) -> set[str]:
    """The installed distributions (canonical names) that provide a module's top-level package."""
    from importlib import metadata

    from packaging.utils import canonicalize_name

    return {canonicalize_name(d) for d in metadata.packages_distributions().get(module.split(".")[0], [])}


def interpreter_version(python: str) -> str | None:
    """The version of the Python at ``python`` (a path or a command), None when it does not run."""
    try:
        proc = subprocess.run(
            [python, "-c", "import platform; print(platform.python_version())"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout.strip() if proc.returncode == 0 and proc.stdout.strip() else None


def find_interpreter(spec: str) -> tuple[str, str] | None:
    """(path, version) of a Python that satisfies ``spec``: this one, else `python3.X` on PATH, else
    a pyenv-installed 3.X (a pyenv shim that refuses until a version is selected is skipped)."""
    wanted = SpecifierSet(spec)
    if wanted.contains(platform.python_version()):
        return sys.executable, platform.python_version()
    minors = [m for m in range(10, 15) if wanted.contains(f"3.{m}.0") or wanted.contains(f"3.{m}.99")]
    root = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv")
    for minor in minors:
        candidates = [shutil.which(f"python3.{minor}")] + sorted(
            str(p) for p in root.glob(f"versions/3.{minor}*/bin/python3.{minor}")
        )
        for candidate in filter(None, candidates):
            version = interpreter_version(candidate)
            if version and wanted.contains(version):
                return candidate, version
    return None


def wanted_python(spec: str) -> str | None:
    """The oldest Python 3.x (3.10 to 3.14) that ``spec`` admits, e.g. '3.12' for '>=3.12'."""
    try:
        specs = SpecifierSet(spec)
    except InvalidSpecifier:
        return None
    return next((f"3.{minor}" for minor in range(10, 15) if specs.contains(f"3.{minor}.0")), None)


def python_setup_hint(spec: str) -> str:
    """How to get an environment whose Python satisfies ``spec``: one sentence, concrete commands."""
    want = wanted_python(spec) or "3"
    venv = f".venv{want.replace('.', '')}"
    source = Path(__file__).resolve().parents[2]
    install = (
        f"pip install -e {shlex.quote(f'{source}[verify,bridge,proxy]')}"
        if (source / "pyproject.toml").is_file()
        else "pip install 'rocmport[verify,bridge,proxy]'"
    )
    return (
        f"make a Python {want} environment and run rocmport from it: `python{want} -m venv {venv} && . {venv}/bin/activate && "
        f"pip install torch && {install}` (on ROCm: a rocm/pytorch image with Python {want}, installing rocmport "
        f'without touching the image\'s torch; see docs/install.md, "Python 3.12 for v0.17 and later")'
    )


def check_python(tree: Path) -> None:
    """Stop with exit 2 when the tree declares a newer Python than this interpreter, saying how to get one."""
    spec = unmet_python(tree)
    if spec:
        raise BadInput(
            f"{tree} requires Python {spec} but rocmport runs on Python {platform.python_version()} ({sys.executable}); "
            + python_setup_hint(spec)
        )
