"""The refresh bot: one refresh per new upstream release, each on its own branch of the project
repository in bisectable commits, with a record so no tag is processed twice and a failed tag is
not retried until its inputs change."""

from __future__ import annotations

import dataclasses
import hashlib
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.version import Version

from rocmport import __version__
from rocmport.config import Settings, load_settings
from rocmport.errors import BadInput, Busy, RocmportError
from rocmport.fsutil import file_lock, write_file
from rocmport.gitutil import check_operand, git, rev_parse, run_git
from rocmport.patches.series import all_series
from rocmport.refresh.engine import Progress, abort_refresh, read_state, refresh
from rocmport.refresh.report import RefreshVerifyOptions, markdown
from rocmport.refresh.result import NEEDS_HUMAN, NOT_VERIFIED, RefreshResult, RefreshStatus
from rocmport.refresh.summary import machine_paths, page_of, write_summary
from rocmport.release_line import ReleaseLine
from rocmport.state import Invalid, expect, one_of, read_json, value_of, write_json
from rocmport.upstream import package_index, refs
from rocmport.upstream.lock import load_lock
from rocmport.upstream.remotes import validate_url
from rocmport.upstream.store import Store
from rocmport.upstreams import MEGATRON_LM

BOT_NAME, BOT_EMAIL = "rocmport-bot", "rocmport-bot@users.noreply.github.com"
BOT_ENV = {
    "GIT_AUTHOR_NAME": BOT_NAME,
    "GIT_AUTHOR_EMAIL": BOT_EMAIL,
    "GIT_COMMITTER_NAME": BOT_NAME,
    "GIT_COMMITTER_EMAIL": BOT_EMAIL,
}
SUMMARIES = "refresh-summaries"


@dataclass(frozen=True)
class Candidate:
    name: str  # the tag (or main@<sha12>)
    ref: str  # what refresh resolves
    commit: str

    @property
    def branch(self) -> str:
        return f"rocmport/refresh-{self.name.replace('@', '-')}"


def state_dir(settings: Settings) -> Path:
    return settings.root / ".rocmport"


# The refresh's own status vocabulary (refresh/result.py): ready / not-verified / up-to-date have a
# branch built (an unverified one labelled so in the record, the JSON and its summary), needs-a-human
# has none. Records of an older rocmport said done / failed: read as not-verified (nobody can tell
# now whether it was verified) / needs-a-human.
TagStatus = RefreshStatus
_LEGACY_STATUS = {"done": NOT_VERIFIED, "failed": NEEDS_HUMAN}
_RECORD_FIX = "fix it, or delete it to have the bot treat every release newer than the lock as new"


@dataclass
class TagRecord:
    """What the bot did with one release: built on ``branch`` at ``commit`` (its tip) with the refresh's
    status (ready, or not-verified and ``reason`` why), or needs-a-human for ``reason`` at upstream
    ``commit``; ``inputs`` says when a needs-a-human one is worth retrying."""

    status: TagStatus
    commit: str
    inputs: str
    branch: str | None = None
    summary_file: str | None = None
    reason: str | None = None
    push: str | None = None  # how the last push went: pushed, replaced, refused (a human's commits), failed
    pushed_to: str | None = None  # the remote that holds ``commit``: set only by a push that succeeded

    @property
    def built(self) -> bool:
        """A branch was made for it: it is never redone."""
        return self.status != NEEDS_HUMAN

    def to_dict(self) -> dict[str, str]:
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}

    @classmethod
    def from_dict(cls, data: Any, where: str) -> TagRecord:
        expect(data, dict, f"key '{where}'")
        unknown = sorted(set(data) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise Invalid(f"key '{where}.{unknown[0]}' is not part of the bot's record")
        status = value_of(data, "status", str, where)
        data = {**data, "status": one_of(_LEGACY_STATUS.get(status, status), TagStatus, f"key '{where}.status'")}
        for key in ("commit", "inputs"):
            value_of(data, key, str, where)
        for key in ("branch", "summary_file", "reason", "push", "pushed_to"):
            value_of(data, key, str, where, required=False)
        if data["status"] != NEEDS_HUMAN and not data.get("branch"):
            raise Invalid(f"key '{where}.branch' is missing")
        return cls(**data)


@dataclass
class BotRecord:
    """.rocmport/bot-state.json: every release the bot processed, by tag."""

    tags: dict[str, TagRecord] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: Any) -> BotRecord:
        tags = value_of(expect(data, dict, "the bot's record"), "tags", dict)
        return cls({name: TagRecord.from_dict(entry, f"tags.{name}") for name, entry in tags.items()})

    def to_dict(self) -> dict[str, Any]:
        return {"tags": {name: r.to_dict() for name, r in self.tags.items()}}


@dataclass
class BotResult:
    """What one bot run did with one release, for the command's exit code and `bot --json`: the release's
    record as the run left it, and when its refresh in this run needs a human, that refresh's summary
    (summary.md's text, for whoever opens the issue). ``refreshed`` False: built by an earlier run and
    only pushed in this one."""

    tag: str
    record: TagRecord
    refreshed: bool = True
    summary: str | None = None

    @property
    def status(self) -> TagStatus:
        return self.record.status

    def to_dict(self) -> dict[str, str]:
        out = {"tag": self.tag, **self.record.to_dict()}
        if not self.refreshed:  # a push of an earlier build prints its record without the inputs
            del out["inputs"]
        if self.summary is not None:
            out["summary"] = self.summary
        return out


def record_path(settings: Settings) -> Path:
    return state_dir(settings) / "bot-state.json"


def read_record(settings: Settings) -> BotRecord:
    return read_json(record_path(settings), BotRecord.from_dict, _RECORD_FIX) or BotRecord()


def write_record(settings: Settings, record: BotRecord) -> None:
    write_json(record_path(settings), record.to_dict())


def exclusive(settings: Settings) -> AbstractContextManager[None]:
    """One bot run per project at a time; a second one is refused at once."""
    return file_lock(
        state_dir(settings) / "bot.lock",
        "another rocmport bot run holds it; wait for it or stop it",
        timeout=0,
        error=Busy,
    )


def candidates(settings: Settings, track: str, lines: list[str] | None, say=print) -> list[Candidate]:
    """Upstream releases newer than the lock, oldest version first (versions, not dates: patch
    releases of an older line are often tagged after the next line's first release)."""
    lock = load_lock(settings.lock_path)
    pin = lock.upstreams.get(MEGATRON_LM.name)
    if pin is None:
        raise BadInput(f"{settings.lock_path}: pins no megatron-lm; run `rocmport sync --ref REF` first")
    current = Version(pin.version or "0")
    by_version: dict[Version, Candidate] = {}
    if pin.source == "pypi":
        if track == "main":
            raise BadInput(
                f"{settings.lock_path}: pins a package-index release; --track main needs a git upstream (`rocmport sync --source git`)"
            )
        for v in package_index.list_final_versions(MEGATRON_LM.distribution):
            if v > current:
                by_version[v] = Candidate(f"v{v}", str(v), f"pypi:{v}")
    else:
        url = validate_url(MEGATRON_LM.name, settings.remotes[MEGATRON_LM.name])
        mirror = Store(settings.cache_dir).update_mirror(url)
        if track == "main":
            head = rev_parse("refs/heads/main", mirror)
            if head is None:
                raise BadInput(f"{settings.remotes[MEGATRON_LM.name]}: has no branch 'main' to track")
            return [] if head == pin.commit else [Candidate(f"main@{head[:12]}", head, head)]
        # Twin tags (v0.15.3 / core_v0.15.3): release_tags sorts the core_ one last, so it wins.
        for t in refs.release_tags(mirror):
            if t.is_final and t.version > current:
                by_version[t.version] = Candidate(t.name, t.name, t.commit)
    wanted = {ReleaseLine.parse(s) for s in lines or []}
    if not wanted:
        newest = max((ReleaseLine.of(v) for v in by_version), default=None)
        series_lines = (ReleaseLine.match(s.line) for s in all_series(settings.patchsets_dir, MEGATRON_LM.name))
        wanted = {line for line in series_lines if line} | ({newest} if newest else set())
    out = [c for v, c in sorted(by_version.items()) if ReleaseLine.of(v) in wanted]
    say(
        f"bot: {len(out)} release(s) newer than {pin.resolved_ref} on lines {', '.join(map(str, sorted(wanted)))}: "
        f"{', '.join(c.name for c in out) or 'none'}"
    )
    return out


def inputs_of(root: Path, base: str, cand: Candidate) -> str:
    """What a refresh of ``cand`` depends on: the upstream commit, the series, rocmport itself."""
    series_tree = run_git("rev-parse", f"{base}:patchsets", cwd=root, check=False).stdout.strip()
    return hashlib.sha256(f"{cand.commit}\0{series_tree}\0{__version__}".encode()).hexdigest()[:16]


def _commit(root: Path, paths: list[str], message: str) -> bool:
    git("add", "-A", "--", *paths, cwd=root)
    if not run_git("diff", "--cached", "--quiet", cwd=root, check=False).returncode:
        return False
    git("commit", "-q", "--no-verify", "-m", message, cwd=root, env=BOT_ENV)
    return True


def _human_commits(root: Path, base: str, tip: str) -> list[str]:
    out = git("log", "--format=%H %ae", f"{base}..{tip}", cwd=root)
    return [line.split()[0] for line in out.splitlines() if line.split()[1] != BOT_EMAIL]


def process(
    settings: Settings,
    cand: Candidate,
    base: str,
    inputs: str,
    verify_opts: RefreshVerifyOptions | None,
    say,
    warn,
) -> BotResult:
    """Refresh to ``cand`` on its own branch from ``base``; the caller's branch is restored after.
    ``inputs``: what the refresh depended on (inputs_of), for the record."""
    root = settings.root
    start = git("symbolic-ref", "-q", "--short", "HEAD", cwd=root)
    existing = rev_parse(f"refs/heads/{cand.branch}", root)
    if existing and _human_commits(root, base, existing):
        why = f"branch {cand.branch} has commits by a human; not rebuilding it"
        return BotResult(cand.name, TagRecord(NEEDS_HUMAN, cand.commit, inputs, reason=why))
    git("checkout", "-q", "-B", cand.branch, base, cwd=root)
    try:
        if read_state(settings):
            abort_refresh(settings, say=say)  # a leftover from a killed run: the record says it never finished
        result = refresh(load_settings(root), cand.ref, verify_opts=verify_opts, say=say, warn=warn)
        summary = write_summary(result, settings.refresh_dir, settings)
        if result.status == NEEDS_HUMAN:
            if result.conflict:
                abort_refresh(settings, say=say)
            git("checkout", "-q", "--force", start, cwd=root)
            git("branch", "-q", "-D", cand.branch, cwd=root)
            return BotResult(
                cand.name,
                TagRecord(NEEDS_HUMAN, cand.commit, inputs, reason=result.why),
                summary=markdown(result, machine_paths(settings), page_of(result, settings)),
            )
        _bisectable_commits(root, cand, result)
        summary_file = root / SUMMARIES / f"{cand.name.replace('@', '-')}.md"
        summary_file.parent.mkdir(exist_ok=True)
        write_file(summary_file, summary.read_text(encoding="utf-8"))
        _commit(root, [SUMMARIES], f"summary of the refresh to {cand.name}")
        built = TagRecord(
            result.status,
            git("rev-parse", "HEAD", cwd=root),
            inputs,
            branch=cand.branch,
            summary_file=str(summary_file.relative_to(root)),
            reason=result.why if result.status == NOT_VERIFIED else None,
        )
        return BotResult(cand.name, built)
    finally:
        if git("symbolic-ref", "-q", "--short", "HEAD", cwd=root) != start:
            git("checkout", "-q", start, cwd=root)


def _bisectable_commits(root: Path, cand: Candidate, result: RefreshResult) -> None:
    """bump the lock -> refreshed series (dropped patches still listed) -> the drops."""
    _commit(root, ["upstream.lock"], f"bump upstream.lock to {cand.name}")
    dropped_any = False
    for up in result.upstreams.values():
        series = Path(up.series)
        if up.dropped:
            dropped_any = True
            write_file(series, up.series_text)
            for name, text in up.dropped_texts.items():
                write_file(series.parent / name, text)
    _commit(root, ["patchsets"], f"refresh patches for {cand.name}")
    if dropped_any:
        for up in result.upstreams.values():
            series = Path(up.series)
            write_file(series, up.series_text_final)
            for name in up.dropped:
                (series.parent / name).unlink(missing_ok=True)
        evidence = "\n".join(f"- {n}: {why}" for up in result.upstreams.values() for n, why in up.dropped.items())
        _commit(root, ["patchsets"], f"drop upstreamed patches\n\n{evidence}\n")


PUSH_FIX = "give a git remote name, URL or path (e.g. --push origin)"


def push(root: Path, remote: str, branch: str, warn) -> str:
    """Push without ever overwriting a human's commits on the remote branch. ``--`` before the
    remote in every call: git never reads it (or the branch) as an option."""
    check_operand(remote, "--push", PUSH_FIX)
    remote_sha = run_git("ls-remote", "--", remote, f"refs/heads/{branch}", cwd=root).stdout.split()
    local = git("rev-parse", "--verify", "--end-of-options", branch, cwd=root)
    if remote_sha and remote_sha[0] != local:
        git("fetch", "-q", "--", remote, f"+refs/heads/{branch}:refs/rocmport/remote-check", cwd=root)
        theirs = remote_sha[0]
        if run_git("merge-base", "--is-ancestor", theirs, local, cwd=root, check=False).returncode != 0:
            humans = _human_commits(root, local, theirs)
            if humans:
                warn(f"{remote} {branch}: has {len(humans)} commit(s) by a human ({humans[0][:12]}); not force-pushing")
                return "refused"
            git(
                "push",
                "-q",
                f"--force-with-lease=refs/heads/{branch}:{theirs}",
                "--",
                remote,
                f"{branch}:refs/heads/{branch}",
                cwd=root,
            )
            return "replaced"
    git("push", "-q", "--", remote, f"{branch}:refs/heads/{branch}", cwd=root)
    return "pushed"


def _push_recorded(settings: Settings, record: BotRecord, tag: str, remote: str, warn) -> TagRecord:
    """Push a built release's branch and record how it went: ``pushed_to`` only once the remote has
    it. A push git refuses is recorded as failed, then its error goes on (exit 1)."""
    entry = record.tags[tag]
    assert entry.branch is not None
    try:
        entry.push = push(settings.root, remote, entry.branch, warn)
    except RocmportError:
        entry.push, entry.pushed_to = "failed", None
        write_record(settings, record)
        raise
    entry.pushed_to = remote if entry.push in ("pushed", "replaced") else None
    write_record(settings, record)
    return entry


def run_once(
    settings: Settings,
    *,
    track="release",
    lines=None,
    retry=False,
    push_remote=None,
    verify_opts: RefreshVerifyOptions | None = None,
    say=print,
    warn=print,
    progress: Progress | None = None,
) -> list[BotResult]:
    """Process every new release once. ``progress``: what has finished, for the line an interrupt prints."""
    progress = progress or Progress()
    with exclusive(settings):
        root = settings.root
        if run_git("status", "--porcelain", "--untracked-files=no", cwd=root).stdout.strip():
            raise BadInput(f"{root}: has uncommitted changes; the bot works on branches of a clean checkout")
        record = read_record(settings)
        base = rev_parse("HEAD", root)
        if base is None:
            raise BadInput(f"{root}: has no commit yet; commit the project (its patchsets/ and upstream.lock) first")
        results: list[BotResult] = []
        for cand in candidates(settings, track, lines, say):
            inputs = inputs_of(root, base, cand)
            prev = record.tags.get(cand.name)
            if prev and prev.built:
                say(f"bot: {cand.name} already built ({prev.status}) on {prev.branch}")
                current = rev_parse(f"refs/heads/{prev.branch}", root)
                if current == prev.commit:
                    base = prev.commit  # later releases build on it, as the PRs stack
                if push_remote and prev.pushed_to != push_remote:
                    # Built by a run without --push (or whose push failed or was refused): push it now.
                    if current != prev.commit:
                        warn(
                            f"bot: {prev.branch} is no longer at the commit the bot built ({str(prev.commit)[:12]}); not pushing it"
                        )
                    else:
                        pushed = _push_recorded(settings, record, cand.name, push_remote, warn)
                        results.append(BotResult(cand.name, pushed, refreshed=False))
                continue
            if prev and prev.status == NEEDS_HUMAN and prev.inputs == inputs and not retry:
                say(
                    f"bot: {cand.name} needs a human since a previous run ({prev.reason}); inputs unchanged, not retrying (--retry to force)"
                )
                continue
            say(f"bot: refreshing to {cand.name} on {cand.branch}")
            progress.step(f"the refresh to {cand.name} on {cand.branch}")
            outcome = process(settings, cand, base, inputs, verify_opts, say, warn)
            # What was built is recorded before any push: a push that fails or is refused leaves a
            # built, unpushed release that the next run with --push pushes (never "done" unpushed).
            record.tags[cand.name] = outcome.record
            write_record(settings, record)
            if outcome.status != NEEDS_HUMAN:
                base = outcome.record.commit
                if push_remote:
                    outcome.record = _push_recorded(settings, record, cand.name, push_remote, warn)
            results.append(outcome)
            progress.finish(f"{cand.name} {outcome.status}")
            reason = outcome.record.reason
            say(f"bot: {cand.name}: {outcome.status}{' (' + reason + ')' if reason else ''}")
        return results
