"""What a verify stage is: the options a run is given (VerifyOptions, checked once by
`run.prepare`), what every stage of that run shares (VerifyContext, computed once by `run_verify`),
and the contract each stage keeps (Stage: its name and number, whether its options ask for it, the
launches it would make, and run(context) -> StageRun). The stages themselves are listed, in order,
in `registry.py`: adding a stage is its module plus one entry there."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Literal

from rocmport.config import DEFAULT_BACKEND, DEFAULT_ITERS, DEFAULT_PP, DEFAULT_TP
from rocmport.verify.stages.unit_tests import suite
from rocmport.verify.runtime import hip_sim
from rocmport.verify.orchestration.launcher import Launcher
from rocmport.verify.stages.gpt_training import StageResult

if TYPE_CHECKING:
    from rocmport.machine.probe import Environment
    from rocmport.verify.stages.bridge import BridgeTraining
    from rocmport.verify.stages.functional import FunctionalRun
    from rocmport.verify.stages.gpt_training import Training
    from rocmport.verify.analyses.impact import Selection
    from rocmport.verify.orchestration.te_layer import TELayer

Mode = Literal["gpu", "cpu-proxy"]


@dataclass(frozen=True)
class UnitOptions:
    """Stage 3: upstream's unit tests."""

    tests: list[str]
    nproc: int
    cache_dir: Path
    base: str | None  # the unported commit the baseline runs
    settings: suite.VerifySettings = field(default_factory=suite.VerifySettings)
    reasons: dict[str, str] = field(default_factory=dict)  # test -> why it is in the suite
    selection: str = "series"  # series | fallback | explicit | all | impacted
    impact: Selection | None = None  # impacted: since, until, changed files, test files selected of the total


@dataclass(frozen=True)
class FunctionalOptions:
    """Stage 4: upstream's functional GPT case through pretrain_gpt.py."""

    case: str
    iters: int
    defaulted: bool = True
    data_path: str | None = None
    record: bool = False
    series_dir: Path | None = None
    resume: bool = True


@dataclass(frozen=True)
class VerifyOptions:
    """Everything a verify run is given, as `run.prepare` checked it (sizes, the tree, its Python):
    ``dp`` is resolved. ``unit``/``functional``/``bridge_tree`` None: that stage does not run and
    ``skipped`` says why; ``stages`` limits the run to a subset."""

    tree: Path
    tp: int = DEFAULT_TP
    pp: int = DEFAULT_PP
    dp: int = 1
    backend: str = DEFAULT_BACKEND
    iters: int = DEFAULT_ITERS
    unit: UnitOptions | None = None
    functional: FunctionalOptions | None = None
    bridge_tree: Path | None = None
    launcher: Launcher = field(default_factory=Launcher)
    hip_version: str | None = hip_sim.DEFAULT_VERSION  # CPU proxy: the simulated ROCm (None: the CUDA path)
    hip_arch: str = hip_sim.DEFAULT_ARCH  # CPU proxy: the simulated GPU's architecture (--hip-arch)
    stages: tuple[str, ...] = ()  # the selected stages' names (prepare: every stage by default)
    skipped: dict[str, str] = field(default_factory=dict)  # stage -> why it does not run here
    te: TELayer | None = None  # Transformer Engine's Python layer on the CPU proxy (None: the local spec)
    moe: bool = True  # with TE: stage 2's MoE case too (--no-moe leaves it out)
    fp8: str | None = None  # with TE: stage 2's FP8 case, "FORMAT:RECIPE" (--fp8-format/--fp8-recipe)
    pycache: Path | None = None  # where the started processes write bytecode (None: they write none)

    @property
    def world(self) -> int:
        return self.tp * self.pp * self.dp


@dataclass(frozen=True)
class VerifyContext:
    """What every stage of one run shares, computed once: the mode and backend, the machine (probed
    once), the simulated ROCm, the firewall's list and the started processes' environment."""

    opts: VerifyOptions
    mode: Mode
    backend: str
    profile: str  # the firewall profile: "rocm" on GPUs, "cpu-proxy" otherwise
    blocked: tuple[str, ...]  # what the firewall removes (TE let through with --te)
    machine: Environment
    hip_version: str | None  # None on a real device and with --no-hip-sim
    device_arch: str | None  # the ROCm GPU's arch, the simulated one (--hip-arch), or None (CUDA)
    env: dict[str, str]  # the started processes' environment
    tmp: Path  # the run's own temporary directory (removed at its end)

    @property
    def tree(self) -> Path:
        return self.opts.tree

    @property
    def launcher(self) -> Launcher:
        return self.opts.launcher


@dataclass
class StageRun:
    """A stage's result, and what it adds to the report under its `Stage.report_key`."""

    result: StageResult
    # stage 2: Training, stage 4: FunctionalRun, stage 5: BridgeTraining (VerifyReport.fill puts each in
    # its field); None: nothing to add
    data: Training | FunctionalRun | BridgeTraining | None = None


class Stage(ABC):
    """One verify stage. ``number`` is its place in `registry.STAGES` (1-based, `--stages 3`)."""

    name: ClassVar[str]  # `--stages` and the report's stage name
    summary: ClassVar[str]  # one line: what it proves (`verify --help`)
    report_key: ClassVar[str | None] = None  # the report field its StageRun.data fills
    after_imports: ClassVar[bool] = True  # skipped when stage 1 (the imports) failed

    def requested(self, opts: VerifyOptions) -> bool:
        """Whether the run's options ask for it (when not, ``opts.skipped[name]`` says why)."""
        return True

    @abstractmethod
    def launches(self, opts: VerifyOptions, tmp: Path) -> list[dict]:
        """The launches it would make ({stage, command, cwd}; `--dry-run`), temporary paths under ``tmp``."""

    @abstractmethod
    def run(self, ctx: VerifyContext) -> StageRun:
        """Run it: its result (and report data), never an exception for a failure of the tree."""
