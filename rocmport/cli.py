"""The `rocmport` command line: a thin click layer over rocmport.commands.*.

Each subcommand lives in its own module (rocmport/commands/<name>.py) exposing a click command
named ``command``; they are imported lazily so `rocmport --help` stays fast.
Exit codes: 0 ok, 1 the operation found a problem, 2 usage / bad input.
"""

from __future__ import annotations

import importlib
import logging
import sys

import click

from rocmport import __version__
from rocmport.errors import EXIT_USAGE, RocmportError

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
    "status": "status",
    "sync": "sync",
    "verify": "verify",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx):
        return sorted(COMMANDS)

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
    type=click.Path(file_okay=False),
    help="The port project directory (holds upstream.lock and patchsets/). Default: current directory.",
)
@click.pass_context
def cli(ctx, verbose, project):
    """Keep NVIDIA Megatron-LM and Megatron-Bridge running on AMD GPUs (ROCm).

    \b
    rocmport sync --ref v0.16     pin upstream commits in upstream.lock
    rocmport apply                build the ported work trees (patches + codemods)
    rocmport verify --tp 2 --pp 2 prove the port imports and trains

    Exit codes: 0 ok, 1 a problem was found, 2 usage or bad input.
    """
    logging.basicConfig(level=logging.WARNING - 10 * verbose, format="%(levelname)s %(name)s: %(message)s")
    ctx.ensure_object(dict)
    ctx.obj["project"] = project
    ctx.obj["verbose"] = verbose


def main(argv=None) -> int:
    try:
        rv = cli.main(args=argv, prog_name="rocmport", standalone_mode=False)
    except RocmportError as exc:
        click.secho(f"rocmport: error: {exc}", err=True, fg="red")
        return exc.exit_code
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.ClickException as exc:
        exc.show()
        return EXIT_USAGE if exc.exit_code == 2 else exc.exit_code
    except click.Abort:
        click.echo("Aborted.", err=True)
        return 1
    except KeyboardInterrupt:
        return 130
    return rv if isinstance(rv, int) else 0


if __name__ == "__main__":
    sys.exit(main())
