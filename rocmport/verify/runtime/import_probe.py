"""Stage 1's and stage 5's import probe, in a started process behind the firewall: ``python -m
rocmport.verify.runtime.import_probe '["megatron.core", ...]'`` imports each module and prints two
lines the parent reads (rocmport.verify.stages.imports.probe_imports): each module's failure or None, and
the file each imported module came from."""

from __future__ import annotations

import importlib
import json
import sys
import traceback

RESULTS, FILES = "ROCMPORT-IMPORTS ", "ROCMPORT-FILES "


def main(modules: list[str]) -> None:
    out: dict[str, dict | None] = {}
    for m in modules:
        try:
            importlib.import_module(m)
            out[m] = None
        except BaseException as e:
            chain = [
                f"{fr.filename}:{fr.lineno}"
                for fr in traceback.extract_tb(e.__traceback__)
                if "/megatron/" in fr.filename or fr.filename.endswith("pretrain_gpt.py")
            ]
            missing = getattr(e, "name", None) if isinstance(e, ModuleNotFoundError) else None
            out[m] = {"error": f"{type(e).__name__}: {e}", "chain": chain[-6:], "missing": missing}
    print(RESULTS + json.dumps(out))
    print(FILES + json.dumps({m: getattr(sys.modules.get(m), "__file__", None) for m in out if out[m] is None}))


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
