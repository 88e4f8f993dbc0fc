"""verify's functional stage: upstream's own GPT functional case (`tests/functional_tests/test_cases/
gpt/<case>/model_config.yaml`) run with `pretrain_gpt.py` under torchrun, its losses parsed from the
log, compared with this machine's recorded goldens (per port version and device kind)."""

from __future__ import annotations

import json
import re
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from rocmport.fsutil import atomic_write_text
from rocmport.verify.launcher import Launcher
from rocmport.verify.stages import FAIL, PASS, SKIPPED, UNSUPPORTED, StageResult, took_part

CASES = Path("tests/functional_tests/test_cases/gpt")
_LOSS_RE = re.compile(r"iteration\s+(\d+)/\s*\d+ \|.*?lm loss: ([0-9.eE+-]+)")
_CUDA_BLOCKER = re.compile(r"(Megatron requires CUDA|Torch not compiled with CUDA enabled|Found no NVIDIA driver|"
                           r"No CUDA GPUs are available|CUDA driver|nvml)", re.I)
_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')
# Data and output locations the case takes from upstream CI's environment.
_DATA_ARGS = ("--data-path", "--vocab-file", "--merge-file", "--split", "--data-cache-path", "--tokenizer-type", "--tokenizer-model")
# A model a 2-core CPU trains in seconds; the parallel layout and every other flag stay the case's.
PROXY_SCALE = {"--num-layers": 4, "--hidden-size": 64, "--num-attention-heads": 4, "--seq-length": 128,
               "--max-position-embeddings": 128, "--micro-batch-size": 2, "--global-batch-size": 8}
TOLERANCE = {"cpu-proxy": 1e-4, "gpu": 0.05}


def default_case(tp: int, pp: int, te_present: bool) -> str:
    """Upstream's case for this parallelism: its TE case where TE is installed, else the case whose
    CI job uninstalls TE and apex (the one a CPU proxy or a TE-less ROCm image can run)."""
    return f"gpt3_mcore_te_tp{tp}_pp{pp}" if te_present else f"gpt3_mcore_tp{tp}_pp{pp}_uninstall_te"


def case_dir(tree: Path, case: str) -> Path:
    return tree / CASES / case


def build_args(config: dict, *, iters: int, proxy: bool, data_path: str | None, work: Path) -> list[str]:
    """MODEL_ARGS as a command line, with CI's paths replaced and (in proxy mode) the model scaled down."""
    args: dict[str, Any] = dict(config.get("MODEL_ARGS") or {})  # YAML values: str, int, float, bool
    paths = {"TENSORBOARD_PATH": work / "tensorboard", "CHECKPOINT_SAVE_PATH": work / "ckpt", "CHECKPOINT_LOAD_PATH": work / "ckpt",
             "DATA_CACHE_PATH": work / "data-cache", "DATA_PATH": Path(data_path) if data_path else work / "data"}
    if not data_path:
        for key in _DATA_ARGS:
            args.pop(key, None)
        args.update({"--mock-data": True, "--tokenizer-type": "NullTokenizer", "--vocab-size": 1024})
    args["--train-iters"] = iters
    args["--log-interval"] = 1
    args["--eval-interval"] = max(iters + 1, int(args.get("--eval-interval", 1000) or 1000))
    if proxy:
        args.update(PROXY_SCALE)
        args["--distributed-backend"] = "gloo"
        for key in ("--fp16", "--bf16"):  # no half-precision kernels on the CPU
            args.pop(key, None)
    out = []
    for key, value in args.items():
        if value is True:
            out.append(key)
        elif value is False or value is None:
            continue
        else:
            text = str(value)
            for var, path in paths.items():
                text = text.replace("${" + var + "}", str(path))
            out += [key, text]
    return out


def parse_losses(log: str) -> list[float]:
    found: dict[int, float] = {}
    for it, loss in _LOSS_RE.findall(log):
        found[int(it)] = float(loss)
    return [found[i] for i in sorted(found)]


def golden_path(series_dir: Path, case: str, device_kind: str) -> Path:
    return series_dir / "goldens" / f"{case}.{device_kind}.json"


def upstream_golden(cdir: Path, losses: list[float]) -> dict | None:
    """Upstream's DGX A100 `lm loss` values for the case, side by side with this run's at the same
    steps (shown for reference with real data: a different machine, never a pass/fail gate)."""
    path = cdir / "golden_values_dev_dgx_a100.json"
    if not path.is_file():
        return None
    values = {int(k): float(v) for k, v in json.loads(path.read_text()).get("lm loss", {}).get("values", {}).items()}
    steps = [k for k in sorted(values) if k <= len(losses)]
    pairs = [(k, values[k], losses[k - 1]) for k in steps]
    summary = ", ".join(f"step {k}: {a:.4f} vs {b:.4f}" for k, a, b in pairs[:1] + pairs[-1:]) or "no common steps"
    return {"path": str(path), "steps": [{"step": k, "a100": a, "here": b} for k, a, b in pairs], "summary": summary}


def _blocker(stderr: str, tree: Path) -> str | None:
    """The first CUDA-only requirement that stopped upstream's script on CPU, with its upstream site
    (the innermost traceback frame inside the tree, e.g. megatron/training/initialize.py:62)."""
    lines = stderr.splitlines()
    root = str(tree.resolve()) + "/"
    for i, line in enumerate(lines):
        if not _CUDA_BLOCKER.search(line) or line.lstrip().startswith(("raise ", "assert ")):
            continue
        site = ""
        for prev in reversed(lines[:i]):
            m = _FRAME.search(prev)
            if m and m.group(1).startswith(root):
                site = f" at {m.group(1)[len(root):]}:{m.group(2)} ({m.group(3)})"
                break
        return line.strip()[:200] + site
    return None


def functional_command(launcher: Launcher, config: dict, args: list[str], dp: int) -> list[str]:
    margs = config.get("MODEL_ARGS") or {}
    world = int(margs.get("--tensor-model-parallel-size", 1)) * int(margs.get("--pipeline-model-parallel-size", 1)) * dp
    return launcher.command(world, ["pretrain_gpt.py", *args], "functional")


def load_case(tree: Path, case: str) -> dict:
    return yaml.safe_load((case_dir(tree, case) / "model_config.yaml").read_text()) or {}


def stage_functional(tree: Path, env: dict, *, case: str, dp: int, iters: int, proxy: bool, data_path: str | None,
                     series_dir: Path | None, record: bool, device_kind: str, defaulted: bool = False,
                     launcher: Launcher = Launcher()) -> tuple[StageResult, dict]:
    start = time.monotonic()
    cdir = case_dir(tree, case)
    if not (tree / "pretrain_gpt.py").is_file():
        return StageResult("functional", SKIPPED, "the tree has no pretrain_gpt.py (a package-index source ships megatron/core only)"), {}
    if not (cdir / "model_config.yaml").is_file():
        near = sorted(p.name for p in (tree / CASES).glob("gpt3_mcore_*") if p.is_dir())[:8]
        text = f"upstream has no functional case {case} ({cdir.relative_to(tree)}); pass --case NAME (e.g. {', '.join(near)})"
        return StageResult("functional", SKIPPED if defaulted else FAIL, text), {}
    config = load_case(tree, case)
    with tempfile.TemporaryDirectory(prefix="rocmport-func-") as tmp:
        work = Path(tmp)
        args = build_args(config, iters=iters, proxy=proxy, data_path=data_path, work=work)
        run_env = {**env, **{k: str(v) for k, v in (config.get("ENV_VARS") or {}).items()}}
        if proxy:
            run_env["ROCMPORT_SHIM_WORKERS"] = "1"
        cmd = functional_command(launcher, config, args, dp)
        proc = subprocess.run(cmd, cwd=tree, env=run_env, capture_output=True, text=True, timeout=1800)
    losses = parse_losses(proc.stdout + proc.stderr)
    if proc.returncode == 0 and not losses and launcher.multi_node:
        return took_part("functional", launcher, time.monotonic() - start), {}
    details = {"case": case, "command": " ".join(cmd), "losses": losses, "iters": iters,
               "log_tail": [ln for ln in proc.stderr.splitlines() if "rank0" in ln or "Error" in ln][-15:]}
    seconds = time.monotonic() - start
    if proc.returncode != 0 or len(losses) < iters:
        blocker = _blocker(proc.stderr, tree) if proxy else None
        if blocker:
            return StageResult("functional", UNSUPPORTED, f"pretrain_gpt.py cannot run on CPU: {blocker}", seconds, details), details
        errors = [ln for ln in proc.stderr.splitlines() if "Error" in ln and "ChildFailedError" not in ln and "elastic" not in ln]
        tail = errors[:1] or proc.stderr.strip().splitlines()[-1:] or ["no output"]
        return StageResult("functional", FAIL, f"pretrain_gpt.py exited {proc.returncode} after {len(losses)} iterations: {tail[0][:300]}",
                           seconds, details), details
    reason = f"{case}: lm loss {losses[0]:.4f} -> {losses[-1]:.4f} in {iters} iterations"
    status = PASS
    if series_dir is not None:
        golden = golden_path(series_dir, case, device_kind)
        if record:
            atomic_write_text(golden, json.dumps({"case": case, "device_kind": device_kind, "iters": iters, "losses": losses,
                                                  "args": args}, indent=1) + "\n")
            reason += f"; golden recorded in {golden}"
        elif golden.is_file():
            ref = json.loads(golden.read_text())["losses"]
            n = min(len(ref), len(losses))
            drift = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(losses[:n], ref[:n])) if n else float("inf")
            tol = TOLERANCE.get(device_kind, 0.05)
            details["golden"] = {"path": str(golden), "max_rel_drift": drift, "tolerance": tol}
            reason += f"; max relative drift vs golden {drift:.2g} (≤ {tol:g})"
            if drift > tol:
                status = FAIL
        else:
            reason += "; no golden for this device kind yet (--record-golden)"
    if data_path:
        reference = upstream_golden(cdir, losses)
        if reference:
            details["upstream_golden_a100"] = reference
            reason += f"; upstream's A100 golden (reference only): {reference['summary']}"
    return StageResult("functional", status, reason, seconds, details), details
