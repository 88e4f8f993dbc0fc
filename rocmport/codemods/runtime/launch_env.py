"""The `launch-env` codemod's runtime helpers: the AMD launcher defaults validate_args() sets on HIP.

Only the text between the `# >>> helper part N` / `# <<< helper part N` markers goes into the
generated helper module (rocmport/codemods/helper.py assembles it, parts in N order); what is
above the first marker is for the type checker and readers (the generated module defines
these names itself)."""

import os

from rocmport import launch_env as rendered
from rocmport.codemods.runtime.core import is_hip

# Part 120's _FSDP_FLAGS is rendered from rocmport/launch_env.py's FSDP_ARGS, the list verify's FSDP cases
# read too, written out as the line was when the piece spelled it (the ports' bytes unchanged).

# >>> helper part 100
# ---- launcher environment and deterministic mode ----------------------------------------------------
# Rendered from rocmport/launch_env.py, the one list `rocmport env`, verify and the container recipe
# use too: (variable, value, why).
LAUNCH_ENV = rendered.LAUNCH_ENV
# <<< helper part 100

# >>> helper part 120
# FSDP asserts CUDA_DEVICE_MAX_CONNECTIONS != 1: with it, that default is not set.
_FSDP_FLAGS = rendered.FSDP_ARGS


def _say(args, message: str) -> None:
    """One line on rank 0 (as Megatron's print_rank_0), where launch logs are read."""
    if getattr(args, "rank", 0) == 0:
        print(message, flush=True)


def apply_launch_env(args, environ=None) -> dict:
    """On HIP, the AMD launcher defaults a launcher forgot, with setdefault (the user's value wins),
    at the start of validate_args: before arguments.py asserts CUDA_DEVICE_MAX_CONNECTIONS=1 for
    tp/cp > 1 and before distributed initialisation reads the NCCL/RCCL variables. Returns what it
    set (and prints it on rank 0). On CUDA nothing is set.

    HSA_* and GPU_MAX_HW_QUEUES are read when the HIP runtime starts; where validate_args runs after
    the first device query (v0.15-v0.17 call torch.cuda.is_available() first) they reach only the
    processes started afterwards, so launchers should export them too (`rocmport env`)."""
    if not is_hip():
        return {}
    env = os.environ if environ is None else environ
    fsdp = any(getattr(args, flag, False) for flag in _FSDP_FLAGS)
    done = {}
    for name, value, _why in LAUNCH_ENV:
        if name == "CUDA_DEVICE_MAX_CONNECTIONS" and fsdp:
            continue
        if name not in env:
            env[name] = done[name] = value
    if done:
        _say(args, "ROCm: launcher environment defaults set (values already set are kept): "
                   + " ".join(f"{k}={v}" for k, v in done.items()))
    return done


# <<< helper part 120
