"""The `hip-runtime-link` codemod's runtime helpers: an inline extension linked against the CUDA runtime
links the HIP runtime on HIP.

Only the text between the `# >>> helper part N` / `# <<< helper part N` markers goes into the
generated helper module (rocmport/codemods/helper.py assembles it, parts in N order); what is
above the first marker is for the type checker and readers (the generated module defines
these names itself)."""

import os

from rocmport.codemods.runtime.core import is_hip

# >>> helper part 192
def hip_runtime_ldflags(flags: list) -> list:
    """Link flags of an inline extension upstream links against the CUDA runtime (the unified-memory
    allocator of dynamic inference): ROCm has no libcudart, so on HIP `-lcudart` becomes the HIP runtime,
    `-L{ROCM_HOME}/lib -lamdhip64` (as AMD links it); torch's load_inline hipifies the source. CUDA unchanged."""
    if not is_hip():
        return flags
    from torch.utils import cpp_extension

    rocm_home = getattr(cpp_extension, "ROCM_HOME", None) or os.environ.get("ROCM_HOME") or os.environ.get("ROCM_PATH")
    out = []
    for f in flags:
        if f == "-lcudart":
            out += ([f"-L{os.path.join(rocm_home, 'lib')}"] if rocm_home else []) + ["-lamdhip64"]
        else:
            out.append(f)
    return out


# <<< helper part 192
