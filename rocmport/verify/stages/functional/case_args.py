"""What one case runs with: its name and directory (confined to the tree's cases directory), its
`pretrain_gpt.py` command line (MODEL_ARGS, CI's paths replaced, in proxy mode the model shrunk by
its plan and PROXY_TRAINING), its ranks, the data it reads, what the tree's training loop can do
for the checkpoint round trip, and where its golden lives."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rocmport.errors import BadInput
from rocmport.verify.orchestration.launcher import Launcher
from rocmport.verify.runtime import protocol
from rocmport.verify.stages import case_plan
from rocmport.verify.stages.case_plan import CasePlan


NAME = "functional"

CASES = Path("tests/functional_tests/test_cases/gpt")
# Data and output locations the case takes from upstream CI's environment.
_DATA_ARGS = (
    "--data-path",
    "--vocab-file",
    "--merge-file",
    "--split",
    "--data-cache-path",
    "--tokenizer-type",
    "--tokenizer-model",
)
# What the proxy changes about training besides the model's size (case_plan.shrink sizes the model,
# keeping the case's parallel layout and pipeline structure).
PROXY_TRAINING = {
    # A few iterations must move the loss: the case warms the learning rate up over 1% of
    # 320000 iterations (about 0 for ten), so on the proxy no warm-up and a small model's rate.
    "--lr": 3e-3,
    "--lr-warmup-iters": 0,
    "--lr-warmup-fraction": None,
    # Data-loader workers are processes, spawned on HIP (dataloader-mp-context), each importing
    # torch and megatron.training: one per rank still proves the spawned worker, and validation,
    # which the case never reaches in a few iterations (--eval-interval 1000), builds no loader.
    "--num-workers": 1,
    "--eval-iters": 0,
}
# The golden's relative loss drift. On the proxy, measured honest drift of every committed golden (v0.15-v0.19,
# TE 2.9.0-2.17.1 and without TE, torch 2.13 and 2.14.1, ATen's DEFAULT, AVX2 and AVX512 kernel paths, MKL on
# AVX2): at most 3.0e-7, the rounding of megatron's 7-digit loss log; a 0.1 % scaling of one TE linear's output
# drifts 1.5e-5. 2e-6 sits between them: 6.7x the honest drift, 7.5x below the smallest injected bug.
TOLERANCE = {"cpu-proxy": 2e-6, "gpu": 0.05}
RESUME_TOLERANCE = {True: 1e-5, False: 1e-3}  # proxy (fp32 on the CPU, deterministic) | GPU
# What the proxy changes in the workers' environment besides the shim, with the reason (reported).
PROXY_ENV = {
    "TORCHDYNAMO_DISABLE": (
        "1",
        "torch.compile off: megatron's jit_fuser functions run eagerly (a GPU compiles "
        "them to triton kernels; inductor on the CPU would build C++ ones, minutes per rank)",
    )
}


def default_case(tp: int, pp: int, te_present: bool, tree: Path | None = None) -> str:
    """Upstream's case for this parallelism: its TE case where TE is installed, else the case whose
    CI job uninstalls TE and apex (the one a CPU proxy or a TE-less ROCm image can run). Up to v0.15
    upstream named its merge-request cases by suite and machine (`gpt3_mr_mcore_tp2_pp2_uninstall_te_
    dgx_a100_1N8G`): with ``tree``, that name where the tree has no case by today's name."""
    name = f"gpt3_mcore_te_tp{tp}_pp{pp}" if te_present else f"gpt3_mcore_tp{tp}_pp{pp}_uninstall_te"
    if tree is None or case_dir(tree, name).is_dir():
        return name
    older = sorted(
        p.name for p in (tree / CASES).glob(f"{name.replace('gpt3_mcore_', 'gpt3_mr_mcore_', 1)}_dgx_*") if p.is_dir()
    )
    return next((n for n in older if n.endswith("_dgx_a100_1N8G")), older[0] if older else name)


def case_dir(tree: Path, case: str) -> Path:
    return tree / CASES / case


# A case is one directory under CASES (upstream's are all one level deep); its name also names its
# goldens (<case>.<device kind>.json), so it is a plain file name: no separator, no `..`, no control.
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]{0,199}", re.ASCII)


def check_case(tree: Path, case: str, option: str = "--case") -> Path:
    """The directory of case ``case`` (given by ``option``) in ``tree``, or BadInput: not a plain name,
    or (through a link) outside the tree's cases directory. Whether it exists is the caller's question."""
    hint = f"give the name of a directory under {CASES} (e.g. gpt3_mcore_tp2_pp2_uninstall_te)"
    if not _NAME.fullmatch(case):
        raise BadInput(f"{option} {case[:200]!r}: not a case name; {hint}")
    root = (tree / CASES).resolve()
    cdir = case_dir(tree, case)
    if not cdir.resolve().is_relative_to(root):
        raise BadInput(f"{option} {case!r}: {cdir} leads outside {tree / CASES} (to {cdir.resolve()}); {hint}")
    return cdir


def cases_near(tree: Path) -> list[str]:
    """Some of the tree's GPT cases with a parallel layout in their name, for a hint."""
    return sorted(p.name for p in (tree / CASES).glob("gpt3_*mcore_*") if p.is_dir() and "_tp" in p.name)[:8]


def build_args(
    config: dict,
    *,
    iters: int,
    proxy: bool,
    data_path: str | None,
    work: Path,
    extra: dict[str, object] | None = None,
    plan: CasePlan | None = None,
) -> list[str]:
    """MODEL_ARGS as a command line, with upstream CI's variables filled in (its paths, REPEAT), (in proxy mode) the model scaled
    down by the case's plan (``plan``, or the one its MODEL_ARGS give), and ``extra`` on top (a value
    of None drops the flag)."""
    args: dict[str, Any] = dict(config.get("MODEL_ARGS") or {})  # YAML values: str, int, float, bool
    # upstream CI's variables (case_plan.CI_VARIABLES), as its launcher's envsubst fills them in
    ci_values = {
        "TENSORBOARD_PATH": str(work / "tensorboard"),
        "CHECKPOINT_SAVE_PATH": str(work / "ckpt"),
        "CHECKPOINT_LOAD_PATH": str(work / "ckpt"),
        "DATA_CACHE_PATH": str(work / "data-cache"),
        "DATA_PATH": str(Path(data_path) if data_path else work / "data"),
        "REPEAT": case_plan.FIRST_REPEAT,
    }

    def resolved(word: str) -> str:  # a variable verify has no value for stays, as envsubst leaves it
        return case_plan.SHELL_VARIABLE.sub(lambda m: ci_values.get(m.group(1) or m.group(2), m.group(0)), word)

    if not data_path:
        for key in _DATA_ARGS:
            args.pop(key, None)
        args.update({"--mock-data": True, "--tokenizer-type": "NullTokenizer", "--vocab-size": 1024})
    args["--train-iters"] = iters
    args["--log-interval"] = 1
    args["--eval-interval"] = max(iters + 1, int(str(args.get("--eval-interval", 1000) or 1000)))
    if proxy:
        if plan is None:
            lay, _ = case_plan.layout(args)
            sized, _ = case_plan.shrink(args, lay)
        args.update(PROXY_TRAINING)
        args.update(plan.args if plan is not None else sized)
        args["--distributed-backend"] = "gloo"
        # fp32 (the CPU has no half-precision kernels the case's numerics test), but where the plan keeps the case's
        # own half precision (case_plan.kept_precision: FP8 weights need the master weights Megatron makes for it).
        kept = {key for key, _ in (plan.kept if plan is not None else case_plan.kept_precision(args))}
        for key in ("--fp16", "--bf16"):
            if key not in kept:
                args.pop(key, None)
    args.update(extra or {})
    out = []
    for key, value in args.items():
        if value is True:
            out.append(key)
        elif value is False or value is None:
            continue
        else:
            # Megatron's --data-path takes several words (a blend: [weight] prefix ...): split the case's
            # value before the paths go in, so a data root with a space stays one word.
            words = str(value).split() if key == "--data-path" else [str(value)]
            out += [key, *(resolved(w) for w in words)]
    return out


# The files a case reads from upstream CI's data root ($DATA_PATH), by flag: a dataset prefix is
# its .bin and .idx.
_DATA_FILES = {
    "--data-path": (".bin", ".idx"),
    "--vocab-file": ("",),
    "--merge-file": ("",),
    "--tokenizer-model": ("",),
}


def missing_data(config: dict, data_root: Path) -> list[str]:
    """The files the case names under ``data_root`` (its ${DATA_PATH}) that are not there."""
    args = config.get("MODEL_ARGS") or {}
    missing = []
    for key, suffixes in _DATA_FILES.items():
        for word in str(args.get(key) or "").split():
            if "${DATA_PATH}" in word:
                path = word.replace("${DATA_PATH}", str(data_root))
                missing += [path + sfx for sfx in suffixes if not Path(path + sfx).is_file()]
    return missing


@dataclass
class ResumeSupport:
    """What the tree's training loop can do for stage 4's checkpoint resume (resume_support)."""

    ckpt_step: bool
    async_save: bool
    async_strategy: bool
    first_two_logged_together: bool
    # the checkpoint formats save_checkpoint writes asynchronously (never the legacy `torch`)
    async_formats: tuple[str, ...] = ("torch_dist",)


# megatron/training/checkpointing.py's save_checkpoint refuses --async-save for a distributed format outside these:
# v0.15/v0.16 `args.ckpt_format != 'torch_dist'`, v0.17+ `args.ckpt_format not in ['torch_dist', 'torch_dcp', ...]`.
_ASYNC_FORMATS = re.compile(
    r"ckpt_format\s*(?:!=|not\s+in)\s*(\[[^\]]*\]|'\w+'|\"\w+\")\s*\)?\s*:\s*"
    r"raise\s+NotImplementedError\(\s*f?['\"]Async checkpoint save not implemented"
)


def resume_support(tree: Path) -> ResumeSupport:
    """Whether the tree's training loop can load a chosen checkpoint step (`--ckpt-step`) and save
    asynchronously with a persistent worker (`--async-save --use-persistent-ckpt-worker`), through a
    chosen writer (`--async-strategy`, v0.17+), and
    whether it logs the first two iterations after a start as one interval: its training log keeps
    the first iteration's loss in the running total (`should_reset = not is_first_iteration`), so
    the second logged `lm loss` of any run is the mean of its first two iterations; and which
    checkpoint formats its save_checkpoint writes asynchronously (the guard that refuses the others)."""
    text = "".join(
        p.read_text(encoding="utf-8", errors="replace") for p in sorted((tree / "megatron" / "training").rglob("*.py"))
    )
    guard = _ASYNC_FORMATS.search(text)
    return ResumeSupport(
        ckpt_step="ckpt_step" in text,
        async_save="async_save" in text and "use_persistent_ckpt_worker" in text,
        async_strategy="async_strategy" in text,
        first_two_logged_together="should_reset = not is_first_iteration" in text,
        # without the guard (a tree that words it otherwise): torch_dist, the one format every line writes async
        async_formats=tuple(re.findall(r"['\"](\w+)['\"]", guard.group(1))) if guard else ("torch_dist",),
    )


# Flags that choose how a checkpoint is written, not what is trained: a golden's args leave them out.
_WRITER_FLAGS = ("--async-strategy",)


def recorded_args(args: list[str], work: Path) -> list[str]:
    """The args as a golden records them: this run's temporary directory as ${WORK}, without the
    checkpoint writer's choice (_WRITER_FLAGS: verify picks one on the CUDA path, the port on HIP)."""
    out: list[str] = []
    for i, a in enumerate(args):
        if a in _WRITER_FLAGS or (i and args[i - 1] in _WRITER_FLAGS):
            continue
        out.append(a.replace(str(work), "${WORK}"))
    return out


def nvrx_usable(env: dict) -> bool:
    """Whether the run's processes can import nvidia-resiliency-ext (not behind the firewall, installed)."""
    import importlib.util

    return (
        "nvidia_resiliency_ext" not in (protocol.FIREWALL.read(env) or ())
        and importlib.util.find_spec("nvidia_resiliency_ext") is not None
    )


def _args_difference(a: list[str], b: list[str]) -> str:
    def pairs(args):
        out, key = {}, None
        for tok in args:
            if tok.startswith("--"):
                key = tok
                out[key] = True
            elif key:
                out[key] = tok
        return out

    pa, pb = pairs(a), pairs(b)
    diff = [
        f"{k} {pa.get(k, '(absent)')} vs {pb.get(k, '(absent)')}"
        for k in sorted(set(pa) | set(pb))
        if pa.get(k) != pb.get(k)
    ]
    return "; ".join(diff[:4]) + (f" (+{len(diff) - 4} more)" if len(diff) > 4 else "")


def golden_path(series_dir: Path, case: str, device_kind: str) -> Path:
    """Where the golden of ``case`` for ``device_kind`` lives: always a file directly in the series' goldens/."""
    # A device kind is lower-case letters, digits, '-', '.' and '+' (`cpu-proxy-te2.12.0`, `rocm-amd-instinct-mi300x`):
    # never a separator, so the golden stays a file directly in goldens/.
    if not _NAME.fullmatch(case) or not re.fullmatch(r"[a-z0-9][a-z0-9.+-]{0,99}", device_kind, re.ASCII):
        raise BadInput(
            f"golden for case {case[:80]!r} and device kind {device_kind[:80]!r}: not plain names; "
            f"a golden is a file in {series_dir / 'goldens'}"
        )
    return series_dir / "goldens" / f"{case}.{device_kind}.json"


def world_size(config: dict, dp: int, plan: CasePlan | None) -> int:
    """The ranks a case runs on: its plan's on the proxy (the layout the case needs: cp, the data-
    parallel ranks it shards over), tp·pp·dp (verify's --dp) on a GPU."""
    if plan is not None:
        return plan.layout.world
    margs = config.get("MODEL_ARGS") or {}
    return int(margs.get("--tensor-model-parallel-size", 1)) * int(margs.get("--pipeline-model-parallel-size", 1)) * dp


def functional_command(launcher: Launcher, world: int, args: list[str], rank_server: str | None = None) -> list[str]:
    """pretrain_gpt.py on ``world`` ranks (forked by the rank server at ``rank_server`` when given)."""
    return launcher.command(world, ["pretrain_gpt.py", *args], NAME, rank_server=rank_server)


def load_case(tree: Path, case: str) -> dict:
    return case_plan.load_config(tree, case)
