"""verify's command-line options: the run's shared ones (the tree, the sizes, the backend, the HIP
simulation, TE with its flavour and FP8, the launcher), declared here, and each stage's own (its ``cli_options``), in the
order of `registry.STAGES`. `rocmport verify` adds them all; `run.prepare` checks them (a caller
such as refresh names only some: the others take their defaults from here)."""

from __future__ import annotations

from typing import Any

import click

from rocmport.config import DEFAULT_BACKEND, DEFAULT_ITERS, DEFAULT_PP, DEFAULT_TP
from rocmport.verify.runtime import hip_sim
from rocmport.verify.orchestration.contract import option_defaults
from rocmport.verify.orchestration.launcher import KINDS
from rocmport.verify.orchestration import registry
from rocmport.verify.orchestration.sizes import MAX_ITERS, MAX_WORLD, SIZE

RUN_OPTIONS: tuple[click.Option, ...] = (
    click.Option(
        ["--tree"],
        type=click.Path(file_okay=False),
        help="The ported Megatron-LM tree (default: the megatron-lm work tree).",
    ),
    click.Option(
        ["--tp"], type=SIZE, default=None, help=f"Tensor-parallel size (default: [tool.rocmport] tp or {DEFAULT_TP})."
    ),
    click.Option(
        ["--pp"], type=SIZE, default=None, help=f"Pipeline-parallel size (default: [tool.rocmport] pp or {DEFAULT_PP})."
    ),
    click.Option(["--dp"], type=SIZE, default=None, help="Data-parallel size (default 1)."),
    click.Option(["--nproc"], type=SIZE, default=None, help="Total processes (a multiple of tp×pp; sets dp)."),
    click.Option(
        ["--backend"], type=click.Choice(["auto", "nccl", "gloo"]), default=DEFAULT_BACKEND, show_default=True
    ),
    click.Option(
        ["--iters"],
        type=click.IntRange(2, MAX_ITERS),
        default=DEFAULT_ITERS,
        show_default=True,
        help="Training iterations in stages 2, 4 and 5.",
    ),
    click.Option(
        ["--stages", "stages_text"],
        default=None,
        metavar="LIST",
        help="Run only these stages: numbers or names, comma-separated "
        f"({', '.join(f'{i} {s.name}' for i, s in enumerate(registry.STAGES, 1))}).",
    ),
    click.Option(
        ["--hip-version"],
        default=hip_sim.DEFAULT_VERSION,
        show_default=True,
        metavar="VERSION",
        help="CPU proxy: the ROCm version every process sees torch built for (the HIP simulation; e.g. 6.4).",
    ),
    click.Option(
        ["--hip-arch"],
        default=hip_sim.DEFAULT_ARCH,
        show_default=True,
        type=click.Choice(list(hip_sim.SIM_DEVICES)),
        help="CPU proxy: the GPU architecture the HIP simulation answers device questions as (and stage 3's "
        "architecture-conditional ROCm known failures, e.g. AMD's MI250 marks on gfx90a).",
    ),
    click.Option(["--no-hip-sim"], is_flag=True, help="CPU proxy: no HIP simulation (the CUDA path of the same tree)."),
    click.Option(
        ["--te", "te_spec"],
        default="none",
        show_default=True,
        metavar="VERSION|auto|none",
        help="CPU proxy: run upstream's Transformer Engine layer spec with TE's own Python layer of this release "
        "(auto: the newest in the line's component-matrix range on the package index), its compiled kernels "
        "replaced by CPU reference implementations; none: Megatron's local spec.",
    ),
    # TE's flavour and FP8 change every TE process of the run (its layer, the ranks' environment): the
    # run's options, checked in run.prepare with --te.
    click.Option(
        ["--te-flavour"],
        type=click.Choice(["nvidia", "rocm"]),
        default=None,
        help="With --te: rocm (the default under the HIP simulation) applies the declared ROCm TE deltas to NVIDIA's "
        "Python layer (docs/rocm-te-flavour.md); nvidia runs it as released (the default with --no-hip-sim).",
    ),
    click.Option(
        ["--fp8-recipe"],
        type=click.Choice(["delayed", "tensorwise", "mxfp8", "blockwise"]),
        default=None,
        help="With --te: stage 2 trains in FP8 with this recipe (Megatron's --fp8-recipe), through the port's argument "
        "validation (a recipe the GPU cannot run is refused there); its layouts are compared within the FP8 bound.",
    ),
    click.Option(
        ["--fp8-format"],
        type=click.Choice(["hybrid", "e4m3"]),
        default="hybrid",
        show_default=True,
        help="With --fp8-recipe: Megatron's --fp8-format.",
    ),
    click.Option(
        ["--record-reach"],
        is_flag=True,
        help="Record which port sites each functional case and unit-test file of this run ran, and its seconds, "
        "into the line's reach record (patchsets/<upstream>/<line>/reach.json, beside the series): what "
        "`--unit-tests reach` and the reach cases select from.",
    ),
    click.Option(
        ["--launcher", "launcher_kind"],
        type=click.Choice(KINDS),
        default="torchrun",
        show_default=True,
        help="torchrun, or Slurm's srun with one task per GPU (run inside an allocation).",
    ),
    click.Option(
        ["--nnodes"], type=SIZE, default=1, show_default=True, help="Nodes (torchrun: run the same command on each)."
    ),
    click.Option(
        ["--node-rank"],
        type=click.IntRange(0, MAX_WORLD - 1),
        default=0,
        show_default=True,
        help="This node's rank (torchrun, multi-node).",
    ),
    click.Option(
        ["--rdzv-endpoint"],
        default=None,
        metavar="HOST:PORT",
        help="torchrun's c10d rendezvous (multi-node; node 0's address).",
    ),
)


def all_options() -> tuple[click.Option, ...]:
    """The run's options, then each stage's own, in the stages' order."""
    return RUN_OPTIONS + tuple(o for stage in registry.STAGES for o in stage.cli_options)


def defaults() -> dict[str, Any]:
    """Every option's value when it is not given, by parameter name."""
    return option_defaults(all_options())
