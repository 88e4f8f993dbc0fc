"""The `deterministic-env` codemod's runtime helpers: the ROCm extras of --deterministic-mode.

Only the text between the `# >>> helper part N` / `# <<< helper part N` markers goes into the
generated helper module (rocmport/codemods/helper.py assembles it, parts in N order); what is
above the first marker is for the type checker and readers (the generated module defines
these names itself)."""

import os
import warnings

from rocmport import launch_env as rendered
from rocmport.codemods.runtime.core import is_hip

# >>> helper part 110
DETERMINISTIC_ENV = rendered.DETERMINISTIC_ENV
# <<< helper part 110

# >>> helper part 130
def apply_deterministic_env(args, environ=None) -> dict:
    """On HIP with --deterministic-mode, the ROCm extras upstream's NCCL_ALGO check does not cover:
    missing ones are set (with a warning naming them); a contradicting value is a clear error.
    Returns what it set. On CUDA, or without --deterministic-mode, nothing happens."""
    if not is_hip() or not getattr(args, "deterministic_mode", False):
        return {}
    env = os.environ if environ is None else environ
    done = {}
    for name, value, why in DETERMINISTIC_ENV:
        current = env.get(name)
        if current is None:
            env[name] = done[name] = value
        elif name != "NCCL_ALGO" and current != value:  # upstream validates NCCL_ALGO itself
            raise ValueError(f"--deterministic-mode on ROCm needs {name}={value} ({why}); it is set to {current!r}. "
                             f"Unset it or export {name}={value}.")
    if done:
        warnings.warn("ROCm --deterministic-mode: set " + " ".join(f"{k}={v}" for k, v in done.items())
                      + " (bitwise-reproducible collectives and rocBLAS GEMMs)", stacklevel=2)
    return done


# <<< helper part 130
