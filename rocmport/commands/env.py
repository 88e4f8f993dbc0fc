"""`rocmport env`: the recommended AMD launcher environment, each variable with its reason."""

from __future__ import annotations

import shlex

import click

from rocmport import output
from rocmport.errors import EXIT_OK
from rocmport.launch_env import DETERMINISTIC_ENV, LAUNCH_ENV


@click.command("env")
@click.option("--deterministic", is_flag=True, help="Add the settings for run-to-run reproducible results.")
@click.option("--json", "as_json", is_flag=True, help="A JSON list of {name, value, reason}.")
def command(deterministic, as_json):
    """Print the launcher environment for Megatron on ROCm (shell `export` lines by default).

    \b
    eval "$(rocmport env)"          # apply it in a shell
    """
    rows = LAUNCH_ENV + (DETERMINISTIC_ENV if deterministic else [])
    if as_json:
        output.emit_json([{"name": n, "value": v, "reason": r} for n, v, r in rows])
    else:
        for name, value, reason in rows:
            click.echo(f"# {reason}\nexport {name}={shlex.quote(value)}")
    return EXIT_OK
