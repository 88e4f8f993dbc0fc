"""Issue #41, rule "Anything passed to git" (row 2): a remote, ref, push target or branch shaped
like an option is refused at the option (exit 2, naming it) before git runs, and git is called
with `--` / `--end-of-options` before such operands, so `--upload-pack=CMD` never runs CMD.

Every command option whose value reaches git is fed option-shaped values (a list, and a Hypothesis
property over generated ones); each must exit 2, create no file (the marker the payload would
touch, or anything in the project) and leave the project's git state as it was."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rocmport.cli import main
from rocmport.errors import EXIT_USAGE
from tests.helpers.refresh import Ported
from tests.helpers.sync import g

# (command and options before the value, the option taking the value, what comes after)
OPTIONS = [
    (["bot", "--once", "--no-verify"], "--push", []),
    (["sync", "--no-bridge"], "--ref", []),
    (["sync", "--ref", "v0.16"], "--bridge-ref", []),
    (["refresh", "--no-verify"], "--to", []),
    (["bot", "--once", "--no-verify"], "--lines", []),
    (["bot", "--once", "--no-verify"], "--track", []),
]


def payloads(marker: Path) -> list[str]:
    return [
        f"--upload-pack=touch {marker};false",
        f"--receive-pack=touch {marker}",
        f"--exec=touch {marker}",
        f"-c core.sshCommand=touch {marker}",
        f"--output={marker}",
        "-",
        "--",
    ]


def snapshot(root: Path) -> tuple[list[str], str, str]:
    """Every path under the project (what a run could have created), its refs and its status."""
    files = sorted(str(p.relative_to(root)) for p in root.rglob("*") if ".git" not in p.parts)
    return files, g(root, "for-each-ref", "--format=%(refname) %(objectname)"), g(root, "status", "--porcelain")


@pytest.fixture()
def port(tmp_path, monkeypatch) -> Ported:
    p = Ported(tmp_path, monkeypatch)
    p.tag({"docs/index.md": "x\n"}, "core_v0.17.0", "0.17.0")  # a new release: the bot would refresh
    return p


def run_hostile(port: Ported, capsys, before: list[str], option: str, after: list[str], value: str) -> tuple[int, str]:
    rc = main(["-C", str(port.root), *before, option, value, *after])
    return rc, capsys.readouterr().err


def test_bot_push_shaped_like_an_option_is_refused_before_any_refresh(port, tmp_path, capsys):
    """The issue's case: git took `--push '--upload-pack=touch X;false'` as an option and ran it,
    after a whole refresh (exit 1, the file there)."""
    marker = tmp_path / "pwned"
    was = snapshot(port.root)
    rc, err = run_hostile(
        port, capsys, ["bot", "--once", "--no-verify"], "--push", [], f"--upload-pack=touch {marker};false"
    )
    assert rc == EXIT_USAGE and err.startswith("rocmport: error: --push '--upload-pack=") and "option" in err, err
    assert not marker.exists() and snapshot(port.root) == was
    assert not (port.root / "build" / "refresh").exists()  # refused before the refresh, not after it


@pytest.mark.parametrize(("before", "option", "after"), OPTIONS, ids=[f"{b[0]} {o}" for b, o, _ in OPTIONS])
def test_every_option_that_reaches_git_refuses_option_shaped_values(port, tmp_path, capsys, before, option, after):
    marker = tmp_path / "pwned"
    was = snapshot(port.root)
    for value in payloads(marker):
        rc, err = run_hostile(port, capsys, before, option, after, value)
        assert rc == EXIT_USAGE, (option, value, err)
        # one error line: rocmport's, or click's own for a choice (--track)
        assert len([ln for ln in err.splitlines() if ln.startswith(("rocmport: error:", "Error:"))]) == 1, err
        assert not marker.exists() and snapshot(port.root) == was, (option, value)


def test_a_remote_url_shaped_like_an_option_is_refused(port, tmp_path, capsys):
    marker = tmp_path / "pwned"
    rc, err = run_hostile(
        port,
        capsys,
        ["sync", "--ref", "v0.16", "--no-bridge"],
        "--remote",
        [],
        f"megatron-lm=--upload-pack=touch {marker}",
    )
    assert rc == EXIT_USAGE and "may not start with '-'" in err and not marker.exists()


def test_a_push_to_a_real_remote_still_works(port, tmp_path, capsys):
    """The check refuses option shapes only: a remote path is pushed to (through `--`)."""
    remote = tmp_path / "remote.git"
    g(tmp_path, "init", "-q", "--bare", str(remote))
    assert main(["-C", str(port.root), "bot", "--once", "--no-verify", "--push", str(remote)]) == 0, (
        capsys.readouterr().err
    )
    assert "rocmport/refresh-core_v0.17.0" in g(remote, "branch", "--list")


def test_git_reads_option_shaped_operands_as_operands(tmp_path):
    """The calls themselves: with `--` / `--end-of-options`, git takes the value as a name, whatever reaches it."""
    from rocmport.gitutil import GitError, git, rev_parse
    from rocmport.refresh.bot import push

    repo = tmp_path / "r"
    g(tmp_path, "init", "-q", str(repo))
    g(repo, "commit", "-q", "--allow-empty", "-m", "x")
    marker = tmp_path / "pwned"
    assert rev_parse(f"--output={marker}", repo) is None
    with pytest.raises(GitError):
        git("ls-remote", "--", f"--upload-pack=touch {marker}", cwd=repo)
    with pytest.raises(Exception):  # refused by check_operand before git, whatever the caller checked
        push(repo, f"--upload-pack=touch {marker}", "main", warn=print)
    assert not marker.exists()


OPTION_SHAPED = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), max_size=40
).map(lambda s: "-" + s)
SEEN: dict[str, int] = {}


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(choice=st.sampled_from(OPTIONS[:4]), value=OPTION_SHAPED)
def test_option_shaped_values_never_reach_git_property(port, tmp_path, capsys, choice, value):
    before, option, after = choice
    SEEN[option] = SEEN.get(option, 0) + 1
    marker = tmp_path / "pwned"
    rc, err = run_hostile(port, capsys, before, option, after, value.replace("MARKER", str(marker)))
    assert rc == EXIT_USAGE, (option, value, err)
    assert "Traceback" not in err and not marker.exists()
    assert not (port.root / "build" / "refresh").exists()


def test_the_property_fed_every_option():
    if not SEEN:
        pytest.skip("run with the property test")
    print(f"\noption-shaped examples per option: {dict(sorted(SEEN.items()))}")
    assert set(SEEN) == {o for _, o, _ in OPTIONS[:4]}


@pytest.mark.parametrize("field", ["resolved_ref", "requested_ref", "commit"])
def test_apply_and_status_refuse_an_option_shaped_ref_in_the_lock(port, tmp_path, capsys, field):
    """apply has no option that reaches git; what it gives git comes from upstream.lock, checked on load."""
    import yaml

    marker = tmp_path / "pwned"
    lock = port.root / "upstream.lock"
    data = yaml.safe_load(lock.read_text())
    data["upstreams"]["megatron-lm"][field] = f"--upload-pack=touch {marker}"
    lock.write_text(yaml.safe_dump(data))
    for args in (["apply"], ["status"]):
        rc = main(["-C", str(port.root), *args])
        err = capsys.readouterr().err
        assert rc == EXIT_USAGE and str(lock) in err and field in err, (args, err)
    assert not marker.exists()
