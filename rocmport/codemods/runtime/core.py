# mypy: disable-error-code="attr-defined"
# (_MissingBase._missing is None on the base class, set on each class `make` builds; the parts stay
# as the generated module has them, so the checker is told here rather than in them.)
#
# The runtime helpers every generated helper module has (is_hip, MissingPackage, the port-site
# recorder ...) and hip_runtime_version, which patch 0001 imports: only the text between the
# `# >>> helper part N` / `# <<< helper part N` markers goes into the generated module
# (rocmport/codemods/helper.py assembles it). Part 1000, the port-site recorder, must come last: it
# wraps every public helper defined above it.
# >>> helper part 10
"""ROCm runtime helpers used by call sites that rocmport's codemods rewrote.

Imports nothing NVIDIA-only. Every helper keeps CUDA behaviour unchanged: it only acts when the
build is HIP (torch.version.hip) or when the package a call site needs is really absent."""

import importlib.util
import os
import warnings

import torch


def _is_hip() -> bool:
    return getattr(torch.version, "hip", None) is not None


IS_HIP = _is_hip()


def is_hip() -> bool:
    """Evaluated at call time (tests and launchers may set torch.version.hip after import)."""
    return _is_hip()


def module_available(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


# <<< helper part 10

# >>> helper part 30
# What asks for each NVIDIA-only package: named in the error a use of a missing one raises.
PACKAGE_HINTS = {
    "nvidia-modelopt": "It is needed by the ModelOpt post-training options (quantization, distillation, pruning, "
                       "--export-*, modelopt checkpoints); run without them on ROCm.",
    "nvidia-resiliency-ext": "It is needed by --enable-ft-package, --non-persistent-ckpt-type local and "
                             "--inprocess-restart; run without them on ROCm.",
}


class MissingPackage:
    """Stands in for a name whose NVIDIA-only package is absent.

    Falsy, so `if x:` checks behave like None; any use raises ModuleNotFoundError naming the
    package, the import that asked for it, and what to do, at the point of use rather than at import."""

    def __init__(self, package: str, module: str, site: str, hint: str = ""):
        self._package, self._module, self._site, self._hint = package, module, site, hint

    def _fail(self, what=""):
        msg = (f"{self._module}{what} needs the NVIDIA-only package '{self._package}', which is not installed "
               f"(imported by {self._site}). ")
        hint = self._hint or PACKAGE_HINTS.get(self._package) or "Disable the option that needs it, or install the package where it exists."
        raise ModuleNotFoundError(msg + hint)

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return MissingPackage(self._package, f"{self._module}.{name}", self._site, self._hint)

    def __call__(self, *args, **kwargs):
        self._fail("()")

    def __mro_entries__(self, bases):
        return (_MissingBase.make(self),)

    def __bool__(self):
        return False

    def __or__(self, other):  # `mto.Foo | None` in annotations evaluated at import time
        return self

    __ror__ = __or__

    def __getitem__(self, item):  # `Foo[Bar]` generics in annotations
        return self

    def __instancecheck__(self, obj):  # isinstance(x, te.Linear) with TE absent: nothing is one
        return False

    def __subclasscheck__(self, cls):
        return False

    def __iter__(self):
        self._fail()

    def __repr__(self):
        return f"<missing {self._module} (package {self._package})>"


class _MissingBase:
    """Base for classes defined on top of a missing package's class: instantiating them fails clearly."""

    _missing = None

    @classmethod
    def make(cls, missing: MissingPackage):
        return type("Missing_" + missing._module.replace(".", "_"), (cls,), {"_missing": missing})

    def __init__(self, *args, **kwargs):
        self._missing._fail("()")


# <<< helper part 30

# >>> helper part 170
def hip_runtime_version() -> tuple[int, int]:
    """(major, minor) of the HIP runtime this process loads (hipRuntimeGetVersion in libamdhip64),
    else of the HIP torch was built with (torch.version.hip), else (0, 0). What runs is what
    matters: a pip torch on a host ROCm, or a newer runtime under an older build, differ."""
    import ctypes

    for lib in ("libamdhip64.so", "libamdhip64.so.7", "libamdhip64.so.6"):
        try:
            hip = ctypes.CDLL(lib)
            version = ctypes.c_int(0)
            hip.hipRuntimeGetVersion.argtypes = [ctypes.POINTER(ctypes.c_int)]
            hip.hipRuntimeGetVersion.restype = ctypes.c_int
            if hip.hipRuntimeGetVersion(ctypes.byref(version)) == 0 and version.value > 0:
                return version.value // 10_000_000, (version.value // 100_000) % 100
        except (OSError, AttributeError):
            continue
    parts = (getattr(torch.version, "hip", None) or "").split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (ValueError, IndexError):
        return 0, 0


# <<< helper part 170

# >>> helper part 1000
# ---- port coverage (rocmport verify) ---------------------------------------------------------------
# Only when $ROCMPORT_PORT_SITES names a directory (verify sets it): each public helper above records
# the call sites that use it, once per site, process and directory, as "<file>:<line> <helper>" lines
# in <dir>/sites-<pid>.txt. The directory is read again at each call: verify's pytest plugin points it
# at each test file's own subdirectory in turn (which test file ran which site). Unset, nothing is
# wrapped and the helpers cost nothing extra.

def _record_port_sites(directory):
    import functools
    import os
    import sys

    seen = set()

    def note(name):
        caller = sys._getframe(2)
        where = os.environ.get("ROCMPORT_PORT_SITES") or directory
        key = (where, caller.f_code.co_filename, caller.f_lineno, name)
        if key[1] != __file__ and key not in seen:
            seen.add(key)
            with open(os.path.join(where, f"sites-{os.getpid()}.txt"), "a", encoding="utf-8") as fh:
                fh.write(f"{key[1]}:{key[2]} {name}\n")

    def counted_function(name, fn):
        @functools.wraps(fn)
        def counted(*args, **kwargs):
            note(name)
            return fn(*args, **kwargs)

        return counted

    def counted_class(name, cls):
        init = cls.__init__

        @functools.wraps(init)
        def counted_init(self, *args, **kwargs):
            note(name)
            init(self, *args, **kwargs)

        cls.__init__ = counted_init

    space = globals()
    for name, obj in list(space.items()):
        if name.startswith("_") or getattr(obj, "__module__", None) != __name__:
            continue
        if isinstance(obj, type):
            counted_class(name, obj)
        elif callable(obj):
            space[name] = counted_function(name, obj)


if __import__("os").environ.get("ROCMPORT_PORT_SITES"):
    _record_port_sites(__import__("os").environ["ROCMPORT_PORT_SITES"])
# <<< helper part 1000
