"""Run one codemod on a source string, and run rewritten code for real in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import libcst as cst

from rocmport.codemods import Context, registry
from rocmport.codemods.runner import helper_text


def rewrite(name: str, source: str, relpath: str = "megatron/core/x.py", options=None) -> tuple[str, int]:
    return rewrite_with_reports(name, source, relpath, options)[:2]


def rewrite_with_reports(name: str, source: str, relpath: str = "megatron/core/x.py", options=None):
    """(text after the codemod, sites, its reports)."""
    source = textwrap.dedent(source)
    ctx = Context(relpath, options or {}, codemod=name)
    module, sites = registry[name].transform(cst.parse_module(source), ctx)
    return module.code, sites, ctx.reports


def assert_codemod(
    name: str, before: str, after: str, relpath: str = "megatron/core/x.py", sites: int | None = None, options=None
):
    """LibCST's assertCodemod: ``before`` becomes exactly ``after``; a second run changes nothing."""
    got, n = rewrite(name, before, relpath, options)
    assert got == textwrap.dedent(after)
    if sites is not None:
        assert n == sites
    again, n2 = rewrite(name, got, relpath, options)
    assert (again, n2) == (got, 0), "not idempotent"


def assert_idempotent(name: str, source: str, relpath: str = "megatron/core/x.py"):
    once, _ = rewrite(name, source, relpath)
    twice, sites = rewrite(name, once, relpath)
    assert twice == once and sites == 0


def run_tree(
    tmp: Path, files: dict[str, str], code: str, hip: str | None = None, env: dict | None = None
) -> subprocess.CompletedProcess:
    """Write ``files`` (plus the generated megatron/core/_rocm.py, with every codemod's piece) under
    tmp and run ``code`` there.

    ``hip`` simulates a ROCm build of torch (torch.version.hip set before anything imports)."""
    for rel, text in {
        "megatron/__init__.py": "",
        "megatron/core/__init__.py": "",
        "megatron/core/_rocm.py": helper_text(list(registry)),
        **files,
    }.items():
        (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp / rel).write_text(textwrap.dedent(text))
    prelude = f"import torch\ntorch.version.hip = {hip!r}\n"
    return subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code)],
        cwd=tmp,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(tmp), **(env or {})},
    )


# megatron/core/utils.py's TE version helpers at v0.16 (get_te_version() returns None without TE).
UTILS_V016 = '''\
from packaging.version import Version as PkgVersion

HAVE_PACKAGING = True
_te_version = None


def get_te_version():
    """Get TE version; None without TE."""
    try:
        import transformer_engine as te
    except ImportError:
        return None
    return PkgVersion(te.__version__)


def is_te_min_version(version, check_equality=True):
    """Check if minimum version of `transformer-engine` is installed."""
    if not HAVE_PACKAGING:
        raise ImportError("packaging is not installed.")

    if check_equality:
        return get_te_version() >= PkgVersion(version)
    return get_te_version() > PkgVersion(version)
'''


# megatron/training/arguments.py's validate_args at v0.16, cut to what the ROCm launcher environment,
# deterministic mode and --tp-comm-overlap meet (the asserts are upstream's, lines 622/951/1078/915).
VALIDATE_ARGS = '''\
import os


def get_device_arch_version():
    return 9  # an MI300X under HIP with capability-gates; Hopper under CUDA


def validate_args(args, defaults={}):
    """Validate arguments."""
    if args.use_torch_fsdp2:
        assert os.environ.get('CUDA_DEVICE_MAX_CONNECTIONS') != "1", \\
            'FSDP always requires CUDA_DEVICE_MAX_CONNECTIONS value large than one'

    if (args.tensor_model_parallel_size > 1 or args.context_parallel_size > 1) \\
        and get_device_arch_version() < 10:
        if args.use_torch_fsdp2:
            pass
        else:
            assert os.environ.get('CUDA_DEVICE_MAX_CONNECTIONS') == "1", \\
                "Using tensor model parallelism or context parallelism require setting the environment variable " \\
                "CUDA_DEVICE_MAX_CONNECTIONS to 1"

    if args.tp_comm_overlap:
        assert args.sequence_parallel == True, 'Tensor parallel communication/GEMM overlap can happen only when sequence parallelism is enabled'

    if args.deterministic_mode:
        all_reduce_choices = ["Tree", "Ring", "CollnetDirect", "CollnetChain", "^NVLS"]
        assert os.getenv("NCCL_ALGO", -1) != -1 and os.getenv("NCCL_ALGO") in all_reduce_choices, \\
            f"NCCL_ALGO must be one of {all_reduce_choices}."

    return args
'''

# What a test run of validate_args needs: a clean environment for the variables the port sets, and
# args with upstream's defaults for the options involved.
VALIDATE_ARGS_PROBE = """
import os, sys, types, warnings
from rocmport_launch import LAUNCH_ENV_NAMES
for name in LAUNCH_ENV_NAMES:
    os.environ.pop(name, None)
os.environ.update(__ENV__)
from megatron.training.arguments import validate_args
args = types.SimpleNamespace(rank=0, tensor_model_parallel_size=2, context_parallel_size=1, use_torch_fsdp2=False,
                             use_megatron_fsdp=False, tp_comm_overlap=False, sequence_parallel=False, deterministic_mode=False)
args.__dict__.update(__ARGS__)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    try:
        validate_args(args)
        print("ok", " ".join(f"{k}={os.environ.get(k)}" for k in LAUNCH_ENV_NAMES if k in os.environ))
    except (AssertionError, ValueError) as exc:
        print(type(exc).__name__, exc)
print("tp_comm_overlap", args.tp_comm_overlap)
for w in caught:
    print("warning", w.message)
"""


def validate_args_tree(arguments: str) -> dict[str, str]:
    """The files to run validate_args from (with the list of the variables the launcher env covers)."""
    from rocmport.launch_env import DETERMINISTIC_ENV, LAUNCH_ENV

    names = [n for n, _, _ in LAUNCH_ENV + DETERMINISTIC_ENV]
    return {
        "megatron/training/__init__.py": "",
        "megatron/training/arguments.py": arguments,
        "rocmport_launch.py": f"LAUNCH_ENV_NAMES = {names!r}\n",
    }


def validate_args_probe(env: dict | None = None, args: dict | None = None) -> str:
    return VALIDATE_ARGS_PROBE.replace("__ENV__", repr(env or {})).replace("__ARGS__", repr(args or {}))
