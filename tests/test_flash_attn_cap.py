"""Coverage item E5: ROCm TE turns its flash-attention path off for a flash-attn newer than its cap
(FlashAttentionUtils.max_version, 2.8.3), so each line's ROCm component matrix pins flash_attn at
most there and `rocmport doctor` names a newer install out of range (with real dist-info metadata in a
site directory, as pip leaves it). The matrix is the ROCm one: upstream's CUDA manifests are not it."""

from __future__ import annotations

import pytest

from tests.test_doctor import _report, fake_dist

LINES = ("v0.15", "v0.16", "v0.17", "v0.18", "v0.19")


@pytest.mark.parametrize("line", LINES)
def test_newer_flash_attn_than_rocm_te_accepts_is_out_of_range(tmp_path, monkeypatch, line):
    built = tmp_path / "built"
    fake_dist(built, "flash_attn", "2.8.0.post2", "flash_attn", ["gfx942"])  # what the recipe builds (v2.8.0-cktile)
    row = _report(monkeypatch, built, line)["flash_attn"]
    assert row.status == "ok", row.detail
    newer = tmp_path / "newer"
    fake_dist(newer, "flash_attn", "3.0.0.post1", "flash_attn", ["gfx942"])  # the version Primus raises TE's cap to
    row = _report(monkeypatch, newer, line)["flash_attn"]
    assert row.status == "out-of-range" and "3.0.0.post1 is outside" in row.detail and "<=2.8.3" in row.detail
