"""A verify run: the options it is given, the launches it would make (`--dry-run`) and the stages
it runs, as plain functions over a ported tree. On GPUs: nccl (RCCL on ROCm). Without: CPU proxy on gloo."""

from __future__ import annotations

import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rocmport import output
from rocmport.config import Settings
from rocmport.errors import BadInput
from rocmport.nvidia_only import blocked
from rocmport.patches.series import load_series
from rocmport.port import worktree as wt
from rocmport.upstream.lock import load_lock
from rocmport.verify import environment, firewall, stages
from rocmport.verify.gpt_worker import HEADS, LAYERS  # imports no torch at module level
from rocmport.verify.launcher import Launcher
from rocmport.upstreams import MEGATRON_LM


def check_sizes(tp: int, pp: int, iters: int) -> None:
    """The option checks a run and a --dry-run share."""
    if tp < 1 or pp < 1 or iters < 2:
        raise BadInput("--tp and --pp must be >= 1 and --iters >= 2")


def run_verify(tree: Path, tp: int, pp: int, dp: int | None, nproc: int | None, backend: str, iters: int,
               bridge_tree: Path | None = None, unit: dict | None = None, functional: dict | None = None,
               launcher: Launcher = Launcher()) -> dict:
    """``unit``: {tests, nproc, known, cache_dir, base} for stage 3, upstream's unit tests;
    ``functional``: {case, defaulted, data_path, record, series_dir, iters} for stage 4, upstream's
    functional GPT case (None: the stage is not run)."""
    if not (tree / MEGATRON_LM.package_dir).is_dir():
        raise BadInput(f"{tree}: not a Megatron-LM tree (no megatron/core); run `rocmport apply` or pass --tree")
    check_sizes(tp, pp, iters)
    if nproc is not None:
        if nproc % (tp * pp):
            raise BadInput(f"--nproc {nproc} is not a multiple of tp×pp = {tp * pp}")
        dp = nproc // (tp * pp)
    dp = dp or 1
    world = tp * pp * dp
    if LAYERS % pp:
        raise BadInput(f"--pp {pp}: the verify model has {LAYERS} layers; use a pp that divides {LAYERS}")
    if HEADS % tp:
        raise BadInput(f"--tp {tp}: the verify model has {HEADS} heads; use a tp that divides {HEADS}")
    environment.check_python(tree)
    env_info = environment.probe()
    if backend == "auto":
        backend = "nccl" if env_info.has_gpu else "gloo"
    per_node = launcher.per_node(world)
    if backend == "nccl" and per_node > env_info.device_count:
        raise BadInput(f"world size {world} (tp {tp} × pp {pp} × dp {dp}) over {launcher.nnodes} node(s) needs {per_node} GPUs per node; "
                       f"this machine has {env_info.device_count}")
    mode = "gpu" if backend == "nccl" else "cpu-proxy"
    profile = "rocm" if mode == "gpu" else "cpu-proxy"
    extra = {"ROCMPORT_BACKEND": backend, **firewall.firewall_env(profile)}
    if mode == "cpu-proxy":
        extra["ROCMPORT_PROXY"] = "1"
    applied_launch_env = environment.launcher_env_for(env_info)
    extra.update(applied_launch_env)
    result: dict[str, Any] = {"mode": mode, "backend": backend, "world_size": world, "tp": tp, "pp": pp, "dp": dp, "tree": str(tree),
              "env": {**env_info.to_dict(), "launcher_env": applied_launch_env, "firewall_profile": profile,
                      "components": _component_versions(tree)},
              "launcher": launcher.to_dict(), "stages": [], "training": {}}
    missing = environment.missing_deps(tree)
    with tempfile.TemporaryDirectory(prefix="rocmport-fw-") as tmp:
        env = environment.child_env(tree, firewall.write_bootstrap(Path(tmp)), extra)
        if missing:
            cmd = f"python -m pip install {' '.join(sorted(set(missing.values())))}"
            result["stages"].append(stages.StageResult("imports", stages.FAIL, f"missing dependencies {', '.join(sorted(missing))}: `{cmd}`").to_dict())
        else:
            with output.progress("stage 1: imports behind the firewall"):
                imports = stages.stage_imports(tree, env, blocked(profile))
            result["stages"].append(imports.to_dict())
        if result["stages"][-1]["status"] != stages.PASS:
            result["stages"].append(stages.StageResult("gpt-training", stages.SKIPPED, "imports failed").to_dict())
        else:
            with output.progress(f"stage 2: GPT training tp{tp}×pp{pp}×dp{dp} on {backend} and the tp1/pp1 reference"):
                training, data = stages.stage_training(tree, env, tp, pp, dp, iters, backend, launcher)
            result["stages"].append(training.to_dict())
            result["training"] = data
        if unit is not None:
            _unit_tests(result, tree, env, unit, launcher)
        if functional is not None:
            _functional(result, tree, env, functional, dp, mode, env_info, launcher)
        if bridge_tree is not None:
            _bridge(result, bridge_tree, env, tp, pp, dp, iters, launcher)
    return result


def _skipped_without_imports(result: dict, name: str) -> bool:
    """Stages after 1 need the tree to import: otherwise they are listed as skipped."""
    if result["stages"][0]["status"] == stages.PASS:
        return False
    result["stages"].append(stages.StageResult(name, stages.SKIPPED, "Megatron-LM imports failed (stage 1)").to_dict())
    return True


def _unit_tests(result: dict, tree: Path, env: dict, unit: dict, launcher: Launcher) -> None:
    from rocmport.verify.unit_tests import stage_unit_tests

    if _skipped_without_imports(result, "unit-tests"):
        return
    with output.progress(f"stage 3: upstream unit tests on {unit['nproc']} ranks ({len(unit['tests'])} files) and the unported baseline"):
        res = stage_unit_tests(tree, env, unit["tests"], unit["nproc"], unit["known"], unit["cache_dir"], unit["base"], launcher)
    result["stages"].append(res.to_dict())


def device_kind(mode: str, env_info: environment.Environment) -> str:
    """Goldens are kept per device kind: `cpu-proxy`, or the platform and the first GPU's name."""
    if mode == "cpu-proxy" or not env_info.devices:
        return "cpu-proxy"
    name = re.sub(r"[^a-z0-9]+", "-", env_info.devices[0].lower()).strip("-")
    return f"{'rocm' if env_info.hip else 'cuda'}-{name}"


def _functional(result: dict, tree: Path, env: dict, opts: dict, dp: int, mode: str, env_info, launcher: Launcher) -> None:
    from rocmport.verify.functional import stage_functional

    if _skipped_without_imports(result, "functional"):
        return
    with output.progress(f"stage 4: upstream's functional case {opts['case']} (pretrain_gpt.py, {opts['iters']} iterations)"):
        res, data = stage_functional(tree, env, case=opts["case"], dp=dp, iters=opts["iters"], proxy=mode == "cpu-proxy",
                                     data_path=opts["data_path"], series_dir=opts["series_dir"], record=opts["record"],
                                     device_kind=device_kind(mode, env_info), defaulted=opts["defaulted"], launcher=launcher)
    result["stages"].append(res.to_dict())
    result["functional"] = data


def _bridge(result: dict, bridge_tree: Path, env: dict, tp: int, pp: int, dp: int, iters: int, launcher: Launcher) -> None:
    from rocmport.verify.bridge_stage import stage_bridge

    if _skipped_without_imports(result, "bridge"):
        return
    with output.progress(f"stage 5: Megatron-Bridge imports and GPTModelProvider training tp{tp}×pp{pp}"):
        bridge, data = stage_bridge(bridge_tree, env, tp, pp, dp, iters, launcher)
    result["stages"].append(bridge.to_dict())
    result["bridge_training"] = data


def _component_versions(tree: Path) -> dict:
    """doctor's view of the line's ROCm components here: {name: {version, status}} for the report's env."""
    from rocmport.verify.doctor import for_verify

    _, series_dir, _ = series_settings(tree)
    return for_verify(series_dir / "series" if series_dir else None)["components"]


def series_settings(tree: Path) -> tuple[dict, Path | None, str | None]:
    """The series the tree was ported with (verify's settings, its directory) and the base commit."""
    state = wt.read_state(tree)
    series = Path(state.series) if state and state.series else None
    base = state.base if state else None
    if series and series.is_file():
        return load_series(series).verify, series.parent, base
    return {}, None, base


def unit_options(cfg: dict, base: str | None, cache_dir: Path, tree: Path, wanted, tests, nproc: int) -> dict | None:
    from rocmport.verify.unit_tests import DEFAULT_TESTS

    if wanted is False or (wanted is None and not (tree / "tests" / "unit_tests").is_dir()):
        return None
    if nproc < 1:
        raise BadInput(f"--unit-nproc {nproc}: must be at least 1")
    return {"tests": list(tests) or list(cfg.get("unit_tests") or DEFAULT_TESTS), "nproc": nproc,
            "known": dict(cfg.get("known_failures") or {}), "cache_dir": cache_dir, "base": base}


def functional_options(tree: Path, series_dir: Path | None, wanted, case, tp: int, pp: int, data_path, record: bool,
                        iters: int) -> dict | None:
    from rocmport.verify.doctor import for_verify
    from rocmport.verify.functional import default_case

    if wanted is False or (wanted is None and not (tree / "pretrain_gpt.py").is_file()):
        return None
    if data_path and not Path(data_path.split()[-1]).parent.exists():
        raise BadInput(f"--data-path {data_path}: no such directory; give the prefix of a Megatron .bin/.idx dataset")
    if record and series_dir is None:
        raise BadInput(f"{tree}: --record-golden needs a tree made by `rocmport apply` (goldens live next to its series)")
    # The TE case where doctor finds Transformer Engine usable (installed, in the line's range, built for the GPU).
    te_usable = for_verify(series_dir / "series" if series_dir else None)["te_usable"]
    return {"case": case or default_case(tp, pp, te_usable), "defaulted": not case,
            "data_path": data_path, "record": record, "series_dir": series_dir, "iters": iters}


def launch_plan(tree: Path, tp: int, pp: int, dp: int, iters: int, unit: dict | None, functional: dict | None,
                bridge_tree: Path | None, launcher: Launcher) -> list[dict]:
    """The command line of every launch verify would make (``--dry-run``); temporary paths under $TMP."""
    from rocmport.verify.bridge_stage import bridge_command
    from rocmport.verify.functional import build_args, functional_command, load_case
    from rocmport.verify.unit_tests import pytest_command

    tmp = Path("$TMP")
    plan = [{"stage": "imports", "command": ["python", "-c", "<import probe>"], "cwd": str(tree)}]
    for name, cmd in stages.training_commands(launcher, tp, pp, dp, iters, tmp).items():
        plan.append({"stage": f"gpt-training ({name})", "command": cmd, "cwd": str(tree)})
    if unit is not None and launcher.runs_stage(single_node=True):
        plan.append({"stage": "unit-tests", "command": pytest_command(unit["tests"], unit["nproc"], launcher), "cwd": str(tree)})
        plan.append({"stage": "unit-tests (baseline, unless cached)", "command": pytest_command(unit["tests"], unit["nproc"], launcher),
                     "cwd": f"{tmp}/baseline at {str(unit['base'])[:12]}"})
    if functional is not None:
        from rocmport.verify.functional import case_dir

        if (case_dir(tree, functional["case"]) / "model_config.yaml").is_file():
            config = load_case(tree, functional["case"])
            args = build_args(config, iters=functional["iters"], proxy=not environment.probe().has_gpu,
                              data_path=functional["data_path"], work=tmp)
            plan.append({"stage": "functional", "command": functional_command(launcher, config, args, dp), "cwd": str(tree)})
    if bridge_tree is not None:
        plan.append({"stage": "bridge", "command": bridge_command(launcher, tp, pp, dp, iters, tmp / "bridge.json"), "cwd": str(bridge_tree)})
    return plan


def _lock_pins(settings: Settings, name: str) -> bool:
    """Whether the project's lock pins ``name`` (True when there is no lock to say otherwise)."""
    return not settings.lock_path.is_file() or name in load_lock(settings.lock_path).upstreams


@dataclass
class Prepared:
    """What a verify run is given once the command's options are checked against the project."""

    tree: Path                   # the ported Megatron-LM tree (resolved)
    bridge_tree: Path | None     # the Megatron-Bridge tree for stage 5, or None
    unit: dict | None            # stage 3's options (unit_options), or None
    functional: dict | None      # stage 4's options (functional_options), or None
    launcher: Launcher


def prepare(settings: Settings, tree: str | None, *, tp: int, pp: int, iters: int, backend: str, with_unit: bool | None,
            unit_tests, unit_nproc: int, with_functional: bool | None, case: str | None, data_path: str | None,
            record_golden: bool, with_bridge: bool | None, launcher_kind: str, nnodes: int, node_rank: int,
            rdzv_endpoint: str | None) -> Prepared:
    """Check the trees and stage options for a run (or a --dry-run) of verify in project ``settings``."""
    check_sizes(tp, pp, iters)
    path = Path(tree) if tree else settings.worktree_path("megatron-lm")
    if not path.is_dir():
        raise BadInput(f"{path}: no such tree; run `rocmport apply` first or pass --tree")
    if not (path / "megatron" / "core").is_dir():
        raise BadInput(f"{path}: not a Megatron-LM tree (no megatron/core); run `rocmport apply` or pass --tree")
    environment.check_python(path)  # before anything imports torch: a 3.12 tree on 3.11 says how to get 3.12
    bridge_tree = settings.worktree_path("megatron-bridge")
    if with_bridge is None:  # the Bridge tree of the lock: a refresh to a release without a companion unpins it
        with_bridge = not tree and bridge_tree.is_dir() and _lock_pins(settings, "megatron-bridge")
    if with_bridge and not bridge_tree.is_dir():
        raise BadInput(f"{bridge_tree}: no Megatron-Bridge work tree; run `rocmport apply` with a Bridge pin or pass --no-bridge")
    launcher = Launcher(kind=launcher_kind, nnodes=nnodes, node_rank=node_rank, rdzv_endpoint=rdzv_endpoint,
                        gpus=backend != "gloo" and environment.probe().has_gpu)
    cfg, series_dir, base = series_settings(path)
    unit = unit_options(cfg, base, settings.cache_dir, path, with_unit, unit_tests, unit_nproc)
    functional = functional_options(path, series_dir, with_functional, case, tp, pp, data_path, record_golden, iters)
    return Prepared(path.resolve(), bridge_tree.resolve() if with_bridge else None, unit, functional, launcher)
