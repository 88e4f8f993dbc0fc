"""`rocmport status`: the lock, whether the cache holds the pinned commits, and the work trees."""

from __future__ import annotations

from pathlib import Path

import click

from rocmport import output
from rocmport.config import load_settings
from rocmport.errors import EXIT_OK
from rocmport.port.status import status
from rocmport.verify.orchestration.report import LastVerify, last_verify


@click.command("status")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable: keys lock, worktrees, cached, last_verify.")
@click.pass_obj
def command(obj, as_json):
    """Show the lock, whether the cache has the pinned commits, the ported work trees and the last verify."""
    settings = load_settings(obj["project"])
    st = status(settings)
    last = last_verify(settings.root)
    if as_json:
        output.emit_json({**st.to_dict(), "last_verify": last.to_dict() if last else None})
        return EXIT_OK
    if not st.lock:
        output.info(f"no lock at {st.lock_path}: run `rocmport sync --ref REF`")
        _print_last_verify(last)
        return EXIT_OK
    rows = []
    for name, pin in sorted(st.lock.upstreams.items()):
        wt = st.worktrees.get(name)
        rows.append(
            [
                name,
                pin.source,
                pin.resolved_ref,
                pin.version or "?",
                pin.commit[:12],
                "yes" if st.cached.get(name) else "NO",
                f"{wt.path} ({wt.branch}, {'clean' if wt.clean else 'DIRTY'}, series {str(wt.series_hash)[:12]}"
                + ("; NOT THE LOCK'S COMMIT" if name in st.mismatches else "")
                + ")"
                if wt
                else "-",
            ]
        )
    output.table(["upstream", "source", "ref", "version", "commit", "cached", "work tree"], rows, title=st.lock_path)
    for name, why in sorted(st.mismatches.items()):
        output.warn(f"{name}: the work tree does not match the lock: {why}")
    _print_last_verify(last)
    return EXIT_OK


def _print_last_verify(last: LastVerify | None) -> None:
    """One line (two with the verdict): when the last verify ran, on which tree at which commit, and what it proved."""
    if last is None:
        output.info("last verify: none recorded here (`rocmport verify` writes build/verify/last.json)")
    elif last.error is not None:
        output.info(f"last verify: {last.error}")
    else:
        tree = f"{last.line} port" if last.line else last.tree
        output.info(
            f"last verify: {last.started or '?'} UTC, {tree} at {str(last.commit or '?')[:12]}"
            + (f"; report {last.report}" if last.report else "")
        )
        page = Path(last.report).with_suffix(".html") if last.report else None  # verify writes it beside the report
        if page is not None and page.is_file():
            output.info(f"  page: {page}")
        elif last.report:
            output.info(f"  page: none beside the report (`rocmport report {last.report}` writes it)")
        output.info(f"  {last.verdict or ('failed: ' + ', '.join(last.failed) if last.failed else 'no stage failed')}")
