"""`rocmport doctor`: what this machine has for running a ported Megatron, against the line's ROCm matrix."""

from __future__ import annotations

import click

from rocmport import output
from rocmport.errors import EXIT_OK, EXIT_PROBLEM
from rocmport.errors import BadInput
from rocmport.components import known_archs, parse_archs
from rocmport.machine.doctor import doctor, matrix_for


@click.command("doctor")
@click.option(
    "--line",
    default=None,
    metavar="vX.Y",
    help="Check against this Megatron-LM line's matrix (default: the line upstream.lock pins).",
)
@click.option(
    "--arch",
    default=None,
    metavar="GFX",
    help="Judge builds and recommend for this GPU arch instead of the GPU's (e.g. gfx942, gfx1100, gfx906).",
)
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def command(obj, line, arch, as_json):
    """Torch and HIP, RCCL, devices and their arch, and each ROCm component of the line's matrix.

    \b
    One row per component (Transformer Engine, flash-attention, apex, grouped_gemm): installed or
    not, version in the line's range, built for this GPU's arch where its libraries record it;
    then what to use on this arch (layers, attention backend, FP8, environment overrides).
    Exit: 0 fine, 1 a required component is missing, out of range, not importable or built for
    another arch, 2 bad input (unknown line or arch, malformed matrix).
    """
    if arch is not None:
        arch = parse_archs(arch)[0]
    matrix = matrix_for(obj["project"], line)
    if arch is not None and arch not in known_archs(
        matrix
    ):  # docs/commands/env-doctor.md: an unknown arch is bad input
        raise BadInput(f"--arch {arch}: not a GPU arch rocmport knows (known: {', '.join(known_archs(matrix))})")
    d = doctor(matrix, arch)
    if as_json:
        output.emit_json(d.to_dict())
        return EXIT_PROBLEM if d.problems else EXIT_OK
    output.info(d.header())
    output.table(["device", "name", "arch"], [[x.index, x.name, x.arch] for x in d.devices] or [["-", "no GPU", "-"]])
    r = d.report
    where = {"gpu": "the GPU", "--arch": "--arch", "none": "no GPU and no --arch: the arch checks are skipped"}[
        r.arch_source
    ]
    if matrix is None:
        output.info(
            "components: no matrix to check against (no upstream.lock with a line whose series has a rocm: section; "
            "pass --line vX.Y)"
        )
    else:
        output.info(f"components of {r.series}, for arch {r.arch or '-'} ({where}):")
        output.table(
            ["component", "required", "wanted", "installed", "built for", "status", "detail"],
            [
                [
                    c.name,
                    "yes" if c.required else "no",
                    c.wanted,
                    f"{c.distribution} {c.version}" if c.version else "not installed",
                    ", ".join(c.built_for) if c.built_for else "-",
                    c.status,
                    c.detail,
                ]
                for c in r.rows
            ],
        )
    output.table(["topic", "use", "why"], [list(rec) for rec in r.recommendations], title="on this arch")
    output.table(["variable", "value"], [[k, v if v is not None else "(unset)"] for k, v in d.env.items()])
    for p in d.problems:
        output.warn(p)
    return EXIT_PROBLEM if d.problems else EXIT_OK
