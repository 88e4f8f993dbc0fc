"""What a refresh tells a reviewer: codemod sites old vs new, a range-diff of the old and new
series, verify on the new pin (and on the old one when a stage fails), and the Markdown PR body."""

from __future__ import annotations

import dataclasses
import json
import platform
import re
import tempfile
from pathlib import Path
from typing import Any

from rocmport.config import DEFAULT_BACKEND, DEFAULT_ITERS, DEFAULT_PP, DEFAULT_TP, Settings
from rocmport.errors import BadInput
from rocmport.gitutil import FIXED_IDENTITY, git, run_git
from rocmport.patches.series import select_series, split_header
from rocmport.port import worktree as wt
from rocmport.port.apply import apply_upstream, report_path
from rocmport.refresh.result import CodemodChange, LostFile, RefreshResult, RefreshVerify, UpstreamOutcome
from rocmport.refresh.staging import StagedSeries
from rocmport.upstream.lock import Lock
from rocmport.upstreams import MEGATRON_LM
from rocmport.machine.python import python_setup_hint, unmet_python
from rocmport.verify.orchestration.registry import NAMES
from rocmport.verify.stages.unit_tests.stage import NAME as UNIT_TESTS
from rocmport.verify.stages.functional import NAME as FUNCTIONAL
from rocmport.verify.orchestration.run import prepare, run_verify


@dataclasses.dataclass(frozen=True)
class RefreshVerifyOptions:
    """What `refresh` and `bot` ask of verify on the new port, as their commands checked it: the sizes
    ([tool.rocmport] tp/pp unless --tp/--pp), the iterations and backend (verify's own defaults, as
    `rocmport verify` without the flag), and the stages (None: stages 1-2; stage 3 costs minutes).
    Kept in the refresh's state file (``to_dict``), so that `refresh --continue` verifies as asked."""

    tp: int = DEFAULT_TP
    pp: int = DEFAULT_PP
    iters: int = DEFAULT_ITERS
    backend: str = DEFAULT_BACKEND
    stages: tuple[str, ...] | None = None

    @property
    def chosen(self) -> list[str]:
        """The stages to run: those asked for, else stages 1-2."""
        return list(self.stages or NAMES[:2])

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"tp": self.tp, "pp": self.pp, "iters": self.iters, "backend": self.backend}
        if self.stages is not None:
            out["stages"] = list(self.stages)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RefreshVerifyOptions:
        """From the state file; a key it lacks (a refresh started by an older rocmport) takes the default."""
        stages = data.get("stages")
        return cls(
            tp=data.get("tp", DEFAULT_TP),
            pp=data.get("pp", DEFAULT_PP),
            iters=data.get("iters", DEFAULT_ITERS),
            backend=data.get("backend", DEFAULT_BACKEND),
            stages=tuple(stages) if stages is not None else None,
        )


def _old_port(settings: Settings, old: Lock, name: str, say=print) -> Path:
    """A work tree holding the port of the old pin: the project's own when it is that, else one built aside."""
    tree = settings.worktree_path(name)
    state = wt.read_state(tree)
    if state is not None and state.status == "done" and state.base == old.upstreams[name].commit:
        return tree
    aside = dataclasses.replace(settings, worktree_dir=settings.refresh_dir / "old")
    apply_upstream(aside, old, name, force=True, say=say)
    return aside.worktree_path(name)


def codemod_changes(settings: Settings, old: Lock, name: str, new_report: dict) -> list[CodemodChange]:
    """Per codemod: sites and files on the old port vs the new, files it newly rewrites, and why each
    file it no longer rewrites dropped out (upstream deleted it, moved it, or changed it)."""
    old_layers: dict[str, dict] = {}
    if name in old.upstreams:
        rp = report_path(_old_port(settings, old, name))
        if rp.is_file():
            old_layers = {c["name"]: c for c in json.loads(rp.read_text()).get("codemods", [])}
    gone = sorted(
        {
            f
            for layer in new_report.get("codemods", [])
            for f in set(old_layers.get(layer["name"], {"files": []})["files"]) - set(layer["files"])
        }
    )
    why = _upstream_fate(Path(new_report["tree"]), old.upstreams[name].commit, new_report["base"], gone) if gone else {}
    rows = []
    for layer in new_report.get("codemods", []):
        before = old_layers.get(layer["name"], {"sites": 0, "files": []})
        rows.append(
            CodemodChange(
                name=layer["name"],
                old_sites=before["sites"],
                new_sites=layer["sites"],
                old_files=len(before["files"]),
                new_files=len(layer["files"]),
                newly_rewritten=sorted(set(layer["files"]) - set(before["files"])),
                no_longer_rewritten=[LostFile(f, why[f]) for f in sorted(set(before["files"]) - set(layer["files"]))],
            )
        )
    return rows


def _upstream_fate(tree: Path, old_base: str, new_base: str, files: list[str]) -> dict[str, str]:
    """What upstream did between the two bases to each file a codemod no longer rewrites."""
    out = {f: "changed upstream: nothing left for the codemod to rewrite" for f in files}
    status = run_git("diff", "--name-status", "-M", "--no-color", old_base, new_base, cwd=tree, check=False)
    changed: dict[str, str] = {}
    for line in status.stdout.splitlines():
        parts = line.split("\t")
        if parts[0] == "D":
            changed[parts[1]] = "deleted upstream"
        elif parts[0].startswith("R") and len(parts) == 3:
            changed[parts[1]] = f"moved upstream to `{parts[2]}`"
        elif parts[0] == "M":
            changed[parts[1]] = "changed upstream: nothing left for the codemod to rewrite"
    for f in files:
        if f in changed:
            out[f] = changed[f]
        elif run_git("cat-file", "-e", f"{old_base}:{f}", cwd=tree, check=False).returncode != 0:
            out[f] = "written by rocmport (not an upstream file)"
        else:
            out[f] = "unchanged upstream: the codemod itself no longer rewrites it"
    return out


def _series_tip(tree: Path, base: str, patches: list[tuple[str, str]], index: Path) -> str:
    """Commit each (subject, diff) on top of ``base`` through a private index: no checkout needed."""
    env = {**FIXED_IDENTITY, "GIT_INDEX_FILE": str(index)}
    git("read-tree", base, cwd=tree, env=env)
    tip = base
    for subject, diff in patches:
        if run_git("apply", "--cached", "-", cwd=tree, env=env, input=diff, check=False).returncode != 0:
            continue
        tip = git("commit-tree", git("write-tree", cwd=tree, env=env), "-p", tip, "-m", subject, cwd=tree, env=env)
    return tip


def range_diff(
    rsettings: Settings, old: Lock, new: Lock, staged: dict[str, StagedSeries], outcomes: dict[str, UpstreamOutcome]
) -> str:
    """`git range-diff` of the old series on the old base vs the new series on the new base."""
    chunks = []
    for name, outcome in outcomes.items():
        if name not in old.upstreams:
            continue
        tree = rsettings.worktree_path(name)
        try:
            old_series = select_series(rsettings.patchsets_dir, name, old.upstreams[name].version)
        except BadInput:  # the old pin had no series: nothing to compare against
            old_series = None
        before = [(p.description.splitlines()[0], p.diff) for p in old_series.patches] if old_series else []
        new_series = staged[name].series
        after = [
            (p.description.splitlines()[0], _diff_of(outcome.regenerated.get(p.name), p.diff))
            for p in new_series.patches
            if p.name not in outcome.dropped
        ]
        if not before and not after:
            continue
        with tempfile.TemporaryDirectory(prefix="rocmport-rd-") as tmp:
            o_base, n_base = old.upstreams[name].commit, new.upstreams[name].commit
            o_tip = _series_tip(tree, o_base, before, Path(tmp) / "a")
            n_tip = _series_tip(tree, n_base, after, Path(tmp) / "b")
            rd = run_git(
                "range-diff", "--no-color", f"{o_base}..{o_tip}", f"{n_base}..{n_tip}", cwd=tree, check=False
            ).stdout
        chunks.append(f"{name}:\n{rd.rstrip()}")
    return "\n\n".join(chunks)


def _diff_of(patch_text: str | None, fallback: str) -> str:
    if patch_text is None:
        return fallback
    return split_header(patch_text)[1]


def verify_page(settings: Settings, to: str) -> Path:
    """Where a refresh to ``to`` writes its verify report's HTML page (its JSON beside it): in the
    project's build/verify/, outside the refresh's own directory (which an abort removes), one per
    release, so the bot's pages of several releases all reach the workflow's artifact."""
    from rocmport.verify.orchestration.report import verify_dir

    return verify_dir(settings.root) / f"refresh-{re.sub(r'[^A-Za-z0-9._-]+', '-', to)}.html"


def _write_verify_page(page: Path, data: dict[str, Any], say) -> None:
    """The new port's verify report (JSON) and its page beside it; a page that cannot be made is
    a line of output, never a failed refresh (the PR body then links none)."""
    from rocmport.verify.orchestration.report import write_json

    page.unlink(missing_ok=True)
    try:
        write_json(data, page.with_suffix(".json"))
        from rocmport.report.render import write_page

        write_page(page.with_suffix(".json"), page)
    except Exception as exc:  # noqa: BLE001 (no jinja2/matplotlib, a full disk: the refresh's verdict stands)
        say(f"refresh: no HTML page of the verify report ({type(exc).__name__}: {exc})")


def run_verify_both(
    settings: Settings,
    rsettings: Settings,
    old: Lock,
    opts: RefreshVerifyOptions,
    say=print,
    page: Path | None = None,
) -> RefreshVerify:
    """Verify the new port; when a stage fails, verify the old port too and label each failure.
    ``page``: write the new port's verify report and its HTML page there (verify_page)."""
    tree = rsettings.worktree_path(MEGATRON_LM.name)
    need = unmet_python(tree)
    if need:
        return RefreshVerify(
            skipped=f"the new tree requires Python {need} and rocmport runs on Python {platform.python_version()}; "
            + python_setup_hint(need)
        )
    # Stages 1-2 unless the refresh (or the bot) asked for more: stage 3 costs minutes on the proxy.
    chosen = opts.chosen
    unit = UNIT_TESTS in chosen
    since = old.upstreams[MEGATRON_LM.name].commit if MEGATRON_LM.name in old.upstreams else None
    not_run = f"refresh verifies {', '.join(chosen)} (--verify-stages); run `rocmport verify` for the rest"

    changed_rewrites = rewritten_changes(settings, old, tree) if unit or FUNCTIONAL in chosen else ()
    # Stage 4's cases are chosen on the new port; the old pin reruns the same ones when one fails there.
    functional, cases_why = (
        hop_functional(tree, since, changed_rewrites) if FUNCTIONAL in chosen else ({"with_functional": False}, None)
    )

    def options(at: Path, stages: list[str], extra: tuple[str, ...] = ()):
        """verify's own checked options for ``at``: ``stages`` (the others listed as not run by refresh);
        stage 3 the tests that reach what upstream changed since the old pin, and the smoke set; stage 4
        the recorded cases that reach it (hop_functional)."""
        impacted = "impacted" if since and (at / "tests" / "unit_tests").is_dir() else None
        checked = prepare(
            rsettings,
            {
                "tree": str(at),
                "tp": opts.tp,
                "pp": opts.pp,
                "iters": opts.iters,
                "backend": opts.backend,
                # impacted where the tree has upstream's tests (a package-index source has none: verify skips stage 3, saying so)
                "with_unit": (impacted if UNIT_TESTS in stages else False),
                "since": since if UNIT_TESTS in stages and impacted else None,
                "impact_extra": extra,
                **(functional if FUNCTIONAL in stages else {"with_functional": False}),
                "with_bridge": False,
                # stages 1-2 left out are "not selected"; the later ones are not requested and say `not_run`
                "stages_text": ",".join(n for n in NAMES if n in stages or n not in NAMES[:2]),
            },
        )
        return dataclasses.replace(
            checked, skipped={**checked.skipped, **{n: not_run for n in NAMES if n not in stages}}
        )

    new = run_verify(options(tree, chosen, changed_rewrites if unit else ()))
    if page is not None:
        _write_verify_page(page, new.to_dict(), say)
    failed = new.failed
    out = RefreshVerify(mode=new.mode, stages=new.stages, failed=failed, requested=chosen)
    ran = new.unit_run()
    if ran is not None and ran.impact:
        out.unit_tests_selection = ran.impact.line
    out.cases_selection = cases_why
    if failed:
        # Stage 3 labels each failure against the unported tree itself: the old pin reruns stages 1-2 only.
        again = [n for n in chosen if n != UNIT_TESTS]
        before = {}
        if any(n in again for n in failed):
            old_tree = _old_port(settings, old, MEGATRON_LM.name, say)
            before = {s.name: s.status for s in run_verify(options(old_tree, again)).stages}
        out.labels = {
            n: (
                "each failing test labelled against the unported tree (see the stage's labels)"
                if n == UNIT_TESTS
                else "also fails on the old pin: upstream or environment"
                if before.get(n) == "fail"
                else "passes on the old pin: introduced by the new upstream or a drifted patch"
            )
            for n in failed
        }
    return out


def hop_functional(at: Path, since: str | None, extra: tuple[str, ...] = ()) -> tuple[dict[str, Any], str]:
    """Stage 4 on a hop (asked for with --verify-stages): the recorded cases (the line's reach record)
    that imported a file upstream changed since the old pin ``since``, or ran a port site in one (or
    in ``extra``: files whose port rewrite changed), as `--unit-tests impacted` picks tests; verify's
    options for it, and the selection in one line. No record, or no case reached: stage 4 does not
    run, saying why."""
    from rocmport.verify.analyses import impact, reach
    from rocmport.verify.orchestration.run import series_settings

    _, series_dir, base = series_settings(at)
    if since is None:
        return {"with_functional": False}, "stage 4: no old pin to diff from, no case selected"
    picked = reach.hop_cases(series_dir, [*impact.changed_files(at, since, base or "HEAD"), *extra])
    if picked is None:
        where = reach.record_path(series_dir) if series_dir else "this tree"
        return {"with_functional": False}, f"stage 4: no recorded case in {where} (--record-reach): not run"
    names, why = picked
    if not names:
        return {"with_functional": False}, f"{why}: stage 4 not run"
    return {"with_functional": True, "cases": ",".join(names)}, f"{why}: {', '.join(names)}"


def rewritten_changes(settings: Settings, old: Lock, tree: Path) -> tuple[str, ...]:
    """Files whose port rewrite changed in this hop although upstream may not have changed them: the
    files a codemod rewrites in the new port and not in the old one, or the other way round (from the
    two apply reports; none when the project's work tree is not the old pin's port)."""
    name = MEGATRON_LM.name
    before, after = report_path(settings.worktree_path(name)), report_path(tree)
    state = wt.read_state(settings.worktree_path(name))
    if name not in old.upstreams or not (before.is_file() and after.is_file()):
        return ()
    if state is None or state.base != old.upstreams[name].commit:
        return ()

    def rewritten(path: Path) -> set[str]:
        return {f for c in json.loads(path.read_text(encoding="utf-8")).get("codemods", []) for f in c.get("files", [])}

    return tuple(sorted(f for f in rewritten(before) ^ rewritten(after) if (tree / f).is_file()))


# What each status means to a reviewer, after the status word itself (refresh/result.py's vocabulary).
_MEANING = {
    "ready": "verified, ready to merge",
    "up-to-date": "already up to date",
    "not-verified": "the patches and codemods carried over, but {why}; run `rocmport verify` on the port before merging",
    "needs-a-human": "{why}",
}


def status_line(result: RefreshResult) -> str:
    """The status a reviewer reads first: the status word (`ready` only when verify ran and passed)
    and what it means, rendered from the result's ``status`` and ``why`` alone (never re-derived),
    so the PR body says what --json and the exit code say."""
    return f"`{result.status}`: " + _MEANING[result.status].format(why=result.why or "")


def portable(text: str, places: dict[str, str]) -> str:
    """``text`` without this machine's absolute paths: each prefix in ``places`` (longest first)
    becomes its replacement, e.g. the project root a relative path."""
    for prefix in sorted(places, key=len, reverse=True):
        if prefix and prefix != "/":  # a whole path component only: /tmp is not the start of /tmpfs
            end = "" if prefix.endswith("/") else r"(?![\w.-])"
            new = places[prefix]
            text = re.sub(re.escape(prefix) + end, lambda _m: new, text)
    return text


def page_link(page: Path, environ: dict[str, str]) -> str:
    """How the PR body names the verify report's page: in a GitHub Actions run, a link to the run,
    whose artifact ($ROCMPORT_REPORT_ARTIFACT, the workflow's name for it) holds the page; elsewhere its path."""
    server, repo, run = (environ.get(k) for k in ("GITHUB_SERVER_URL", "GITHUB_REPOSITORY", "GITHUB_RUN_ID"))
    if server and repo and run:
        artifact = environ.get("ROCMPORT_REPORT_ARTIFACT", "rocmport-report-pages")
        return (
            f"[the verify report page]({server}/{repo}/actions/runs/{run}) (artifact `{artifact}`, file `{page.name}`)"
        )
    return f"`{page}` (open it in a browser: it needs no network)"


def markdown(result: RefreshResult, places: dict[str, str] | None = None, page: str | None = None) -> str:
    """The PR body. ``places``: absolute path prefixes of this machine -> what the body says instead;
    ``page``: how to name the verify report's HTML page (page_link), None when there is none."""
    lines = [f"# rocmport refresh to `{result.to}`", ""]
    lines += [f"**Status:** {status_line(result)}", ""]
    lines += ["| upstream | from | to |", "|---|---|---|"]
    new_pins, old_pins = (
        dict(sorted(result.new_lock.upstreams.items())),
        dict(sorted(result.old_lock.upstreams.items())),
    )
    for name, pin in new_pins.items():
        before = old_pins.get(name)
        frm = f"`{before.resolved_ref}` ({before.commit[:12]})" if before else "—"
        lines.append(f"| {name} | {frm} | `{pin.resolved_ref}` ({pin.commit[:12]}) |")
    for name, before in old_pins.items():
        if name not in new_pins:
            lines.append(
                f"| {name} | `{before.resolved_ref}` ({before.commit[:12]}) | — (no companion release; no longer pinned) |"
            )
    if result.conflict:
        c = result.conflict
        hunks = ", ".join(f"{h.file}:{h.line}" for h in c.hunks) or "—"
        lines += [
            "",
            "## Conflict",
            "",
            f"`{c.patch}` ({c.upstream}) does not apply: {c.detail}.",
            f"Files: {', '.join(c.files)}; hunks: {hunks}. Work tree: `{c.tree}`.",
            "Resolve there, commit, then `rocmport refresh --continue` (or `--abort`).",
        ]
    for name, up in result.upstreams.items():
        lines += ["", f"## {name}: patches ({'new series' if up.created else 'series'} `{up.series}`)", ""]
        if up.patches:
            lines += ["| patch | outcome | action | detail |", "|---|---|---|---|"]
            lines += [f"| `{p.name}` | {p.bucket} | {p.action} | {p.evidence or p.detail} |" for p in up.patches]
        else:
            lines.append("No patches in this series.")
        if up.dropped:
            lines += ["", "Dropped (upstream has them):"] + [f"- `{n}`: {why}" for n, why in up.dropped.items()]
        if up.codemods:
            lines += ["", "| codemod | sites old → new | files old → new | newly rewritten |", "|---|---|---|---|"]
            for cm in up.codemods:
                new_files = ", ".join(f"`{f}`" for f in cm.newly_rewritten[:5]) + (
                    " …" if len(cm.newly_rewritten) > 5 else ""
                )
                lines.append(
                    f"| {cm.name} | {cm.old_sites} → {cm.new_sites} | {cm.old_files} → {cm.new_files} | {new_files or '—'} |"
                )
            gone = [(cm.name, f) for cm in up.codemods for f in cm.no_longer_rewritten]
            if gone:
                lines += ["", "No longer rewritten:"] + [f"- {name}: `{f.file}`: {f.why}" for name, f in gone]
    v = result.verify
    lines += ["", "## Verify", ""]
    if v is None:
        lines.append("Skipped (`--no-verify`): this port is not verified.")
    elif v.skipped:
        lines.append(f"Not run: {v.skipped}. This port is not verified.")
    else:
        lines += [f"Mode: {v.mode}.", "", "| stage | status | seconds | reason |", "|---|---|---|---|"]
        for s in v.stages:
            label = (v.labels or {}).get(s.name, "")
            lines.append(
                f"| {s.name} | {s.status} | {round(s.seconds, 2)} | {s.reason}{' — ' + label if label else ''} |"
            )
        if v.unit_tests_selection:
            lines += ["", f"Unit tests: {v.unit_tests_selection}."]
        if v.cases_selection:
            lines += ["", f"Functional cases: {v.cases_selection}."]
        if page:
            lines += ["", f"Loss curves, port-site coverage and the labelled tests: {page}."]
    if result.range_diff:
        lines += [
            "",
            "<details><summary>range-diff of the old vs new series</summary>",
            "",
            "```",
            result.range_diff,
            "```",
            "",
            "</details>",
        ]
    return portable("\n".join(lines) + "\n", places or {})
