"""`rocmport codemod`: run the codemods on any tree (in place by default)."""

from __future__ import annotations

from pathlib import Path

import click

from rocmport import output
from rocmport.errors import EXIT_OK, EXIT_PROBLEM


@click.command("codemod")
@click.argument("path", type=click.Path(exists=True, file_okay=False), default=".")
@click.option("--only", multiple=True, metavar="NAME", help="Run only these codemods (repeatable). Default: all.")
@click.option("--diff", "show_diff", is_flag=True, help="Print the changes; write nothing.")
@click.option("--check", is_flag=True, help="Exit 1 if anything would change; write nothing.")
@click.option("--list", "list_only", is_flag=True, help="List the codemods and exit.")
@click.option("--jobs", type=int, help="Worker processes (default: the cores there are).")
@click.option(
    "--json", "as_json", is_flag=True, help="Per-file outcome, per-codemod site counts and per-site reports as JSON."
)
def command(path, only, show_diff, check, list_only, jobs, as_json):
    """Run rocmport's libcst codemods over PATH (a Megatron-LM or Megatron-Bridge tree).

    Per file: changed | unchanged | failed, with changed-site counts per codemod.
    Exit: 0 ok, 1 --check found changes or a file failed to parse, 2 bad input.
    """
    from rocmport.codemods import registry  # libcst: imported when a codemod command runs, not for --help
    from rocmport.codemods.on_tree import rewrite_tree

    if list_only:
        rows = [[c.NAME, c.VERSION, c.DESCRIPTION] for c in registry.values()]
        if as_json:
            output.emit_json([{"name": r[0], "version": r[1], "description": r[2]} for r in rows])
        else:
            output.table(["codemod", "version", "purpose"], rows)
        return EXIT_OK
    tree = Path(path)
    with output.progress(f"running codemods over {tree}"):
        done = rewrite_tree(tree, list(only), jobs, write=not (show_diff or check))
    if show_diff and not as_json:
        click.echo(done.diff(), nl=False)
    result = done.result
    if as_json:
        output.emit_json(done.summary())
    else:
        for f in result.failures:
            output.warn(f"{tree / f.path}:{f.line or '?'}: {f.message}")
        for r in done.reports("warning"):
            output.warn(f"{tree / r.path}:{r.line or '?'}: {r.codemod}: {r.message}")
        verb = "would change" if (show_diff or check) else "changed"
        output.info(
            f"{len(done.final)} files {verb} ({', '.join(f'{k}: {v} sites' for k, v in done.sites.items())}); "
            f"{result.files_total} files, {result.files_parsed} parsed, {result.cache_hits} from cache, {len(result.failures)} failed"
        )
    if result.failures or (check and done.final):
        return EXIT_PROBLEM
    return EXIT_OK
