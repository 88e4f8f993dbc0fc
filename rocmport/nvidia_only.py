"""The one published list of NVIDIA-only modules, in two profiles, used by codemods, scans and verify.

- rocm: what a ROCm image lacks. ROCm builds of apex, transformer_engine, flash_attn and
  grouped_gemm exist, so they are not listed.
- cpu-proxy: everything in rocm plus those four and apex's CUDA kernels (a CPU-only machine has none).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROCM = (
    "modelopt",
    "nvidia_resiliency_ext",
    "nv_grouped_gemm",
    "pynvml",
    "cuda",  # cuda-python bindings (cuda.bindings, cuda.bindings.nvml)
    "flash_attn_interface",  # FlashAttention-3 (Hopper)
    "flashattn_hopper",
    "flash_attn_3",
    "flashinfer",
    "nvshmem",
    "cudnn",
    "flash_mla",
    "nixl",
    "nvidia",  # nvidia-* wheels (nvidia.cudnn, nvidia.nccl ...)
)

CPU_PROXY = ROCM + (
    "apex",
    "amp_C",
    "fused_weight_gradient_mlp_cuda",
    "scaled_masked_softmax_cuda",
    "scaled_upper_triang_masked_softmax_cuda",
    "scaled_softmax_cuda",
    "fused_layer_norm_cuda",
    "fast_layer_norm",
    "transformer_engine",
    "transformer_engine_torch",
    "flash_attn",
    "grouped_gemm",
)

PROFILES = {"rocm": ROCM, "cpu-proxy": CPU_PROXY}


def blocked(profile: str) -> tuple[str, ...]:
    try:
        return PROFILES[profile]
    except KeyError:
        raise ValueError(f"unknown profile {profile!r}; known: {', '.join(PROFILES)}") from None


def _top(name: str) -> str:
    return name.split(".")[0]


def handles_import_error(handler: ast.ExceptHandler) -> bool:
    """Does this `except` catch an ImportError (bare, ImportError, ModuleNotFoundError, Exception)?"""
    names = [handler.type] if not isinstance(handler.type, ast.Tuple) else list(handler.type.elts)
    return handler.type is None or any(
        isinstance(n, ast.Name) and n.id in ("ImportError", "ModuleNotFoundError", "Exception") for n in names
    )


def _guarded(node: ast.AST, parents: dict) -> bool:
    """Inside a try that handles ImportError, an `if` (e.g. HAVE_X / TYPE_CHECKING), or a function."""
    cur = parents.get(node)
    while cur is not None:
        if isinstance(cur, (ast.FunctionDef, ast.AsyncFunctionDef, ast.If)):
            return True
        if isinstance(cur, ast.Try) and any(handles_import_error(h) for h in cur.handlers):
            return True
        cur = parents.get(cur)
    return False


def scan_unguarded_imports(
    tree: str | Path, profile: str = "rocm", paths: list[str] | None = None
) -> list[tuple[str, int, str]]:
    """(path, line, module) for every module-level import of a listed module that nothing guards."""
    names = set(blocked(profile))
    tree = Path(tree)
    out = []
    files = (
        paths
        if paths is not None
        else [str(p.relative_to(tree)) for p in sorted(tree.rglob("*.py")) if ".git" not in p.parts]
    )
    for rel in files:
        try:
            mod = ast.parse((tree / rel).read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue
        parents = {child: node for node in ast.walk(mod) for child in ast.iter_child_nodes(node)}
        for node in ast.walk(mod):
            if isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                mods = [node.module]
            else:
                continue
            for m in mods:
                if _top(m) in names and not _guarded(node, parents):
                    out.append((rel, node.lineno, m))
    return out
