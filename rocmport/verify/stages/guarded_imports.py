"""Stage 1's second probe: every guard the port wrote runs with its package absent.

guard-nvidia-only-imports turns a module-level import of an NVIDIA-only package (modelopt,
nvidia-resiliency-ext, and those a line's recipe adds, e.g. transformer_engine) into `try: ... except
ImportError: NAME = MissingPackage(...)`. The placeholder call is the site: it runs only where the
package is absent. Most of these files are examples and upstream test files that no stage imports, so
stage 1 imports each file of the tree that holds such a site, in one started process behind the
firewall with every guarded package blocked too (TE included: under --te it is present for the other
stages), each under its module name (never `__main__`), its records in its own directory
(port_sites' `import=<file>` unit), so the report counts the sites as run and names the file.

What an import failure there means (per file, `guarded_imports` in stage 1's report):
- a dependency this environment lacks that is not NVIDIA-only (transformers, datasets ...): not the
  port's; the sites before it ran, the others name it as why they did not;
- a use of the placeholder at module level after the guard (an example that needs ModelOpt to do
  anything): the guard did what it is for, the failure moved to the use;
- an ImportError of a firewalled package outside a guard: a port bug, failing the stage, when it is
  a module-level import of one of the codemod's packages in a file the codemod guards (it guards
  every module-level import of them except in the library modules upstream imports only behind
  feature probes, codemods/feature_probes.py); else it is outside the codemod's scope by design (a
  package it does not guard, an import inside a function or block, a probe-only module) and is
  reported as such;
- a test file that skips itself at module level first (`pytest.importorskip("nvidia_resiliency_ext")`,
  `if not HAVE_GTP: pytest.skip(...)`), as pytest would here: its guards after that point run only
  where the skip does not happen; reported per site, the stage passes;
- anything else (a module-level argparse's exit, a hang, a crash): reported with where it stopped."""

from __future__ import annotations

import ast
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rocmport.gitutil import run_git
from rocmport.verify.analyses import port_sites
from rocmport.verify.orchestration import te_layer
from rocmport.verify.runtime import import_probe, protocol

CODEMOD = "guard-nvidia-only-imports"
PER_FILE_SECONDS = 120  # the probe's alarm for one file's import (a module-level wait ends there)

# Each file's verdict (GuardedFile.verdict); only PORT_BUG fails stage 1.
IMPORTED = "imported"
MISSING_DEPENDENCY = "missing-dependency"
USES_MISSING_PACKAGE = "uses-missing-package"
OUTSIDE_SCOPE = "unguarded-by-design"
SKIPS_ITSELF = "skips-itself"
PORT_BUG = "port-bug"
STOPPED = "stopped"


@dataclass
class GuardedFile:
    """What stage 1's import of one file holding guard sites did."""

    sites: int  # the guard sites in the file
    ran: int = 0  # those recorded as run (by this file's import or an earlier one's)
    verdict: str = IMPORTED
    stopped: str = ""  # why the import stopped ("" when it did not)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"sites": self.sites, "ran": self.ran, "verdict": self.verdict}
        if self.stopped:
            out["stopped"] = self.stopped
        return out


@dataclass
class GuardedImports:
    """Stage 1's probe of the guard sites: per file (relative to the tree) what its import did."""

    files: dict[str, GuardedFile] = field(default_factory=dict)
    blocked: tuple[str, ...] = ()  # the probe's firewall

    @property
    def sites(self) -> int:
        return sum(f.sites for f in self.files.values())

    @property
    def ran(self) -> int:
        return sum(f.ran for f in self.files.values())

    def with_verdict(self, verdict: str) -> dict[str, GuardedFile]:
        return {p: f for p, f in self.files.items() if f.verdict == verdict}

    def to_dict(self) -> dict[str, Any]:
        return {
            "sites": self.sites,
            "ran": self.ran,
            "files": {p: f.to_dict() for p, f in sorted(self.files.items())},
        }

    def summary(self) -> str:
        """ "12 of 30 guarded imports ran with their package absent (16 files imported; 2 stopped after ...)"."""
        counts: dict[str, int] = {}
        for f in self.files.values():
            counts[f.verdict] = counts.get(f.verdict, 0) + 1
        parts = [f"{n} {VERDICT_WORDS[v]}" for v, n in sorted(counts.items()) if v != IMPORTED]
        imported = counts.get(IMPORTED, 0)
        return (
            f"{self.ran} of {self.sites} guarded imports ran with their package absent "
            f"({imported} of {len(self.files)} files holding them imported"
            + (f"; {', '.join(parts)}" if parts else "")
            + ")"
        )


VERDICT_WORDS = {
    MISSING_DEPENDENCY: "stopped on a dependency not installed here",
    SKIPS_ITSELF: "skip themselves at module level before their guards",
    USES_MISSING_PACKAGE: "stopped using the missing package after the guard",
    OUTSIDE_SCOPE: "stopped on an NVIDIA-only import outside the codemod's scope",
    PORT_BUG: "stopped on an unguarded import the codemod should have guarded",
    STOPPED: "stopped otherwise",
}


# apex-to-torch guards module-level apex imports too (`except ImportError: apex = apex_fallback('apex')`):
# such a site runs when its file is imported without apex, as a guard-nvidia-only-imports one does.
APEX_CODEMOD, APEX_FALLBACK = "apex-to-torch", "apex_fallback"


def guard_sites(sites: list[port_sites.Site]) -> dict[str, list[port_sites.Site]]:
    """The port's guarded module-level imports by file, of the port's ``sites`` (port_sites.tree_sites):
    guard-nvidia-only-imports' sites and apex-to-torch's module-level apex fallbacks (e.g. v0.16's legacy
    vision models, which only the pretrain_vision_* scripts import)."""
    out: dict[str, list[port_sites.Site]] = {}
    for site in sites:
        apex_guard = site.codemod == APEX_CODEMOD and site.helper == APEX_FALLBACK and site.scope == "<module>"
        if site.codemod == CODEMOD or apex_guard:
            out.setdefault(site.path, []).append(site)
    return out


def guarded_packages(tree: Path) -> tuple[str, ...]:
    """The top-level modules the codemod guards in this port: its defaults and the recipe's additions."""
    from rocmport.codemods.guard_nvidia_only_imports import DEFAULT_PACKAGES
    from rocmport.patches.series import load_series
    from rocmport.port import worktree as wt

    packages = set(DEFAULT_PACKAGES)
    state = wt.read_state(tree)
    series = wt.project_series(tree, Path(state.series)) if state and state.series else None
    if series is not None and series.is_file():
        for c in load_series(series).codemods:
            if c["name"] == CODEMOD:
                packages |= set((c.get("options") or {}).get("packages") or {})
    return tuple(sorted(packages))


def module_of(tree: Path, rel: str) -> tuple[str, bool]:
    """The module name a file is imported under, and whether that name imports it as a package module
    (every folder from the tree's root down to it holds an __init__.py); else it is imported by path."""
    parts = list(Path(rel).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    folders = [tree.joinpath(*Path(rel).parts[:i]) for i in range(1, len(Path(rel).parts))]
    package = all((d / "__init__.py").is_file() for d in folders) and all(p.isidentifier() for p in parts)
    return ".".join(parts), package


def probe_env(env: Mapping[str, str], blocked: tuple[str, ...], packages: tuple[str, ...]) -> tuple[dict, tuple]:
    """Stage 1's environment with every guarded package and TE behind the firewall, TE's layer off."""
    shut = tuple(sorted({*blocked, *te_layer.MODULES, *packages}))
    out = dict(env)
    protocol.FIREWALL.set(out, shut)
    protocol.TE.unset(out)
    protocol.TE_PATH.unset(out)
    return out, shut


def run_probe(tree: Path, env: dict, entries: list[dict], timeout: float) -> dict[str, dict]:
    """Import each entry's file in a started process (import_probe --files), a fresh one after a file
    that crashed or hung it: path -> what its import did."""
    results: dict[str, dict] = {}
    remaining = list(entries)
    while remaining:
        proc = subprocess.Popen(
            [sys.executable, "-W", "ignore", "-m", import_probe.__name__, "--files", json.dumps(remaining)],
            cwd=tree,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,  # a file's children end with it
        )
        start = time.monotonic()
        stopped = ""
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            stopped = f"the probe was stopped after {time.monotonic() - start:.0f} s"
        started = None
        for line in out.splitlines():
            if line.startswith(import_probe.GUARD_START):
                started = json.loads(line.removeprefix(import_probe.GUARD_START))
            elif line.startswith(import_probe.GUARD_DONE):
                done = json.loads(line.removeprefix(import_probe.GUARD_DONE))
                results[done["path"]] = done
                started = None
        if started is not None:  # the file its process ended in
            last = (err.strip().splitlines() or [""])[-1]
            why = stopped or f"the probe process ended (exit {proc.returncode})"
            results[started] = {
                "path": started,
                "error": f"{why} during its import: {last}".rstrip(": "),
                "type": "crash",
            }
        elif not any(e["path"] in results for e in remaining):
            last = (err.strip().splitlines() or [""])[-1]
            for e in remaining:  # the probe never started a file (it crashed first): each says why
                results[e["path"]] = {
                    "path": e["path"],
                    "error": f"the probe ended (exit {proc.returncode}) before importing it: {last}",
                    "type": "crash",
                }
        remaining = [e for e in remaining if e["path"] not in results]
    return results


def probe_guards(
    tree: Path,
    env: Mapping[str, str],
    blocked: tuple[str, ...],
    stage_dir: Path | None,
    port: list[port_sites.Site] | None = None,
) -> GuardedImports:
    """Import every file holding a guard site behind the firewall (guarded packages and TE blocked),
    each with its records in its own directory under ``stage_dir`` (stage 1's records; None: a
    temporary directory, removed after). ``port``: the tree's port sites as the run found them
    (port_sites.tree_sites; None: found here)."""
    sites = guard_sites(port_sites.tree_sites(tree) if port is None else port)
    if not sites:
        return GuardedImports()
    if stage_dir is None:
        import tempfile

        with tempfile.TemporaryDirectory(prefix="rocmport-guards-") as tmp:
            return _probe(tree, env, blocked, Path(tmp), sites)
    return _probe(tree, env, blocked, stage_dir, sites)


def _probe(
    tree: Path, env: Mapping[str, str], blocked: tuple[str, ...], records: Path, sites: dict[str, list[port_sites.Site]]
) -> GuardedImports:
    packages = guarded_packages(tree)
    penv, shut = probe_env(env, blocked, packages)
    entries: list[dict[str, Any]] = []
    for rel in sorted(sites):
        module, package = module_of(tree, rel)
        where = records / port_sites.unit_dir_name("import", rel)
        entries.append(
            {"path": rel, "module": module, "package": package, "records": str(where), "seconds": PER_FILE_SECONDS}
        )
    results = run_probe(tree, penv, entries, min(900.0, 60.0 + (PER_FILE_SECONDS + 10) * len(entries)))
    calls, _ = port_sites.read_records(records, tree)
    ran = {s.key for s in port_sites.sites_ran([s for group in sites.values() for s in group], calls)}
    out = GuardedImports(blocked=shut)
    texts = _TreeTexts(tree)
    for entry in entries:
        rel = entry["path"]
        found = GuardedFile(len(sites[rel]), sum(s.key in ran for s in sites[rel]))
        result = results.get(rel) or {"error": "the probe gave no result for it", "type": "crash"}
        if result.get("error"):
            found.verdict, found.stopped = judge(result, shut, packages, texts)
            port_sites.write_stopped(records / port_sites.unit_dir_name("import", rel), found.stopped)
        out.files[rel] = found
    return out


class _TreeTexts:
    """The tree's Python files, read once and only when a verdict needs them (the feature-probe scan)."""

    def __init__(self, tree: Path):
        self.tree = tree
        self._texts: dict[str, str] | None = None

    def text(self, rel: str) -> str | None:
        path = self.tree / rel
        try:
            return path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            return None

    def all(self) -> dict[str, str]:
        if self._texts is None:
            listed = run_git("ls-files", "-z", "--", "*.py", cwd=self.tree, check=False).stdout.split("\0")
            self._texts = {rel: t for rel in listed if rel and (t := self.text(rel)) is not None}
        return self._texts


def judge(
    result: Mapping[str, Any], shut: tuple[str, ...], packages: tuple[str, ...], texts: _TreeTexts
) -> tuple[str, str]:
    """(verdict, why the import stopped) for a file whose import raised (import_probe.import_file's result)."""
    error, kind, missing = result["error"], result.get("type"), result.get("missing")
    frames = [f for f in result.get("frames") or [] if f[0] not in port_sites.HELPER_FILES]
    where = f" at {frames[-1][0]}:{frames[-1][1]}" if frames else ""
    if kind in ("crash", "elsewhere"):
        return STOPPED, error
    if kind == "FileImportHung":
        return STOPPED, f"its import did not finish in {PER_FILE_SECONDS} s{where} (a module-level wait)"
    if result.get("skip"):
        return SKIPS_ITSELF, (
            f"the file skips itself at module level{where} ({error.removeprefix('Skipped: ')}) before this "
            f"guard, as pytest would here: the guard runs only where that skip does not happen"
        )
    helper_frames = [f for f in result.get("frames") or [] if f[0] in port_sites.HELPER_FILES]
    if kind == "ModuleNotFoundError" and missing is None and helper_frames:
        return USES_MISSING_PACKAGE, (
            f"a module-level use of the placeholder the guard bound{where} ({error}): the file needs the package to run"
        )
    top = (missing or "").split(".")[0]
    if kind == "ModuleNotFoundError" and top and top not in shut:
        return (
            MISSING_DEPENDENCY,
            f"{top} is not installed here (not NVIDIA-only){where}: `pip install {top}` runs further",
        )
    if kind in ("ModuleNotFoundError", "ImportError") and top in shut:
        return _unguarded(top, frames, packages, texts, error)
    if kind == "SystemExit":
        return STOPPED, f"{error}{where}: the script parses its command line or exits at import"
    return STOPPED, f"{error}{where}"


def _unguarded(top: str, frames: list, packages: tuple[str, ...], texts: _TreeTexts, error: str) -> tuple[str, str]:
    """An import of a firewalled package outside a guard: a port bug when the codemod should have
    guarded it (a module-level import of one of its packages, in a file it does not leave alone),
    else outside its scope by design, saying which part of the scope."""
    if not frames:
        return OUTSIDE_SCOPE, f"{error}: raised outside the tree (an installed package imports {top})"
    rel, line, func = frames[-1]
    at = f"{rel}:{line}"
    if top not in packages:
        return OUTSIDE_SCOPE, (
            f"{top} (NVIDIA-only, firewalled) imported at {at}: not a package {CODEMOD} guards ({', '.join(packages)})"
        )
    text = texts.text(rel)
    if func != "<module>" or text is None or not _top_level_import(text, line):
        return OUTSIDE_SCOPE, (
            f"{top} imported at {at} inside {'a function' if func != '<module>' else 'a block'}: "
            f"{CODEMOD} guards module-level imports only"
        )
    from rocmport.codemods.feature_probes import probe_only_files

    probes = probe_only_files(texts.all(), [rel]).get(rel)
    if probes:
        return OUTSIDE_SCOPE, (
            f"{top} imported at {at}, a module {CODEMOD} leaves unguarded on purpose: upstream imports it "
            f"only behind feature probes ({', '.join(probes)}), which must see it fail"
        )
    return PORT_BUG, f"unguarded module-level import of {top} at {at}, which {CODEMOD} guards: a port bug"


def _top_level_import(text: str, line: int) -> bool:
    """Whether ``line`` of the module is an import statement of the module's own body (not in a try,
    an if or a function): the imports the codemod guards."""
    try:
        body = ast.parse(text).body
    except SyntaxError:
        return False
    return any(
        isinstance(n, (ast.Import, ast.ImportFrom)) and n.lineno <= line <= (n.end_lineno or n.lineno) for n in body
    )
