"""Progress output: one line per update in a log, the elapsed time of each step, and on a terminal
nothing glued onto the spinner's line."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from rocmport import output

REPO = Path(__file__).resolve().parents[1]
STEP = (
    "from rocmport import output\nimport time\nwith output.progress('stage 3: unit tests and the unported baseline'):\n"
    "    time.sleep(1.3)\n    output.info('port [1/7] tests/unit_tests/test_a.py: 3 passed (rank 0), 1 s elapsed')\n"
    "    time.sleep(0.3)\n"
)


def test_a_log_gets_one_line_per_update_and_the_step_s_elapsed_time():
    proc = subprocess.run(
        [sys.executable, "-c", STEP],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=60,
    )
    assert proc.stderr.splitlines() == [
        "... stage 3: unit tests and the unported baseline",
        "port [1/7] tests/unit_tests/test_a.py: 3 passed (rank 0), 1 s elapsed",
        "... stage 3: unit tests and the unported baseline: done in 1 s",
    ]


@pytest.mark.skipif(not hasattr(os, "openpty"), reason="needs a pseudo-terminal")
def test_on_a_terminal_a_line_goes_above_the_spinner_never_onto_it():
    """v0.19 on a TTY: "…baselineport [1/7] …", the progress line glued onto the spinner's."""
    master, slave = os.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-c", STEP],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env={**os.environ, "PYTHONPATH": str(REPO), "TERM": "xterm", "COLUMNS": "100"},
    )
    os.close(slave)
    raw = b""
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:  # the child closed its end
            break
        if not chunk:
            break
        raw += chunk
    os.close(master)
    assert proc.wait(timeout=60) == 0
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", raw.decode())
    segments = [s.strip() for s in re.split(r"[\r\n]", text) if s.strip()]
    assert "port [1/7] tests/unit_tests/test_a.py: 3 passed (rank 0), 1 s elapsed" in segments, segments
    assert any(s.endswith("stage 3: unit tests and the unported baseline 0:00:01") for s in segments), (
        segments
    )  # elapsed time


def test_elapsed():
    assert [output.elapsed(s) for s in (0.4, 59, 125, 3725)] == ["0 s", "59 s", "2m05s", "1h02m"]


def test_at_80_columns_the_key_column_stays_whole():
    """A patch name in apply's table at 80 columns was cut into pieces; the other columns wrap instead."""
    import io

    from rich.console import Console

    name = "0003-transformer-engine-version-gates-on-rocm.patch"
    buf = io.StringIO()
    Console(width=80, file=buf, color_system=None).print(
        output.build_table(
            ["patch", "bucket", "offsets", "files", "detail"],
            [[name, "clean", "0", "megatron/core/a.py, megatron/core/b.py", "x " * 40]],
        )
    )
    assert any(name in line for line in buf.getvalue().splitlines()), buf.getvalue()


def test_a_long_step_says_how_far_it_is_in_a_log_at_most_every_few_seconds_and_at_its_end():
    script = (
        "from rocmport import output\nimport time\noutput.LOG_EVERY = 0.25\n"
        "output.advance('outside any step: nothing')\n"
        "with output.progress('applying the megatron-lm port'):\n"
        "    for i in range(1, 31):\n        time.sleep(0.02)\n        output.advance(f'codemods: {i}/30 files')\n"
        "    output.advance('codemods: 30/30 files', final=True)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=60,
    )
    lines = proc.stderr.splitlines()
    assert lines[0] == "... applying the megatron-lm port" and lines[-1].startswith(
        "... applying the megatron-lm port: done in "
    )
    updates = lines[1:-1]
    assert 1 <= len(updates) <= 5, lines  # 0.6 s of updates, a line at most every 0.25 s, and the final one
    assert updates[-1] == "... applying the megatron-lm port: codemods: 30/30 files, 0 s elapsed"
    assert all(
        re.fullmatch(r"\.\.\. applying the megatron-lm port: codemods: \d+/30 files, \d+ s elapsed", u) for u in updates
    ), updates


def test_the_codemod_runner_reports_files_done_of_total(tmp_path):
    """A cold v0.19 apply showed one spinner line for 18 minutes: the runner now says how far it is."""
    tree = tmp_path / "tree"
    (tree / "megatron" / "core").mkdir(parents=True)
    for i in range(12):
        (tree / "megatron" / "core" / f"m{i}.py").write_text("from apex.optimizers import FusedAdam\n\nx = FusedAdam\n")
    script = (
        "import sys\nfrom rocmport import output\nfrom rocmport.codemods.runner import compute_layers\n"
        "with output.progress('running codemods'):\n"
        "    r = compute_layers(sys.argv[1], [{'name': 'apex-to-torch'}], jobs=2, cache_dir=sys.argv[2])\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script, str(tree), str(tmp_path / "cache")],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "... running codemods: codemods: 12/12 files (12 in the tree), " in proc.stderr, proc.stderr
    # a second run: every file from the cache, and said so
    proc = subprocess.run(
        [sys.executable, "-c", script, str(tree), str(tmp_path / "cache")],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=300,
    )
    assert "codemods: 0/12" not in proc.stderr and "running codemods: done in" in proc.stderr


def test_a_table_in_a_log_fits_100_columns(capsys):
    """Not on a terminal (a log, a pipe), a table is 100 columns wide at most (it was 160): long cells
    wrap, the key column stays whole."""
    why = "CK flash-attention targets gfx90a, gfx942, gfx950; install or rebuild it for this arch (see the table) " * 2
    output.table(["topic", "use", "why"], [["flash-attention", "not usable here yet: install the CK build", why]])
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= output.LOG_WIDTH == 100
    assert "│ flash-attention │" in out


def test_a_step_that_says_nothing_still_gets_a_line_every_few_seconds_in_a_log():
    """verify's stage 1 ran 49 s and stage 5 3m12s with no line between its start and its end (the
    main job on 2 loaded cores): a step silent for LOG_EVERY seconds says it is still running."""
    script = (
        "from rocmport import output\nimport time\noutput.LOG_EVERY = 0.4\n"
        "with output.progress('stage 5: Megatron-Bridge imports and GPTModelProvider training tp2×pp2'):\n"
        "    time.sleep(1.5)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=60,
    )
    lines = proc.stderr.splitlines()
    beats = [ln for ln in lines[1:-1] if ln.endswith(" elapsed")]
    assert beats == lines[1:-1] and 2 <= len(beats) <= 4, lines
    assert all(re.fullmatch(r"\.\.\. stage 5: .* tp2×pp2: still running, \d+ s elapsed", b) for b in beats), beats
    assert lines[-1].startswith("... stage 5: Megatron-Bridge imports and GPTModelProvider training tp2×pp2: done in ")
