"""Output helpers: JSON for machines, rich tables for people, progress on stderr."""

from __future__ import annotations

import json
import sys
from contextlib import contextmanager

import click

from rocmport.redact import redact


# Everything printed goes through redact(): a credential in a URL is never shown, wherever it came from.


def emit_json(data) -> None:
    click.echo(redact(json.dumps(data, indent=2, sort_keys=True, default=str)))


def info(msg: str) -> None:
    """A line for the human reader, on stderr so --json stdout stays clean."""
    click.echo(redact(msg), err=True)


def warn(msg: str) -> None:
    click.secho(f"warning: {redact(msg)}", err=True, fg="yellow")


@contextmanager
def progress(description: str):
    """A spinner on a TTY, a plain log line otherwise (automation gets no live terminal UI)."""
    if sys.stderr.isatty():
        from rich.console import Console

        with Console(stderr=True).status(redact(description)):
            yield
    else:
        info(f"... {description}")
        yield


def table(headers: list[str], rows: list[list], title: str | None = None) -> None:
    """Print a table to stdout (rich when available, plain columns otherwise)."""
    from rich.console import Console
    from rich.table import Table

    t = Table(*headers, title=redact(title) if title else title, show_lines=False)
    for row in rows:
        t.add_row(*[redact(str(c)) for c in row])
    Console(width=None if sys.stdout.isatty() else 160).print(t)
