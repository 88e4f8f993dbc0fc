"""`rocmport verify`: does the ported tree train GPT correctly here, with model parallelism and
without any NVIDIA-only package? On GPUs: nccl (RCCL on ROCm). Without: CPU proxy on gloo."""

from __future__ import annotations

import shlex
from pathlib import Path

import click

from rocmport import output
from rocmport.config import DEFAULT_BACKEND, DEFAULT_ITERS, DEFAULT_PP, DEFAULT_TP, load_settings
from rocmport.errors import EXIT_OK, EXIT_PROBLEM, BadInput, RocmportError
from rocmport.fsutil import check_output_path, write_file
from rocmport.redact import redact
from rocmport.verify.orchestration import report
from rocmport.verify.orchestration import summary
from rocmport.verify.runtime import hip_sim
from rocmport.verify.orchestration.launcher import KINDS
from rocmport.verify.orchestration.registry import STAGES
from rocmport.verify.orchestration.result import VerifyReport
from rocmport.verify.orchestration.run import MAX_ITERS, MAX_WORLD, check_sizes_from, launch_plan, prepare, run_verify
from rocmport.commands.sizes import SIZE


def _print_summary(r: VerifyReport, report_path: str | None = None) -> None:
    """The verdict in one line first, the stage table, what blocks (each with why in words), the
    rest folded behind a count (all of it in the report), port coverage, the loss curve."""
    click.echo(redact(summary.verdict(r)))
    if r.mode == "gpu" and not r.env.machine.hip:
        output.warn(
            f"NVIDIA GPU: the stages ran the port's CUDA path on {r.env.machine.devices[0] if r.env.machine.devices else 'a CUDA GPU'}"
            "; its ROCm (HIP) branches did not run. This is not a ROCm result."
        )
    if r.mode == "cpu-proxy":
        output.warn(
            "CPU PROXY MODE: no GPU here; the same stages ran on CPU processes over gloo. This is not a GPU result."
        )
        sim = r.hip_sim
        if sim:
            output.warn(
                f"HIP simulated: every process saw a ROCm {sim.version} build of torch and an {sim.device} "
                f"({sim.arch}); not a ROCm GPU result. --no-hip-sim runs the CUDA path."
            )
        else:
            output.info("HIP simulation off (--no-hip-sim): the CUDA path of the tree ran.")
        te = r.te
        if te:
            output.warn(
                f"Transformer Engine {te.version}, {te.python_layer} ({te.source}): {te.note}; "
                "its compiled kernels ran as CPU reference implementations."
            )
    e = r.env.machine
    output.info(
        f"torch {e.torch} ({f'HIP {e.hip}' if e.hip else f'CUDA {e.cuda}' if e.cuda else 'a CPU build'}), "
        f"Python {e.python}, {e.device_count} GPU(s); "
        f"backend {r.backend}, world {r.world_size} = tp {r.tp} × pp {r.pp} × dp {r.dp}"
    )
    output.table(
        ["stage", "status", "seconds", "reason"],
        [[s.name, s.status, round(s.seconds, 2), s.reason] for s in r.stages],
    )
    blocking = summary.blocking_lines(r)
    if blocking:
        click.echo("blocking:")
        for line in blocking:
            click.echo(redact(f"  {line}"))
    unit = r.unit_run()
    if unit is not None and unit.impact:
        click.echo(f"unit-tests: {unit.impact.line}")
    folded = summary.folded_line(r, f"the report, {report_path}" if report_path else "the report (--json)")
    if folded:
        click.echo(redact(folded))
    redirects = r.functional.redirects if r.functional else None  # stage 4's FunctionalRun, its details too
    if redirects:
        top = sorted(redirects.items(), key=lambda kv: -kv[1])[:5]
        click.echo(
            f"functional: {len(redirects)} torch.cuda call sites answered on the CPU; most called: "
            + ", ".join(f"{k} ×{v}" for k, v in top)
        )
    for line in summary.coverage_lines(r):
        click.echo(redact(line))
    if r.training and r.training.losses:
        click.echo(report.loss_plot(r.training.losses))


@click.command("verify")
@click.option(
    "--tree", type=click.Path(file_okay=False), help="The ported Megatron-LM tree (default: the megatron-lm work tree)."
)
@click.option(
    "--tp", type=SIZE, default=None, help=f"Tensor-parallel size (default: [tool.rocmport] tp or {DEFAULT_TP})."
)
@click.option(
    "--pp", type=SIZE, default=None, help=f"Pipeline-parallel size (default: [tool.rocmport] pp or {DEFAULT_PP})."
)
@click.option("--dp", type=SIZE, default=None, help="Data-parallel size (default 1).")
@click.option("--nproc", type=SIZE, default=None, help="Total processes (a multiple of tp×pp; sets dp).")
@click.option("--backend", type=click.Choice(["auto", "nccl", "gloo"]), default=DEFAULT_BACKEND, show_default=True)
@click.option(
    "--iters",
    type=click.IntRange(2, MAX_ITERS),
    default=DEFAULT_ITERS,
    show_default=True,
    help="Training iterations in stages 2, 4 and 5.",
)
@click.option(
    "--stages",
    "stages_text",
    default=None,
    metavar="LIST",
    help=f"Run only these stages: numbers or names, comma-separated ({', '.join(f'{i} {s.name}' for i, s in enumerate(STAGES, 1))}).",
)
@click.option(
    "--unit-tests",
    "with_unit",
    is_flag=False,
    flag_value="default",
    default=None,
    type=click.Choice(["default", "all", "impacted"]),
    help="Stage 3, upstream's unit tests: the line's default suite (bare flag), `all` of tests/unit_tests "
    "(nightly; each run's per-file seconds and last pass are recorded), or `impacted`: the test files whose "
    "imports reach a file upstream changed since --since, plus a smoke set "
    "(default: the suite, when the tree has tests/unit_tests).",
)
@click.option(
    "--since",
    default=None,
    metavar="COMMIT",
    help="With --unit-tests impacted: the upstream commit the port was last verified at (a refresh hop's old pin).",
)
@click.option("--no-unit-tests", "no_unit", is_flag=True, help="Skip stage 3.")
@click.option(
    "--unit-test",
    "unit_tests",
    multiple=True,
    metavar="PATH",
    help="A test file, directory or id under the tree's tests/unit_tests to run instead of the suite "
    "(repeatable; a path that leads out of tests/unit_tests is exit 2).",
)
@click.option(
    "--unit-nproc", type=SIZE, default=8, show_default=True, help="Ranks for the unit tests (upstream CI uses 8)."
)
@click.option(
    "--functional/--no-functional",
    "with_functional",
    default=None,
    help="Stage 4, upstream's functional GPT case with pretrain_gpt.py (default: when the tree has pretrain_gpt.py).",
)
@click.option(
    "--case",
    default=None,
    metavar="NAME",
    help="Functional case: a directory name under tests/functional_tests/test_cases/gpt (default: by tp/pp, and the TE "
    "case where doctor finds TE usable).",
)
@click.option(
    "--data-path",
    default=None,
    metavar="DIR",
    help="Real data for the functional case: upstream CI's data root ($DATA_PATH), under which the case names its "
    "dataset and tokenizer files (default: mock data, NullTokenizer).",
)
@click.option(
    "--record-golden",
    is_flag=True,
    help="Store this run's functional loss curve (and its args) as the golden for this device kind.",
)
@click.option(
    "--resume/--no-resume",
    default=True,
    show_default=True,
    help="Stage 4's checkpoint round trip: resume from the mid-run checkpoint and compare the remaining losses.",
)
@click.option(
    "--bridge/--no-bridge",
    "with_bridge",
    default=None,
    help="Stage 5, Megatron-Bridge (default: when the megatron-bridge work tree exists and --tree is not given).",
)
@click.option(
    "--hip-version",
    default=hip_sim.DEFAULT_VERSION,
    show_default=True,
    metavar="VERSION",
    help="CPU proxy: the ROCm version every process sees torch built for (the HIP simulation; e.g. 6.4).",
)
@click.option(
    "--hip-arch",
    default=hip_sim.DEFAULT_ARCH,
    show_default=True,
    type=click.Choice(list(hip_sim.SIM_DEVICES)),
    help="CPU proxy: the GPU architecture the HIP simulation answers device questions as (and stage 3's "
    "architecture-conditional ROCm known failures, e.g. AMD's MI250 marks on gfx90a).",
)
@click.option("--no-hip-sim", is_flag=True, help="CPU proxy: no HIP simulation (the CUDA path of the same tree).")
@click.option(
    "--te",
    "te_spec",
    default="none",
    show_default=True,
    metavar="VERSION|auto|none",
    help="CPU proxy: run upstream's Transformer Engine layer spec with TE's own Python layer of this release "
    "(auto: the newest in the line's component-matrix range on the package index), its compiled kernels "
    "replaced by CPU reference implementations; none: Megatron's local spec.",
)
@click.option(
    "--te-flavour",
    type=click.Choice(["nvidia", "rocm"]),
    default=None,
    help="With --te: rocm (the default under the HIP simulation) applies the declared ROCm TE deltas to NVIDIA's "
    "Python layer (docs/rocm-te-flavour.md); nvidia runs it as released (the default with --no-hip-sim).",
)
@click.option(
    "--fp8-recipe",
    type=click.Choice(["delayed", "tensorwise", "mxfp8", "blockwise"]),
    default=None,
    help="With --te: stage 2 trains in FP8 with this recipe (Megatron's --fp8-recipe), through the port's argument "
    "validation (a recipe the GPU cannot run is refused there); its layouts are compared within the FP8 bound.",
)
@click.option(
    "--fp8-format",
    type=click.Choice(["hybrid", "e4m3"]),
    default="hybrid",
    show_default=True,
    help="With --fp8-recipe: Megatron's --fp8-format.",
)
@click.option(
    "--moe/--no-moe",
    default=True,
    show_default=True,
    help="With --te: stage 2 also trains a MoE model (4 experts, top-2, TE's GroupedLinear, expert parallel 2) "
    "against its tp1/pp1 run; --no-moe leaves it out (the dense pair alone).",
)
@click.option(
    "--launcher",
    "launcher_kind",
    type=click.Choice(KINDS),
    default="torchrun",
    show_default=True,
    help="torchrun, or Slurm's srun with one task per GPU (run inside an allocation).",
)
@click.option(
    "--nnodes", type=SIZE, default=1, show_default=True, help="Nodes (torchrun: run the same command on each)."
)
@click.option(
    "--node-rank",
    type=click.IntRange(0, MAX_WORLD - 1),
    default=0,
    show_default=True,
    help="This node's rank (torchrun, multi-node).",
)
@click.option(
    "--rdzv-endpoint",
    default=None,
    metavar="HOST:PORT",
    help="torchrun's c10d rendezvous (multi-node; node 0's address).",
)
@click.option("--dry-run", is_flag=True, help="Print every launch's command line and exit without running anything.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON (schema in the README).")
@click.option(
    "--report",
    "report_path",
    type=click.Path(dir_okay=False),
    help="Write the JSON report here (default: build/verify/<line>-<UTC time>.json; build/verify/last.json either way).",
)
@click.option(
    "--html",
    "html_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Write the report's HTML page here (default: beside the JSON report, ending in .html).",
)
@click.option("--no-html", is_flag=True, help="Write no HTML page.")
@click.option(
    "--junit",
    type=click.Path(dir_okay=False),
    help="Write JUnit XML here (a test case per stage and per upstream unit test; - for stdout).",
)
@click.pass_obj
def command(
    obj,
    tree,
    tp,
    pp,
    dp,
    nproc,
    backend,
    iters,
    stages_text,
    with_unit,
    since,
    no_unit,
    unit_tests,
    unit_nproc,
    with_functional,
    case,
    data_path,
    record_golden,
    resume,
    with_bridge,
    hip_version,
    hip_arch,
    no_hip_sim,
    launcher_kind,
    nnodes,
    node_rank,
    rdzv_endpoint,
    te_spec,
    te_flavour,
    fp8_recipe,
    fp8_format,
    moe,
    dry_run,
    as_json,
    report_path,
    html_path,
    no_html,
    junit,
):
    """Prove the ported tree imports without NVIDIA-only packages and trains GPT with tp×pp.

    \b
    Stage 1 imports: megatron.core, megatron.training, pretrain_gpt's imports, behind the firewall.
    Stage 2 gpt-training: megatron's schedule/DDP/optimizer via torchrun; the loss falls, tied
            embeddings stay equal, and losses match a tp1/pp1 run from the same weights.
    Stage 3 unit-tests: upstream's tests (torchrun -m pytest, rocmport's plugin), each failure
            labelled against the unported tree run under the same conditions (cached by commit):
            port-regression / unverified / missing-dependency, and a selected file that did not
            run (not-run, with why), fail the stage; upstream-known,
            proxy-artifact, needs-nvidia-only, flaky and known-failure do not.
    Stage 4 functional: upstream's GPT case (pretrain_gpt.py with its MODEL_ARGS; mock data),
            a checkpoint saved half way and resumed with equal losses, and this device kind's golden.
    Stage 5 bridge: Megatron-Bridge's modules import; a GPT built by its GPTModelProvider trains.
    Without a GPU every stage runs on the CPU proxy with the HIP simulation (torch built for ROCm,
    an MI300X; --hip-arch another GPU): --no-hip-sim for the CUDA path. Stages that do not apply are listed as skipped.
    The report is always written (--report, else build/verify/<line>-<UTC time>.json) with
    build/verify/last.json, which `rocmport status` shows, and its HTML page beside it (--html, --no-html).
    Exit: 0 no stage failed, 1 a stage failed or a report could not be written, 2 bad input.
    """
    # An output that is a device, a FIFO or a link is refused now, not after an hour's run.
    if report_path is not None:
        check_output_path(report_path, "--report")
    if junit is not None:
        check_output_path(junit, "--junit", stdout_dash=True)
    settings = load_settings(obj["project"])
    refuse_contradictions(settings, tp, pp)
    opts = prepare(
        settings,
        tree,
        tp=settings.tp if tp is None else tp,
        pp=settings.pp if pp is None else pp,
        dp=dp,
        nproc=nproc,
        iters=iters,
        backend=backend,
        with_unit=False if no_unit else with_unit,
        unit_tests=unit_tests,
        unit_nproc=unit_nproc,
        with_functional=with_functional,
        case=case,
        data_path=data_path,
        record_golden=record_golden,
        resume=resume,
        with_bridge=with_bridge,
        launcher_kind=launcher_kind,
        nnodes=nnodes,
        node_rank=node_rank,
        rdzv_endpoint=rdzv_endpoint,
        hip_version=None if no_hip_sim else hip_version,
        stages_text=stages_text,
        te=te_spec,
        te_flavour=te_flavour,
        fp8_recipe=fp8_recipe,
        fp8_format=fp8_format,
        moe=moe,
        hip_arch=hip_arch,
        since=since,
    )
    if html_path and no_html:
        raise click.UsageError("--html and --no-html: give one")
    if dry_run:
        plan = launch_plan(opts)
        if as_json:
            output.emit_json(plan)
        else:
            for step in plan:
                click.echo(f"# {step['stage']} (in {step['cwd']})\n{shlex.join(step['command'])}")
        return EXIT_OK
    html = None if no_html else (html_path or "")
    return _finish(run_verify(opts), obj["project"], report_path, junit, as_json, html)


def refuse_contradictions(settings, tp: int | None, pp: int | None) -> None:
    """Option combinations verify would otherwise ignore or resolve silently, refused (exit 2, naming
    both) before anything is read; and tp/pp from [tool.rocmport] told by file and key, not as an
    option the user never gave. Self-contained (reads the command's own parameters and where each came
    from) so it can move with verify's options."""
    from click.core import ParameterSource

    ctx = click.get_current_context()
    given = {
        name: ctx.get_parameter_source(name) not in (ParameterSource.DEFAULT, ParameterSource.DEFAULT_MAP, None)
        for name in ctx.params
    }
    p = ctx.params
    if given["moe"] and p["te_spec"].strip() == "none":
        flag = "--moe" if p["moe"] else "--no-moe"
        raise BadInput(
            f"{flag}: only with --te VERSION|auto (the MoE model trains on TE's GroupedLinear); "
            f"--te {p['te_spec'] or repr(p['te_spec'])} runs Megatron's local spec: drop {flag} or give --te"
        )
    if given["no_unit"]:
        other = next(
            (
                o
                for o, k in (("--unit-tests", "with_unit"), ("--unit-test", "unit_tests"), ("--since", "since"))
                if given[k]
            ),
            None,
        )
        if other:
            raise BadInput(f"--no-unit-tests and {other}: one skips stage 3, the other runs it; give one of them")
    if given["with_unit"] and given["unit_tests"] and p["with_unit"] != "impacted":  # impacted: prepare says why
        raise BadInput(
            f"--unit-tests {p['with_unit']} and --unit-test: --unit-test runs only the files it names, "
            f"so --unit-tests {p['with_unit']} would be ignored; give one of them"
        )
    check_sizes_from(settings, tp, pp, iters=DEFAULT_ITERS)


def _finish(
    result: VerifyReport,
    project: str,
    report_path: str | None,
    junit: str | None,
    as_json: bool,
    html: str | None = None,
) -> int:
    """Write the report (always: --report, else build/verify/<line>-<time>.json) and last.json, the
    JUnit XML, the HTML page (``html``: its path, "" beside the report, None none), and print the
    summary, each whatever the others do: an hour's run is never lost to a path that cannot be
    written. A write that fails is one line at the end and exit 1."""
    problems: list[str] = []
    root = Path(project).resolve()  # last.json names the report absolutely: `status` may run from anywhere
    target = Path(report_path).resolve() if report_path else report.default_path(root, result)
    written: Path | None = None
    data = result.to_dict()  # the JSON boundary: the report file, last.json and --json
    try:
        report.write_json(data, target)
        written = target
    except Exception as exc:  # noqa: BLE001 (OSError, or a value JSON cannot hold): the summary still prints
        problems.append(f"the report could not be written to {target}: {_why(exc)}")
    try:
        report.write_last(root, data, written)
    except Exception as exc:  # noqa: BLE001
        message = f"the last verify could not be recorded in {report.verify_dir(root) / report.LAST}: {_why(exc)}"
        if written:  # the report itself is safe: only `rocmport status` misses this run
            output.warn(message)
        else:
            problems.append(message)
    if junit:
        try:
            write_file(junit, report.junit_xml(result.mode, result.stages), stdout_dash=True)
        except Exception as exc:  # noqa: BLE001
            problems.append(f"the JUnit XML could not be written to {junit}: {_why(exc)}")
    page = _write_page(written, html, problems)
    try:
        if as_json:
            output.emit_json(data)
        else:
            _print_summary(result, str(written) if written else None)
    finally:
        if written:
            output.info(f"report: {written}")
        if page:
            output.info(f"page: {page}")
        for problem in problems:
            click.secho(f"rocmport: error: {redact(problem)}", err=True, fg="red")
    return EXIT_PROBLEM if result.failed or problems else EXIT_OK


def _write_page(written: Path | None, html: str | None, problems: list[str]) -> Path | None:
    """The report's HTML page, rendered from the JSON just written (the page reads the JSON only):
    at ``html``, or beside the report when ``html`` is "". Without the renderer's packages the default
    page is left out with a note; a page asked for by --html that cannot be written is a problem."""
    if html is None:
        return None
    if written is None:
        if html:
            problems.append(f"the HTML page was not written to {html}: the JSON report it renders was not written")
        return None
    from rocmport.commands.report import MISSING_EXTRA, page_path_beside

    target = Path(html).resolve() if html else page_path_beside(written)
    try:
        import jinja2  # noqa: F401
        import matplotlib  # noqa: F401
    except ImportError:
        if html:
            problems.append(f"the HTML page was not written to {target}: {MISSING_EXTRA}")
        else:
            output.info(f"no HTML page: {MISSING_EXTRA}; --no-html leaves it out quietly")
        return None
    from rocmport.report.render import write_page

    try:
        return write_page(written, target)
    except Exception as exc:  # noqa: BLE001 (the run's JSON report is written: only its page is lost)
        problems.append(f"the HTML page could not be written to {target}: {_why(exc)}")
        return None


def _why(exc: Exception) -> str:
    """An exception in a few words: the OS's reason ("Permission denied"), else its type and message."""
    if isinstance(exc, FileExistsError) and exc.filename:  # making its directory: a file stands in the way
        return f"{exc.filename} is a file, not a directory"
    if isinstance(exc, RocmportError):  # already one line naming the path and what to do
        return str(exc)
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror + (f" ({exc.filename})" if exc.filename else "")
    return f"{type(exc).__name__}: {exc}"
