"""The one error boundary (rocmport.cli.main), through real `python -m rocmport` processes: a user
never sees a traceback; a bug exits 70 with its traceback in a log file; a failing git or file
system exits 1 in one line; bad input stays 2."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

from rocmport.errors import EXIT_INTERNAL, EXIT_PROBLEM, EXIT_USAGE
from tests.helpers.patches import Project
from tests.helpers.sync import build_mlm

REPO = Path(__file__).resolve().parents[1]


def rocmport(*args: str, cache: Path, code: str | None = None) -> subprocess.CompletedProcess:
    """``python -m rocmport ARGS``, or ``python -c CODE`` (which calls rocmport.cli.main itself)."""
    env = {
        **os.environ,
        "ROCMPORT_CACHE_DIR": str(cache),
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    cmd = [sys.executable, "-c", code, *args] if code else [sys.executable, "-m", "rocmport", *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)


# A command with a bug in it, registered the way rocmport's own are (a module under
# rocmport.commands exposing `command`), run through the real entry point.
BUGGY = textwrap.dedent("""\
    import sys, types, click
    from rocmport import cli

    @click.command("buggy")
    def command():
        {}["missing key"]

    sys.modules["rocmport.commands.buggy"] = types.SimpleNamespace(command=command)
    cli.COMMANDS["buggy"] = "buggy"
    sys.exit(cli.main(sys.argv[1:]))
""")


def test_a_bug_exits_70_with_one_line_and_the_traceback_in_a_log_file(tmp_path):
    proc = rocmport("buggy", cache=tmp_path / "cache", code=BUGGY)
    assert proc.returncode == EXIT_INTERNAL == 70
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert proc.stderr.startswith("rocmport: internal error: KeyError: 'missing key'; the traceback is in ")
    logs = list((tmp_path / "cache" / "logs").glob("crash-*.log"))
    assert len(logs) == 1 and str(logs[0]) in proc.stderr
    text = logs[0].read_text()
    assert (
        "Traceback (most recent call last)" in text and "KeyError: 'missing key'" in text and "argv: ['buggy']" in text
    )


def test_a_bug_logs_to_the_temporary_directory_when_the_cache_cannot_be_written(tmp_path):
    cache = tmp_path / "cache"
    cache.write_text("a file where the cache directory should be\n")
    proc = rocmport("buggy", cache=cache, code=BUGGY)
    assert proc.returncode == EXIT_INTERNAL and "Traceback" not in proc.stderr
    log = Path(proc.stderr.split("the traceback is in ", 1)[1].split(";", 1)[0])
    assert log.parent == Path(tempfile.gettempdir()) and "KeyError" in log.read_text()
    log.unlink()


def test_a_failing_git_exits_1_in_one_line(tmp_path, monkeypatch):
    """The work tree borrows its objects from the cache; with the cache gone, git fails in status."""
    proj = Project(tmp_path, monkeypatch)
    assert rocmport("-C", str(proj.root), "apply", cache=proj.cache).returncode == 0
    shutil.rmtree(proj.cache)
    proc = rocmport("-C", str(proj.root), "status", cache=proj.cache)
    assert proc.returncode == EXIT_PROBLEM
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert proc.stderr.startswith("rocmport: error: git ") and "failed: " in proc.stderr


def test_a_directory_where_the_lock_goes_is_refused_naming_the_path(tmp_path):
    """The one writer replaces regular files only (#41): a directory at the lock's path is refused,
    exit 2, naming it (it was exit 1, the rename's "Is a directory"). A full disk: test_output_paths.py."""
    mlm = tmp_path / "up" / "mlm"
    build_mlm(mlm)
    project = tmp_path / "project"
    (project / "upstream.lock" / "not-a-file").mkdir(parents=True)  # a directory where the lock goes
    proc = rocmport(
        "-C",
        str(project),
        "sync",
        "--ref",
        "v0.16",
        "--no-bridge",
        "--remote",
        f"megatron-lm={mlm}",
        cache=tmp_path / "cache",
    )
    assert proc.returncode == EXIT_USAGE
    assert "Traceback" not in proc.stderr
    assert (
        proc.stderr.strip().splitlines()[-1].startswith("rocmport: error: ")
        and f"{project / 'upstream.lock'}: is a directory" in proc.stderr
    )


def test_bad_input_stays_2(tmp_path):
    proc = rocmport("-C", str(tmp_path), "apply", cache=tmp_path / "cache")
    assert proc.returncode == EXIT_USAGE
    assert (
        proc.stderr
        == f"rocmport: error: {tmp_path.resolve() / 'upstream.lock'}: no lock file; run `rocmport sync --ref REF` first\n"
    )


def test_the_command_listing_is_each_commands_own_first_line():
    """`rocmport --help` lists the commands from cli.SHORT_HELP (importing none of them): each entry
    is the first line of that command's docstring, as click would show it."""
    import importlib

    from rocmport import cli

    assert set(cli.SHORT_HELP) == set(cli.COMMANDS)
    for name, module in cli.COMMANDS.items():
        command = importlib.import_module(f"rocmport.commands.{module}").command
        assert cli.SHORT_HELP[name] == (command.help or "").split("\n\n")[0].strip(), f"{name}: update cli.SHORT_HELP"
