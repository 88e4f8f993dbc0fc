"""`rocmport env`: the AMD launcher environment for one GPU kind and this machine's fabric, each
variable with its reason and source; the launcher's own values always win."""

from __future__ import annotations

import os
import shlex
from pathlib import Path

import click

from rocmport import output
from rocmport.errors import EXIT_OK, BadInput
from rocmport.machine.launch_profile import (
    ARCH_CHOICES,
    check_host,
    profile,
    resolve_arch,
    resolve_env,
    tune_settings,
)


@click.command("env")
@click.option(
    "--arch",
    default=None,
    metavar="|".join((*ARCH_CHOICES, "auto")),
    help="Add this GPU kind's values (auto: the first GPU's arch).",
)
@click.option("--deterministic", is_flag=True, help="Add the settings for run-to-run reproducible results.")
@click.option(
    "--tune",
    nargs=2,
    type=(click.Choice(["record", "replay"]), click.Path(file_okay=False)),
    default=None,
    metavar="record|replay DIR",
    help="GEMM tuning: record (tune each new GEMM shape, write the results into DIR) or replay (read them, tune nothing).",
)
@click.option(
    "--master-addr",
    default=None,
    metavar="HOST",
    help="The master's address, for the socket interface toward it (default: $MASTER_ADDR).",
)
@click.option("--no-fabric", is_flag=True, help="Do not read this machine's RDMA devices and routes.")
@click.option(
    "--explain", is_flag=True, help="Say why each variable is set, where the value comes from, and what was found."
)
@click.option(
    "--json", "as_json", is_flag=True, help="A JSON list of {name, value, reason, source, part, yours, ours}."
)
@click.option("--sys-root", default="/sys", hidden=True, type=click.Path(path_type=Path))
@click.option("--proc-root", default="/proc", hidden=True, type=click.Path(path_type=Path))
def command(arch, deterministic, tune, master_addr, no_fabric, explain, as_json, sys_root, proc_root):
    """Print the launcher environment for Megatron on ROCm (shell `export` lines by default).

    \b
    eval "$(rocmport env --arch auto)"                 # apply it in a shell
    rocmport env --arch gfx950 --explain               # why each variable, and its source
    eval "$(rocmport env --tune record /data/tuning)"  # first run: tune the GEMMs
    eval "$(rocmport env --tune replay /data/tuning)"  # later runs: reuse the tuning

    A variable already set in this environment is kept (yours wins) and said so.
    """
    arch = resolve_arch(arch) if arch is not None else None  # `--arch ''` is a typo, not "no arch"
    if tune and not tune[1].strip():  # Path('') is '.': an empty DIR would record into wherever this runs
        raise BadInput(f"--tune {tune[0]} '': give a directory")
    tuned, tune_notes = tune_settings(tune[0], Path(tune[1])) if tune else ([], [])
    if master_addr is not None:
        check_host(master_addr, "--master-addr")
    elif os.environ.get("MASTER_ADDR"):
        master_addr = check_host(os.environ["MASTER_ADDR"], "MASTER_ADDR")
    settings, notes = profile(
        arch,
        deterministic,
        master_addr=master_addr,
        sys_root=sys_root,
        proc_root=proc_root,
        fabric=not no_fabric,
        tune=tuned,
    )
    rows = resolve_env(settings)
    notes += tune_notes
    if as_json:
        output.emit_json([r.to_dict() for r in rows])
        for note in notes:
            output.info(note)
    elif explain:
        for r in rows:
            s = r.setting
            kept = f"  (yours, kept; rocmport's would be {s.value})" if r.yours else ""
            click.echo(f"{s.name}={r.value}  [{s.part}]{kept}\n    why: {s.reason}\n    source: {s.source}")
        for note in notes:
            click.echo(f"note: {note}")
    else:
        for r in rows:
            s = r.setting
            if r.yours:
                click.echo(f"# {s.name}={shlex.quote(r.value)} is yours and stays (rocmport's: {s.value}, {s.reason})")
            else:
                click.echo(f"# {s.reason}\nexport {s.name}={shlex.quote(r.value)}")
    return EXIT_OK
