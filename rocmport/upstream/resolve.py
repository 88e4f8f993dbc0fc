"""Sync's resolution: refs for Megatron-LM and its companion Megatron-Bridge resolved in the cache
(git mirrors or the package index) into exact pins in upstream.lock; without a ref, the lock
re-fetched and verified."""

from __future__ import annotations

from dataclasses import dataclass, field

from rocmport import output
from rocmport.config import Settings
from rocmport.errors import BadInput
from rocmport.upstream import package_index, refs
from rocmport.upstream.companion import choose_bridge
from rocmport.upstream.lock import Lock, Pin, load_lock, load_lock_or_none
from rocmport.upstream.remotes import Remote, RemoteUnreachable, validate_url
from rocmport.upstream.store import Store
from rocmport.upstreams import MEGATRON_BRIDGE, MEGATRON_LM, UPSTREAMS

SOURCES = ("auto", "git", "pypi")


@dataclass
class SyncResult:
    lock: Lock
    notes: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    written: bool = False


def lock_url(settings: Settings, remote: Remote) -> str:
    """What the lock records: the canonical URL, never a machine-local override path, never credentials."""
    return UPSTREAMS[remote.name].url if remote.is_local else remote.stored


def _git_pin(settings, store, remote, requested, pre, offline, say) -> Pin:
    with output.progress(f"fetching {remote.name} from {remote.shown}"):
        mirror = store.update_mirror(remote, offline)
    return _pin_at(settings, mirror, remote, requested, pre, say)


def _bridge_pin_git(settings, store, remote, mlm: Pin, bridge_ref, pre, offline, say, warn) -> Pin | None:
    with output.progress(f"fetching {remote.name} from {remote.shown}"):
        mirror = store.update_mirror(remote, offline)
    if bridge_ref:
        pin = _pin_at(settings, mirror, remote, bridge_ref, pre, say)
        pin.chosen_by = "override"
        return pin
    comp = choose_bridge(mirror, store.mirror_dir(MEGATRON_LM.name), mlm.commit, mlm.version)
    if comp is None:
        warn(
            f"megatron-bridge: no release matches Megatron-LM {mlm.resolved_ref} ({mlm.version}); no companion pinned (give --bridge-ref to choose one)"
        )
        return None
    say(f"megatron-bridge: {comp.tag} chosen by rule {comp.rule}: {comp.explanation}")
    return Pin(
        url=lock_url(settings, remote),
        source="git",
        requested_ref=f"companion of {mlm.resolved_ref}",
        resolved_ref=comp.tag,
        commit=comp.commit,
        commit_date=refs.commit_date(mirror, comp.commit),
        version=refs.version_at(mirror, comp.commit, remote.name),
        chosen_by=comp.rule,
    )


def _pin_at(settings, mirror, remote, requested, pre, say) -> Pin:
    res = refs.resolve(mirror, requested, pre=pre, upstream=remote.name)
    say(f"{remote.name}: {res.explanation}")
    return Pin(
        lock_url(settings, remote),
        "git",
        requested,
        res.resolved_ref,
        res.commit,
        refs.commit_date(mirror, res.commit),
        version=refs.version_at(mirror, res.commit, remote.name),
    )


def _pypi_pins(store, requested, pre, bridge_ref, no_bridge, say, warn) -> dict[str, Pin]:
    mlm = package_index.pin_from_index(store, MEGATRON_LM.name, requested, pre=pre)
    say(
        f"megatron-lm: {requested} -> {MEGATRON_LM.distribution} {mlm.version} sdist {mlm.sdist_filename} (sha256 verified)"
    )
    pins = {MEGATRON_LM.name: mlm}
    if no_bridge:
        return pins
    if bridge_ref:
        pin = package_index.pin_from_index(store, MEGATRON_BRIDGE.name, bridge_ref, pre=pre)
        pin.chosen_by = "override"
    else:
        found = package_index.choose_bridge_from_index(
            store, mlm.resolved_ref
        )  # a package-index pin resolves to its version
        if found is None:
            warn(
                f"megatron-bridge: no sdist on the index declares a bounded {MEGATRON_LM.distribution} range admitting {mlm.version}; no companion pinned"
            )
            return pins
        sdist, why = found
        pin = package_index.pin_from_index(store, MEGATRON_BRIDGE.name, str(sdist.version))
        pin.requested_ref, pin.chosen_by = f"companion of {mlm.resolved_ref}", "declared-range"
        say(f"megatron-bridge: {sdist.version} chosen by rule declared-range: {why} (sdists' Requires-Dist)")
    pins[MEGATRON_BRIDGE.name] = pin
    return pins


def sync(
    settings: Settings,
    ref: str | None,
    *,
    pre=False,
    offline=False,
    source="auto",
    bridge_ref=None,
    no_bridge=False,
    say=output.info,
    warn=output.warn,
) -> SyncResult:
    if source not in SOURCES:
        raise BadInput(f"--source {source}: choose one of {', '.join(SOURCES)}")
    # Validate every URL before any network access.
    remotes = {name: validate_url(name, url) for name, url in settings.remotes.items()}
    store = Store(settings.cache_dir)
    if ref is None:
        return verify_lock(settings, store, remotes, offline, say)
    load_lock_or_none(settings.lock_path)  # a malformed lock is reported before anything is replaced
    lock = resolve_lock(
        settings,
        ref,
        pre=pre,
        offline=offline,
        source=source,
        bridge_ref=bridge_ref,
        no_bridge=no_bridge,
        say=say,
        warn=warn,
    )
    lock.save(settings.lock_path)
    return SyncResult(lock=lock, written=True)


def resolve_lock(
    settings: Settings,
    ref: str,
    *,
    pre=False,
    offline=False,
    source="auto",
    bridge_ref=None,
    no_bridge=False,
    say=output.info,
    warn=output.warn,
) -> Lock:
    """Resolve ``ref`` (and the companion) into a Lock, fetching into the cache; writes nothing else."""
    remotes = {name: validate_url(name, url) for name, url in settings.remotes.items()}
    store = Store(settings.cache_dir)
    pins: dict[str, Pin] = {}
    use_pypi = source == "pypi"
    if source in ("auto", "git"):
        try:
            pins[MEGATRON_LM.name] = _git_pin(settings, store, remotes[MEGATRON_LM.name], ref, pre, offline, say)
        except RemoteUnreachable as exc:
            if source == "git" or offline:
                raise
            warn(
                f"{exc}\n>>> FALLING BACK TO THE PACKAGE INDEX (--source pypi): megatron/core only, no tests or training scripts <<<"
            )
            use_pypi = True
    if use_pypi:
        pins = _pypi_pins(store, ref, pre, bridge_ref, no_bridge, say, warn)
    elif not no_bridge:
        bridge = _bridge_pin_git(
            settings, store, remotes[MEGATRON_BRIDGE.name], pins[MEGATRON_LM.name], bridge_ref, pre, offline, say, warn
        )
        if bridge:
            pins[MEGATRON_BRIDGE.name] = bridge
    return Lock(upstreams=pins)


def verify_lock(settings, store, remotes, offline, say) -> SyncResult:
    """Re-fetch what the lock names and check the pins still exist and tags have not moved."""
    lock = load_lock(settings.lock_path)
    result = SyncResult(lock=lock)
    for name, pin in lock.upstreams.items():
        if pin.source == "pypi":
            fresh = package_index.pin_from_index(store, name, pin.resolved_ref) if not offline else pin
            if fresh.sdist != pin.sdist or fresh.commit != pin.commit:
                result.problems.append(
                    f"{name}: the index's {pin.sdist_filename} no longer matches the lock (sha256 or commit changed)"
                )
            else:
                say(f"{name}: pypi {pin.resolved_ref} ok ({pin.commit[:12]})")
            continue
        remote = remotes[name]
        with output.progress(f"fetching {name} from {remote.shown}"):
            mirror = store.update_mirror(remote, offline)
        if not store.has_commit(name, pin.commit):
            result.problems.append(
                f"{name}: pinned commit {pin.commit} is not in {remote.shown}; re-pin with `rocmport sync --ref REF`"
            )
            continue
        tag_now = refs.tags(mirror).get(pin.resolved_ref)
        if tag_now is None and pin.resolved_ref != pin.commit and pin.resolved_ref not in refs.branches(mirror):
            result.problems.append(
                f"{name}: {pin.resolved_ref} is gone upstream (the tag was deleted): the lock pins {pin.commit[:12]}, which "
                f"nothing upstream names any more; the lock keeps it (re-pin with `rocmport sync --ref REF`)"
            )
            continue
        if tag_now is not None and tag_now != pin.commit:
            result.problems.append(
                f"{name}: tag {pin.resolved_ref} moved: lock pins {pin.commit[:12]}, upstream now {tag_now[:12]}; "
                f"the lock keeps the old commit (re-pin with `rocmport sync --ref {pin.resolved_ref}`)"
            )
            continue
        say(f"{name}: {pin.resolved_ref} ok ({pin.commit[:12]})")
    return result
