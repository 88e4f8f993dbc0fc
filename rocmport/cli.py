"""The `rocmport` command line: a thin click layer over rocmport.commands.*, and the one place
where exceptions become a message and an exit code (no user ever sees a traceback).

Each subcommand lives in its own module (rocmport/commands/<name>.py) exposing a click command
named ``command``; they are imported lazily so `rocmport --help` stays fast.
Exit codes (rocmport.errors): 0 ok, 1 the operation found a problem, 2 usage / bad input,
3 another run holds the lock, 70 an internal error (its traceback goes to a log file).
"""

from __future__ import annotations

import importlib
import logging
import os
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path

import click

from rocmport import __version__
from rocmport.config import default_cache_dir
from rocmport.fsutil import write_file
from rocmport.redact import redact
from rocmport.errors import EXIT_INTERNAL, EXIT_PROBLEM, EXIT_USAGE, RocmportError

# name -> module under rocmport.commands; each module defines `command`.
COMMANDS: dict[str, str] = {
    "apply": "apply",
    "codemod": "codemod",
    "doctor": "doctor",
    "emit": "emit",
    "env": "env",
    "bot": "bot",
    "build": "build",
    "patches": "patches",
    "refresh": "refresh",
    "report": "report",
    "status": "status",
    "sync": "sync",
    "verify": "verify",
}


# The first line of each command's docstring, for `rocmport --help`: listing the commands then imports
# none of them (apply's and codemod's modules load libcst, verify's load torch). click shortens it
# as it would the docstring's; tests/test_cli.py holds each to its command's docstring.
SHORT_HELP: dict[str, str] = {
    "apply": "Check out the pinned commits and build the ported branches rocm/<ref>.",
    "bot": "Open one refresh branch per new upstream release: rocmport/refresh-<tag>.",
    "build": "Build installable wheels and sdists of the ported trees into dist/.",
    "codemod": "Run rocmport's libcst codemods over PATH (a Megatron-LM or Megatron-Bridge tree).",
    "doctor": "Torch and HIP, RCCL, devices and their arch, and each ROCm component of the line's matrix.",
    "emit": "Generate files for running the port (a container recipe).",
    "env": "Print the launcher environment for Megatron on ROCm (shell `export` lines by default).",
    "patches": "List, export and check the patch series in patchsets/.",
    "refresh": "Re-pin to a new upstream release and carry the patch series over.",
    "report": "Render a verify report as one self-contained HTML page (two reports: what changed).",
    "status": "Show the lock, whether the cache has the pinned commits, the ported work trees and the last verify.",
    "sync": "Pin Megatron-LM (and its companion Megatron-Bridge) in upstream.lock.",
    "verify": "Prove the ported tree imports without NVIDIA-only packages and trains GPT with tp×pp.",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx):
        return sorted(COMMANDS)

    def format_commands(self, ctx, formatter):
        """click's listing, from SHORT_HELP where it has the command (a command it lacks is loaded)."""
        names = self.list_commands(ctx)
        limit = formatter.width - 6 - max(map(len, names), default=0)  # as click.Group.format_commands
        rows = []
        for name in names:
            if name in SHORT_HELP:
                rows.append((name, click.Command(name, help=SHORT_HELP[name]).get_short_help_str(limit)))
                continue
            cmd = self.get_command(ctx, name)
            if cmd is not None and not cmd.hidden:
                rows.append((name, cmd.get_short_help_str(limit)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)

    def get_command(self, ctx, name):
        module = COMMANDS.get(name)
        if module is None:
            return None
        return importlib.import_module(f"rocmport.commands.{module}").command


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="rocmport")
@click.option("-v", "--verbose", count=True, help="More output (-vv for debug logs).")
@click.option(
    "-C",
    "--project",
    "project",
    default=".",
    type=click.Path(exists=True, file_okay=False),  # a mistyped -C is an error, not an empty project
    help="The port project directory (holds upstream.lock and patchsets/). Default: current directory.",
)
@click.pass_context
def cli(ctx, verbose, project):
    """Keep NVIDIA Megatron-LM and Megatron-Bridge running on AMD GPUs (ROCm).

    \b
    rocmport sync --ref v0.16     pin upstream commits in upstream.lock
    rocmport apply                build the ported work trees (patches + codemods)
    rocmport verify --tp 2 --pp 2 prove the port imports and trains

    Exit codes: 0 ok, 1 a problem was found, 2 usage or bad input, 3 busy (bot), 70 internal error.
    """
    logging.basicConfig(level=logging.WARNING - 10 * verbose, format="%(levelname)s %(name)s: %(message)s")
    ctx.ensure_object(dict)
    ctx.obj["project"] = project
    ctx.obj["verbose"] = verbose


def main(argv=None) -> int:
    try:
        rv = cli.main(args=argv, prog_name="rocmport", standalone_mode=False)
    except RocmportError as exc:
        if argv is None and exc.exit_code in (130, 143):  # the process is ending, interrupted and cleaned
            for s in (signal.SIGINT, signal.SIGTERM):  # up: a second Ctrl-C must not kill it while it says so
                signal.signal(s, signal.SIG_IGN)  # (exit -2, the line lost); in-process callers keep theirs
        click.secho(f"rocmport: error: {redact(str(exc))}", err=True, fg="red")
        return exc.exit_code
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.ClickException as exc:
        # click quotes the user's text as given: a control character (`--to $'\r'`) would rewrite the
        # terminal's line or forge one; shown escaped, the error stays the one line it is.
        # (click types `message` Final; it is a plain attribute that format_message() reads)
        setattr(exc, "message", "".join(c if c.isprintable() else repr(c)[1:-1] for c in exc.message))
        exc.show()
        return EXIT_USAGE if exc.exit_code == 2 else exc.exit_code
    except click.Abort as exc:
        click.echo("Aborted.", err=True)
        # click turns a Ctrl-C into Abort: it still exits as a SIGINT does (130), as a shell expects.
        return 130 if isinstance(exc.__cause__, KeyboardInterrupt) else 1
    except KeyboardInterrupt:
        return 130
    except OSError as exc:  # the file system or the machine said no (a full disk, a path that is a directory)
        click.secho(f"rocmport: error: {redact(_one_line(exc))}", err=True, fg="red")
        return EXIT_PROBLEM
    except Exception as exc:  # a bug in rocmport: one line here, the traceback in a log file
        log = write_crash_log(sys.argv[1:] if argv is None else list(argv))
        click.secho(
            f"rocmport: internal error: {type(exc).__name__}: {redact(_one_line(exc))}; the traceback is in {log}; "
            f"please report it with that file",
            err=True,
            fg="red",
        )
        return EXIT_INTERNAL
    return rv if isinstance(rv, int) else 0


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def write_crash_log(argv: list[str]) -> Path:
    """The current exception's traceback, with the command line and versions, in a new file under
    <cache>/logs (or the temporary directory when the cache cannot be written)."""
    text = (
        f"rocmport {__version__} on Python {sys.version.split()[0]}\nargv: {argv!r}\ncwd: {os.getcwd()}\n\n"
        + traceback.format_exc()
    )
    name = f"crash-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}.log"
    for directory in (default_cache_dir() / "logs", Path(tempfile.gettempdir())):
        try:
            directory.mkdir(parents=True, exist_ok=True)
            write_file(directory / name, redact(text))
            return directory / name
        except OSError:
            continue
    return Path(os.devnull)


if __name__ == "__main__":
    sys.exit(main())
