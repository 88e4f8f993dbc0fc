"""Output helpers: JSON for machines, rich tables for people, progress on stderr."""

from __future__ import annotations

import json
import sys
import threading
import time
from contextlib import contextmanager

import click

from rocmport.errors import terminal_safe
from rocmport.redact import redact as _redact


def redact(text: str) -> str:
    """What is printed: credentials in URLs hidden, and nothing a terminal would act on (escapes from a file)."""
    return terminal_safe(_redact(text))


# Everything printed goes through redact(): a credential in a URL is never shown, wherever it came from.


def emit_json(data) -> None:
    click.echo(redact(json.dumps(data, indent=2, sort_keys=True, default=str)))


# The consoles whose live line (a spinner) is on the terminal now: a line printed meanwhile goes
# through the innermost, above its spinner, never glued onto the spinner's line.
_LIVE: list = []


def info(msg: str) -> None:
    """A line for the human reader, on stderr so --json stdout stays clean."""
    if _STEPS:  # a line said during a step (stage 3's per-file lines): the step is not silent
        _STEPS[-1].logged = time.monotonic()
    if _LIVE:
        _LIVE[-1].print(redact(msg), markup=False, highlight=False, soft_wrap=True)
    else:
        click.echo(redact(msg), err=True)


def warn(msg: str) -> None:
    if _LIVE:
        _LIVE[-1].print(f"warning: {redact(msg)}", style="yellow", markup=False, highlight=False, soft_wrap=True)
    else:
        click.secho(f"warning: {redact(msg)}", err=True, fg="yellow")


def elapsed(seconds: float) -> str:
    """ "7 s", "2m05s", "1h02m": how long a step has run."""
    s = int(seconds)
    return f"{s} s" if s < 60 else f"{s // 60}m{s % 60:02d}s" if s < 3600 else f"{s // 3600}h{s % 3600 // 60:02d}m"


def plural(n: int, word: str) -> str:
    """ "1 file", "3 files"."""
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


# A progress line in a log (not a TTY) at most this often: a long step says where it is without flooding.
LOG_EVERY = 10.0


class _Step:
    """One running `progress` step: `advance` says how far it is (files done/total …)."""

    def __init__(self, description: str, start: float, bar=None, task=None):
        self.description, self.start, self.bar, self.task = description, start, bar, task
        self.logged = start
        self.lock = threading.Lock()  # the heartbeat's thread and `advance` both log
        self.detail = "still running"  # the last `advance`, which the heartbeat repeats

    def advance(self, detail: str, final: bool = False) -> None:
        now = time.monotonic()
        if self.bar is not None:
            self.bar.update(self.task, description=redact(f"{self.description}: {detail}"))
            return
        with self.lock:
            self.detail = detail
            if final or now - self.logged >= LOG_EVERY:
                self.logged = now
                info(f"... {self.description}: {detail}, {elapsed(now - self.start)} elapsed")

    def heartbeat(self, stop: threading.Event) -> None:
        """In a log, a step that says nothing for LOG_EVERY seconds (a verify stage's processes
        training, importing) gets a line saying it is still running (or how far it last said it
        was): no silent minute."""
        while not stop.wait(min(1.0, LOG_EVERY / 4)):
            with self.lock:
                now = time.monotonic()
                if now - self.logged >= LOG_EVERY and _STEPS and _STEPS[-1] is self:
                    self.logged = now
                    info(f"... {self.description}: {self.detail}, {elapsed(now - self.start)} elapsed")


_STEPS: list[_Step] = []


def advance(detail: str, final: bool = False) -> None:
    """How far the innermost running `progress` step is ("codemods: 812/2210 files"): on a TTY it
    replaces the spinner's text; in a log, a line at most every LOG_EVERY seconds (and the ``final``
    one). Outside any step it says nothing: library callers and tests get no output."""
    if _STEPS:
        _STEPS[-1].advance(detail, final)


@contextmanager
def progress(description: str):
    """A spinner with the elapsed time on a TTY (lines printed meanwhile go above it); otherwise
    (automation gets no live terminal UI) a plain log line when the step starts and one with its
    elapsed time when it ends. Work inside reports how far it is with `advance`."""
    start = time.monotonic()
    if sys.stderr.isatty():
        from rich.console import Console
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        console = Console(stderr=True)
        with Progress(
            SpinnerColumn(),
            TextColumn("{task.description}", markup=False),
            TimeElapsedColumn(),
            console=console,
            transient=True,
        ) as bar:
            task = bar.add_task(redact(description), total=None)
            _LIVE.append(console)
            _STEPS.append(_Step(description, start, bar, task))
            try:
                yield
            finally:
                _STEPS.pop()
                _LIVE.remove(console)
    else:
        info(f"... {description}")
        step = _Step(description, start)
        _STEPS.append(step)
        stop = threading.Event()
        beat = threading.Thread(target=step.heartbeat, args=(stop,), name="rocmport-progress", daemon=True)
        beat.start()
        try:
            yield
        finally:
            stop.set()
            beat.join()
            _STEPS.pop()
        info(f"... {description}: done in {elapsed(time.monotonic() - start)}")


LOG_WIDTH = 100  # a table's width when stdout is not a terminal
KEY_WIDTH = 56  # the first (key) column stays whole up to this width, however narrow the terminal


def build_table(headers: list[str], rows: list[list], title: str | None = None):
    """The rich Table of ``rows``. Its first column is the key (a patch, a stage, a component): on a
    narrow terminal (80 columns) the other columns wrap and it stays whole."""
    from rich.table import Table

    cells = [[redact(str(c)) for c in row] for row in rows]
    t = Table(title=redact(title) if title else title, show_lines=False)
    for i, h in enumerate(headers):
        if i == 0:
            t.add_column(h, no_wrap=True, min_width=min(KEY_WIDTH, max([len(h), *(len(r[0]) for r in cells if r)])))
        else:
            t.add_column(h, overflow="fold")  # a long word breaks onto the next line, never cut to "…"
    for row in cells:
        t.add_row(*row)
    return t


def table(headers: list[str], rows: list[list], title: str | None = None) -> None:
    """Print a table to stdout (rich when available, plain columns otherwise)."""
    from rich.console import Console

    # Not on a terminal (a log, a pipe, CI): LOG_WIDTH columns, which a log viewer or a review shows whole.
    Console(width=None if sys.stdout.isatty() else LOG_WIDTH).print(build_table(headers, rows, title))
