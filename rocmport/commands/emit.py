"""`rocmport emit docker`: generated recipes for running the port."""

from __future__ import annotations

from pathlib import Path

import click

from rocmport import output
from rocmport.config import load_settings
from rocmport.errors import EXIT_OK, BadInput
from rocmport.fsutil import atomic_write_text
from rocmport.package.docker import DEFAULT_ARCH, DEFAULT_BASE_TAG, project_dockerfile
from rocmport.upstreams import MEGATRON_LM


@click.group("emit")
def command():
    """Generate files for running the port (a container recipe)."""


@command.command("docker")
@click.option("-o", "--output", "out", type=click.Path(dir_okay=False), help="Write the Dockerfile here (default: stdout).")
@click.option("--base-tag", default=DEFAULT_BASE_TAG, show_default=True, help="rocm/pytorch image tag (an ARG: overridable at docker build).")
@click.option("--arch", default=DEFAULT_ARCH, show_default=True, help="PYTORCH_ROCM_ARCH default (an ARG).")
@click.option("--extra", "extras", multiple=True, default=(f"{MEGATRON_LM.distribution}:mlm",), show_default=True,
              metavar="DIST:EXTRA", help="Install this extra's dependencies too, e.g. megatron-core:mlm.")
@click.option("--dist", default="dist", show_default=True, help="Where `rocmport build` put the wheels, relative to the build context.")
@click.pass_obj
def docker(obj, out, base_tag, arch, extras, dist):
    """A Dockerfile on rocm/pytorch that installs the `rocmport build` wheels.

    \b
    Wheels with --no-deps, then the remaining dependencies of the ported manifests under a
    constraint pinning the image's ROCm torch (never reinstalled); ROCm TE attention defaults
    (NVTE_FLASH_ATTN=0, NVTE_FUSED_ATTN=1) and the `rocmport env` launcher environment.
    """
    settings = load_settings(obj["project"])
    wanted: dict[str, list[str]] = {}
    for item in extras:
        if ":" not in item:
            raise BadInput(f"--extra {item}: expected DIST:EXTRA, e.g. {MEGATRON_LM.distribution}:mlm")
        name, extra = item.split(":", 1)
        wanted.setdefault(name, []).append(extra)
    text = project_dockerfile(settings, wanted, base_tag=base_tag, arch=arch, dist=dist)
    if out:
        atomic_write_text(Path(out), text)
        output.info(f"wrote {out}")
    else:
        click.echo(text, nl=False)
    return EXIT_OK
