"""`rocmport bot`: refresh the port for every new upstream release (once, or polling)."""

from __future__ import annotations

import time

import click

from rocmport import output, procs
from rocmport.config import load_settings
from rocmport.errors import EXIT_OK, EXIT_PROBLEM, BadInput, RocmportError
from rocmport.gitutil import check_operand
from rocmport.refresh.bot import PUSH_FIX, run_once
from rocmport.upstream.remotes import validate_url
from rocmport.refresh.engine import Progress
from rocmport.refresh.report import RefreshVerifyOptions
from rocmport.refresh.result import NEEDS_HUMAN
from rocmport.commands.refresh import check_verify_sizes, refresh_stages
from rocmport.release_line import ReleaseLine

MAX_INTERVAL = 365 * 24 * 3600
# Each cycle fetches upstream: a poller asked for 1e-300 s ran 25,495 cycles in two minutes. No
# upstream releases that often; 10 s is the floor.
MIN_INTERVAL = 10.0
# A failed cycle (network down, the lock busy) is retried after the interval doubled per failure in a
# row, up to this (or the interval, when that is longer): a broken network is not hammered.
MAX_BACKOFF = 3600.0


def backoff(interval: float, failures: int) -> float:
    """Seconds to wait after ``failures`` failed cycles in a row (0: the interval itself)."""
    return min(interval * 2 ** min(failures, 32), max(interval, MAX_BACKOFF))


def _refuse_ignored(track: str, lines: str | None) -> None:
    """Options the chosen mode would ignore, refused (exit 2, naming both) rather than dropped."""
    from click.core import ParameterSource

    ctx = click.get_current_context()
    given = lambda name: ctx.get_parameter_source(name) == ParameterSource.COMMANDLINE  # noqa: E731
    if ctx.params.get("once") and given("interval"):
        raise BadInput("--interval: only with --watch (--once runs one cycle); drop --interval or use --watch")
    if track == "main" and lines is not None:
        raise BadInput(
            "--track main and --lines: --track main follows upstream's main branch, not release lines; give one of them"
        )


@click.command("bot")
@click.option("--once", is_flag=True, help="Process new releases once and exit.")
@click.option("--watch", is_flag=True, help="Keep polling upstream every --interval seconds.")
@click.option(
    "--interval",
    type=float,
    default=3600,
    show_default=True,
    help=f"Seconds between polls with --watch (at least {MIN_INTERVAL:g}, at most {MAX_INTERVAL}; a failed poll is "
    "retried after twice the wait, doubling per failure in a row, up to an hour).",
)
@click.option(
    "--track",
    type=click.Choice(["release", "main"]),
    default="release",
    show_default=True,
    help="Follow release tags, or upstream's main branch (one refresh per new main commit seen).",
)
@click.option(
    "--lines",
    help="Release lines to follow, e.g. v0.16,v0.17 (default: [tool.rocmport] release-lines, "
    "else the newest line and every line that has a series).",
)
@click.option("--retry", is_flag=True, help="Retry releases that failed before even if nothing changed.")
@click.option(
    "--push",
    "push_remote",
    metavar="REMOTE",
    help="Push each refresh branch to this git remote (never over a human's commits).",
)
@click.option("--no-verify", is_flag=True, help="Skip `rocmport verify` in each refresh.")
@click.option(
    "--verify-stages",
    "verify_stages",
    default=None,
    metavar="LIST",
    help="verify's stages in each refresh, as `refresh --verify-stages` (default 1,2; 1,2,3 adds the unit tests "
    "the hop's changes reach and a smoke set; the full suite is `verify --unit-tests all`, nightly).",
)
@click.option("--json", "as_json", is_flag=True, help="Print what was processed as JSON (with --once).")
@click.pass_obj
def command(obj, once, watch, interval, track, lines, retry, push_remote, no_verify, verify_stages, as_json):
    """Open one refresh branch per new upstream release: rocmport/refresh-<tag>.

    \b
    Each branch holds bisectable commits: "bump upstream.lock to <tag>", "refresh patches for
    <tag>", "drop upstreamed patches" (when any), and the summary in refresh-summaries/<tag>.md.
    State in .rocmport/bot-state.json, in refresh's words: a release built (ready, or not-verified
    and why) is never redone; one that needs-a-human is retried only when its inputs change
    (upstream commit, the series, rocmport) or with --retry.
    Exit: 0 every release ready or not-verified (or none new), 1 a release needs-a-human, 130/143 interrupted,
    2 bad input, 3 another bot run holds the lock.
    """
    if once == watch:
        raise BadInput("give exactly one of --once or --watch")
    _refuse_ignored(track, lines)
    if not MIN_INTERVAL <= interval <= MAX_INTERVAL:  # nan and inf too: time.sleep refuses them after the first cycle
        raise BadInput(
            f"--interval {interval}: must be a number of seconds from {MIN_INTERVAL:g} to {MAX_INTERVAL} (a year)"
        )
    if as_json and watch:
        raise BadInput("--json: only with --once (--watch logs one line per event)")
    if no_verify and verify_stages is not None:
        raise BadInput("--verify-stages: not with --no-verify (give one of them)")
    chosen = refresh_stages(verify_stages)
    if push_remote is not None:  # at the option: git would read '--upload-pack=CMD' as an option and run CMD
        check_operand(push_remote, "--push", PUSH_FIX)
        if "::" in push_remote or "://" in push_remote or ":" in push_remote.split("/", 1)[0]:
            validate_url("--push", push_remote)  # a URL: no ext::/fd:: transport, no option-shaped host
    if lines is not None and not lines.strip(", "):
        raise BadInput(f"--lines {lines!r}: names no release line; give lines such as v0.16,v0.17")
    settings = load_settings(obj["project"])
    wanted = (
        [str(ReleaseLine.parse(s, "--lines: release line")) for s in lines.split(",") if s.strip()]
        if lines
        else list(settings.release_lines)
    )
    if not no_verify:  # verify's sizes from [tool.rocmport], told now rather than in every release's refresh
        check_verify_sizes(settings)
    verify_opts = (
        None
        if no_verify
        else RefreshVerifyOptions(  # stages None: stages 1-2, as refresh's
            tp=settings.tp, pp=settings.pp, stages=tuple(chosen) if verify_stages is not None else None
        )
    )
    progress = Progress()
    kw = dict(
        track=track,
        lines=wanted,
        retry=retry,
        push_remote=push_remote,
        verify_opts=verify_opts,
        say=output.info,
        warn=output.warn,
        progress=progress,
    )
    # Ctrl-C, or SIGTERM from cron, CI or systemd: the refresh under way stops as `refresh` does (every
    # process ended, exit 130/143), the checkout goes back to its branch, and the next run starts that
    # release again (the record says it never finished).
    then = "the checkout is back on the branch it was on; the next run starts the unfinished release again"
    with procs.run_scope("rocmport-bot-", progress.line, then=then):
        if once:
            results = run_once(settings, **kw)
            if as_json:
                output.emit_json({"processed": [r.to_dict() for r in results]})
            return EXIT_PROBLEM if any(r.status == NEEDS_HUMAN for r in results) else EXIT_OK
        cycle = failures = 0
        while True:  # plain log lines, one per event: this runs under cron/CI, not on a terminal
            cycle += 1
            output.info(f"bot: cycle {cycle} at {time.strftime('%Y-%m-%dT%H:%M:%S%z')}")
            progress.step(f"cycle {cycle}")
            try:
                results = run_once(settings, **kw)
                output.info(f"bot: cycle {cycle} processed {len(results)} release(s)")
                failures = 0
            except RocmportError as exc:  # a bad cycle (network, a busy lock) must not end the poller
                failures += 1
                output.warn(
                    f"bot: cycle {cycle} failed: {exc}; next try in {backoff(interval, failures):g} s"
                    + (f" ({failures} failures in a row)" if failures > 1 else "")
                )
            progress.finish(f"cycle {cycle}")
            progress.done[:] = progress.done[
                -3:
            ]  # a poller's line names its last cycles, not every one since it started
            time.sleep(backoff(interval, failures))
