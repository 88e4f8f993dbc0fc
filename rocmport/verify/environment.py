"""What verify runs on: the invoking interpreter and torch (never modified), devices, backend."""

from __future__ import annotations

import importlib.util
import os
import platform
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from packaging.specifiers import InvalidSpecifier, SpecifierSet

from rocmport.errors import BadInput

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


def probe() -> Environment:
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return Environment(
        python=platform.python_version(), torch=torch.__version__, hip=getattr(torch.version, "hip", None),
        cuda=getattr(torch.version, "cuda", None), device_count=count,
        devices=[torch.cuda.get_device_name(i) for i in range(count)],
    )


def unmet_python(tree: Path) -> str | None:
    """The tree's `requires-python` when this interpreter does not satisfy it, else None."""
    pyproject = tree / "pyproject.toml"
    if not pyproject.is_file():
        return None
    try:
        spec = tomllib.loads(pyproject.read_text(encoding="utf-8")).get("project", {}).get("requires-python")
        return spec if spec and not SpecifierSet(spec).contains(platform.python_version()) else None
    except (tomllib.TOMLDecodeError, InvalidSpecifier):
        return None


def check_python(tree: Path) -> None:
    """Stop with exit 2 when the tree declares a newer Python than this interpreter."""
    spec = unmet_python(tree)
    if spec:
        raise BadInput(
            f"{tree} requires Python {spec} but rocmport runs on Python {platform.python_version()} ({sys.executable}); "
            f"run verify with a Python that satisfies {spec}"
        )


def missing_deps(tree: Path) -> dict[str, str]:
    """Ordinary dependencies of the tree that this interpreter lacks: module -> pip name."""
    needed = dict(ORDINARY_DEPS)
    if (tree / "megatron" / "training").is_dir():
        needed.update(TRAINING_DEPS)
    return {m: dist for m, dist in needed.items() if importlib.util.find_spec(m) is None}


def launcher_env_for(env: Environment) -> dict[str, str]:
    """The AMD launcher environment applies to the processes verify starts on ROCm only."""
    from rocmport.launch_env import launch_env

    return launch_env() if env.hip else {}


def child_env(tree: Path, bootstrap: Path, extra: dict[str, str]) -> dict[str, str]:
    """The started processes' environment: the tree (and the firewall) put first on the path."""
    env = dict(os.environ)
    parts = [str(bootstrap), str(tree)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    env.update({"PYTHONPATH": os.pathsep.join(parts), "OMP_NUM_THREADS": env.get("OMP_NUM_THREADS", "1"), **extra})
    return env
