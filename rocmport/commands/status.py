"""`rocmport status`: the lock, whether the cache holds the pinned commits, and the work trees."""

from __future__ import annotations

import click

from rocmport import output
from rocmport.config import load_settings
from rocmport.errors import EXIT_OK
from rocmport.port.status import status


@click.command("status")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable: keys lock, worktrees, cached.")
@click.pass_obj
def command(obj, as_json):
    """Show the lock, whether the cache has the pinned commits, and the ported work trees."""
    data = status(load_settings(obj["project"]))
    if as_json:
        output.emit_json(data)
        return EXIT_OK
    if not data["lock"]:
        output.info(f"no lock at {data['lock_path']}: run `rocmport sync --ref REF`")
        return EXIT_OK
    rows = []
    for name, pin in data["lock"]["upstreams"].items():
        wt = data["worktrees"].get(name)
        rows.append([
            name, pin["source"], pin["resolved_ref"], pin.get("version") or "?", pin["commit"][:12],
            "yes" if data["cached"].get(name) else "NO",
            f"{wt['path']} ({wt['branch']}, {'clean' if wt['clean'] else 'DIRTY'}, series {str(wt['series_hash'])[:12]})" if wt else "-",
        ])
    output.table(["upstream", "source", "ref", "version", "commit", "cached", "work tree"], rows, title=data["lock_path"])
    return EXIT_OK
