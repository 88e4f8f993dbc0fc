"""What a verify stage is. A stage owns its options and its data (as a LibCST codemod owns its
arguments and a pre-commit language its behaviour): its module declares

- ``cli_options``: its command-line options (click), added to `rocmport verify` by the command;
- ``check(given, setup)``: the ONE place those options are checked, returning the stage's own
  typed options, or NotRequested with why it does not run here;
- ``run(ctx, options)`` -> StageRun: its result and its typed report data (StageData), whose
  ``report_entries()`` are the keys it adds to the report's JSON;
- ``launches(opts, options, tmp)``: what it would start (`--dry-run`).

The run's shared options (tree, sizes, backend, HIP simulation, TE, launcher) are VerifyOptions,
checked once by `run.prepare`; each stage's own are in ``VerifyOptions.by_stage``. What every stage
of one run shares is VerifyContext. The stages are listed, in order, in `registry.STAGES`: adding a
stage is its module plus one line there."""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Literal, Protocol, TypeVar

import click

from rocmport.config import DEFAULT_BACKEND, DEFAULT_ITERS, DEFAULT_PP, DEFAULT_TP
from rocmport.verify.runtime import hip_sim
from rocmport.verify.orchestration.launcher import Launcher
from rocmport.verify.orchestration.stage_result import StageResult

if TYPE_CHECKING:
    from rocmport.config import Settings
    from rocmport.machine.probe import Environment
    from rocmport.verify.analyses.port_sites import Site
    from rocmport.verify.orchestration.te_layer import TELayer

Mode = Literal["gpu", "cpu-proxy"]
Options = TypeVar("Options")


@dataclass(frozen=True)
class NotRequested:
    """A stage's ``check``: it does not run here, and why (the report's skipped reason)."""

    why: str


@dataclass(frozen=True)
class VerifyOptions:
    """Everything a verify run is given, as `run.prepare` checked it: the shared options (``dp``
    resolved), and each requested stage's own checked options by its name (``by_stage``); a stage
    absent there does not run and ``skipped`` says why; ``stages`` limits the run to a subset."""

    tree: Path
    tp: int = DEFAULT_TP
    pp: int = DEFAULT_PP
    dp: int = 1
    backend: str = DEFAULT_BACKEND
    iters: int = DEFAULT_ITERS
    launcher: Launcher = field(default_factory=Launcher)
    hip_version: str | None = hip_sim.DEFAULT_VERSION  # CPU proxy: the simulated ROCm (None: the CUDA path)
    hip_arch: str = hip_sim.DEFAULT_ARCH  # CPU proxy: the simulated GPU's architecture (--hip-arch)
    stages: tuple[str, ...] = ()  # the selected stages' names (prepare: every stage by default)
    skipped: dict[str, str] = field(default_factory=dict)  # stage -> why it does not run here
    te: TELayer | None = None  # Transformer Engine's Python layer on the CPU proxy (None: the local spec)
    fp8: str | None = None  # with TE: stage 2's FP8 case, "FORMAT:RECIPE" (--fp8-format/--fp8-recipe)
    pycache: Path | None = None  # where the started processes write bytecode (None: they write none)
    record_reach: Path | None = None  # --record-reach: the series directory whose reach.json this run adds to
    by_stage: dict[str, Any] = field(default_factory=dict)  # stage name -> its own checked options

    @property
    def world(self) -> int:
        return self.tp * self.pp * self.dp


class RunSetup:
    """What a stage's ``check`` may read besides its own options: the project's settings, the tree
    and whether --tree named it, the checked sizes, the tree's series (verify settings, directory,
    base commit), and the run's TE layer (resolved on first use: fetching it may take a download)."""

    def __init__(
        self,
        settings: Settings,
        tree: Path,
        *,
        tree_given: bool,
        tp: int,
        pp: int,
        dp: int,
        iters: int,
        series: Any,  # the series' verify settings (stage 3's suite.VerifySettings: a stage's type, not the contract's)
        series_dir: Path | None,
        base: str | None,
        te: Callable[[], TELayer | None] = lambda: None,
    ) -> None:
        self.settings, self.tree, self.tree_given = settings, tree, tree_given
        self.tp, self.pp, self.dp, self.iters = tp, pp, dp, iters
        self.series, self.series_dir, self.base = series, series_dir, base
        self._te = te

    @functools.cached_property
    def te(self) -> TELayer | None:
        return self._te()


@dataclass(frozen=True)
class VerifyContext:
    """What every stage of one run shares, computed once: the mode and backend, the machine (probed
    once), the simulated ROCm, the firewall's list, the started processes' environment and the port's
    sites (found on first use)."""

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
    sites_dir: Path | None = None  # where the started processes record the port's helper call sites
    # stage 4's CUDA-path twin of an FP8 case (--no-hip-sim, TE's arithmetic deltas only); None off the ROCm flavour
    cuda_twin_env: dict[str, str] | None = None

    @functools.cached_property
    def port_sites(self) -> list[Site]:
        """The port's helper call sites in the tree (port_sites.tree_sites: every file the codemods touched
        parsed and blamed), found once per run when first asked, for its readers: stage 1's guard probe,
        --record-reach's record and the report's coverage. Not cached beyond the run: a tree edited
        between two runs is read again."""
        from rocmport.verify.analyses.port_sites import tree_sites

        return tree_sites(self.tree)

    @property
    def tree(self) -> Path:
        return self.opts.tree

    @property
    def launcher(self) -> Launcher:
        return self.opts.launcher


class StageData(Protocol):
    """A stage's typed report data: ``report_entries()`` are the top-level keys it adds to the
    report's JSON ({"training": {...}}); the renderers read its attributes."""

    def report_entries(self) -> dict[str, Any]: ...


@dataclass
class StageRun:
    """A stage's result, and the data it adds to the report (None: nothing)."""

    result: StageResult
    data: StageData | None = None


class Stage(ABC, Generic[Options]):
    """One verify stage. ``number`` is its place in `registry.STAGES` (1-based, `--stages 3`)."""

    name: ClassVar[str]  # `--stages` and the report's stage name
    summary: ClassVar[str]  # one line: what it proves (`verify --help`)
    after_imports: ClassVar[bool] = True  # skipped when stage 1 (the imports) failed
    cli_options: ClassVar[tuple[click.Option, ...]] = ()  # its own command-line options
    # The report's entries when the stage gave no data (skipped, or stopped before any): stage 2's
    # "training" is {} then, the others are left out.
    absent_entries: ClassVar[Mapping[str, Any]] = {}

    @abstractmethod
    def check(self, given: Mapping[str, Any], setup: RunSetup) -> Options | NotRequested:
        """Its options from the command line's values (``given``, by parameter name, every option
        present), checked: BadInput (exit 2) for a bad one, NotRequested when it does not run here."""

    def launches(self, opts: VerifyOptions, options: Options, tmp: Path) -> list[dict]:
        """The launches it would make ({stage, command, cwd}; `--dry-run`), temporary paths under ``tmp``."""
        return []

    @abstractmethod
    def run(self, ctx: VerifyContext, options: Options) -> StageRun:
        """Run it: its result (and report data), never an exception for a failure of the tree."""

    def data_when_skipped(self, ctx: VerifyContext, options: Options) -> StageData | None:
        """Report data of a requested stage that did not run (stage 1 failed): none by default."""
        return None


def option_defaults(options: tuple[click.Option, ...]) -> dict[str, Any]:
    """Each option's value when the command line does not give it, as click gives it to the command
    (a flag False, a repeatable option ()): what `prepare` fills in for a caller that names only some."""
    return dict(click.Command("defaults", params=list(options)).make_context("defaults", []).params)
