"""`rocmport verify`: does the ported tree train GPT correctly here, with model parallelism and
without any NVIDIA-only package? On GPUs: nccl (RCCL on ROCm). Without: CPU proxy on gloo."""

from __future__ import annotations

import tempfile
from pathlib import Path

import click

from rocmport import output
from rocmport.config import load_settings
from rocmport.errors import EXIT_OK, EXIT_PROBLEM, BadInput
from rocmport.nvidia_only import blocked
from rocmport.verify import environment, firewall, report, stages
from rocmport.verify.gpt_worker import HEADS, LAYERS  # imports no torch at module level


def run_verify(tree: Path, tp: int, pp: int, dp: int | None, nproc: int | None, backend: str, iters: int,
               bridge_tree: Path | None = None) -> dict:
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
    if backend == "nccl" and world > env_info.device_count:
        raise BadInput(f"world size {world} (tp {tp} × pp {pp} × dp {dp}) needs {world} GPUs; this machine has {env_info.device_count}")
    mode = "gpu" if backend == "nccl" else "cpu-proxy"
    profile = "rocm" if mode == "gpu" else "cpu-proxy"
    extra = {"ROCMPORT_BACKEND": backend, **firewall.firewall_env(profile)}
    if mode == "cpu-proxy":
        extra["ROCMPORT_PROXY"] = "1"
    applied_launch_env = environment.launcher_env_for(env_info)
    extra.update(applied_launch_env)
    result = {"mode": mode, "backend": backend, "world_size": world, "tp": tp, "pp": pp, "dp": dp, "tree": str(tree),
              "env": {**env_info.to_dict(), "launcher_env": applied_launch_env, "firewall_profile": profile},
              "stages": [], "training": {}}
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
                training, data = stages.stage_training(tree, env, tp, pp, dp, iters, backend)
            result["stages"].append(training.to_dict())
            result["training"] = data
        if bridge_tree is not None:
            _bridge(result, bridge_tree, env, tp, pp, dp, iters)
    return result


def _bridge(result: dict, bridge_tree: Path, env: dict, tp: int, pp: int, dp: int, iters: int) -> None:
    from rocmport.verify.bridge_stage import stage_bridge

    if result["stages"][0]["status"] != stages.PASS:
        result["stages"].append(stages.StageResult("bridge", stages.SKIPPED, "Megatron-LM imports failed").to_dict())
        return
    with output.progress(f"stage 3: Megatron-Bridge imports and GPTModelProvider training tp{tp}×pp{pp}"):
        bridge, data = stage_bridge(bridge_tree, env, tp, pp, dp, iters)
    result["stages"].append(bridge.to_dict())
    result["bridge_training"] = data


def _print_summary(r: dict) -> None:
    if r["mode"] == "cpu-proxy":
        output.warn("CPU PROXY MODE: no GPU here; the same stages ran on CPU processes over gloo. This is not a GPU result.")
    e = r["env"]
    output.info(f"torch {e['torch']} (hip {e['hip']}, cuda {e['cuda']}), Python {e['python']}, {e['device_count']} GPU(s); "
                f"backend {r['backend']}, world {r['world_size']} = tp {r['tp']} × pp {r['pp']} × dp {r['dp']}")
    output.table(["stage", "status", "seconds", "reason"], [[s["name"], s["status"], s["seconds"], s["reason"]] for s in r["stages"]])
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
@click.option("--iters", type=int, default=10, show_default=True, help="Training iterations in stage 2.")
@click.option("--bridge/--no-bridge", "with_bridge", default=None,
              help="Run the Megatron-Bridge stage (default: when the megatron-bridge work tree exists and --tree is not given).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON (schema in the README).")
@click.option("--report", "report_path", type=click.Path(dir_okay=False), help="Also write the JSON report here.")
@click.option("--junit", type=click.Path(dir_okay=False), help="Write JUnit XML here.")
@click.pass_obj
def command(obj, tree, tp, pp, dp, nproc, backend, iters, with_bridge, as_json, report_path, junit):
    """Prove the ported tree imports without NVIDIA-only packages and trains GPT with tp×pp.

    \b
    Stage 1 imports: megatron.core, megatron.training, pretrain_gpt's imports, behind the firewall.
    Stage 2 gpt-training: megatron's schedule/DDP/optimizer via torchrun; the loss falls, tied
            embeddings stay equal, and losses match a tp1/pp1 run from the same weights.
    Stage 3 bridge: Megatron-Bridge's modules import; a GPT built by its GPTModelProvider trains.
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
    result = run_verify(path.resolve(), tp, pp, dp, nproc, backend, iters, bridge_tree.resolve() if with_bridge else None)
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
