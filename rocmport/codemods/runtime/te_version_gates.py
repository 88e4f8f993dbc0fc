"""The `te-version-gates` codemod's runtime helpers: Transformer Engine version gates and call sites that
ask ROCm TE's API on HIP.

Only the text between the `# >>> helper part N` / `# <<< helper part N` markers goes into the
generated helper module (rocmport/codemods/helper.py assembles it, parts in N order); what is
above the first marker is for the type checker and readers (the generated module defines
these names itself)."""

# mypy: disable-error-code="misc"
# (te_gate reads the signature of `obj.__init__` when obj is a class: what TE's constructor takes.)

import importlib

from rocmport.codemods.runtime.core import is_hip

# >>> helper part 90
# ---- Transformer Engine version gates ----------------------------------------------------------------

def _te_object(owner: str):
    """transformer_engine.<owner> (e.g. "pytorch.Linear"), importing submodules on the way; None if absent."""
    obj = importlib.import_module("transformer_engine")
    for part in owner.split("."):
        if hasattr(obj, part):
            obj = getattr(obj, part)
        else:
            obj = importlib.import_module(f"{obj.__name__}.{part}")
    return obj


def te_gate(version_ok: bool, owner: str, kwarg: str) -> bool:
    """A TE version gate that guards passing ``kwarg`` to ``transformer_engine.<owner>``.

    CUDA: the version gate's own answer, unchanged. HIP: ROCm's Transformer Engine numbers its
    releases its own way, so ask the API instead: does ``owner`` take ``kwarg``? When its signature
    cannot tell (``**kwargs`` only), the version gate decides."""
    if not is_hip():
        return version_ok
    try:
        obj = _te_object(owner)
    except (ImportError, AttributeError):
        return False
    import inspect

    try:
        params = inspect.signature(obj.__init__ if isinstance(obj, type) else obj).parameters
    except (TypeError, ValueError):
        return version_ok
    if kwarg in params:
        return True
    return version_ok if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()) else False


def te_has(version_ok: bool, name: str) -> bool:
    """A TE version gate that guards whether ``transformer_engine.<name>`` exists (a class to wrap).

    CUDA: the version gate's answer, unchanged. HIP: whether ROCm TE has it."""
    if not is_hip():
        return version_ok
    try:
        _te_object(name)
    except (ImportError, AttributeError):
        return False
    return True


# <<< helper part 90

# >>> helper part 200
# ---- TE call sites ---------------------------------------------------------------------------------

def te_accepts(fn, name: str) -> bool:
    """Does the TE callable ``fn`` take the keyword ``name``? CUDA: True (upstream passes it as it
    always did). HIP: ask its signature (ROCm TE drifts: e.g. general_gemm allocates its workspace
    itself in some releases and rejects `workspace=`); a `**kwargs` signature takes anything."""
    if not is_hip():
        return True
    import inspect

    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return True
    return name in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def save_original_input_ok(config) -> bool:
    """Transformer Engine cannot save a module's original input under the delayed-scaling FP8 recipe
    (upstream guards it from v0.16): on HIP the unguarded v0.15 site asks; CUDA unchanged."""
    return not is_hip() or getattr(config, "fp8_recipe", None) != "delayed"


# <<< helper part 200
