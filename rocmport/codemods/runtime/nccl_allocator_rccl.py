"""The `nccl-allocator-rccl` codemod's runtime helpers: the NCCL allocator extension linked against RCCL on
HIP.

Only the text between the `# >>> helper part N` / `# <<< helper part N` markers goes into the
generated helper module (rocmport/codemods/helper.py assembles it, parts in N order); what is
above the first marker is for the type checker and readers (the generated module defines
these names itself)."""

from rocmport.codemods.runtime.core import is_hip

# >>> helper part 190
# ---- NCCL allocator --------------------------------------------------------------------------------

def nccl_ldflags(flags: list) -> list:
    """Link flags of the NCCL memory allocator extension: RCCL on HIP (as AMD's fork links it)."""
    return ["-lrccl" if f == "-lnccl" else f for f in flags] if is_hip() else flags


# <<< helper part 190
