"""The `rocm:` component matrix of every Megatron-LM line: it exists, it parses, bad entries are
refused with the file and key (exit 2), and `rocmport patches list` shows it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rocmport.cli import main
from rocmport import components, output
from rocmport.patches.series import all_series, load_series

REPO = Path(__file__).resolve().parents[1]
PATCHSETS = REPO / "patchsets"
LINES = ("v0.15", "v0.16", "v0.17", "v0.18", "v0.19")


def test_every_megatron_lm_line_has_a_matrix_with_its_sources():
    lines = {s.line: s for s in all_series(PATCHSETS, "megatron-lm")}
    assert set(LINES) <= set(lines)
    for line in LINES:
        series = lines[line]
        m = series.rocm
        assert m is not None, line
        assert {"transformer_engine", "flash_attn", "apex"} <= set(m.components), line
        te = m.components["transformer_engine"]
        assert te.required and te.git == "https://github.com/ROCm/TransformerEngine.git"
        assert te.admits("2.10.0") or te.admits("2.17.0")
        assert not te.admits("2.8.0")  # below every line's declared minimum (2.9.0a0)
        # Every choice carries its source: each component block has comments naming where it comes from.
        text = series.path.read_text()
        block = text[text.index("rocm:") :]
        for name in m.components:
            part = block[block.index(f"    {name}:") :]
            assert "#" in part.split("\n    ", 3)[1] + part.split("\n    ", 3)[2], (line, name)
    # grouped_gemm only where upstream still imports it (grouped_gemm_util.py exists at v0.15/v0.16).
    assert "grouped_gemm" in lines["v0.16"].rocm.components and "grouped_gemm" not in lines["v0.17"].rocm.components
    # Python in the tag agrees with the lines that require 3.12.
    for line in ("v0.17", "v0.18", "v0.19"):
        assert lines[line].rocm.python == "3.12" and "py3.12" in lines[line].rocm.base_tag


def _matrix() -> dict:
    return yaml.safe_load((PATCHSETS / "megatron-lm" / "v0.16" / "series").read_text())["rocm"]


@pytest.mark.parametrize(
    "edit, key",
    [
        (
            lambda m: m["components"]["transformer_engine"].update(versions=">=2.x"),
            "rocm.components.transformer_engine.versions",
        ),
        (
            lambda m: m["components"]["flash_attn"]["archs"]["builds"].append("sm_90"),
            "rocm.components.flash_attn.archs.builds",
        ),
        (
            lambda m: m["components"]["apex"]["build_env"].update({"bad-name": "1"}),
            "rocm.components.apex.build_env.bad-name",
        ),
        (
            lambda m: m["components"]["apex"]["build_env"].update({"APEX_BUILD_CPP_OPS": True}),
            "rocm.components.apex.build_env.APEX_BUILD_CPP_OPS",
        ),
        (
            lambda m: m["components"]["transformer_engine"]["source"].update(git="ext::sh -c touch% /tmp/x"),
            "rocm.components.transformer_engine.source.git",
        ),
        (
            lambda m: m["components"]["transformer_engine"]["source"].update(ref="--upload-pack=x"),
            "rocm.components.transformer_engine.source.ref",
        ),
        (lambda m: m["components"].update(cudnn={}), "rocm.components.cudnn"),
        (lambda m: m["components"]["flash_attn"].pop("smoke"), "rocm.components.flash_attn.smoke"),
        (lambda m: m["components"]["flash_attn"].update(smoke="print(1)"), "rocm.components.flash_attn.smoke"),
        (
            lambda m: m["components"]["flash_attn"]["archs"]["refuses"]["gfx1100"].update(instead="flash_attn:cute"),
            "rocm.components.flash_attn.archs.refuses.gfx1100.instead",
        ),
        (
            lambda m: m["components"]["grouped_gemm"]["build_env"].update(X="{nproc}"),
            "rocm.components.grouped_gemm.build_env.X",
        ),
        (lambda m: m["base_image"].update(python=3.12), "rocm.base_image.python"),
        (lambda m: m["base_image"].update(python="3.10"), "rocm.base_image.python"),
        (lambda m: m["base_image"].update(tag=""), "rocm.base_image.tag"),
        (lambda m: m.update(extra=1), "rocm.extra"),
        (lambda m: m.update(package_index="http://insecure.example/simple"), "rocm.package_index"),
        (
            lambda m: m["components"]["apex"].update(build_requires=["torch==2.9"]),
            "rocm.components.apex.build_requires",
        ),
        (
            lambda m: m["components"]["apex"].update(build_requires=["ninja >>= 1"]),
            "rocm.components.apex.build_requires",
        ),
    ],
)
def test_schema_names_the_file_and_key(edit, key):
    data = _matrix()
    edit(data)
    matrix, errors = components.validate(data, "patchsets/megatron-lm/v0.16/series")
    assert matrix is None and errors
    assert any(e.startswith(f"patchsets/megatron-lm/v0.16/series: key '{key}'") for e in errors), errors


def _project_copy(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    shutil.copytree(PATCHSETS, root / "patchsets")
    return root


def test_patches_list_shows_the_matrix_and_a_bad_one_exits_2(tmp_path, capsys, monkeypatch):
    root = _project_copy(tmp_path)
    monkeypatch.setattr(output, "LOG_WIDTH", 200)  # the cells' words whole, to find them (a log gets 100, folded)
    assert main(["-C", str(root), "patches", "list", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    by_line = {d["line"]: d for d in data["series"] if d["upstream"] == "megatron-lm"}
    assert by_line["v0.16"]["rocm"]["components"]["transformer_engine"]["source"].endswith("@release_v2.10_rocm")
    assert by_line["v0.19"]["rocm"]["base_image"].startswith("rocm/pytorch:")
    assert main(["-C", str(root), "patches", "list"]) == 0
    human = capsys.readouterr().out
    assert "transformer_engine" in human and "release_v2.10_rocm" in human and "flash_attn" in human
    # A bad entry: the real CLI in a subprocess, exit 2 and one line naming the file and the key.
    series = root / "patchsets" / "megatron-lm" / "v0.17" / "series"
    series.write_text(series.read_text().replace('versions: ">=2.9.0a0,<2.15"', 'versions: "two point nine"'))
    proc = subprocess.run(
        [sys.executable, "-m", "rocmport", "-C", str(root), "patches", "list"], capture_output=True, text=True
    )
    assert proc.returncode == 2, proc.stderr
    assert f"{series}: key 'rocm.components.transformer_engine.versions'" in proc.stderr


def test_choose_refuses_what_an_arch_cannot_build_naming_the_alternative():
    m = load_series(PATCHSETS / "megatron-lm" / "v0.16" / "series").rocm
    with pytest.raises(
        components.BadInput, match=r"gfx1100: flash_attn does not build there .*use --components apex,flash_attn:triton"
    ):
        components.choose(m, "apex,flash_attn", ["gfx1100"])
    with pytest.raises(
        components.BadInput, match=r"gfx90a: transformer_engine does not build there .*#439.*--transformer-impl local"
    ):
        components.choose(m, "all", ["gfx942", "gfx90a"])
    chosen, warnings = components.choose(m, "apex,flash_attn:triton", ["gfx1100"])
    assert [c.label for c in chosen] == ["apex", "flash_attn:triton"] and any(
        "apex on gfx1100: unverified" in w for w in warnings
    )
    assert components.choose(m, "none", ["gfx906"]) == ([], [])
    with pytest.raises(components.BadInput, match="not a gfx arch"):
        components.parse_archs("sm_90")
    with pytest.raises(components.BadInput, match="no variant 'cute'"):
        components.choose(m, "flash_attn:cute", ["gfx942"])
