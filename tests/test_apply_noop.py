"""The no-op `rocmport apply` (nothing changed since the last one) is decided without loading libcst or
a codemod, and says what the full apply says; `rocmport --help` and `status` load neither libcst nor
torch; apply reads only the selected line's series. Behaviour, not timing: the time is a figure of
benchmarks/bench_noop_apply.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rocmport.config import load_settings
from rocmport.port.apply import apply_project
from tests.helpers.patches import Project, make_patch

REPO = Path(__file__).resolve().parents[1]
HEAVY = ("libcst", "torch", "rocmport.codemods.catalog", "rocmport.codemods.runner")

# rocmport.cli.main as `python -m rocmport` runs it, then the heavy modules it left loaded, as JSON.
RUNNER = """\
import json, sys
from rocmport.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
print(json.dumps({"code": code, "heavy": sorted({m.split(".")[0] if m.startswith(("libcst", "torch")) else m
                                                 for m in sys.modules if m.startswith(%r)})}))
""" % (HEAVY,)


@pytest.fixture()
def proj(tmp_path, monkeypatch):
    p = Project(tmp_path, monkeypatch)
    p.write_series(
        {"0001-f.patch": make_patch(p.up, {"megatron/core/utils.py": "x = 1\n"})},
        codemods=["apex-to-torch", "guard-nvidia-only-imports", "launch-env"],
    )
    return p


def run(proj: Project, *args: str) -> tuple[int, list[str], str, str]:
    """``rocmport ARGS`` in a fresh interpreter: exit code, heavy modules loaded, stdout (less the
    runner's line), stderr."""
    env = {
        **os.environ,
        "ROCMPORT_CACHE_DIR": str(proj.cache),
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.run(
        [sys.executable, "-c", RUNNER, *args], capture_output=True, text=True, env=env, timeout=300, cwd=proj.tmp
    )
    *out, last = proc.stdout.rstrip("\n").split("\n")
    result = json.loads(last)
    return result["code"], result["heavy"], "\n".join(out), proc.stderr


def test_a_noop_apply_loads_no_codemod_and_says_what_apply_says(proj):
    code, heavy, _, _ = run(proj, "-C", str(proj.root), "apply")
    assert code == 0 and "libcst" in heavy  # the real build ran the codemods (the check below can fail)
    code, heavy, _, err = run(proj, "-C", str(proj.root), "apply")
    assert code == 0 and heavy == [], heavy
    assert "megatron-lm: up to date (rocm/core_v0.16.1" in err and "nothing to do" in err
    code, heavy, out, _ = run(proj, "-C", str(proj.root), "apply", "--json")
    assert code == 0 and heavy == []
    # The same report the full apply gives for unchanged inputs (its own no-op answer).
    full = [r.to_dict() for r in apply_project(load_settings(proj.root), None, say=lambda _: None)]
    assert full[0]["noop"] is True
    assert json.loads(out) == {"upstreams": {"megatron-lm": full[0]}}


def test_a_changed_input_is_not_a_noop(proj):
    assert run(proj, "-C", str(proj.root), "apply")[0] == 0
    # A codemod's options change the inputs hash: the full apply runs and rebuilds.
    proj.write_series(
        {"0001-f.patch": make_patch(proj.up, {"megatron/core/utils.py": "x = 1\n"})},
        codemods=[
            "apex-to-torch",
            {"name": "guard-nvidia-only-imports", "options": {"packages": {"foo": "foo"}}},
            "launch-env",
        ],
    )
    code, heavy, _, err = run(proj, "-C", str(proj.root), "apply")
    assert code == 0 and "libcst" in heavy and "nothing to do" not in err
    # An uncommitted edit: never "up to date"; the full apply refuses, as it does for any edit.
    (proj.tree / "megatron/core/utils.py").write_text("edited\n")
    code, _, _, err = run(proj, "-C", str(proj.root), "apply")
    assert code == 2 and "uncommitted changes in megatron/core/utils.py" in err and "nothing to do" not in err


def test_help_and_status_load_neither_libcst_nor_torch(proj):
    code, heavy, out, _ = run(proj, "--help")
    assert code == 0 and heavy == [] and "apply    Check out the pinned commits" in out
    assert run(proj, "-C", str(proj.root), "apply")[0] == 0
    code, heavy, _, err = run(proj, "-C", str(proj.root), "status")
    assert code == 0 and heavy == [], heavy


def test_apply_reads_only_the_selected_series(proj):
    other = proj.root / "patchsets" / "megatron-lm" / "v0.17"
    other.mkdir()
    (other / "series").write_text(
        "upstream: megatron-lm\nline: v0.17\nversions: '>=0.17.0,<0.18.0'\npatches: [0001-gone.patch]\n"
    )
    # Another line's series names a patch file that is not there: that line is not built, so not read.
    code, _, _, err = run(proj, "-C", str(proj.root), "apply")
    assert code == 0, err
    # The selected series is read whole: the same fault there is refused.
    (proj.series_dir / "series").write_text(
        (proj.series_dir / "series").read_text().replace("0001-f.patch", "0001-gone.patch")
    )
    code, _, _, err = run(proj, "-C", str(proj.root), "apply")
    assert code == 2 and "0001-gone.patch" in err, err
