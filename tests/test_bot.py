"""`rocmport bot` on a real project repository following a real local upstream."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from pathlib import Path

import pytest
import yaml
from filelock import FileLock

from rocmport.cli import main
from rocmport.config import load_settings
from rocmport.errors import EXIT_BUSY
from rocmport.refresh import bot
from tests.helpers.real import REPO, project_with
from tests.helpers.refresh import LAYERS, Ported, edit_line
from tests.helpers.sync import commit, g


@pytest.fixture()
def port(tmp_path, monkeypatch):
    return Ported(tmp_path, monkeypatch)


def _release_0_16_2(port: Ported) -> str:
    """core_v0.16.2 on a release branch, tagged after core_v0.17.0 (as upstream does)."""
    g(port.up, "checkout", "-q", "-b", "core_r0.16.0", "core_v0.16.1")
    sha = commit(
        port.up,
        {
            "megatron/core/package_info.py": 'MAJOR = 0\nMINOR = 16\nPATCH = 2\nPRE_RELEASE = ""\n',
            "docs/index.md": "patch release docs\n",
        },
        "0.16.2",
        "2025-06-01T00:00:00+00:00",
    )
    g(port.up, "tag", "core_v0.16.2")
    g(port.up, "checkout", "-q", "main")
    return sha


def subjects(port: Ported, rev: str, n: int) -> list[str]:
    return g(port.root, "log", "--format=%s", f"-{n}", rev).splitlines()[::-1]


def test_two_releases_processed_in_version_order_on_their_own_branches(port, capsys):
    port.tag({"megatron/core/layers.py": "top\n" + LAYERS}, "core_v0.17.0", "0.17.0")
    _release_0_16_2(port)
    main_head = g(port.root, "rev-parse", "HEAD")
    capsys.readouterr()
    assert port.run("bot", "--once", "--no-verify", "--json") == 0
    done = json.loads(capsys.readouterr().out)["processed"]
    assert [d["tag"] for d in done] == ["core_v0.16.2", "core_v0.17.0"] and {d["status"] for d in done} == {
        "not-verified"
    }
    assert {d["reason"] for d in done} == {"verify was skipped (--no-verify)"}
    # The project is back on main, untouched.
    assert (
        g(port.root, "rev-parse", "--abbrev-ref", "HEAD") == "main" and g(port.root, "rev-parse", "HEAD") == main_head
    )
    assert g(port.root, "status", "--porcelain") == ""
    b16, b17 = "rocmport/refresh-core_v0.16.2", "rocmport/refresh-core_v0.17.0"
    assert subjects(port, b16, 2) == ["bump upstream.lock to core_v0.16.2", "summary of the refresh to core_v0.16.2"]
    assert subjects(port, b17, 3) == [
        "bump upstream.lock to core_v0.17.0",
        "refresh patches for core_v0.17.0",
        "summary of the refresh to core_v0.17.0",
    ]
    # The PRs stack: 0.17.0 builds on the 0.16.2 branch; each commit is the bot's.
    assert g(port.root, "merge-base", "--is-ancestor", b16, b17) == ""
    assert set(g(port.root, "log", "--format=%ae", f"main..{b17}").splitlines()) == {bot.BOT_EMAIL}
    assert "core_v0.17.0" in g(port.root, "show", f"{b17}:upstream.lock")
    assert "0001-layers-ten.patch" in g(port.root, "show", f"{b17}:patchsets/megatron-lm/v0.17/series")
    assert "# rocmport refresh to `core_v0.17.0`" in g(port.root, "show", f"{b17}:refresh-summaries/core_v0.17.0.md")
    # A second run finds nothing to do.
    assert port.run("bot", "--once", "--no-verify", "--json") == 0
    assert json.loads(capsys.readouterr().out)["processed"] == []


def test_upstreamed_patch_is_dropped_in_its_own_commit(port):
    port.upstream_commit({"megatron/core/utils.py": "def f():\n    return 2\n"}, "upstream: f returns 2")
    port.tag({"docs/index.md": "x\n"}, "core_v0.17.0", "0.17.0")
    assert port.run("bot", "--once", "--no-verify") == 0
    b = "rocmport/refresh-core_v0.17.0"
    assert subjects(port, b, 4) == [
        "bump upstream.lock to core_v0.17.0",
        "refresh patches for core_v0.17.0",
        "drop upstreamed patches",
        "summary of the refresh to core_v0.17.0",
    ]
    # Bisectable: the refresh commit still lists the patch; the drop commit removes it with the evidence.
    assert "0003-utils.patch" in g(port.root, "show", f"{b}~2:patchsets/megatron-lm/v0.17/series").split("patches:")[1]
    drop = g(port.root, "show", "--stat", "--format=%B", f"{b}~1")
    assert "0003-utils.patch: reverse-applies" in drop and "0003-utils.patch | " in drop


def test_failed_release_is_not_retried_until_inputs_change(port, capsys):
    port.tag({"megatron/core/layers.py": edit_line(LAYERS, 30, "line 30 upstream")}, "core_v0.17.0", "0.17.0")
    assert port.run("bot", "--once", "--no-verify") == 1
    record = json.loads((port.root / ".rocmport" / "bot-state.json").read_text())["tags"]["core_v0.17.0"]
    assert record["status"] == "needs-a-human" and record["reason"] == "conflict in 0002-layers-thirty.patch"
    assert "rocmport/refresh-core_v0.17.0" not in g(port.root, "branch", "--list")
    assert not (port.root / "build" / "refresh" / "state.json").exists()
    capsys.readouterr()
    assert port.run("bot", "--once", "--no-verify") == 0
    assert "inputs unchanged, not retrying" in capsys.readouterr().err
    assert port.run("bot", "--once", "--no-verify", "--retry") == 1
    # New patches are new inputs: fix the series on main and the bot tries again, successfully.
    series = port.series_dir / "series"
    series.write_text(series.read_text().replace("  - 0002-layers-thirty.patch\n", ""))
    (port.series_dir / "0002-layers-thirty.patch").unlink()
    g(port.root, "commit", "-qam", "drop 0002")
    assert port.run("bot", "--once", "--no-verify") == 0
    assert (
        json.loads((port.root / ".rocmport" / "bot-state.json").read_text())["tags"]["core_v0.17.0"]["status"]
        == "not-verified"
    )


def test_concurrent_run_is_refused(port, capsys):
    port.tag({"docs/index.md": "x\n"}, "core_v0.17.0", "0.17.0")
    (port.root / ".rocmport").mkdir(exist_ok=True)
    with FileLock(str(port.root / ".rocmport" / "bot.lock")):
        cmd = [sys.executable, "-m", "rocmport", "-C", str(port.root), "bot", "--once", "--no-verify"]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=os.environ.copy(), timeout=120)
    assert proc.returncode == EXIT_BUSY and "another rocmport bot run" in proc.stderr
    assert "rocmport/refresh-core_v0.17.0" not in g(port.root, "branch", "--list")


def test_push_to_a_bare_remote_never_over_a_human(port, tmp_path):
    remote = tmp_path / "remote.git"
    g(tmp_path, "init", "-q", "--bare", str(remote))
    port.tag({"docs/index.md": "x\n"}, "core_v0.17.0", "0.17.0")
    assert port.run("bot", "--once", "--no-verify", "--push", str(remote)) == 0
    b = "rocmport/refresh-core_v0.17.0"
    assert g(remote, "rev-parse", b) == g(port.root, "rev-parse", b)
    # A bot-only rewrite of the branch may replace the remote one ...
    g(port.root, "checkout", "-q", b)
    subprocess.run(
        ["git", "commit", "-q", "--amend", "-m", "summary again"],
        cwd=port.root,
        check=True,
        env={**os.environ, **bot.BOT_ENV},
    )
    g(port.root, "checkout", "-q", "main")
    assert bot.push(port.root, str(remote), b, warn=print) == "replaced"
    # ... but once a human added a commit there, the bot never force-pushes.
    human = tmp_path / "human"
    g(tmp_path, "clone", "-q", "-b", b, str(remote), str(human))
    commit(human, {"NOTE.md": "reviewed\n"}, "human review note")
    g(human, "push", "-q", "origin", b)
    g(port.root, "checkout", "-q", b)
    subprocess.run(
        ["git", "commit", "-q", "--amend", "-m", "summary a third time"],
        cwd=port.root,
        check=True,
        env={**os.environ, **bot.BOT_ENV},
    )
    g(port.root, "checkout", "-q", "main")
    warnings = []
    assert bot.push(port.root, str(remote), b, warn=warnings.append) == "refused"
    assert "human review note" in g(remote, "log", "-1", "--format=%s", b) and "by a human" in warnings[0]


def test_a_push_that_failed_is_pushed_by_the_next_run_with_push(port, tmp_path, capsys):
    """Built and pushed are recorded apart: a refused push, then a run without --push, never leave the
    release "done" in a way that stops a later --push from pushing it."""
    port.tag({"docs/index.md": "x\n"}, "core_v0.17.0", "0.17.0")
    b = "rocmport/refresh-core_v0.17.0"
    missing = tmp_path / "no-such-remote.git"
    assert port.run("bot", "--once", "--no-verify", "--push", str(missing)) == 1  # git refuses: exit 1 with its error
    record = json.loads((port.root / ".rocmport" / "bot-state.json").read_text())["tags"]["core_v0.17.0"]
    assert record["status"] == "not-verified" and record["push"] == "failed" and "pushed_to" not in record
    tip = g(port.root, "rev-parse", b)
    assert record["commit"] == tip
    assert port.run("bot", "--once", "--no-verify") == 0  # no --push: nothing pushed, nothing rebuilt
    assert g(port.root, "rev-parse", b) == tip
    good = tmp_path / "good.git"
    g(tmp_path, "init", "-q", "--bare", str(good))
    capsys.readouterr()
    assert port.run("bot", "--once", "--no-verify", "--push", str(good), "--json") == 0
    (pushed,) = json.loads(capsys.readouterr().out)["processed"]
    assert pushed["tag"] == "core_v0.17.0" and pushed["push"] == "pushed" and pushed["branch"] == b
    assert g(good, "rev-parse", b) == tip
    record = json.loads((port.root / ".rocmport" / "bot-state.json").read_text())["tags"]["core_v0.17.0"]
    assert record["pushed_to"] == str(good) and record["push"] == "pushed"
    # Pushed once: the next run with the same remote has nothing to do.
    capsys.readouterr()
    assert port.run("bot", "--once", "--no-verify", "--push", str(good), "--json") == 0
    assert json.loads(capsys.readouterr().out)["processed"] == []


def test_track_main_and_release_lines(port, capsys):
    port.tag({"docs/index.md": "x\n"}, "core_v0.17.0", "0.17.0")
    head = port.upstream_commit(
        {"megatron/core/package_info.py": 'MAJOR = 0\nMINOR = 18\nPATCH = 0\nPRE_RELEASE = "rc0"\n'}, "main moves"
    )
    settings = load_settings(port.root)
    assert [c.name for c in bot.candidates(settings, "main", None, say=print)] == [f"main@{head[:12]}"]
    assert [c.name for c in bot.candidates(settings, "release", ["v0.16"], say=print)] == []
    assert port.run("bot", "--once", "--no-verify", "--track", "main") == 0
    assert "rocmport/refresh-main-" + head[:12] in g(port.root, "branch", "--list")
    assert "resolved_ref: " + head in g(port.root, "show", f"rocmport/refresh-main-{head[:12]}:upstream.lock")


def test_bad_input(port):
    assert port.run("bot") == 2
    assert port.run("bot", "--once", "--watch") == 2
    (port.root / "upstream.lock").write_text((port.root / "upstream.lock").read_text() + "# edited\n")
    assert port.run("bot", "--once", "--no-verify") == 2  # a dirty checkout is refused


def test_watch_polls_with_plain_log_lines(port):
    cmd = [sys.executable, "-m", "rocmport", "-C", str(port.root), "bot", "--watch", "--interval", "10", "--no-verify"]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=os.environ.copy())
    lines, deadline = [], time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            line = proc.stderr.readline()
            lines.append(line)
            if "cycle 2 processed" in line:
                break
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert any("cycle 2 processed 0 release(s)" in ln for ln in lines), lines
    assert not any("\x1b[" in ln for ln in lines)


def test_lines_option_is_normalised_and_checked(port, capsys):
    port.tag({"docs/index.md": "x\n"}, "core_v0.17.0", "0.17.0")
    assert port.run("bot", "--once", "--no-verify", "--lines", "0.16") == 0
    assert "on lines v0.16: none" in capsys.readouterr().err
    assert port.run("bot", "--once", "--no-verify", "--lines", "sixteen") == 2


WORKFLOW = REPO / ".github" / "workflows" / "rocmport-refresh.yml"


def _lint(path: Path) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).with_name("check-jsonschema")
    return subprocess.run(
        [str(exe), "--builtin-schema", "vendor.github-workflows", str(path)], capture_output=True, text=True
    )


def test_shipped_workflow_passes_the_github_workflow_schema_and_runs_the_bot(tmp_path):
    proc = _lint(WORKFLOW)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = WORKFLOW.read_text()
    assert 'rocmport bot --once --track "${{ matrix.track }}" --push origin --json' in text and "schedule:" in text
    # refresh's verify runs on new releases: Python 3.12 (v0.17+ require it) and verify's extras.
    steps = yaml.safe_load(text)["jobs"]["refresh"]["steps"]
    setup = next(s for s in steps if s.get("uses", "").startswith("actions/setup-python"))
    assert str(setup["with"]["python-version"]) == "3.12"
    install = next(s for s in steps if s.get("name", "").startswith("Install rocmport"))["run"]
    assert "-e '.[verify,bridge,proxy,report]'" in install
    broken = tmp_path / "broken.yml"
    broken.write_text(text.replace("runs-on: ubuntu-latest", "runs_on: ubuntu-latest"))
    assert _lint(broken).returncode != 0  # the linter does reject a broken workflow


@pytest.mark.network
def test_bot_on_the_package_index_refreshes_a_patch_release(tmp_path, real_index, capsys):
    """Lock at megatron-core 0.16.0 from the real index: the bot refreshes to 0.16.1 on its branch."""
    root = project_with(tmp_path / "project", {"megatron-lm": "v0.16"})
    g(tmp_path, "init", "-q", "-b", "main", str(root))
    (root / ".gitignore").write_text("/build/\n/.rocmport/\n")
    run = lambda *a: main(["-C", str(root), *a])  # noqa: E731
    assert run("sync", "--ref", "0.16.0", "--source", "pypi", "--no-bridge") == 0
    g(root, "add", "-A")
    g(root, "commit", "-qm", "port at 0.16.0")
    capsys.readouterr()
    assert run("bot", "--once", "--no-verify", "--lines", "v0.16", "--json") == 0
    done = json.loads(capsys.readouterr().out)["processed"]
    assert [(d["tag"], d["status"]) for d in done] == [("v0.16.1", "not-verified")]
    lock = g(root, "show", "rocmport/refresh-v0.16.1:upstream.lock")
    assert "resolved_ref: 0.16.1" in lock and "source: pypi" in lock
    summary = g(root, "show", "rocmport/refresh-v0.16.1:refresh-summaries/v0.16.1.md")
    assert "0001-dist-ckpt-no-pinned-preload-on-hip.patch" in summary
    assert "**Status:** `not-verified`" in summary and "ready to merge" not in summary  # the bot ran with --no-verify


def _expression(text: str, variables: dict[str, str]):
    """GitHub Actions' expression language, the part the shipped workflow uses: `vars.NAME` (unset:
    ''), string literals, `==`, `!=`, `&&`, `||` (their value-returning forms), `always()`, `fromJSON()`."""
    import re as _re

    tokens = _re.findall(r"'(?:[^']|'')*'|\|\||&&|==|!=|\(|\)|[A-Za-z_][A-Za-z0-9_.]*", text)
    pos = 0

    def peek():
        return tokens[pos] if pos < len(tokens) else None

    def take():
        nonlocal pos
        pos += 1
        return tokens[pos - 1]

    def primary():
        tok = take()
        if tok.startswith("'"):
            return tok[1:-1].replace("''", "'")
        if tok == "(":
            value = or_()
            assert take() == ")"
            return value
        if tok in ("always", "fromJSON"):
            assert take() == "("
            arg = None if peek() == ")" else or_()
            assert take() == ")"
            return True if tok == "always" else json.loads(arg)
        if tok.startswith("vars."):
            return variables.get(tok[5:], "")
        if tok.startswith("github."):  # the run's context (github.event_name), by its full name
            return variables.get(tok, "")
        raise AssertionError(f"unsupported in the test's evaluator: {tok}")

    def compare():
        left = primary()
        while peek() in ("==", "!="):
            op, right = take(), primary()
            left = (left == right) if op == "==" else (left != right)
        return left

    def and_():
        left = compare()
        while peek() == "&&":
            take()
            right = compare()
            left = right if left else left
        return left

    def or_():
        left = and_()
        while peek() == "||":
            take()
            right = and_()
            left = left if left else right
        return left

    value = or_()
    assert pos == len(tokens), text
    return value


def _render(value, variables):
    """A workflow value with its ${{ }} evaluated: a whole-value expression keeps its type."""
    import re as _re

    if isinstance(value, dict):
        return {k: _render(v, variables) for k, v in value.items()}
    if isinstance(value, list):
        return [_render(v, variables) for v in value]
    if isinstance(value, str):
        whole = _re.fullmatch(r"\$\{\{(.*)\}\}", value.strip(), _re.S)
        if whole:
            return _expression(whole.group(1), variables)
    return value


@pytest.mark.parametrize(
    "variables, tracks, gpu",
    [
        ({}, ["release"], None),
        ({"ROCMPORT_TRACKS": '["release", "main"]'}, ["release", "main"], None),
        ({"ROCMPORT_GPU_RUNNER": '["self-hosted", "rocm", "mi300x"]'}, ["release"], ["self-hosted", "rocm", "mi300x"]),
    ],
)
def test_the_workflow_renders_its_tracks_and_the_gpu_job_from_repository_variables(variables, tracks, gpu):
    jobs = yaml.safe_load(WORKFLOW.read_text())["jobs"]
    assert _render(jobs["refresh"]["strategy"], variables)["matrix"]["track"] == tracks
    bot = next(s for s in jobs["refresh"]["steps"] if s.get("id") == "bot")["run"]
    assert '--track "${{ matrix.track }}"' in bot
    job = jobs["gpu-verify"]
    runs = bool(_expression(job["if"].strip()[3:-2], variables))
    assert runs == (gpu is not None)
    if gpu:
        assert _render(job["runs-on"], variables) == gpu and job["needs"] == "refresh"
        script = next(s for s in job["steps"] if s.get("name") == "Verify each built branch on the GPU")["run"]
        for what in (
            "rocmport emit docker",
            "rocmport doctor",
            "rocmport verify --tp 2 --pp 2",
            "--record-golden",
            "gh pr comment",
            "--device=/dev/kfd",
        ):
            assert what in script, what


@pytest.mark.parametrize("event, runs", [("schedule", True), ("workflow_dispatch", False)])
def test_the_nightly_job_runs_every_gpt_case_of_the_pinned_line_on_the_schedule(event, runs):
    """Refresh hops run the cases their change reaches; the scheduled run is where all of them run."""
    job = yaml.safe_load(WORKFLOW.read_text())["jobs"]["nightly-cases"]
    assert bool(_expression(job["if"].strip()[3:-2], {"github.event_name": event})) is runs
    script = next(s for s in job["steps"] if s.get("name") == "Every GPT case of the pinned line")["run"]
    lines = [ln.strip() for ln in script.splitlines() if ln.strip()]
    assert lines[0] == "rocmport apply"
    verify = lines[1].split()
    assert verify[:2] == ["rocmport", "verify"] and verify[verify.index("--cases") + 1] == "all"
    assert verify[verify.index("--te") + 1] == "auto" and "--report" in verify
    assert job["timeout-minutes"] >= 120  # the issue's budget: --cases all within 2 h on 2 cores
    upload = next(s for s in job["steps"] if s.get("uses", "").startswith("actions/upload-artifact"))
    assert upload["if"] == "always()" and "nightly-cases" in upload["with"]["path"]
