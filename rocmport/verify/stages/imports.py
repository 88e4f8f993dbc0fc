"""Stage 1, imports: megatron.core, megatron.training and pretrain_gpt's imports, behind the firewall
(NVIDIA-only packages removed), each in a fresh interpreter of the tree's environment; then each file
holding a guarded import the port wrote, with its package absent (rocmport.verify.stages.guarded_imports)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rocmport import output
from rocmport.upstreams import MEGATRON_LM
from rocmport.verify.analyses.port_sites import Site
from rocmport.verify.orchestration import environment
from rocmport.verify.orchestration.contract import RunSetup, Stage, StageRun, VerifyContext, VerifyOptions
from rocmport.verify.orchestration.stage_result import FAIL, PASS, StageResult
from rocmport.verify.runtime import import_probe, protocol
from rocmport.verify.stages.guarded_imports import PORT_BUG, GuardedImports, probe_guards
from rocmport.verify.stages.gpt_training import _last_error

NAME = "imports"


@dataclass(frozen=True)
class ImportsOptions:
    """Stage 1 has no options of its own: it always runs when selected."""


class ImportsStage(Stage[ImportsOptions]):
    name = NAME
    summary = "megatron.core, megatron.training, pretrain_gpt's imports, behind the firewall"
    after_imports = False

    def check(self, given: Mapping[str, Any], setup: RunSetup) -> ImportsOptions:
        return ImportsOptions()

    def launches(self, opts: VerifyOptions, options: ImportsOptions, tmp: Path) -> list[dict]:
        return [{"stage": self.name, "command": ["python", "-c", "<import probe>"], "cwd": str(opts.tree)}]

    def run(self, ctx: VerifyContext, options: ImportsOptions) -> StageRun:
        missing = environment.missing_deps(ctx.tree)
        if missing:
            cmd = f"python -m pip install {' '.join(sorted(set(missing.values())))}"
            return StageRun(StageResult(self.name, FAIL, f"missing dependencies {', '.join(sorted(missing))}: `{cmd}`"))
        with output.progress("stage 1: imports behind the firewall"):
            return StageRun(stage_imports(ctx.tree, ctx.env, ctx.blocked, ctx.port_sites))


STAGE = ImportsStage()


def modules_import(n: int, kind: str = "") -> str:
    """ "1 module imports" / "24 modules import" (``kind`` e.g. "Bridge ")."""
    return f"{n} {kind}module imports" if n == 1 else f"{n} {kind}modules import"


@dataclass
class ImportProbe:
    """What an import probe found (stage 1 over Megatron-LM, stage 5 over Megatron-Bridge): the modules
    it imported, and those that failed ({module: {error, chain, missing}}); stage 1 adds the tree's own
    modules imported from elsewhere, stage 5 the tree's declared requirements this Python does not meet.
    None: not part of this result (absent from the JSON)."""

    modules: list[str]
    failures: dict[str, dict[str, Any]] | None = None
    not_from_tree: dict[str, str] | None = None
    declared_unmet: dict[str, dict[str, str]] | None = None
    # Stage 1: its import of each file holding a guarded import (None: the tree has none, or the
    # modules above failed first).
    guarded_imports: GuardedImports | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"modules": self.modules}
        for key in ("failures", "not_from_tree", "declared_unmet"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.guarded_imports is not None:
            out["guarded_imports"] = self.guarded_imports.to_dict()
        return out


def probe_imports(tree: Path, env: dict, mods: list[str]) -> tuple[dict[str, Any] | None, str, str]:
    """Import ``mods`` in a process started in ``tree`` with ``env`` (stage 1's and stage 5's probe,
    rocmport.verify.runtime.import_probe): (module -> its failure or None, the files they came from
    as the probe printed them, ""), or (None, "", why) when the probe itself crashed."""
    proc = subprocess.run(
        [sys.executable, "-W", "ignore", "-m", "rocmport.verify.runtime.import_probe", json.dumps(mods)],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    lines = proc.stdout.splitlines()
    line = next((ln for ln in lines if ln.startswith(import_probe.RESULTS)), None)
    if line is None:
        return None, "", f"the import probe crashed: {_last_error(proc)}"
    files = next((ln for ln in lines if ln.startswith(import_probe.FILES)), "")
    return json.loads(line.removeprefix(import_probe.RESULTS)), files, ""


def modules_to_import(tree: Path) -> list[str]:
    mods = [MEGATRON_LM.module]
    if (tree / "megatron" / "training").is_dir():
        mods.append("megatron.training")
    script = tree / "pretrain_gpt.py"
    if script.is_file():
        for node in ast.parse(script.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.Import):
                mods += [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                mods.append(node.module)
        mods.append("pretrain_gpt")
    return list(dict.fromkeys(mods))


def has_code(package: Path) -> bool:
    """Whether any Python file in ``package`` holds more than blank lines (stops at the first that does)."""
    return any(
        p.stat().st_size and p.read_text(encoding="utf-8", errors="replace").strip() for p in package.rglob("*.py")
    )


def stage_imports(tree: Path, env: dict, blocked: tuple[str, ...], port_sites: list[Site] | None = None) -> StageResult:
    """Stage 1 on ``tree``; ``port_sites``: the tree's port sites as the run found them (None: found
    when the guard probe needs them)."""
    start = time.monotonic()
    if not has_code(tree / "megatron" / "core"):  # it would import, and prove nothing
        return StageResult(
            NAME,
            FAIL,
            f"{tree / 'megatron' / 'core'} holds no Python code: nothing to check "
            f"(not a Megatron-LM tree; run `rocmport apply` or pass --tree)",
        )
    mods = modules_to_import(tree)
    results, files, crashed = probe_imports(tree, env, mods)
    if results is None:
        return StageResult(NAME, FAIL, crashed, time.monotonic() - start)
    failed = {m: r for m, r in results.items() if r}
    details = ImportProbe(mods, failures=failed)
    if not failed:
        elsewhere = _not_from(tree, files)
        if (
            elsewhere
        ):  # the tree's own package was shadowed (or is a namespace package): nothing of the tree was checked
            m, where = next(iter(elsewhere.items()))
            return StageResult(
                NAME,
                FAIL,
                f"{m} imported {where}, not from the tree {tree}: stage 1 checked nothing of the tree "
                f"(a package of that name earlier on the path, or no {m.replace('.', '/')}/__init__.py)",
                time.monotonic() - start,
                ImportProbe(mods, failures=failed, not_from_tree=elsewhere),
            )
        shown = ", ".join(mods[:3]) + (f" and {len(mods) - 3} more" if len(mods) > 3 else "")
        # What was not tested says so: "1 module imports" alone hid that megatron.training was absent, not tried.
        absent = (
            ""
            if (tree / "megatron" / "training").is_dir()
            else "; the tree has no megatron/training (a package-index source): not tested"
        )
        reason = f"{modules_import(len(mods))} behind the firewall ({shown}){absent}"
        # Then every guard the port wrote, with its package absent (guarded_imports).
        stage_dir = protocol.PORT_SITES.read(env)
        guarded = probe_guards(tree, env, blocked, Path(stage_dir) if stage_dir else None, port_sites)
        if guarded.files:
            details.guarded_imports = guarded
            bugs = guarded.with_verdict(PORT_BUG)
            if bugs:
                rel, found = next(iter(bugs.items()))
                return StageResult(
                    NAME, FAIL, f"{found.stopped} (imported for its guards: {rel})", time.monotonic() - start, details
                )
            reason += f"; {guarded.summary()}"
        return StageResult(NAME, PASS, reason, time.monotonic() - start, details)
    m, r = next(iter(failed.items()))
    missing = r.get("missing")
    hint = ""
    if missing and missing.split(".")[0] in blocked:
        hint = f" (NVIDIA-only package {missing} is firewalled: a port bug)"
    elif missing:
        hint = f" (missing dependency: `{sys.executable} -m pip install {missing.split('.')[0]}`)"
    chain = " -> ".join(r["chain"])
    return StageResult(NAME, FAIL, f"{m}: {r['error']}{hint}; import chain: {chain}", time.monotonic() - start, details)


def _not_from(tree: Path, probe_files: str) -> dict[str, str]:
    """The tree's own modules (megatron.*, pretrain_gpt) the probe imported from elsewhere: module -> where."""
    files = json.loads(probe_files.removeprefix(import_probe.FILES)) if probe_files else {}
    root = tree.resolve()
    out = {}
    for m, f in files.items():
        if m.split(".")[0] not in ("megatron", "pretrain_gpt") or m == "megatron":
            continue
        if f is None:
            out[m] = "as a namespace package (no file)"
        elif not Path(f).resolve().is_relative_to(root):
            out[m] = f"from {f}"
    return out
