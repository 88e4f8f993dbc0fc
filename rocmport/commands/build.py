"""`rocmport build`: wheels and sdists of the ported megatron-core and Megatron-Bridge."""

from __future__ import annotations

from pathlib import Path

import click

from rocmport import output
from rocmport.config import load_settings
from rocmport.errors import EXIT_OK, EXIT_PROBLEM, BadInput
from rocmport.package import build
from rocmport.package.build import build_upstream
from rocmport.patches.series import select_series
from rocmport.upstreams import NAMES, UPSTREAMS
from rocmport.port import manifests
from rocmport.upstream.lock import load_lock


@click.command("build")
@click.option("--upstream", type=click.Choice(sorted(NAMES)), help="Only this upstream (default: every applied one).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default="dist", show_default=True, help="Where wheels and sdists go.")
@click.option("--build-number", type=int, help="The N of +rocm.N (default: commits that touched the series in this project).")
@click.option("--check-deps/--no-check-deps", default=True, show_default=True,
              help="Check with `pip install --dry-run --report` that installing the wheels pulls nothing CUDA-only.")
@click.option("--json", "as_json", is_flag=True, help="Print what was built as JSON.")
@click.pass_obj
def command(obj, upstream, out_dir, build_number, check_deps, as_json):
    """Build installable wheels and sdists of the ported trees into dist/.

    \b
    Version: <upstream>+rocm.<n>; the upstream commit, series and its hash are in the package
    (megatron/core/_rocm_build.py) and its metadata (Project-URL). The work trees stay clean.
    Exit: 0 built (and no CUDA-only dependency), 1 a build failed or would pull a CUDA-only package, 2 bad input.
    """
    settings = load_settings(obj["project"])
    lock = load_lock(settings.lock_path)
    names = [upstream] if upstream else [n for n in NAMES if n in lock.upstreams
                                          and settings.worktree_path(n).is_dir()]
    if not names:
        raise BadInput(f"{settings.worktree_path('megatron-lm')}: no ported tree to build; run `rocmport apply` first")
    out = (settings.root / out_dir) if not Path(out_dir).is_absolute() else Path(out_dir)
    results, problems, wheels = [], [], []
    for name in names:
        tree = settings.worktree_path(name)
        series = select_series(settings.patchsets_dir, name, lock.upstreams[name].version)
        number = build_number if build_number is not None else build.build_number(settings.root, series.dir)
        with output.progress(f"building {UPSTREAMS[name].distribution} from {tree}"):
            built = build_upstream(tree, name, number, out, say=output.info)
        found = manifests.cuda_only_requirements(tree)
        problems += [f"{name}: {f}: {r} is CUDA-only" for f, r in found]
        record = built.to_dict()
        if check_deps:
            wheel = next(f for f in built.files if f.endswith(".whl"))
            wheels.append(wheel)  # Bridge resolves against the ported megatron-core built just before
            with output.progress(f"pip install --dry-run {Path(wheel).name}"):
                would, error = manifests.pip_dry_run(list(reversed(wheels)))
            cuda = manifests.cuda_only_installs(would)
            record["dry_run"] = {"would_install": would, "cuda_only": cuda, "error": error}
            problems += [f"{name}: installing {Path(wheel).name} would pull {', '.join(cuda)}"] if cuda else []
            if error:
                output.warn(f"{name}: pip could not resolve the wheel's dependencies here: {error}")
        results.append(record)
    if as_json:
        output.emit_json({"built": results, "problems": problems})
    else:
        output.table(["distribution", "version", "files"],
                     [[UPSTREAMS[r["upstream"]].distribution, r["version"], "\n".join(Path(f).name for f in r["files"])] for r in results])
    for p in problems:
        output.warn(p)
    return EXIT_PROBLEM if problems else EXIT_OK
