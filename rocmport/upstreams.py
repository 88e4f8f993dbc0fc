"""The upstreams rocmport ports, and every fact about each in one table: where it lives, what the
package index calls it, where its package and the generated helper go, and its default recipe.

Everything else asks this table (`UPSTREAMS[name]`, `upstream_of_path`); no other module spells a
URL, a distribution name or a package directory of an upstream."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePosixPath


@dataclass(frozen=True)
class Upstream:
    name: str  # the key in upstream.lock, patchsets/<name>/ and build/<name>
    url: str  # the canonical git URL (what the lock records)
    distribution: str  # the package-index distribution it is published as
    package_dir: str  # the Python package inside the tree (holds package_info.py)
    # The default codemod recipe (`apply --codemods-only`, a new series): names or {name, options}.
    default_codemods: tuple[str | dict, ...] = ()
    excluded_paths: tuple[str, ...] = ()  # left out of the default recipe's sparse checkout

    @property
    def module(self) -> str:
        """The dotted package, e.g. megatron.core."""
        return ".".join(PurePosixPath(self.package_dir).parts[-2:])

    @property
    def package_info(self) -> str:
        """Where the tree declares its version."""
        return f"{self.package_dir}/package_info.py"

    @property
    def helper_path(self) -> str:
        """The generated runtime helper the codemods' rewritten sites import."""
        return f"{self.package_dir}/_rocm.py"

    @property
    def helper_module(self) -> str:
        return f"{self.module}._rocm"

    @property
    def web_url(self) -> str:
        """The repository's web address (commit links)."""
        return self.url.removesuffix(".git")


MEGATRON_LM = Upstream(
    name="megatron-lm",
    url="https://github.com/NVIDIA/Megatron-LM.git",
    distribution="megatron-core",
    package_dir="megatron/core",
    default_codemods=(
        "apex-to-torch",
        "fused-kernel-fallbacks",
        "guard-nvidia-only-imports",
        "attention-backend-env",
        "te-version-gates",
        "device-probes",
        "flash-attention-hooks",
        "capability-gates",
        "grouped-gemm",
        "launch-env",
        "deterministic-env",
        "tp-comm-overlap",
        "async-checkpoint-spawn",
        "dataloader-mp-context",
        "nccl-allocator-rccl",
        "async-save-strategy",
        "empty-cache-interval",
    ),
)

MEGATRON_BRIDGE = Upstream(
    name="megatron-bridge",
    url="https://github.com/NVIDIA-NeMo/Megatron-Bridge.git",
    distribution="megatron-bridge",
    package_dir="src/megatron/bridge",
    # Bridge imports TE unconditionally (peft/lora*.py; transformer_engine_torch from v0.4): guard it
    # so `import megatron.bridge` works without TE.
    default_codemods=(
        {
            "name": "guard-nvidia-only-imports",
            "options": {
                "packages": {
                    "transformer_engine": "transformer-engine",
                    "transformer_engine_torch": "transformer-engine",
                }
            },
        },
    ),
    excluded_paths=("docs",),
)

# Megatron-LM first: Bridge's port points at the ported Megatron-LM tree.
UPSTREAMS: dict[str, Upstream] = {u.name: u for u in (MEGATRON_LM, MEGATRON_BRIDGE)}
NAMES: tuple[str, ...] = tuple(UPSTREAMS)


def upstream_of_path(relpath: str) -> Upstream:
    """The upstream a file of a ported tree belongs to, by its path (Bridge's files live under a
    `bridge` directory near the top; everything else is Megatron-LM's)."""
    return MEGATRON_BRIDGE if "bridge" in PurePosixPath(relpath).parts[:3] else MEGATRON_LM


# The install manifests apply's last step rewrites (globs relative to a work tree).
MANIFEST_GLOBS: tuple[str, ...] = (
    "pyproject.toml",
    "requirements*.txt",
    "requirements/*.txt",
    "megatron/*/requirements*.txt",
)


def later_step_paths() -> tuple[str, ...]:
    """Where the steps after the patches write in a work tree (globs): the codemods' helper, the
    manifests, and what `build` stamps into its copy. A patch may not put a symlink at or above one."""
    stamped = [
        p for u in UPSTREAMS.values() for p in (u.helper_path, u.package_info, f"{u.package_dir}/_rocm_build.py")
    ]
    return (*stamped, *MANIFEST_GLOBS)
