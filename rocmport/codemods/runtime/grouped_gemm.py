"""The `grouped-gemm` codemod's runtime helpers: the grouped_gemm install hint (AMD's build on ROCm).

Only the text between the `# >>> helper part N` / `# <<< helper part N` markers goes into the
generated helper module (rocmport/codemods/helper.py assembles it, parts in N order); what is
above the first marker is for the type checker and readers (the generated module defines
these names itself)."""

from rocmport.codemods.runtime.core import is_hip

# >>> helper part 60
GROUPED_GEMM_ROCM_HINT = (
    "grouped_gemm is not installed; on ROCm install AMD's build "
    "(`pip install git+https://github.com/ROCm/grouped_gemm`), not the CUDA-only one."
)


def grouped_gemm_hint(cuda_hint: str) -> str:
    """The install hint for grouped_gemm: upstream's on CUDA, AMD's build on ROCm."""
    return GROUPED_GEMM_ROCM_HINT if is_hip() else cuda_hint


# <<< helper part 60
