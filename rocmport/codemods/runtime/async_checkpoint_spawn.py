"""The `async-checkpoint-spawn` codemod's runtime helpers: the start method of the async checkpoint writer.

Only the text between the `# >>> helper part N` / `# <<< helper part N` markers goes into the
generated helper module (rocmport/codemods/helper.py assembles it, parts in N order); what is
above the first marker is for the type checker and readers (the generated module defines
these names itself)."""

from rocmport.codemods.runtime.core import is_hip

# >>> helper part 150
# ---- async checkpoints -----------------------------------------------------------------------------

def async_start_method(upstream: str) -> str:
    """The start method of the process that writes an async checkpoint (TemporalAsyncCaller):
    upstream's ('fork') on CUDA; 'spawn' on HIP, as AMD's fork does: a child forked after the
    trainer allocated pinned memory segfaults on HIP < 7.1, and a forked HIP context is unsafe."""
    return "spawn" if is_hip() else upstream


# <<< helper part 150
