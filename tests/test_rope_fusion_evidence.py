"""Coverage item E7 is open with evidence that a ROCm user does not meet it, and this checks the
evidence on each line's release and on AMD's 0.15 port (the real files of a Megatron-LM mirror):
upstream's default RoPE path is already TE's fused RoPE wherever TE is installed, with no HIP
branch (so the HIP simulation and the CUDA control take the same path), the port's codemods leave it
alone, and AMD's `--disable-te-fused-rope` reaches nothing in its 0.15 port.

    ROCMPORT_TEST_MLM_MIRROR=/path/to/Megatron-LM.git python -m pytest -q -m mirror tests/test_rope_fusion_evidence.py"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml

MLM = os.environ.get("ROCMPORT_TEST_MLM_MIRROR")
REPO = Path(__file__).resolve().parents[1]
RELEASES = {
    "v0.15": "core_v0.15.3",
    "v0.16": "core_v0.16.1",
    "v0.17": "core_v0.17.1",
    "v0.18": "core_v0.18.2",
    "v0.19": "core_v0.19.0",
}
ROPE = "megatron/core/models/common/embeddings/rope_utils.py"
TE = "megatron/core/extensions/transformer_engine.py"
needs_mirror = pytest.mark.skipif(not MLM, reason="set ROCMPORT_TEST_MLM_MIRROR to a local Megatron-LM mirror")


def show(ref: str, path: str) -> str:
    return subprocess.run(
        ["git", "--git-dir", MLM, "show", f"{ref}:{path}"], capture_output=True, text=True, check=True
    ).stdout


def function(source: str, name: str) -> ast.FunctionDef:
    return next(n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.FunctionDef) and n.name == name)


def calls(node: ast.AST) -> list[ast.Call]:
    return [n for n in ast.walk(node) if isinstance(n, ast.Call)]


@pytest.mark.mirror
@needs_mirror
@pytest.mark.parametrize("line", list(RELEASES))
def test_upstream_default_rope_is_tes_fused_rope(line):
    tag = RELEASES[line]
    rope = show(tag, ROPE)
    # rope_utils takes the fused function from the TE extension and has no HIP branch of its own.
    assert "from megatron.core.extensions.transformer_engine import fused_apply_rotary_pos_emb" in rope
    assert not re.search(r"\bhip\b|is_hip|IS_HIP", rope)
    apply = function(rope, "apply_rotary_pos_emb")
    fusion = next(
        n for n in ast.walk(apply) if isinstance(n, ast.If) and ast.unparse(n.test) == "config.apply_rope_fusion"
    )
    assert any(ast.unparse(c.func) == "fused_apply_rotary_pos_emb" for c in calls(fusion))
    # TE's fused kernel: apply_rotary_pos_emb(..., fused=True) in every branch of the extension's wrapper.
    te_calls = [
        c
        for c in calls(function(show(tag, TE), "fused_apply_rotary_pos_emb"))
        if ast.unparse(c.func) == "apply_rotary_pos_emb"
    ]
    assert te_calls and all(
        any(k.arg == "fused" and ast.unparse(k.value) == "True" for k in c.keywords) for c in te_calls
    )
    # On by default for RoPE: `--no-rope-fusion` is the opt-out (store_false into apply_rope_fusion).
    args = show(tag, "megatron/training/arguments.py")
    assert re.search(r"'--no-rope-fusion', action='store_false',(.|\n){0,200}dest='apply_rope_fusion'", args)


@pytest.mark.parametrize("line", list(RELEASES))
def test_the_port_leaves_the_rope_path_alone(line):
    sites = json.loads((REPO / "docs/coverage/sites.json").read_text())[line]
    assert not [s for reports in sites.values() for s in reports if s[0] == ROPE]
    items = {i["id"]: i for i in yaml.safe_load((REPO / "docs/coverage/items.yaml").read_text())}
    assert "does not meet it" in items["E7"]["open"]


@pytest.mark.mirror
@needs_mirror
def test_amds_flag_reaches_nothing_in_its_015_port():
    ref = "refs/pull/3318/head"
    hits = subprocess.run(
        ["git", "--git-dir", MLM, "grep", "-l", "disable_te_fused_rope", ref, "--", "megatron"],
        capture_output=True,
        text=True,
    ).stdout.split()
    assert [h.split(":", 1)[1] for h in hits] == ["megatron/training/arguments.py"]
    config = ast.parse(show(ref, "megatron/core/transformer/transformer_config.py"))
    fields = {n.target.id for n in ast.walk(config) if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    assert "apply_rope_fusion" in fields and "disable_te_fused_rope" not in fields
    # ... and the flag only ever goes into TransformerConfig(**kw_args): a TypeError when it is given.
    args = show(ref, "megatron/training/arguments.py")
    assert "kw_args['disable_te_fused_rope'] = args.disable_te_fused_rope" in args
