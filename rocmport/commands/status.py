"""`rocmport status`: the lock, whether the cache holds the pinned commits, and the work trees."""

from __future__ import annotations

import click

from rocmport import output
from rocmport.config import load_settings
from rocmport.errors import EXIT_OK
from rocmport.port.status import status
from rocmport.verify.report import last_verify


@click.command("status")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable: keys lock, worktrees, cached, last_verify.")
@click.pass_obj
def command(obj, as_json):
    """Show the lock, whether the cache has the pinned commits, the ported work trees and the last verify."""
    settings = load_settings(obj["project"])
    data = status(settings)
    data["last_verify"] = last_verify(settings.root)
    if as_json:
        output.emit_json(data)
        return EXIT_OK
    if not data["lock"]:
        output.info(f"no lock at {data['lock_path']}: run `rocmport sync --ref REF`")
        _print_last_verify(data["last_verify"])
        return EXIT_OK
    rows = []
    for name, pin in data["lock"]["upstreams"].items():
        wt = data["worktrees"].get(name)
        rows.append(
            [
                name,
                pin["source"],
                pin["resolved_ref"],
                pin.get("version") or "?",
                pin["commit"][:12],
                "yes" if data["cached"].get(name) else "NO",
                f"{wt['path']} ({wt['branch']}, {'clean' if wt['clean'] else 'DIRTY'}, series {str(wt['series_hash'])[:12]})"
                if wt
                else "-",
            ]
        )
    output.table(
        ["upstream", "source", "ref", "version", "commit", "cached", "work tree"], rows, title=data["lock_path"]
    )
    _print_last_verify(data["last_verify"])
    return EXIT_OK


def _print_last_verify(last: dict | None) -> None:
    """One line (two with the verdict): when the last verify ran, on which tree at which commit, and what it proved."""
    if last is None:
        output.info("last verify: none recorded here (`rocmport verify` writes build/verify/last.json)")
    elif "error" in last:
        output.info(f"last verify: {last['error']}")
    else:
        tree = f"{last['line']} port" if last.get("line") else last["tree"]
        output.info(
            f"last verify: {last['started'] or '?'} UTC, {tree} at {str(last['commit'] or '?')[:12]}"
            + (f"; report {last['report']}" if last.get("report") else "")
        )
        output.info(
            f"  {last['verdict'] or ('failed: ' + ', '.join(last['failed']) if last['failed'] else 'no stage failed')}"
        )
