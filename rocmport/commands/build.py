"""`rocmport build`: wheels and sdists of the ported megatron-core and Megatron-Bridge."""

from __future__ import annotations

from pathlib import Path

import click

from rocmport import output
from rocmport.config import load_settings
from rocmport.errors import EXIT_OK, EXIT_PROBLEM
from rocmport.package.build import build_project
from rocmport.upstreams import NAMES, UPSTREAMS


@click.command("build")
@click.option("--upstream", type=click.Choice(sorted(NAMES)), help="Only this upstream (default: every applied one).")
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False),
    default="dist",
    show_default=True,
    help="Where wheels and sdists go.",
)
@click.option(
    "--build-number",
    type=click.IntRange(min=0),
    help="The N of +rocm.N (default: commits that touched the series in this project).",
)
@click.option(
    "--check-deps/--no-check-deps",
    default=True,
    show_default=True,
    help="Check with `pip install --dry-run --report` that installing the wheels pulls nothing CUDA-only.",
)
@click.option(
    "--python",
    "python",
    metavar="PATH",
    help="The Python to build for (default: [tool.rocmport] python, else this one when it satisfies the trees' requires-python, "
    "else a python3.X on PATH or under pyenv that does).",
)
@click.option("--json", "as_json", is_flag=True, help="Print what was built as JSON.")
@click.pass_obj
def command(obj, upstream, out_dir, build_number, check_deps, python, as_json):
    """Build installable wheels and sdists of the ported trees into dist/.

    \b
    Version: <upstream>+rocm.<n>; the upstream commit, series and its hash are in the package
    (megatron/core/_rocm_build.py) and its metadata (Project-URL). The work trees stay clean.
    Built for the Python the trees declare (Megatron-LM v0.17+: 3.12), and each wheel must install
    with it (its tags and Requires-Python).
    Exit: 0 built (installable, no CUDA-only dependency), 1 a build failed, a wheel its Python cannot
    install, or one that would pull a CUDA-only package, 2 bad input (no Python the trees need here).
    """
    settings = load_settings(obj["project"])
    result = build_project(
        settings,
        upstream,
        out_dir,
        build_number,
        check_deps,
        say=output.info,
        warn=output.warn,
        python=python or settings.python,
    )
    if as_json:
        output.emit_json(
            {"built": [b.to_dict() for b in result.built], "python": result.python, "problems": result.problems}
        )
    else:
        output.table(
            ["distribution", "version", "files"],
            [
                [UPSTREAMS[b.upstream].distribution, b.version, "\n".join(Path(f).name for f in b.files)]
                for b in result.built
            ],
        )
    for p in result.problems:
        output.warn(p)
    return EXIT_PROBLEM if result.problems else EXIT_OK
