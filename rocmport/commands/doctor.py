"""`rocmport doctor`: what this machine has for running a ported Megatron."""

from __future__ import annotations

import click

from rocmport import output
from rocmport.errors import EXIT_OK
from rocmport.verify.doctor import doctor


@click.command("doctor")
@click.option("--json", "as_json", is_flag=True)
def command(as_json):
    """ROCm/HIP version, RCCL, devices and arch, ROCm builds of apex/TE/flash_attn/grouped_gemm, env vars."""
    d = doctor()
    if as_json:
        output.emit_json(d)
        return EXIT_OK
    output.info(f"torch {d['torch']}: hip {d['hip']}, cuda {d['cuda']}; ROCm at {d['rocm_path']}; RCCL {d['rccl']}")
    output.table(["device", "name", "arch"], [[x["index"], x["name"], x["arch"]] for x in d["devices"]] or [["-", "no GPU", "-"]])
    output.table(["package", "importable", "version", "ROCm build"],
                 [[m, "yes" if p["importable"] else "no", p["version"] or "-", "yes" if p["rocm_build"] else "-"] for m, p in d["packages"].items()])
    output.table(["variable", "value"], [[k, v if v is not None else "(unset)"] for k, v in d["env"].items()])
    return EXIT_OK
