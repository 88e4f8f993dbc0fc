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
from typing import Any

from rocmport.upstreams import MEGATRON_BRIDGE, MEGATRON_LM
from rocmport.machine.python import declared_unmet, distributions_of, unmet_python
from rocmport.verify.stages.gpt_training import (
    FAIL,
    PASS,
    ImportProbe,
    SKIPPED,
    UNSUPPORTED,
    StageResult,
    _last_error,
    launch,
    modules_import,
    probe_imports,
    took_part,
    unsupported_why,
)
from rocmport.verify.orchestration.launcher import Launcher

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


def bridge_command(launcher: Launcher, tp: int, pp: int, dp: int, iters: int, out: Path, te: bool = False) -> list[str]:
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
            *(["--te"] if te else []),
        ],
        "bridge",
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
    te: str | None = None,
) -> tuple[StageResult, BridgeTraining | None]:
    """``te``: the description of TE's Python layer when the GPTModelProvider uses Bridge's TE spec."""
    start = time.monotonic()
    need = unmet_python(bridge_tree)
    if need:
        return StageResult(
            "bridge", SKIPPED, f"{bridge_tree} requires Python {need}; this is Python {sys.version.split()[0]}"
        ), None
    env = bridge_env(env, bridge_tree)
    mods = _modules(bridge_tree)
    results, _, crashed = probe_imports(bridge_tree, env, mods)
    if results is None:
        return StageResult("bridge", FAIL, crashed, time.monotonic() - start), None
    failed = {m: r for m, r in results.items() if r}
    unmet = declared_unmet(bridge_tree, PROVIDED)
    details = ImportProbe(mods, declared_unmet=unmet or None)
    if failed:
        m, r = next(iter(failed.items()))
        missing = f" (missing: {r['missing']})" if r.get("missing") else ""
        return StageResult(
            "bridge",
            FAIL,
            f"{m}: {r['error']}{missing}{_blame_environment(r, unmet)}",
            time.monotonic() - start,
            replace(details, failures=failed),
        ), None
    with tempfile.TemporaryDirectory(prefix="rocmport-bridge-") as tmp:
        out = Path(tmp) / "bridge.json"
        run = launch(bridge_command(launcher, tp, pp, dp, iters, out, te=te is not None), env, bridge_tree)
        data = json.loads(out.read_text()) if out.exists() else None
    if run.returncode == 0 and not data and launcher.multi_node:
        return took_part("bridge", launcher, time.monotonic() - start), None
    if data and "unsupported" in data:
        return StageResult(
            "bridge", UNSUPPORTED, unsupported_why(data["unsupported"]), time.monotonic() - start, details
        ), None
    if run.returncode != 0 or not data:
        return StageResult(
            "bridge",
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
        return StageResult("bridge", FAIL, "; ".join(problems), seconds, details), training
    reason = (
        f"{modules_import(len(mods), 'Bridge ')} behind the firewall; GPTModelProvider model tp{tp}×pp{pp}: "
        f"loss {losses[0]:.4f} -> {losses[-1]:.4f} in {iters} iterations, tied embeddings equal"
        + (f"; Bridge's TE layer spec, {te}" if te else "")
    )
    return StageResult("bridge", PASS, reason, seconds, details), training
