"""guard-nvidia-only-imports: hard imports of modelopt and nvidia-resiliency-ext become guarded.

With the package present nothing changes (same names, plus a True HAVE_ flag). Without it the
names are bound to falsy placeholders that raise ModuleNotFoundError naming the package and the
importing file when used: the failure moves from import time to the code path that needs it.

Except in a module upstream imports only behind feature probes (`try: from megatron.post_training.utils
import ...; has_nvidia_modelopt = True except ...: False`): there the failing import *is* how upstream
turns the feature off, and a guard would make the probe say the feature is present
(codemods/feature_probes.py). Such a file is left as it is, with a report saying which probes decide.

An import after a module-level skip that happens wherever its package is absent is left too, reported
as a skip: after `pytest.importorskip` of the package (version 4), or after `if not FLAG:
pytest.skip(..., allow_module_level=True)` where FLAG is proved from the tree to be true only where
the package imports (version 5, codemods/skip_flags.py): a guard there could never run."""

from __future__ import annotations

from collections.abc import Mapping

import libcst as cst

from rocmport.codemods.base import Codemod, Context, import_names
from rocmport.codemods.feature_probes import probe_only_files
from rocmport.codemods.guard import guard_imports, helper_import, matching_import
from rocmport.codemods.skip_flags import skip_flags

DEFAULT_PACKAGES = {"modelopt": "nvidia-modelopt", "nvidia_resiliency_ext": "nvidia-resiliency-ext"}


class GuardNvidiaOnlyImports(Codemod):
    NAME = "guard-nvidia-only-imports"
    DESCRIPTION = "Guard hard imports of modelopt / nvidia-resiliency-ext; uses fail clearly, not imports"
    # Only module-level (unindented) imports are guarded.
    TRIGGERS = (
        "\nimport modelopt",
        "\nfrom modelopt",
        "\nimport nvidia_resiliency_ext",
        "\nfrom nvidia_resiliency_ext",
    )
    # More modules to guard, each with the distribution that provides it (named in the error).

    def triggers(self, options: dict) -> tuple[str, ...]:
        extra = options.get("packages", {})
        return self.TRIGGERS + tuple(t for pkg in extra for t in (f"\nimport {pkg}", f"\nfrom {pkg}"))

    def tree_facts(self, texts: Mapping[str, str], options: dict) -> dict[str, object]:
        """relpath -> {"probes": the files whose feature probes import it} for a file to leave
        unguarded, and/or {"skip_flags": {FLAG: {package: proof}}} for a file that skips itself at
        module level unless FLAG, a flag true only where the package imports (codemods/skip_flags.py)."""
        triggered = [rel for rel, text in texts.items() if self.triggered(text, options)]
        facts: dict[str, dict] = {rel: {"probes": probes} for rel, probes in probe_only_files(texts, triggered).items()}
        packages = {**DEFAULT_PACKAGES, **options.get("packages", {})}
        for rel, flags in skip_flags(texts, triggered, packages).items():
            facts.setdefault(rel, {})["skip_flags"] = flags
        return dict(facts)

    def transform(self, module: cst.Module, ctx: Context):
        packages = dict(DEFAULT_PACKAGES)
        packages.update(ctx.options.get("packages", {}))
        facts = ctx.facts if isinstance(ctx.facts, dict) else {}
        probes = facts.get("probes") or []
        if probes:
            imported = sorted(
                {
                    packages[top]
                    for stmt in module.body
                    if (node := matching_import(stmt, set(packages)))
                    for name in import_names(node)
                    if (top := name.split(".")[0]) in packages
                }
            )
            ctx.skip(
                f"left unguarded: upstream imports this module only behind feature probes "
                f"({', '.join(probes)}), which must see it fail where {' / '.join(imported)} is absent",
                probes=list(probes),
            )
            return module, 0

        # The placeholder class is imported inside the except branch: nothing extra runs on CUDA.
        def fallback(name: str, source: str, node) -> str:
            return f"MissingPackage({packages[source.split('.')[0]]!r}, {source!r}, {ctx.relpath!r})"

        return guard_imports(
            module,
            ctx,
            set(packages),
            fallback,
            lambda top: f"HAVE_{top.upper()}",
            prelude=helper_import(ctx, "MissingPackage"),
            skip_flags=facts.get("skip_flags"),
        )
