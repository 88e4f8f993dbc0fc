"""Property tests over `refresh`'s and `bot`'s option parsers (issue 30): whatever a user types, the
command either accepts it and hands the engine one consistent, typed value, or exits 2 with one
error line naming the option; never 70 (a bug), never 1, never a traceback. The engines are replaced
by recorders (the parser is what is under test; the engines have their own tests on real git
projects), so every example is a real `rocmport` command line through the real cli."""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from rocmport.cli import main
from rocmport.commands import bot as bot_command
from rocmport.commands import refresh as refresh_command
from rocmport.config import DEFAULT_PP, DEFAULT_TP
from rocmport.refresh.report import RefreshVerifyOptions
from rocmport.refresh.result import UP_TO_DATE, RefreshResult
from rocmport.upstream.lock import Lock, Pin
from rocmport.verify.runtime.gpt_worker import HEADS, LAYERS

EXAMPLES = int(os.environ.get("ROCMPORT_FUZZ_EXAMPLES", "300"))
FUZZ = settings(
    max_examples=EXAMPLES, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck)
)

TEXT = st.text(st.characters(blacklist_characters="\0", blacklist_categories=("Cs",)), max_size=12)  # argv holds no NUL
SIZE_TEXT = st.one_of(
    st.integers(min_value=-3, max_value=9).map(str),
    st.integers(min_value=-(10**30), max_value=10**30).map(str),
    st.sampled_from(["", " ", "1.5", "0x4", "1e3", "²", "٤", "+2", "--", "nan"]),
    TEXT,
)
LOCK = Lock(
    {
        "megatron-lm": Pin(
            url="https://example.invalid/megatron-lm.git",
            source="git",
            requested_ref="v0.16",
            resolved_ref="core_v0.16.1",
            commit="0" * 40,
            commit_date="2026-01-01T00:00:00+00:00",
        )
    }
)


class Done(BaseException):
    """Ends the bot's --watch loop from its first sleep (not an Exception: the cli does not turn it into 70)."""


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("options") / "project"
    root.mkdir()
    (root / "a-file").write_text("")
    (root / "a-dir").mkdir()
    return root


def run(argv: list[str]) -> tuple[int | None, str, str]:
    out, err = io.StringIO(), io.StringIO()
    rc: int | None
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(argv)
        except Done:
            rc = None  # the watch loop reached its sleep: accepted
    return rc, out.getvalue(), err.getvalue()


def error_line(err: str) -> str:
    """The line that says what is wrong: click's 'Error: ...' after its usage lines, or rocmport's one line."""
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert lines, "exit 2 without a message"
    assert "Traceback" not in err and "internal error" not in err, err
    return lines[-1]


def names_an_option(line: str, argv: list[str], options: list[str]) -> bool:
    """The error line names an option of the command (or quotes the stray argument it refuses)."""
    return any(o in line for o in options) or "No such option" in line or "unexpected extra argument" in line


# --- refresh ---------------------------------------------------------------------------------------

REFRESH_OPTIONS = ["--to", "--continue", "--abort", "--no-verify", "--tp", "--pp", "--summary", "--json"]


@pytest.fixture()
def engine(monkeypatch) -> list[tuple]:
    """refresh's three engine entry points, recording what the parser handed them."""
    calls: list[tuple] = []

    def fake_refresh(settings, to, *, verify_opts, **_):
        calls.append(("refresh", to, verify_opts))
        return RefreshResult(UP_TO_DATE, to, LOCK, LOCK).settle(up_to_date=True)

    def fake_continue(settings, **_):
        calls.append(("continue",))
        return RefreshResult(UP_TO_DATE, "v0.17", LOCK, LOCK).settle(up_to_date=True)

    def fake_abort(settings, **_):
        calls.append(("abort",))
        return []

    monkeypatch.setattr(refresh_command, "refresh", fake_refresh)
    monkeypatch.setattr(refresh_command, "continue_refresh", fake_continue)
    monkeypatch.setattr(refresh_command, "abort_refresh", fake_abort)
    return calls


def summary_paths(project: Path):
    return st.sampled_from(
        [
            "",
            " ",
            "out.md",
            "new-dir/out.md",
            "a-file/out.md",
            "a-dir",
            "~",
            "/proc/version/x",
            str(project / "sum.md"),
            "-",
            "--json",
        ]
    )


@st.composite
def refresh_argv(draw, project: Path) -> list[str]:
    parts: list[list[str]] = []
    for _ in range(draw(st.integers(0, 3))):  # the action: none, one, or several (repeated, too)
        parts.append(
            draw(
                st.sampled_from(
                    [
                        [
                            "--to",
                            draw(st.one_of(st.sampled_from(["v0.17", "core_v0.17.1", "", " ", "-x", ".."]), TEXT))
                            or "",
                        ],
                        ["--continue"],
                        ["--abort"],
                    ]
                )
            )
        )
    if draw(st.booleans()):
        parts.append(["--no-verify"])
    for name in ("--tp", "--pp"):
        if draw(st.booleans()):
            parts.append([name, draw(SIZE_TEXT)])
    if draw(st.booleans()):
        parts.append(["--summary", draw(summary_paths(project))])
    if draw(st.booleans()):
        parts.append(["--json"])
    if draw(st.integers(0, 9)) == 0:
        parts.append(
            [draw(st.sampled_from(["--bogus", "extra", "--to"]))]
        )  # an unknown option, a stray argument, a value missing
    order = draw(st.permutations(parts))
    return [token for part in order for token in part]


def _int(text: str) -> int | None:
    """The integer click reads from ``text``: Python's int(), which takes any Unicode digits ('٤' is 4)
    and underscores between digits."""
    try:
        return int(text)
    except ValueError:
        return None


def _check_refresh(project: Path, engine: list[tuple], argv: list[str]) -> None:
    engine.clear()
    for leftover in ("sum.md", "out.md", "new-dir"):
        path = project / leftover
        if path.is_file():
            path.unlink()
    rc, out, err = run(["-C", str(project), "refresh", *argv])
    assert rc in (0, 2), (argv, rc, err)
    if rc == 2:
        line = error_line(err)
        assert names_an_option(line, argv, REFRESH_OPTIONS), (argv, line)
        assert len(line) < 400 and engine == []
        return
    # Accepted: exactly one action, handed on typed and consistent.
    assert len(engine) == 1, (argv, engine)
    call = engine[0]
    # the options given: a token right after an option that takes a value is that value, whatever
    # it looks like (click reads `--to --continue` as --to's value, and a later --to wins)
    given = {t for i, t in enumerate(argv) if not (i and argv[i - 1] in ("--to", "--tp", "--pp", "--summary"))}
    if call[0] == "refresh":
        _, to, verify_opts = call
        assert to and to.strip() and "--continue" not in given and "--abort" not in given
        if "--no-verify" in given:
            assert verify_opts is None
        else:
            tp, pp = verify_opts.tp, verify_opts.pp
            assert (
                type(tp) is int and type(pp) is int and tp >= 1 and pp >= 1 and HEADS % tp == 0 and LAYERS % pp == 0
            ), (argv, verify_opts)
            for name, value, default in (("--tp", tp, DEFAULT_TP), ("--pp", pp, DEFAULT_PP)):
                if name in given:  # the last one given wins, as click takes it
                    assert value == _int(argv[len(argv) - 1 - argv[::-1].index(name) + 1]), (argv, verify_opts)
                else:
                    assert value == default
    else:
        assert not given & {"--no-verify", "--tp", "--pp"}, (argv, call)  # never silently dropped
        if call[0] == "abort":
            assert not given & {"--json", "--summary"}
            return
    if "--json" in given:
        assert json.loads(out)["status"] == "up-to-date"
    if "--summary" in given:
        value = argv[len(argv) - 1 - argv[::-1].index("--summary") + 1]
        target = Path(value)
        target = target if target.is_absolute() else Path.cwd() / target
        assert target.is_file() and "rocmport refresh to" in target.read_text(), (argv, target)
        if not str(target).startswith(str(project)):
            target.unlink()


@FUZZ
@given(data=st.data())
@example(data=None)
def test_fuzz_refresh_options(project, engine, monkeypatch, data):
    monkeypatch.chdir(project)
    if data is None:  # the examples the probes started from
        for argv in (
            ["--to", "v0.17", "--tp", "0"],
            ["--to", "v0.17", "--tp", "3"],
            ["--continue", "--no-verify"],
            ["--abort", "--tp", "2"],
            ["--to", "v0.17", "--summary", ""],
            ["--to", "v0.17", "--summary", "a-file/out.md"],
            ["--to", " "],
            [],
        ):
            _check_refresh(project, engine, argv)
        return
    _check_refresh(project, engine, data.draw(refresh_argv(project)))


def test_refresh_settings_sizes_are_checked_before_anything_runs(tmp_path, engine, monkeypatch):
    """[tool.rocmport] pp = 3 cannot be verified (4 layers): exit 2 naming the file and the key, before
    the refresh runs, instead of a failure after the whole refresh."""
    (tmp_path / "pyproject.toml").write_text("[tool.rocmport]\npp = 3\n")
    rc, _, err = run(["-C", str(tmp_path), "refresh", "--to", "v0.17"])
    assert rc == 2 and engine == []
    assert f"{tmp_path / 'pyproject.toml'}: [tool.rocmport] pp = 3: the verify model has {LAYERS} layers" in err
    rc, _, err = run(["-C", str(tmp_path), "refresh", "--to", "v0.17", "--pp", "2"])  # the option wins
    assert rc == 0 and engine == [("refresh", "v0.17", RefreshVerifyOptions(tp=DEFAULT_TP, pp=2))]


# --- bot -------------------------------------------------------------------------------------------

BOT_OPTIONS = ["--once", "--watch", "--interval", "--track", "--lines", "--retry", "--push", "--no-verify", "--json"]


@pytest.fixture()
def poller(monkeypatch) -> list[dict]:
    calls: list[dict] = []

    def fake_run_once(settings, **kw):
        calls.append(kw)
        return []

    def fake_sleep(seconds):
        calls.append({"slept": seconds})
        raise Done

    monkeypatch.setattr(bot_command, "run_once", fake_run_once)
    monkeypatch.setattr(bot_command.time, "sleep", fake_sleep)
    return calls


LINE = st.one_of(
    st.sampled_from(["v0.16", "v0.17", " v0.18 ", "0.16", "v0", "v0.x", "", "v99999999999999999999.1"]), TEXT
)
INTERVAL = st.one_of(
    st.sampled_from(["3600", "0.5", "0", "-1", "nan", "inf", "-inf", "1e400", "1e9", "31536000", "", "x"]),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    TEXT,
)


@st.composite
def bot_argv(draw) -> list[str]:
    parts: list[list[str]] = [draw(st.sampled_from([["--once"], ["--watch"], ["--once", "--watch"], []]))]
    if draw(st.booleans()):
        parts.append(["--interval", draw(INTERVAL)])
    if draw(st.booleans()):
        parts.append(["--track", draw(st.one_of(st.sampled_from(["release", "main", "Main", ""]), TEXT))])
    if draw(st.booleans()):
        parts.append(["--lines", ",".join(draw(st.lists(LINE, max_size=4)))])
    if draw(st.booleans()):
        parts.append(["--push", draw(st.one_of(st.just("origin"), TEXT))])
    for flag in ("--retry", "--no-verify", "--json"):
        if draw(st.booleans()):
            parts.append([flag])
    order = draw(st.permutations(parts))
    return [token for part in order for token in part]


def _last(argv: list[str], name: str) -> str:
    return argv[len(argv) - 1 - argv[::-1].index(name) + 1]


@FUZZ
@given(argv=bot_argv())
@example(argv=["--watch", "--interval", "nan"])
@example(argv=["--watch", "--interval", "inf"])
@example(argv=["--once", "--lines", ""])
@example(argv=["--watch", "--json"])
def test_fuzz_bot_options(project, poller, argv):
    poller.clear()
    rc, out, err = run(["-C", str(project), "bot", *argv])
    assert rc in (0, 2, None), (argv, rc, err)
    if rc == 2:
        line = error_line(err)
        assert names_an_option(line, argv, BOT_OPTIONS), (argv, line)
        assert poller == []
        return
    kw = poller[0]
    assert ("--once" in argv) != ("--watch" in argv)
    assert kw["track"] in ("release", "main") and kw["retry"] == ("--retry" in argv)
    assert (kw["verify_opts"] is None) == ("--no-verify" in argv)
    assert all(re.fullmatch(r"v[0-9]+\.[0-9]+", line) for line in kw["lines"]), kw["lines"]
    if "--lines" in argv:
        assert kw["lines"], argv  # a --lines that names no line is refused, not taken as "the default lines"
    if "--watch" in argv:
        assert rc is None and "--json" not in argv
        slept = poller[1]["slept"]
        assert math.isfinite(slept) and 0 < slept <= bot_command.MAX_INTERVAL
        if "--interval" in argv:
            assert slept == float(_last(argv, "--interval"))
    elif "--json" in argv:
        assert json.loads(out) == {"processed": []}


def test_readme_says_how_refresh_and_bot_options_are_checked():
    docs = Path(__file__).resolve().parents[1] / "docs" / "commands"  # the README's reference, moved
    readme = (docs / "refresh.md").read_text() + (docs / "bot.md").read_text()
    assert "Options are checked before anything runs (exit 2, one line naming the option): `--tp`/`--pp` as" in readme
    assert "SECONDS is 10 to a year (`nan`, `inf`, `1e-300`: exit 2)" in readme
