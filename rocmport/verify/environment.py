"""What verify runs on: the invoking interpreter and torch (never modified), devices, backend."""

from __future__ import annotations

import functools
import importlib.util
import os
import platform
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from packaging.specifiers import InvalidSpecifier, SpecifierSet

from rocmport._compat import tomllib
from rocmport.errors import BadInput
from rocmport.upstreams import MEGATRON_LM

# Ordinary (non-NVIDIA) dependencies megatron imports, by module -> what to pip install.
ORDINARY_DEPS = {"einops": "einops", "packaging": "packaging", "numpy": "numpy"}
TRAINING_DEPS = {"six": "six", "regex": "regex", "pydantic": "pydantic", "triton": "triton"}


@dataclass
class Environment:
    python: str
    torch: str | None
    hip: str | None
    cuda: str | None
    device_count: int
    devices: list[str] = field(default_factory=list)

    @property
    def has_gpu(self) -> bool:
        return self.device_count > 0

    def to_dict(self) -> dict:
        return dict(self.__dict__)


@functools.cache  # the machine does not change under a running rocmport: probed once per process
def probe() -> Environment:
    try:
        import torch
    except ImportError:
        raise BadInput(
            f"verify needs torch in the Python it runs with ({sys.executable}) and there is none: "
            f"on a CPU or CUDA machine `{sys.executable} -m pip install torch`; on ROCm run rocmport "
            f"with the image's Python, whose torch must never be replaced"
        ) from None

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return Environment(
        python=platform.python_version(),
        torch=torch.__version__,
        hip=getattr(torch.version, "hip", None),
        cuda=getattr(torch.version, "cuda", None),
        device_count=count,
        devices=[torch.cuda.get_device_name(i) for i in range(count)],
    )


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
        f"without touching the image's torch; see the README's \"Python 3.12 for v0.17 and later\")"
    )


def check_python(tree: Path) -> None:
    """Stop with exit 2 when the tree declares a newer Python than this interpreter, saying how to get one."""
    spec = unmet_python(tree)
    if spec:
        raise BadInput(
            f"{tree} requires Python {spec} but rocmport runs on Python {platform.python_version()} ({sys.executable}); "
            + python_setup_hint(spec)
        )


def missing_deps(tree: Path) -> dict[str, str]:
    """Ordinary dependencies of the tree that this interpreter lacks: module -> pip name."""
    needed = dict(ORDINARY_DEPS)
    if (tree / "megatron" / "training").is_dir():
        needed.update(TRAINING_DEPS)
    return {m: dist for m, dist in needed.items() if importlib.util.find_spec(m) is None}


# What upstream's pretrain_gpt.py needs besides megatron.training's imports, and why: module -> (pip
# name, what uses it).
FUNCTIONAL_DEPS = {
    # megatron/core/datasets/Makefile builds the dataset index helpers (a C++ compiler, make, `python3 -m pybind11`)
    "pybind11": ("pybind11", "megatron/core/datasets/Makefile builds the dataset helpers with it"),
    # upstream's cases save with --async-save --use-persistent-ckpt-worker: the persistent writer asks
    # psutil for its memory (an optional import upstream: without it the save fails after the first iterations)
    "psutil": ("psutil", "the persistent checkpoint writer of upstream's --async-save cases uses it"),
}


def functional_blockers(tree: Path) -> str | None:
    """What stage 4 lacks on this machine, as a one-line reason with the fix, else None."""
    import shutil

    if not (tree / MEGATRON_LM.package_dir / "datasets" / "Makefile").is_file():
        return None
    writer = tree / MEGATRON_LM.package_dir / "dist_checkpointing" / "strategies" / "filesystem_async.py"
    uses = {"pybind11": True, "psutil": writer.is_file() and "import psutil" in writer.read_text(errors="replace")}
    missing = {mod: dep for mod, dep in FUNCTIONAL_DEPS.items() if uses[mod] and importlib.util.find_spec(mod) is None}
    tools = [t for t in ("make",) if shutil.which(t) is None] + (
        [] if shutil.which("c++") or shutil.which("g++") else ["c++ (g++)"]
    )
    problems = []
    if missing:
        problems.append(
            f"missing dependency {', '.join(d for d, _ in missing.values())} ("
            + "; ".join(f"{d}: {why}" for d, why in missing.values())
            + f"): `{sys.executable} -m pip install {' '.join(d for d, _ in missing.values())}`"
        )
    if tools:
        problems.append(
            f"no {' or '.join(tools)} on PATH to build megatron's dataset helpers (install build-essential)"
        )
    return "; ".join(problems) or None


def child_env(tree: Path, bootstrap: Path, extra: dict[str, str | None], pycache: Path | None = None) -> dict[str, str]:
    """The started processes' environment: the tree (and the firewall) put first on the path, the
    bootstrap's bin/ (this interpreter as `python3`) first on PATH; ``extra`` on top (None: unset).
    Bytecode goes to ``pycache`` (PYTHONPYCACHEPREFIX), never into the tree; without one none is written."""
    env = dict(os.environ)
    parts = [str(bootstrap), str(tree)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    env.update(
        {
            "PYTHONPATH": os.pathsep.join(parts),
            "OMP_NUM_THREADS": env.get("OMP_NUM_THREADS", "1"),
            "PATH": os.pathsep.join([str(bootstrap / "bin"), env.get("PATH", "")]),
            "ROCMPORT_PYTHON": sys.executable,
        }
    )
    if pycache is not None:
        # Bytecode is written, but under ``pycache``, not in the tree's __pycache__: written there, it
        # made the tree dirty for the next `apply` wherever the tree's .gitignore does not name it. Not
        # written at all (PYTHONDONTWRITEBYTECODE), every rank, checkpoint writer and data-loader worker
        # compiled megatron's sources again at each start (a tenth of stage 4's processor time on 2 cores).
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(pycache)
    else:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        env.pop("PYTHONPYCACHEPREFIX", None)
    for key, value in extra.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env
