"""`rocmport codemod`: run the codemods on any tree (in place by default)."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

import click

from rocmport import output
from rocmport.errors import EXIT_OK, EXIT_PROBLEM, BadInput


@click.command("codemod")
@click.argument("path", type=click.Path(exists=True, file_okay=False), default=".")
@click.option("--only", multiple=True, metavar="NAME", help="Run only these codemods (repeatable). Default: all.")
@click.option("--diff", "show_diff", is_flag=True, help="Print the changes; write nothing.")
@click.option("--check", is_flag=True, help="Exit 1 if anything would change; write nothing.")
@click.option("--list", "list_only", is_flag=True, help="List the codemods and exit.")
@click.option("--jobs", type=int, help="Worker processes (default: the cores there are).")
@click.option("--json", "as_json", is_flag=True, help="Per-file outcome and per-codemod site counts as JSON.")
def command(path, only, show_diff, check, list_only, jobs, as_json):
    """Run rocmport's libcst codemods over PATH (a Megatron-LM or Megatron-Bridge tree).

    Per file: changed | unchanged | failed, with changed-site counts per codemod.
    Exit: 0 ok, 1 --check found changes or a file failed to parse, 2 bad input.
    """
    from rocmport.codemods import compute_layers, registry

    if list_only:
        rows = [[c.NAME, c.VERSION, c.DESCRIPTION] for c in registry.values()]
        if as_json:
            output.emit_json([{"name": r[0], "version": r[1], "description": r[2]} for r in rows])
        else:
            output.table(["codemod", "version", "purpose"], rows)
        return EXIT_OK
    for name in only:
        if name not in registry:
            raise BadInput(f"--only {name}: unknown codemod; known: {', '.join(registry)}")
    tree = Path(path)
    with output.progress(f"running codemods over {tree}"):
        result = compute_layers(tree, list(only) or list(registry), jobs=jobs)
    final: dict[str, str] = {}
    per_file: dict[str, dict[str, int]] = {}
    for layer in result.layers:
        for rel, text in layer.files.items():
            final[rel] = text
            per_file.setdefault(rel, {})[layer.name] = layer.sites.get(rel, 0)
    if show_diff and not as_json:
        for rel in sorted(final):
            old = (tree / rel).read_text(encoding="utf-8").splitlines(keepends=True) if (tree / rel).exists() else []
            click.echo("".join(difflib.unified_diff(old, final[rel].splitlines(keepends=True), f"a/{rel}", f"b/{rel}")), nl=False)
    if not (show_diff or check):
        for rel, text in final.items():
            (tree / rel).parent.mkdir(parents=True, exist_ok=True)
            (tree / rel).write_text(text, encoding="utf-8")
    files: dict[str, dict[str, Any]] = {rel: {"outcome": "changed", "sites": sites} for rel, sites in per_file.items()}
    for f in result.failures:
        files[f.path] = {"outcome": "failed", "line": f.line, "message": f.message}
    sites = {layer.name: sum(layer.sites.values()) for layer in result.layers}
    summary = {
        "files_total": result.files_total, "files_parsed": result.files_parsed, "cache_hits": result.cache_hits,
        "sites": sites,
        "files": files, "written": not (show_diff or check),
    }
    if as_json:
        output.emit_json(summary)
    else:
        for f in result.failures:
            output.warn(f"{tree / f.path}:{f.line or '?'}: {f.message}")
        verb = "would change" if (show_diff or check) else "changed"
        output.info(f"{len(final)} files {verb} ({', '.join(f'{k}: {v} sites' for k, v in sites.items())}); "
                    f"{result.files_total} files, {result.files_parsed} parsed, {result.cache_hits} from cache, {len(result.failures)} failed")
    if result.failures or (check and final):
        return EXIT_PROBLEM
    return EXIT_OK
