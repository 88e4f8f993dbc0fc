"""guard-nvidia-only-imports: hard imports of modelopt and nvidia-resiliency-ext become guarded.

With the package present nothing changes (same names, plus a True HAVE_ flag). Without it the
names are bound to falsy placeholders that raise ModuleNotFoundError naming the package and the
importing file when used: the failure moves from import time to the code path that needs it."""

from __future__ import annotations

import libcst as cst

from rocmport.codemods.base import Codemod, Context
from rocmport.codemods.guard import guard_imports, helper_import
from rocmport.codemods.options import DISTRIBUTION, MODULE

DEFAULT_PACKAGES = {"modelopt": "nvidia-modelopt", "nvidia_resiliency_ext": "nvidia-resiliency-ext"}


class GuardNvidiaOnlyImports(Codemod):
    NAME = "guard-nvidia-only-imports"
    VERSION = "2"
    DESCRIPTION = "Guard hard imports of modelopt / nvidia-resiliency-ext; uses fail clearly, not imports"
    # Only module-level (unindented) imports are guarded.
    TRIGGERS = ("\nimport modelopt", "\nfrom modelopt", "\nimport nvidia_resiliency_ext", "\nfrom nvidia_resiliency_ext")
    USES_HELPER = True
    # More modules to guard, each with the distribution that provides it (named in the error).
    OPTIONS = {"packages": {MODULE: DISTRIBUTION}}

    def triggers(self, options: dict) -> tuple[str, ...]:
        extra = options.get("packages", {})
        return self.TRIGGERS + tuple(t for pkg in extra for t in (f"\nimport {pkg}", f"\nfrom {pkg}"))

    def transform(self, module: cst.Module, ctx: Context):
        packages = dict(DEFAULT_PACKAGES)
        packages.update(ctx.options.get("packages", {}))
        # The placeholder class is imported inside the except branch: nothing extra runs on CUDA.
        def fallback(name: str, source: str, node) -> str:
            return f"MissingPackage({packages[source.split('.')[0]]!r}, {source!r}, {ctx.relpath!r})"

        return guard_imports(module, ctx, set(packages), fallback, lambda top: f"HAVE_{top.upper()}",
                             prelude=helper_import(ctx, "MissingPackage"))
