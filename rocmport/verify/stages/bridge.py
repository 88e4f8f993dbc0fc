"""verify's Megatron-Bridge stage: with the ported Megatron-LM and Bridge behind the firewall,
Bridge and its training/recipe modules import, and a small GPT configured and built by Bridge's
GPTModelProvider trains with megatron's schedule (loss falls, tied embeddings stay equal)."""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import click

from rocmport import output
from rocmport.errors import BadInput
from rocmport.upstream.lock import load_lock
from rocmport.upstreams import MEGATRON_BRIDGE, MEGATRON_LM
from rocmport.machine.python import declared_unmet, distributions_of, unmet_python
from rocmport.verify.analyses.port_sites import Coverage, tree_coverage
from rocmport.verify.orchestration.contract import NotRequested, RunSetup, Stage, StageRun, VerifyContext, VerifyOptions
from rocmport.verify.orchestration.launcher import Launcher
from rocmport.verify.orchestration.stage_result import FAIL, PASS, SKIPPED, UNSUPPORTED, StageResult
from rocmport.verify.stages.gpt_training import _last_error, launch, took_part, unsupported_why
from rocmport.verify.stages.imports import ImportProbe, modules_import, probe_imports

if TYPE_CHECKING:
    from rocmport.verify.orchestration.te_layer import TELayer

NAME = "bridge"

# The package, the GPT provider, and the training entry points and recipes users run.
BRIDGE_MODULES = (
    MEGATRON_BRIDGE.module,
    "megatron.bridge.models.gpt_provider",
    "megatron.bridge.peft.lora",
    "megatron.bridge.training.gpt_step",
    "megatron.bridge.training.pretrain",
    "megatron.bridge.training.train",
    "megatron.bridge.training.checkpointing",
    "megatron.bridge.recipes",
)


# What the README's "Python 3.12" block installs for Megatron-Bridge v0.5 and later (the v0.18, v0.19
# and main lines), its one source: a transformers range inside each of their declared ones (v0.5
# `>=5.8.1,<5.9`, v0.6 and main `>=5.8,<=5.12.1`) and the tokenizers it works with. Where the installed
# transformers misses Bridge's declared range and that range admits this pin, stage 5 suggests the same.
BRIDGE_PINS = ("transformers>=5.8.1,<5.9", "tokenizers<0.23")

# What verify puts on the path itself (the ported trees) or never replaces (the user's torch): a
# version Bridge declares for these says nothing about the environment.
PROVIDED = (MEGATRON_LM.distribution, MEGATRON_BRIDGE.distribution, "torch")


def _blame_environment(failure: dict, unmet: dict[str, dict[str, str]]) -> str:
    """When the module a failed import names comes from a distribution installed outside the range
    Bridge declares for it (transformers 5.24 removed what Bridge v0.5, declaring >=5.8.1,<5.9, imports),
    the failure is this environment's, not the port's: say so, with the pip command."""
    names = [failure.get("missing") or ""] + re.findall(r"from '([\w.]+)'", failure.get("error", ""))
    dists = sorted({d for n in names if n for d in distributions_of(n)} & set(unmet))
    if not dists:
        return ""
    found = "; ".join(
        f"{d} {unmet[d]['installed']} is installed, Megatron-Bridge declares {unmet[d]['declared']}" for d in dists
    )
    pinned = [d for d in dists if _pin_fits(d, unmet[d]["declared"])]
    wanted = " ".join(
        [f"'{p}'" for p in BRIDGE_PINS if pinned] + [f"'{unmet[d]['declared']}'" for d in dists if d not in pinned]
    )
    return f" — an environment problem: {found} (pyproject.toml): `{sys.executable} -m pip install {wanted}`" + (
        " (the README's pin for Megatron-Bridge v0.5+, inside that range)" if pinned else ""
    )


def _pin_fits(dist: str, declared: str) -> bool:
    """Whether BRIDGE_PINS pins ``dist`` with a range whose lowest version the declared requirement admits."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    wanted = Requirement(declared).specifier
    for pin in map(Requirement, BRIDGE_PINS):
        if canonicalize_name(pin.name) == dist:
            floors = [s.version for s in pin.specifier if s.operator in (">=", "==", "~=")]
            return bool(floors) and all(wanted.contains(v, prereleases=True) for v in floors)
    return False


def _modules(bridge_tree: Path) -> list[str]:
    src = bridge_tree / "src"
    return [
        m
        for m in BRIDGE_MODULES
        if (src / m.replace(".", "/")).with_suffix(".py").is_file()
        or (src / m.replace(".", "/") / "__init__.py").is_file()
    ]


def bridge_env(env: dict, bridge_tree: Path) -> dict:
    env = dict(env)
    parts = env.get("PYTHONPATH", "").split(os.pathsep)
    # After the firewall bootstrap (first), before the Megatron-LM tree.
    env["PYTHONPATH"] = os.pathsep.join([parts[0], str(bridge_tree / "src"), *parts[1:]])
    return env


def bridge_command(
    launcher: Launcher, tp: int, pp: int, dp: int, iters: int, out: Path, te: TELayer | None = None
) -> list[str]:
    return launcher.command(
        tp * pp * dp,
        [
            "-m",
            "rocmport.verify.runtime.gpt_worker",
            "--bridge",
            "--tp",
            str(tp),
            "--pp",
            str(pp),
            "--iters",
            str(iters),
            "--out",
            str(out),
            *(["--te"] if te is not None else []),
        ],
        NAME,
    )


@dataclass
class BridgeTraining:
    """Stage 5's losses (`bridge_training` of the report): a GPT built by Bridge's GPTModelProvider."""

    losses: list[float]
    tied_embeddings_equal: bool

    def to_dict(self) -> dict[str, Any]:
        return {"losses": self.losses, "tied_embeddings_equal": self.tied_embeddings_equal}


def stage_bridge(
    bridge_tree: Path,
    env: dict,
    tp: int,
    pp: int,
    dp: int,
    iters: int,
    launcher: Launcher = Launcher(),
    te: TELayer | None = None,
) -> tuple[StageResult, BridgeTraining | None]:
    """``te``: TE's Python layer when the GPTModelProvider uses Bridge's TE spec."""
    start = time.monotonic()
    need = unmet_python(bridge_tree)
    if need:
        return StageResult(
            NAME, SKIPPED, f"{bridge_tree} requires Python {need}; this is Python {sys.version.split()[0]}"
        ), None
    env = bridge_env(env, bridge_tree)
    mods = _modules(bridge_tree)
    results, _, crashed = probe_imports(bridge_tree, env, mods)
    if results is None:
        return StageResult(NAME, FAIL, crashed, time.monotonic() - start), None
    failed = {m: r for m, r in results.items() if r}
    unmet = declared_unmet(bridge_tree, PROVIDED)
    details = ImportProbe(mods, declared_unmet=unmet or None)
    if failed:
        m, r = next(iter(failed.items()))
        missing = f" (missing: {r['missing']})" if r.get("missing") else ""
        return StageResult(
            NAME,
            FAIL,
            f"{m}: {r['error']}{missing}{_blame_environment(r, unmet)}",
            time.monotonic() - start,
            replace(details, failures=failed),
        ), None
    with tempfile.TemporaryDirectory(prefix="rocmport-bridge-") as tmp:
        out = Path(tmp) / "bridge.json"
        run = launch(bridge_command(launcher, tp, pp, dp, iters, out, te=te), env, bridge_tree)
        data = json.loads(out.read_text()) if out.exists() else None
    if run.returncode == 0 and not data and launcher.multi_node:
        return took_part(NAME, launcher, time.monotonic() - start), None
    if data and "unsupported" in data:
        return StageResult(
            NAME, UNSUPPORTED, unsupported_why(data["unsupported"]), time.monotonic() - start, details
        ), None
    if run.returncode != 0 or not data:
        return StageResult(
            NAME,
            FAIL,
            f"training through GPTModelProvider failed: {_last_error(run)}",
            time.monotonic() - start,
            details,
        ), None
    losses = data["losses"]
    training = BridgeTraining(losses, data["tied_embeddings_equal"])
    problems = []
    if not losses or losses[-1] >= losses[0]:
        problems.append(
            f"loss did not decrease ({losses[0]:.4f} -> {losses[-1]:.4f})" if losses else "no losses reported"
        )
    if not data["tied_embeddings_equal"]:
        problems.append("tied embedding copies differ")
    seconds = time.monotonic() - start
    if problems:
        return StageResult(NAME, FAIL, "; ".join(problems), seconds, details), training
    reason = (
        f"{modules_import(len(mods), 'Bridge ')} behind the firewall; GPTModelProvider model tp{tp}×pp{pp}: "
        f"loss {losses[0]:.4f} -> {losses[-1]:.4f} in {iters} iterations, tied embeddings equal"
        + (f"; Bridge's TE layer spec, {te.describe()}" if te else "")
    )
    return StageResult(NAME, PASS, reason, seconds, details), training


@dataclass(frozen=True)
class BridgeOptions:
    """Stage 5: the project's Megatron-Bridge work tree it runs."""

    tree: Path


@dataclass
class BridgeReport:
    """Stage 5's report data: its losses (`bridge_training`, when it trained) and the port's helper
    call sites that ran in the Bridge tree (`bridge_port_sites`)."""

    training: BridgeTraining | None
    port_sites: dict[str, Coverage]

    def report_entries(self) -> dict[str, Any]:
        out: dict[str, Any] = {"bridge_port_sites": {name: cov.to_dict() for name, cov in self.port_sites.items()}}
        if self.training is not None:
            out["bridge_training"] = self.training.to_dict()
        return out


def _lock_pins(settings, name: str) -> bool:
    """Whether the project's lock pins ``name`` (True when there is no lock to say otherwise)."""
    return not settings.lock_path.is_file() or name in load_lock(settings.lock_path).upstreams


class BridgeStage(Stage[BridgeOptions]):
    name = NAME
    summary = "Megatron-Bridge's modules import; a GPT built by its GPTModelProvider trains"
    cli_options = (
        click.Option(
            ["--bridge/--no-bridge", "with_bridge"],
            default=None,
            help="Stage 5, Megatron-Bridge (default: when the megatron-bridge work tree exists and --tree is not given).",
        ),
    )

    def check(self, given: Mapping[str, Any], setup: RunSetup) -> BridgeOptions | NotRequested:
        settings, wanted = setup.settings, given["with_bridge"]
        bridge_tree = settings.worktree_path(MEGATRON_BRIDGE.name)
        if wanted is None:  # the Bridge tree of the lock: a refresh to a release without a companion unpins it
            pinned = _lock_pins(settings, MEGATRON_BRIDGE.name)
            if setup.tree_given:
                return NotRequested(
                    "--tree given (stage 5 runs with the project's own work trees; --bridge to ask for it)"
                )
            if not bridge_tree.is_dir():
                return NotRequested("no Megatron-Bridge work tree (the lock pins no Bridge)")
            if not pinned:
                return NotRequested(
                    "the lock pins no Megatron-Bridge (its old work tree is not verified against this Megatron-LM)"
                )
        elif not wanted:
            return NotRequested("--no-bridge")
        if not bridge_tree.is_dir():
            raise BadInput(
                f"{bridge_tree}: no Megatron-Bridge work tree; run `rocmport apply` with a Bridge pin or pass --no-bridge"
            )
        return BridgeOptions(bridge_tree.resolve())

    def launches(self, opts: VerifyOptions, options: BridgeOptions, tmp: Path) -> list[dict]:
        return [
            {
                "stage": self.name,
                "command": bridge_command(
                    opts.launcher, opts.tp, opts.pp, opts.dp, opts.iters, tmp / "bridge.json", te=opts.te
                ),
                "cwd": str(options.tree),
            }
        ]

    def run(self, ctx: VerifyContext, options: BridgeOptions) -> StageRun:
        o = ctx.opts
        with output.progress(f"stage 5: Megatron-Bridge imports and GPTModelProvider training tp{o.tp}×pp{o.pp}"):
            result, training = stage_bridge(options.tree, ctx.env, o.tp, o.pp, o.dp, o.iters, o.launcher, te=o.te)
        return StageRun(result, BridgeReport(training, self._sites(ctx, options)))

    def data_when_skipped(self, ctx: VerifyContext, options: BridgeOptions) -> BridgeReport:
        return BridgeReport(None, self._sites(ctx, options))  # its sites, none of them reached

    @staticmethod
    def _sites(ctx: VerifyContext, options: BridgeOptions) -> dict[str, Coverage]:
        # After its own processes ran: the Bridge tree's sites are reached by stage 5's processes alone.
        assert ctx.sites_dir is not None
        return tree_coverage(options.tree, ctx.sites_dir, ctx.opts.stages, ctx.opts.te.version if ctx.opts.te else None)


STAGE = BridgeStage()
