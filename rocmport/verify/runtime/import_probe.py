"""Stage 1's and stage 5's import probe, in a started process behind the firewall: ``python -m
rocmport.verify.runtime.import_probe '["megatron.core", ...]'`` imports each module and prints two
lines the parent reads (rocmport.verify.stages.imports.probe_imports): each module's failure or None, and
the file each imported module came from.

``python -m rocmport.verify.runtime.import_probe --files '[{...}, ...]'`` is stage 1's probe of the
port's guarded imports (rocmport.verify.stages.guarded_imports): it imports each file of the tree that
holds a guard-nvidia-only-imports site, one after the other, each under its own module name (never
``__main__``: an example's main does not run; a test file is imported as pytest collects it, its tests
are not run), with the port-site records pointed at the file's own directory. It prints a line when a
file starts and one with what its import did, so the parent knows which file a crash or a hang stopped."""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import signal
import sys
import traceback
from types import FrameType

from rocmport.verify.runtime import protocol

RESULTS, FILES = "ROCMPORT-IMPORTS ", "ROCMPORT-FILES "
GUARD_START, GUARD_DONE = "ROCMPORT-GUARD-START ", "ROCMPORT-GUARD "


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


class FileImportHung(Exception):
    """A file's import ran past the probe's time for one file (a module-level wait: a rendezvous, input)."""


def _hung(signum: int, frame: FrameType | None) -> None:
    raise FileImportHung("its import did not finish within the probe's time for one file")


def import_file(root: str, entry: dict) -> dict:
    """Import one file (``entry``: its path relative to ``root``, its module name, whether that name is
    importable as a package module, its records directory): what happened, for the parent."""
    path = os.path.join(root, entry["path"])
    os.makedirs(entry["records"], exist_ok=True)
    protocol.PORT_SITES.set(os.environ, entry["records"])
    # As `python FILE` would see it: the file's directory first on the path (an example's sibling
    # modules), its own path as argv[0] and no arguments (a module-level argparse sees an empty line).
    saved_argv, saved_path = sys.argv[:], sys.path[:]
    sys.argv = [path]
    if not entry["package"]:
        sys.path.insert(0, os.path.dirname(path))
    signal.signal(signal.SIGALRM, _hung)
    signal.alarm(int(entry.get("seconds", 120)))
    try:
        if entry["package"]:
            found = getattr(importlib.import_module(entry["module"]), "__file__", None)
            if found is None or os.path.realpath(found) != os.path.realpath(path):
                # A package of the same name earlier on the path (another project's `tests`): this
                # file's guards did not run.
                return {
                    "path": entry["path"],
                    "error": f"{entry['module']} was imported from {found}",
                    "type": "elsewhere",
                }
        else:
            spec = importlib.util.spec_from_file_location(entry["module"], path)
            assert spec is not None and spec.loader is not None, path
            module = importlib.util.module_from_spec(spec)
            sys.modules[entry["module"]] = module
            spec.loader.exec_module(module)
        return {"path": entry["path"], "error": None}
    except BaseException as e:  # SystemExit (a module-level argparse), KeyboardInterrupt from a test's own code
        frames = [
            [os.path.relpath(os.path.realpath(fr.filename), root), fr.lineno or 0, fr.name]
            for fr in traceback.extract_tb(e.__traceback__)
            if os.path.realpath(fr.filename).startswith(root + os.sep)
        ]
        return {
            "path": entry["path"],
            "error": f"{type(e).__name__}: {e}"[:500],
            "type": type(e).__name__,
            "skip": _is_pytest_skip(e),
            "missing": getattr(e, "name", None) if isinstance(e, ModuleNotFoundError) else None,
            "frames": frames[-8:],
        }
    finally:
        signal.alarm(0)
        sys.argv, sys.path[:] = saved_argv, saved_path


def _is_pytest_skip(e: BaseException) -> bool:
    """A module-level pytest.skip / importorskip (pytest names its outcome classes' module builtins)."""
    outcomes = sys.modules.get("_pytest.outcomes")
    return outcomes is not None and isinstance(e, outcomes.Skipped)


def guarded_main(root: str, entries: list[dict]) -> None:
    for entry in entries:
        print("\n" + GUARD_START + json.dumps(entry["path"]), flush=True)
        print("\n" + GUARD_DONE + json.dumps(import_file(root, entry)), flush=True)
    # Whatever a file left behind (a non-daemon thread) must not keep this process alive: the exit
    # handlers (the bootstrap's record of the modules imported) run, then the process ends.
    import atexit

    atexit._run_exitfuncs()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    if sys.argv[1] == "--files":
        guarded_main(os.path.realpath(os.getcwd()), json.loads(sys.argv[2]))
    else:
        main(json.loads(sys.argv[1]))
