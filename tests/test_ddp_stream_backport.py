"""Coverage item E2: v0.15's get_model() builds DDP on a side stream that is not ordered against the
default stream; patch 0004 backports upstream's v0.16 fix (4ba9f469). Checked on the real file of
the line's release: the patch applies, the patched statements are v0.16.1's, and run in a process
verify would start (HIP simulation, and the CUDA control) they order the streams as v0.16 does,
where the unpatched v0.15 code does not.

    ROCMPORT_TEST_MLM_MIRROR=/path/to/Megatron-LM.git python -m pytest -q -m mirror tests/test_ddp_stream_backport.py"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import textwrap
from pathlib import Path

import pytest

from rocmport.patches.series import load_series
from rocmport.verify.runtime import hip_sim

MLM = os.environ.get("ROCMPORT_TEST_MLM_MIRROR")
REPO = Path(__file__).resolve().parents[1]
REL = "megatron/training/training.py"
PATCH = "0004-training-ddp-side-stream-waits-for-default-stream.patch"
pytestmark = [
    pytest.mark.mirror,
    pytest.mark.skipif(not MLM, reason="set ROCMPORT_TEST_MLM_MIRROR to a local Megatron-LM mirror"),
]


def show(tag: str) -> str:
    return subprocess.run(
        ["git", "--git-dir", MLM, "show", f"{tag}:{REL}"], capture_output=True, text=True, check=True
    ).stdout


def patched_v015(tmp_path: Path) -> str:
    """core_v0.15.3's training.py with every patch of the v0.15 recipe that touches it."""
    series = load_series(REPO / "patchsets/megatron-lm/v0.15/series")
    assert PATCH in [p.name for p in series.patches]
    (tmp_path / REL).parent.mkdir(parents=True)
    (tmp_path / REL).write_text(show("core_v0.15.3"))
    for patch in series.patches:
        subprocess.run(["git", "apply", "--include", REL, "-"], input=patch.diff, text=True, cwd=tmp_path, check=True)
    return (tmp_path / REL).read_text()


def ddp_block(source: str) -> list[ast.stmt]:
    """get_model()'s statements from the stream set-up through the DDP wrap (and the wait after it)."""
    fn = next(n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.FunctionDef) and n.name == "get_model")
    for node in ast.walk(fn):
        body = getattr(node, "body", None)
        if not isinstance(body, list):
            continue
        for i, stmt in enumerate(body):
            if isinstance(stmt, ast.With) and "torch.cuda.stream" in ast.unparse(stmt.items[0].context_expr):
                start = i - 2 if i >= 2 and "ddp_stream" in ast.unparse(body[i - 2]) else i
                end = i + 2 if i + 1 < len(body) and "wait_stream(ddp_stream)" in ast.unparse(body[i + 1]) else i + 1
                return body[start:end]
    raise AssertionError("get_model has no DDP stream block")


def test_patched_v015_is_upstreams_v016_fix(tmp_path):
    before, after, fixed = (
        ddp_block(show("core_v0.15.3")),
        ddp_block(patched_v015(tmp_path)),
        ddp_block(show("core_v0.16.1")),
    )
    assert [ast.dump(s) for s in after] == [ast.dump(s) for s in fixed]
    assert len(before) == 1 and "wait_stream" not in ast.unparse(before[0])


# The block's statements run with recording streams and a recording DDP: what is queued where.
RECORD = r"""
import json, torch
events = []
class Stream:
    def __init__(self, name="side"): self.name = name
    def wait_stream(self, other): events.append(f"{self.name} waits for {other.name}")
DEFAULT = Stream("default")
current = [DEFAULT]
class stream:
    def __init__(self, s): self.s = s
    def __enter__(self): current.append(self.s)
    def __exit__(self, *a): current.pop()
torch.cuda.Stream, torch.cuda.current_stream, torch.cuda.stream = Stream, (lambda: current[-1]), stream
def DP(module=None, **kw):
    events.append(f"DDP({module}) on {current[-1].name}")
    return module
config = ddp_config = args = None
model = ["chunk0", "chunk1"]
class args: overlap_param_gather_with_optimizer_step = False
"""


def run_block(tmp_path: Path, block: list[ast.stmt], hip: bool) -> list[str]:
    from tests.test_hip_sim import run_probe

    code = RECORD + textwrap.dedent("\n".join(ast.unparse(s) for s in block)) + "\nprint(json.dumps(events))\n"
    proc = run_probe(
        tmp_path / ("hip" if hip else "cuda"), hip_sim.child_env(hip_sim.DEFAULT_VERSION) if hip else {}, code=code
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.torch
def test_streams_ordered_on_hip_and_cuda(tmp_path):
    ordered = ["side waits for default", "DDP(chunk0) on side", "DDP(chunk1) on side", "default waits for side"]
    block = ddp_block(patched_v015(tmp_path / "tree"))
    for hip in (True, False):
        (tmp_path / ("hip" if hip else "cuda")).mkdir()
        assert run_block(tmp_path, block, hip) == ordered
    # Upstream's v0.15: DDP on the side stream with nothing ordering it against the default stream.
    (tmp_path / "up" / "hip").mkdir(parents=True)
    up = ddp_block(show("core_v0.15.3"))
    assert run_block(tmp_path / "up", up, hip=True) == ["DDP(chunk0) on side", "DDP(chunk1) on side"]
