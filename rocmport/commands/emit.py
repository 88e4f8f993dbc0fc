"""`rocmport emit docker`: generated recipes for running the port."""

from __future__ import annotations

from pathlib import Path

import click

from rocmport import output
from rocmport.config import load_settings
from rocmport.errors import EXIT_OK, BadInput
from rocmport.fsutil import STDOUT, check_output_path, write_file
from rocmport.package.docker import DEFAULT_ARCH, DEFAULT_MAX_JOBS, project_dockerfile
from rocmport.upstreams import MEGATRON_LM


@click.group("emit")
def command():
    """Generate files for running the port (a container recipe)."""


@command.command("docker")
@click.option(
    "-o", "--output", "out", type=click.Path(dir_okay=False), help="Write the Dockerfile here (default, or -: stdout)."
)
@click.option(
    "--base-tag",
    default=None,
    help="rocm/pytorch image tag (default: the line's matrix; an ARG, overridable at docker build).",
)
@click.option(
    "--arch",
    default=DEFAULT_ARCH,
    show_default=True,
    help="GPU archs to build for, ';' or ',' separated (gfx942, gfx950, gfx90a, gfx1100, gfx1201, gfx906 ...).",
)
@click.option(
    "--components",
    "spec",
    default=None,
    metavar="all|none|NAME[:VARIANT],...",
    help="ROCm components to build from the line's matrix (e.g. transformer_engine,flash_attn:triton); "
    "none: the slim image. Default: all, or none when the series has no rocm: section.",
)
@click.option(
    "--max-jobs",
    type=click.IntRange(min=1),
    default=DEFAULT_MAX_JOBS,
    show_default=True,
    help="Default MAX_JOBS for the component builds (an ARG).",
)
@click.option(
    "--extra",
    "extras",
    multiple=True,
    default=(f"{MEGATRON_LM.distribution}:mlm",),
    show_default=True,
    metavar="DIST:EXTRA",
    help="Install this extra's dependencies too, e.g. megatron-core:mlm.",
)
@click.option(
    "--dist",
    default="dist",
    show_default=True,
    help="Where `rocmport build` put the sdists, relative to the build context.",
)
@click.pass_obj
def docker(obj, out, base_tag, arch, spec, max_jobs, extras, dist):
    """A multi-stage Dockerfile on rocm/pytorch: ROCm components, the port, smoke imports.

    \b
    One stage per component of the line's ROCm matrix (Transformer Engine, flash-attention, apex,
    grouped_gemm) builds it for --arch (a component that cannot build there is refused, naming what
    to use instead); the ported packages are built from the `rocmport build` sdists with the image's
    own Python; the image's ROCm torch is recorded first and the build fails if anything replaced it;
    smoke imports last. Exit: 0 written, 2 bad input (option, matrix, no applied tree).
    """
    if out is not None and not out.strip():  # `-o ''`: a typo, never "stdout" (that is leaving -o out)
        raise BadInput("-o '': give a file path, or leave -o out to print the Dockerfile")
    if out is not None:  # a device, a FIFO or a link is refused before any work (- is stdout)
        check_output_path(out, "--output", stdout_dash=True)
    settings = load_settings(obj["project"])
    wanted: dict[str, list[str]] = {}
    for item in extras:
        if ":" not in item:
            raise BadInput(f"--extra {item}: expected DIST:EXTRA, e.g. {MEGATRON_LM.distribution}:mlm")
        name, extra = item.split(":", 1)
        wanted.setdefault(name, []).append(extra)
    recipe = project_dockerfile(
        settings,
        wanted,
        base_tag=base_tag,
        arch=arch,
        spec=spec,
        max_jobs=max_jobs,
        dist=dist,
        file_name=Path(out).name if out and out != STDOUT else None,
    )
    for w in recipe.warnings:
        output.warn(w)
    if out and out != STDOUT:
        write_file(out, recipe.text)
        output.info(f"wrote {out}: {recipe.summary}")
    else:
        click.echo(recipe.text, nl=False)
    return EXIT_OK
