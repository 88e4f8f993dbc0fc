"""`rocmport sync`: resolve refs for Megatron-LM and its companion Megatron-Bridge, fetch them into
the cache, and pin exact commits in upstream.lock. Without --ref: re-fetch and verify the lock."""

from __future__ import annotations

import click

from rocmport import output
from rocmport.config import load_settings, persist_overrides
from rocmport.errors import EXIT_OK, EXIT_PROBLEM, BadInput
from rocmport.redact import CREDENTIAL_HELP, has_credentials
from rocmport.gitutil import check_operand
from rocmport.upstream.remotes import local_git_dir, validate_url
from rocmport.upstream.resolve import SOURCES, sync


def _parse_remotes(values) -> dict[str, str]:
    out = {}
    for v in values:
        if "=" not in v:
            raise BadInput(f"--remote {v}: expected NAME=URL, e.g. megatron-lm=/srv/mirrors/Megatron-LM")
        name, url = v.split("=", 1)
        out[name.strip()] = url
    return out


@click.command("sync")
@click.option(
    "--ref",
    help="Megatron-LM ref: v0.16 (newest final core_v0.16.*), an exact tag, a branch or a SHA. Omit to verify the lock.",
)
@click.option("--pre", is_flag=True, help="Let a release line resolve to rc/pre-release tags.")
@click.option(
    "--remote",
    "remote_args",
    multiple=True,
    metavar="NAME=URL",
    help="Override an upstream URL (https, ssh, local path, file://). Remembered in .rocmport/local.yaml.",
)
@click.option(
    "--cache-dir",
    type=click.Path(file_okay=False),
    help="Mirror cache (default: $ROCMPORT_CACHE_DIR or ~/.cache/rocmport). Remembered.",
)
@click.option("--offline", is_flag=True, help="Use only the cache; never touch the network.")
@click.option(
    "--source",
    type=click.Choice(SOURCES),
    default="auto",
    show_default=True,
    help="git, the package index (pypi), or git with a loud fallback to the index.",
)
@click.option("--bridge-ref", help="Pin this Megatron-Bridge ref instead of choosing the companion.")
@click.option("--no-bridge", is_flag=True, help="Do not pin Megatron-Bridge.")
@click.option("--json", "as_json", is_flag=True, help="Print the lock and findings as JSON.")
@click.pass_obj
def command(obj, ref, pre, remote_args, cache_dir, offline, source, bridge_ref, no_bridge, as_json):
    """Pin Megatron-LM (and its companion Megatron-Bridge) in upstream.lock.

    \b
    rocmport sync --ref v0.16
    rocmport sync --ref v0.16 --remote megatron-lm=/srv/mirrors/Megatron-LM
    rocmport sync --ref v0.16 --source pypi
    rocmport sync                     # re-fetch and verify the lock (exit 1 if a tag moved)
    """
    if bridge_ref and no_bridge:
        raise BadInput("--bridge-ref and --no-bridge contradict each other; give one")
    # Refs reach git: one shaped like an option is refused here, before any fetch.
    for option, value in (("--ref", ref), ("--bridge-ref", bridge_ref)):
        if value is not None:
            check_operand(value, option, "give a ref: a release line (v0.16), a tag, a branch or a SHA")
    remotes = _parse_remotes(remote_args)
    settings = load_settings(obj["project"], remotes=remotes, cache_dir=cache_dir)
    for name, url in remotes.items():  # what will be remembered must exist, even --offline
        remote = validate_url(name, url)
        if remote.is_local:
            local_git_dir(remote)
    if any(has_credentials(url) for url in remotes.values()):
        output.warn(CREDENTIAL_HELP)
    result = sync(settings, ref, pre=pre, offline=offline, source=source, bridge_ref=bridge_ref, no_bridge=no_bridge)
    persist_overrides(settings, remotes, cache_dir)
    if as_json:
        output.emit_json({"lock": result.lock.to_dict(), "written": result.written, "problems": result.problems})
    elif result.written:
        output.info(f"wrote {settings.lock_path}")
    for problem in result.problems:
        output.warn(problem)
    return EXIT_PROBLEM if result.problems else EXIT_OK
