"""`rocmport verify`: does the ported tree train GPT correctly here, with model parallelism and
without any NVIDIA-only package? On GPUs: nccl (RCCL on ROCm). Without: CPU proxy on gloo."""

from __future__ import annotations

import re
import shlex
import tempfile
from pathlib import Path

import click

from rocmport import output
from rocmport.config import load_settings
from rocmport.errors import EXIT_OK, EXIT_PROBLEM, BadInput
from rocmport.nvidia_only import blocked
from rocmport.verify import environment, firewall, report, stages
from rocmport.verify.gpt_worker import HEADS, LAYERS  # imports no torch at module level
from rocmport.verify.launcher import KINDS, Launcher


def run_verify(tree: Path, tp: int, pp: int, dp: int | None, nproc: int | None, backend: str, iters: int,
               bridge_tree: Path | None = None, unit: dict | None = None, functional: dict | None = None,
               launcher: Launcher = Launcher()) -> dict:
    """``unit``: {tests, nproc, known, cache_dir, base} for stage 3, upstream's unit tests;
    ``functional``: {case, defaulted, data_path, record, series_dir, iters} for stage 4, upstream's
    functional GPT case (None: the stage is not run)."""
    if not (tree / "megatron" / "core").is_dir():
        raise BadInput(f"{tree}: not a Megatron-LM tree (no megatron/core); run `rocmport apply` or pass --tree")
    if tp < 1 or pp < 1 or iters < 2:
        raise BadInput("--tp and --pp must be >= 1 and --iters >= 2")
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
    result = {"mode": mode, "backend": backend, "world_size": world, "tp": tp, "pp": pp, "dp": dp, "tree": str(tree),
              "env": {**env_info.to_dict(), "launcher_env": applied_launch_env, "firewall_profile": profile},
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


def _series_settings(tree: Path) -> tuple[dict, Path | None, str | None]:
    """The series the tree was ported with (verify's settings, its directory) and the base commit."""
    from rocmport import worktree as wt
    from rocmport.patchset import load_series

    state = wt.read_state(tree) or {}
    series = Path(state["series"]) if state.get("series") else None
    if series and series.is_file():
        return load_series(series).verify, series.parent, state.get("base")
    return {}, None, state.get("base")


def _unit_options(cfg: dict, base: str | None, cache_dir: Path, tree: Path, wanted, tests, nproc: int) -> dict | None:
    from rocmport.verify.unit_tests import DEFAULT_TESTS

    if wanted is False or (wanted is None and not (tree / "tests" / "unit_tests").is_dir()):
        return None
    if nproc < 1:
        raise BadInput(f"--unit-nproc {nproc}: must be at least 1")
    return {"tests": list(tests) or list(cfg.get("unit_tests") or DEFAULT_TESTS), "nproc": nproc,
            "known": dict(cfg.get("known_failures") or {}), "cache_dir": cache_dir, "base": base}


def _functional_options(tree: Path, series_dir: Path | None, wanted, case, tp: int, pp: int, data_path, record: bool,
                        iters: int) -> dict | None:
    import importlib.util

    from rocmport.verify.functional import default_case

    if wanted is False or (wanted is None and not (tree / "pretrain_gpt.py").is_file()):
        return None
    if data_path and not Path(data_path.split()[-1]).parent.exists():
        raise BadInput(f"--data-path {data_path}: no such directory; give the prefix of a Megatron .bin/.idx dataset")
    if record and series_dir is None:
        raise BadInput(f"{tree}: --record-golden needs a tree made by `rocmport apply` (goldens live next to its series)")
    return {"case": case or default_case(tp, pp, importlib.util.find_spec("transformer_engine") is not None), "defaulted": not case,
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


def _print_summary(r: dict) -> None:
    if r["mode"] == "cpu-proxy":
        output.warn("CPU PROXY MODE: no GPU here; the same stages ran on CPU processes over gloo. This is not a GPU result.")
    e = r["env"]
    output.info(f"torch {e['torch']} (hip {e['hip']}, cuda {e['cuda']}), Python {e['python']}, {e['device_count']} GPU(s); "
                f"backend {r['backend']}, world {r['world_size']} = tp {r['tp']} × pp {r['pp']} × dp {r['dp']}")
    output.table(["stage", "status", "seconds", "reason"], [[s["name"], s["status"], s["seconds"], s["reason"]] for s in r["stages"]])
    for stage in r["stages"]:
        if stage["name"] == "unit-tests" and stage.get("labels"):
            local = set(stage.get("local_spec_instead_of_te", []))
            for nodeid, lab in sorted(stage["labels"].items()):
                click.echo(f"{lab}: {nodeid}" + ("  (ran with the local spec in place of TE's)" if nodeid in local else ""))
                click.echo(f"    failure: {stage['failures'].get(nodeid) or '-'}")
                click.echo(f"    unported tree: {' '.join(stage['on_baseline'].get(nodeid, '').split())}")
    t = r["training"]
    if t.get("losses"):
        click.echo(report.loss_plot(t["losses"]))


@click.command("verify")
@click.option("--tree", type=click.Path(file_okay=False), help="The ported Megatron-LM tree (default: the megatron-lm work tree).")
@click.option("--tp", type=int, default=2, show_default=True, help="Tensor-parallel size.")
@click.option("--pp", type=int, default=2, show_default=True, help="Pipeline-parallel size.")
@click.option("--dp", type=int, default=None, help="Data-parallel size (default 1).")
@click.option("--nproc", type=int, default=None, help="Total processes (a multiple of tp×pp; sets dp).")
@click.option("--backend", type=click.Choice(["auto", "nccl", "gloo"]), default="auto", show_default=True)
@click.option("--iters", type=int, default=10, show_default=True, help="Training iterations in stages 2, 4 and 5.")
@click.option("--unit-tests/--no-unit-tests", "with_unit", default=None,
              help="Stage 3, upstream's unit tests (default: when the tree has tests/unit_tests).")
@click.option("--unit-test", "unit_tests", multiple=True, metavar="PATH",
              help="A test file or id to run (default: the series' verify.unit_tests, else test_gpt_model.py and test_schedules.py).")
@click.option("--unit-nproc", type=int, default=8, show_default=True, help="Ranks for the unit tests (upstream CI uses 8).")
@click.option("--functional/--no-functional", "with_functional", default=None,
              help="Stage 4, upstream's functional GPT case with pretrain_gpt.py (default: when the tree has pretrain_gpt.py).")
@click.option("--case", default=None, metavar="NAME",
              help="Functional case under tests/functional_tests/test_cases/gpt (default: by tp/pp and whether TE is installed).")
@click.option("--data-path", default=None, help="Real data for the functional case (default: mock data, NullTokenizer).")
@click.option("--record-golden", is_flag=True, help="Store this run's functional loss curve as the golden for this device kind.")
@click.option("--bridge/--no-bridge", "with_bridge", default=None,
              help="Stage 5, Megatron-Bridge (default: when the megatron-bridge work tree exists and --tree is not given).")
@click.option("--launcher", "launcher_kind", type=click.Choice(KINDS), default="torchrun", show_default=True,
              help="torchrun, or Slurm's srun with one task per GPU (run inside an allocation).")
@click.option("--nnodes", type=int, default=1, show_default=True, help="Nodes (torchrun: run the same command on each).")
@click.option("--node-rank", type=int, default=0, show_default=True, help="This node's rank (torchrun, multi-node).")
@click.option("--rdzv-endpoint", default=None, metavar="HOST:PORT", help="torchrun's c10d rendezvous (multi-node; node 0's address).")
@click.option("--dry-run", is_flag=True, help="Print every launch's command line and exit without running anything.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON (schema in the README).")
@click.option("--report", "report_path", type=click.Path(dir_okay=False), help="Also write the JSON report here.")
@click.option("--junit", type=click.Path(dir_okay=False), help="Write JUnit XML here.")
@click.pass_obj
def command(obj, tree, tp, pp, dp, nproc, backend, iters, with_unit, unit_tests, unit_nproc, with_functional, case, data_path,
            record_golden, with_bridge, launcher_kind, nnodes, node_rank, rdzv_endpoint, dry_run, as_json, report_path, junit):
    """Prove the ported tree imports without NVIDIA-only packages and trains GPT with tp×pp.

    \b
    Stage 1 imports: megatron.core, megatron.training, pretrain_gpt's imports, behind the firewall.
    Stage 2 gpt-training: megatron's schedule/DDP/optimizer via torchrun; the loss falls, tied
            embeddings stay equal, and losses match a tp1/pp1 run from the same weights.
    Stage 3 unit-tests: upstream's tests (torchrun -m pytest, rocmport's plugin in proxy mode),
            each failure labelled port-regression / upstream-known (the unported tree, cached
            by commit) / known-failure (the series' verify.known_failures).
    Stage 4 functional: upstream's GPT case (pretrain_gpt.py with its MODEL_ARGS; mock data),
            losses against this device kind's golden; unsupported-in-proxy names the CPU blocker.
    Stage 5 bridge: Megatron-Bridge's modules import; a GPT built by its GPTModelProvider trains.
    Exit: 0 no stage failed, 1 a stage failed, 2 bad input.
    """
    settings = load_settings(obj["project"])
    path = Path(tree) if tree else settings.worktree_path("megatron-lm")
    if not path.is_dir():
        raise BadInput(f"{path}: no such tree; run `rocmport apply` first or pass --tree")
    bridge_tree = settings.worktree_path("megatron-bridge")
    if with_bridge is None:
        with_bridge = not tree and bridge_tree.is_dir()
    if with_bridge and not bridge_tree.is_dir():
        raise BadInput(f"{bridge_tree}: no Megatron-Bridge work tree; run `rocmport apply` with a Bridge pin or pass --no-bridge")
    launcher = Launcher(kind=launcher_kind, nnodes=nnodes, node_rank=node_rank, rdzv_endpoint=rdzv_endpoint,
                        gpus=backend != "gloo" and environment.probe().has_gpu)
    cfg, series_dir, base = _series_settings(path)
    unit = _unit_options(cfg, base, settings.cache_dir, path, with_unit, unit_tests, unit_nproc)
    functional = _functional_options(path, series_dir, with_functional, case, tp, pp, data_path, record_golden, iters)
    bridge = bridge_tree.resolve() if with_bridge else None
    if dry_run:
        plan = launch_plan(path.resolve(), tp, pp, (nproc // (tp * pp)) if nproc else (dp or 1), iters, unit, functional, bridge, launcher)
        if as_json:
            output.emit_json(plan)
        else:
            for step in plan:
                click.echo(f"# {step['stage']} (in {step['cwd']})\n{shlex.join(step['command'])}")
        return EXIT_OK
    result = run_verify(path.resolve(), tp, pp, dp, nproc, backend, iters, bridge, unit, functional, launcher)
    if report_path:
        report.write_json(result, report_path)
    if junit:
        from rocmport.fsutil import atomic_write_text

        atomic_write_text(junit, report.junit_xml(result))
    if as_json:
        output.emit_json(result)
    else:
        _print_summary(result)
    return EXIT_PROBLEM if any(s["status"] == "fail" for s in result["stages"]) else EXIT_OK
