"""The one declaration of what verify's parent process tells the processes it starts (ranks, their
children, build steps): every ``ROCMPORT_*`` environment variable of that conversation, once, with
its type, who writes it and who reads it.

The parent writes a variable with ``VAR.entry(value)`` (or ``VAR.set(env, value)``) into the started
processes' environment; the rank side reads it back typed with ``VAR.read()`` (None when unset).
No other module spells these names (tests/test_architecture.py fails on one that does), so a
variable is renamed, retyped or retired here, and docs/runtime-protocol.md is checked against
``VARIABLES``.

Not this protocol, and spelled where they are read (the architecture test lists each such file,
docs/runtime-protocol.md says why): the user's settings (the cache directory, the package index),
rocmport's process marker of a run (procs.py, any command), and the ported tree's own knobs, read
by the helper that apply writes into the tree (rocmport/codemods/runtime/, copied byte for byte
into megatron/core/_rocm.py, which cannot import rocmport; it also reads ``PORT_SITES``).

Imports nothing but the standard library: the bootstrap of every started process reads it."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


def _flag(text: str) -> bool:
    return text == "1"


def _names(text: str) -> tuple[str, ...]:
    return tuple(filter(None, text.split(",")))


def _seconds(value: float) -> str:
    return f"{value:g}"  # 45.0 -> "45", as a person would write it


@dataclass(frozen=True)
class Var(Generic[T]):
    """One variable of the protocol: its name, what it carries, who writes and who reads it."""

    name: str
    kind: str  # the value's form, for the docs: "flag", "path", "text", "seconds", "names"
    doc: str
    writer: str
    reader: str
    parse: Callable[[str], T]
    format: Callable[[T], str]

    def read(self, env: Mapping[str, str] | None = None) -> T | None:
        """The value in ``env`` (this process's environment by default); None when unset or empty."""
        text = (os.environ if env is None else env).get(self.name, "")
        return self.parse(text) if text else None

    def raw(self, env: Mapping[str, str] | None = None) -> str:
        """The value as it is written ("" when unset): for a cache key that must not change form."""
        return (os.environ if env is None else env).get(self.name, "")

    def entry(self, value: T) -> dict[str, str]:
        """``{name: value}`` for the started processes' environment."""
        return {self.name: self.format(value)}

    def set(self, env: MutableMapping[str, str], value: T) -> None:
        env[self.name] = self.format(value)

    def unset(self, env: MutableMapping[str, str]) -> None:
        env.pop(self.name, None)


def flag(name: str, doc: str, writer: str, reader: str) -> Var[bool]:
    return Var(name, "flag", doc, writer, reader, _flag, lambda on: "1" if on else "0")


def text(name: str, doc: str, writer: str, reader: str, kind: str = "text") -> Var[str]:
    return Var(name, kind, doc, writer, reader, str, str)


# ---- the environment, the firewall and the bootstrap (sitecustomize.py) ----
PYTHON = text(
    "ROCMPORT_PYTHON",
    "The interpreter verify runs on: only a process on it installs the HIP simulation, TE and the shim "
    "(another Python gets the firewall alone).",
    "the parent (the started processes' environment)",
    "the bootstrap",
    kind="path",
)
FIREWALL = Var(
    "ROCMPORT_FIREWALL",
    "names",
    "Comma-separated top-level modules the started processes see as not installed (the NVIDIA-only packages).",
    "the parent (the firewall's profile; --te lets TE through)",
    "the bootstrap; stage 4 (whether nvidia-resiliency-ext is let through)",
    _names,
    ",".join,
)
BUILD_STEP = flag(
    "ROCMPORT_BUILD_STEP",
    "Set by the bootstrap's bin/python3: a build step in the tree (megatron's Makefile), which gets the firewall only.",
    "the bootstrap's bin/python, bin/python3",
    "the bootstrap",
)
BACKEND = text(
    "ROCMPORT_BACKEND",
    "The torch.distributed backend of the run (gloo on the CPU proxy, nccl on GPUs).",
    "the parent (the run)",
    "runtime.gpt_worker",
)
PROXY = flag(
    "ROCMPORT_PROXY",
    "The run is on the CPU proxy: the ranks install the proxy shim.",
    "the parent (the run)",
    "runtime.gpt_worker, runtime.pytest_plugin; stage 3 (watchdog default, baseline cache key)",
)
HIP_SIM = text(
    "ROCMPORT_HIP_SIM",
    "The ROCm version the HIP simulation gives this process's torch (CPU proxy; unset: the CUDA path).",
    "runtime.hip_sim.child_env",
    "the bootstrap, runtime.hip_sim, runtime.proxy_shim; stage 3 (baseline cache key)",
)
HIP_SIM_ARCH = text(
    "ROCMPORT_HIP_SIM_ARCH",
    "The simulated GPU's architecture (verify --hip-arch; gfx942 when unset or unknown).",
    "runtime.hip_sim.child_env",
    "runtime.hip_sim",
)
TE = text(
    "ROCMPORT_TE",
    "The Transformer Engine version whose Python layer runs on the CPU proxy (verify --te).",
    "verify.te_layer.child_env",
    "the bootstrap, runtime.te_loader, runtime.proxy_shim, runtime.pytest_plugin; stage 3 (baseline cache key)",
)
TE_PATH = text(
    "ROCMPORT_TE_PATH",
    "The unpacked TE wheel put first on the started processes' path.",
    "verify.te_layer.child_env",
    "runtime.te_loader",
    kind="path",
)
PORT_SITES = text(
    "ROCMPORT_PORT_SITES",
    "A directory: the tree's helper records the rewritten call sites that ran, the bootstrap the modules each "
    "process imported (the report's port coverage). The tree's generated helper module spells this "
    "name itself: it cannot import rocmport.",
    "the parent (the run)",
    "the bootstrap, the port's generated helper module; stage 3 (removed for the unported tree)",
    kind="path",
)

# ---- the proxy shim in upstream's processes ----
SHIM_WORKERS = flag(
    "ROCMPORT_SHIM_WORKERS",
    "Each torchrun (or Slurm) worker of an upstream script (pretrain_gpt.py) installs the proxy shim.",
    "stage 4 (functional)",
    "the bootstrap, runtime.slurm_task",
)
SHIM_OUT = text(
    "ROCMPORT_SHIM_OUT",
    "A directory where each shimmed worker writes the redirects it made (stage 4's report).",
    "stage 4 (functional)",
    "runtime.proxy_shim",
    kind="path",
)
SPAWN_SERVER = text(
    "ROCMPORT_SPAWN_SERVER",
    "The socket of the rank server that forks what a rank starts with multiprocessing's spawn (stage 4, --fork-ranks).",
    "runtime.rank_server (in each rank it forks)",
    "runtime.rank_server, runtime.served_spawn",
    kind="path",
)
SHIM_CHILDREN = flag(
    "ROCMPORT_SHIM_CHILDREN",
    "A child a unit-test rank spawns (multiprocessing spawn) installs the proxy shim too.",
    "runtime.pytest_plugin (in the rank)",
    "the bootstrap",
)

# ---- stage 3: upstream's unit tests under the pytest plugin ----
UNIT_OUT = text(
    "ROCMPORT_UNIT_OUT",
    "A directory: each rank writes its outcomes to rank<RANK>.json there after each test; also the mark by "
    "which stage 3 finds a run's stray processes.",
    "stage 3 (unit_tests)",
    "runtime.pytest_plugin",
    kind="path",
)
UNIT_TEST_TIMEOUT = Var(
    "ROCMPORT_UNIT_TEST_TIMEOUT",
    "seconds",
    "The per-test watchdog: a test that runs longer is reported as hung (45 on the CPU proxy, 900 on GPUs).",
    "stage 3 (unit_tests)",
    "runtime.pytest_plugin",
    float,
    _seconds,
)
BASELINE_GUARDS = flag(
    "ROCMPORT_BASELINE_GUARDS",
    "The unported tree runs: the plugin adds the minimal guards that let upstream's test modules import.",
    "stage 3 (unit_tests)",
    "runtime.pytest_plugin",
)
UNIT_ONLY = text(
    "ROCMPORT_UNIT_ONLY",
    "A file of test ids and test files, one a line: the plugin runs only the collected tests it names, the others "
    "deselected unrecorded (stage 3's unported baseline: the tests the port did not pass).",
    "stage 3 (unit_tests, its unported baseline)",
    "runtime.pytest_plugin",
    kind="path",
)

# ---- Transformer Engine's flavour and FP8 on the CPU proxy (verify --te-flavour, --fp8-recipe) ----
TE_FLAVOUR = text(
    "ROCMPORT_TE_FLAVOUR",
    "Which TE the Python layer behaves as: nvidia (as released) or rocm (the declared ROCm TE deltas applied).",
    "runtime.te_flavour.TEFlavour.env (through verify.te_layer.child_env)",
    "runtime.te_flavour, runtime.te_rocm",
)
TE_DELTAS = Var(
    "ROCMPORT_TE_DELTAS",
    "names",
    "The ROCm TE deltas this run applies, by name (runtime.te_flavour declares each with its source).",
    "runtime.te_flavour.TEFlavour.env",
    "runtime.te_flavour, runtime.te_rocm",
    _names,
    ",".join,
)
TE_VERSION = text(
    "ROCMPORT_TE_VERSION",
    "The version string TE reports under the rocm flavour (a ROCm local tag, or a .dev0 pre-release).",
    "runtime.te_flavour.TEFlavour.env",
    "runtime.te_rocm",
)
TE_FP8 = text(
    "ROCMPORT_TE_FP8",
    "The FP8 encodings of the CPU kernels: ocp (NVIDIA, gfx950) or fnuz (gfx942 under the rocm flavour).",
    "runtime.te_flavour.TEFlavour.env",
    "runtime.te_fp8",
)
VERIFY_FP8 = text(
    "ROCMPORT_VERIFY_FP8",
    "Stage 2's FP8 case, FORMAT:RECIPE (hybrid:delayed, e4m3:tensorwise, hybrid:mxfp8 ...).",
    "the parent (the run)",
    "runtime.gpt_worker; stage 2 (its bounds)",
)
CUDA_SIM_ARCH = text(
    "ROCMPORT_CUDA_SIM_ARCH",
    "The CUDA path's simulated GPU (sm_90: an H100, on which NVIDIA's TE runs FP8); an A100 when unset.",
    "the parent (the run)",
    "runtime.hip_sim",
)

VARIABLES: tuple[Var, ...] = (
    PYTHON,
    FIREWALL,
    BUILD_STEP,
    BACKEND,
    PROXY,
    HIP_SIM,
    HIP_SIM_ARCH,
    TE,
    TE_PATH,
    PORT_SITES,
    SHIM_WORKERS,
    SHIM_OUT,
    SPAWN_SERVER,
    SHIM_CHILDREN,
    UNIT_OUT,
    UNIT_TEST_TIMEOUT,
    BASELINE_GUARDS,
    UNIT_ONLY,
    TE_FLAVOUR,
    TE_DELTAS,
    TE_VERSION,
    TE_FP8,
    VERIFY_FP8,
    CUDA_SIM_ARCH,
)


def markdown() -> str:
    """The variables as the table of docs/runtime-protocol.md (tests/test_runtime_protocol.py holds
    the page to it; `python -m rocmport.verify.runtime.protocol` prints it)."""
    rows = [
        "| variable | value | written by | read by | what it says |",
        "|---|---|---|---|---|",
        *(f"| `{v.name}` | {v.kind} | {v.writer} | {v.reader} | {v.doc} |" for v in VARIABLES),
    ]
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
