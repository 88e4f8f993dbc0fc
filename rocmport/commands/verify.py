"""`rocmport verify`: does the ported tree train GPT correctly here, with model parallelism and
without any NVIDIA-only package? On GPUs: nccl (RCCL on ROCm). Without: CPU proxy on gloo."""

from __future__ import annotations

import shlex
from pathlib import Path

import click

from rocmport import output
from rocmport.config import DEFAULT_ITERS, load_settings
from rocmport.errors import EXIT_OK, EXIT_PROBLEM, BadInput, RocmportError
from rocmport.fsutil import check_output_path, write_file
from rocmport.redact import redact
from rocmport.verify.orchestration import options, report, summary
from rocmport.verify.orchestration.result import VerifyReport
from rocmport.verify.orchestration.run import check_sizes_from, launch_plan, prepare, run_verify
from rocmport.verify.stages import functional, gpt_training


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
    run4 = r.data_of(functional.NAME, functional.FunctionalCases)
    if run4 is not None and run4.note:
        click.echo(f"functional: {run4.note}")
    redirects = run4.redirects if run4 else None  # every case's, summed
    if redirects:
        top = sorted(redirects.items(), key=lambda kv: -kv[1])[:5]
        click.echo(
            f"functional: {len(redirects)} torch.cuda call sites answered on the CPU; most called: "
            + ", ".join(f"{k} ×{v}" for k, v in top)
        )
    for line in summary.coverage_lines(r):
        click.echo(redact(line))
    training = r.data_of(gpt_training.NAME, gpt_training.Training)
    if training and training.losses:
        click.echo(report.loss_plot(training.losses))


class _VerifyCommand(click.Command):
    """`rocmport verify`: its own options (below) after the run's and each stage's, read from the
    stages' registry whenever the command line is parsed or --help is shown: the command never lists them."""

    def get_params(self, ctx: click.Context) -> list[click.Parameter]:
        return [*options.all_options(), *super().get_params(ctx)]


@click.command("verify", cls=_VerifyCommand)
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
def command(obj, dry_run, as_json, report_path, html_path, no_html, junit, **given):
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
    Stage 4 functional: upstream's GPT cases (--cases reach|all|NAME,...; pretrain_gpt.py with their
            MODEL_ARGS; mock data), each with a checkpoint saved half way and resumed with equal
            losses and this device kind's golden; a failing case runs again on the unported tree and
            is labelled (only a port-regression, or an unverified run stopped on
            a NaN, Inf or spiky loss, fails the stage).
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
    refuse_contradictions(settings, given["tp"], given["pp"])
    # The run's options and each stage's own (options.all_options()), checked by prepare and the stages.
    opts = prepare(settings, given)
    if html_path and no_html:
        raise click.UsageError("--html and --no-html: give one")
    if dry_run:
        plan = launch_plan(opts)
        if as_json:
            output.emit_json(plan)
        else:
            for step in plan:
                click.echo(f"# {step['stage']} (in {step['cwd']})\n{shlex.join(step['command'])}")
                if step.get("decided_by"):
                    click.echo(f"# {step['decided_by']}")
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
