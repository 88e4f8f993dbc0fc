"""Hostile and broken input files: the lock, a series, a patch. Each is refused in one line naming the
file (and the key, line or byte), exit 2, before the work tree is touched."""

from __future__ import annotations

import os

import pytest

from rocmport.cli import main
from rocmport.errors import BadInput
from rocmport.inputs import decode, parse_yaml
from rocmport.patches.series import load_series, parse_patch
from rocmport.upstream.lock import Lock, Pin, load_lock, parse_lock, parse_lock_bytes
from tests.helpers.patches import LAYERS, Project, file_to_link_patch, link_patch, make_patch
from tests.helpers.sync import g

SHA = "55ac7082517c3878ae653c07c09c534b8aed49f6"


@pytest.fixture()
def proj(tmp_path, monkeypatch):
    return Project(tmp_path, monkeypatch)


def apply(proj, *args):
    return main(["-C", str(proj.root), "apply", *args])


def untouched(proj) -> bool:
    """Nothing of the work tree exists: the input was refused before apply cloned or reset anything."""
    return not proj.tree.exists()


# -- the one loader ------------------------------------------------------------------------------


def test_non_utf8_names_file_byte_and_line():
    with pytest.raises(BadInput) as err:
        decode(b"line one\nline \xc3( two\n", "f.yaml")
    assert str(err.value).startswith("f.yaml: not UTF-8 at byte 14 (line 2, byte 0xc3)")


@pytest.mark.parametrize(
    "text, what",
    [
        ("a: 1\na: 2\n", "at line 2 (duplicate key 'a' (first at line 1))"),
        ("x:\n  b: 1\n  b: 2\n", "at line 3 (duplicate key 'b'"),
        ("? [a, b]\n: 1\n", "a mapping key must be a plain value"),
        ("[" * 3000, "nested too deeply"),
        ("a: !!python/object:os.system x\n", "could not determine a constructor"),
    ],
)
def test_yaml_duplicates_and_oddities_are_one_line(text, what):
    with pytest.raises(BadInput) as err:
        parse_yaml(text, "f.yaml")
    assert what in str(err.value) and "\n" not in str(err.value)


def test_yaml_merge_may_still_be_overridden():
    assert parse_yaml("base: &b {a: 1}\nx:\n  <<: *b\n  a: 2\n", "f") == {"base": {"a": 1}, "x": {"a": 2}}


# -- upstream.lock -------------------------------------------------------------------------------


def _lock_text(**changes) -> str:
    pin = dict(
        url="https://github.com/NVIDIA/Megatron-LM.git",
        source="git",
        requested_ref="v0.16",
        resolved_ref="core_v0.16.1",
        commit=SHA,
        commit_date="2025-12-01T00:00:00+00:00",
        version="0.16.1",
    )
    pin.update(changes)
    return Lock(upstreams={"megatron-lm": Pin(**pin)}).dumps()


@pytest.mark.parametrize(
    "text, key",
    [
        (_lock_text().replace("schema_version: 1", "schema_version: true"), "schema_version"),
        (_lock_text(version="banana"), "upstreams.megatron-lm.version"),
        (_lock_text(resolved_ref="core_v0.16.1\nx"), "upstreams.megatron-lm.resolved_ref"),
        (_lock_text(resolved_ref="../../x"), "upstreams.megatron-lm.resolved_ref"),
        (_lock_text(resolved_ref="-x"), "upstreams.megatron-lm.resolved_ref"),
        (_lock_text(requested_ref="v0.16\nrm -rf"), "upstreams.megatron-lm.requested_ref"),
        (_lock_text(commit=SHA + "\n"), "upstreams.megatron-lm.commit"),
        (_lock_text(commit_date="yesterday"), "upstreams.megatron-lm.commit_date"),
        (_lock_text(url="https://user:TOKEN@github.com/NVIDIA/Megatron-LM.git"), "upstreams.megatron-lm.url"),
        (_lock_text(url="ext::sh -c touch x"), "upstreams.megatron-lm.url"),
        (_lock_text(chosen_by="whim"), "upstreams.megatron-lm.chosen_by"),
        (_lock_text().replace("version: 0.16.1", "version: 0.16"), "upstreams.megatron-lm.version"),
    ],
)
def test_lock_values_are_checked_by_meaning(text, key):
    with pytest.raises(BadInput) as err:
        parse_lock(text, "upstream.lock")
    msg = str(err.value)
    assert f"key '{key}'" in msg and "\n" not in msg and "TOKEN" not in msg


def test_lock_duplicate_key_and_bad_byte(tmp_path):
    with pytest.raises(BadInput, match="duplicate key 'schema_version'"):
        parse_lock(_lock_text().replace("schema_version: 1", "schema_version: 1\nschema_version: 1"))
    data = _lock_text().encode().replace(b"requested_ref: v0.16", b"requested_ref: v0.16\xff")
    path = tmp_path / "upstream.lock"
    path.write_bytes(data)
    at = data.index(b"\xff")
    with pytest.raises(BadInput, match=rf"{path}: not UTF-8 at byte {at} "):
        load_lock(path)
    with pytest.raises(BadInput, match="not UTF-8 at byte"):
        parse_lock_bytes(data)


def test_lock_with_a_bad_byte_stops_every_command(proj, capsys):
    lock = proj.root / "upstream.lock"
    lock.write_bytes(lock.read_bytes().replace(b"requested_ref: v0.16", b"requested_ref: v0.16\xc3"))
    for args in (["apply"], ["status"], ["sync"], ["patches", "list"], ["build"]):
        rc = main(["-C", str(proj.root), *args])
        err = capsys.readouterr().err
        if args == ["patches", "list"]:  # lists the series; never reads the lock
            assert rc == 0
            continue
        assert rc == 2, args
        assert "upstream.lock: not UTF-8 at byte" in err and "Traceback" not in err
    assert untouched(proj)


# -- series --------------------------------------------------------------------------------------

SERIES = "upstream: megatron-lm\nline: v0.16\nversions: '>=0.16.0,<0.17.0'\n"


@pytest.mark.parametrize(
    "extra, message",
    [
        ("codemods: 5\n", "key 'codemods' must be a list of codemod names"),
        (
            "codemods:\n  - name: guard-nvidia-only-imports\n    options: {packages: 5}\n",
            "key 'codemods[0]' (guard-nvidia-only-imports): option 'packages' must be a mapping of a Python module name",
        ),
        (
            "codemods:\n  - name: guard-nvidia-only-imports\n    options: {packages: {'os; import evil': x}}\n",
            "option 'packages' must be a mapping of a Python module name",
        ),
        (
            "codemods:\n  - name: guard-nvidia-only-imports\n    options: {bogus: 1}\n",
            "unknown option 'bogus' (it takes: packages)",
        ),
        ("codemods:\n  - name: apex-to-torch\n    options: {x: 1}\n", "unknown option 'x' (it takes: none)"),
        ("codemods: [apex-to-torch, apex-to-torch]\n", "lists 'apex-to-torch' a second time"),
        ("codemods: [no-such-codemod]\n", "unknown codemod 'no-such-codemod'"),
        ("line: v0.99\n", "not valid YAML at line 4 (duplicate key 'line'"),
        ("verify:\n  unit_tests: [1, {a: b}]\n", "key 'verify.unit_tests' must be a list of test paths"),
        ("verify:\n  known_failures: {a: 1}\n", "key 'verify.known_failures' must map test ids"),
        ("manifests: {drop: [x]}\n", "key 'manifests' must be false or a mapping"),
        ("allow: [everything]\n", "key 'allow' must be a list of: binary, gitlinks, mode-changes, symlinks"),
        ("max_patch_bytes: -1\n", "key 'max_patch_bytes' must be a positive number of bytes"),
        ("max_patch_bytes: true\n", "key 'max_patch_bytes' must be a positive number of bytes"),
        ("excluded_paths: [../x]\n", "key 'excluded_paths' must be a list of relative directories"),
        ("patches: [../../x.patch]\n", "key 'patches' must be a list of file names"),
    ],
)
def test_series_is_checked_before_anything_is_touched(proj, capsys, extra, message):
    (proj.series_dir / "series").write_text(SERIES + extra)
    assert apply(proj) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) <= 2
    assert untouched(proj)


def test_series_upstream_must_match_its_directory(proj, capsys):
    (proj.series_dir / "series").write_text(SERIES.replace("megatron-lm", "megatron-bridge"))
    assert apply(proj) == 2
    assert "key 'upstream' is 'megatron-bridge' but the series lives under megatron-lm/" in capsys.readouterr().err
    assert untouched(proj)


def test_duplicate_patch_in_series(proj, capsys):
    patch = make_patch(proj.up, {"megatron/core/utils.py": "x = 1\n"})
    proj.write_series({"0001-f.patch": patch})
    (proj.series_dir / "series").write_text(
        (proj.series_dir / "series").read_text().replace("- 0001-f.patch", "- 0001-f.patch\n- 0001-f.patch")
    )
    assert apply(proj) == 2
    assert "key 'patches' lists 0001-f.patch twice" in capsys.readouterr().err
    assert untouched(proj)


def test_non_utf8_series_and_patch(proj, capsys):
    patch = make_patch(proj.up, {"megatron/core/utils.py": "x = 1\n"})
    proj.write_series({"0001-f.patch": patch})
    bad = patch.encode().replace(b"x = 1", b"x = \xff")
    (proj.series_dir / "0001-f.patch").write_bytes(bad)
    assert apply(proj) == 2
    at = bad.index(b"\xff")
    line = bad[:at].count(b"\n") + 1
    assert f"0001-f.patch: not UTF-8 at byte {at} (line {line}, byte 0xff)" in capsys.readouterr().err
    series = proj.series_dir / "series"
    series.write_bytes(series.read_bytes().replace(b"line: v0.16", b"line: v0.16\xfe"))
    assert apply(proj) == 2
    assert "series: not UTF-8 at byte" in capsys.readouterr().err
    assert untouched(proj)


# -- patches -------------------------------------------------------------------------------------


def _binary_patch(proj) -> str:
    (proj.up / "megatron/core/blob.bin").write_bytes(bytes(range(256)))
    g(proj.up, "add", "-A")
    diff = g(proj.up, "diff", "--cached", "--binary", "--full-index") + "\n\n"
    g(proj.up, "reset", "-q", "--hard", "HEAD")
    return "Description: bin\nUpstream-Status: Pending\n---\n" + diff


GITLINK = (
    "Description: gitlink\nUpstream-Status: Pending\n---\ndiff --git a/sub b/sub\nnew file mode 160000\nindex 0000000..1234567\n"
    "--- /dev/null\n+++ b/sub\n@@ -0,0 +1 @@\n+Subproject commit 1234567890123456789012345678901234567890\n"
)
MODE = (
    "Description: mode\nUpstream-Status: Pending\n---\ndiff --git a/megatron/core/utils.py b/megatron/core/utils.py\n"
    "old mode 100644\nnew mode 100755\n"
)


@pytest.mark.parametrize(
    "kind, key", [("binary", "binary"), ("gitlink", "gitlinks"), ("mode", "mode-changes"), ("link", "symlinks")]
)
def test_binary_gitlink_mode_and_link_need_the_series_to_allow_them(proj, capsys, kind, key):
    patch = {
        "binary": lambda: _binary_patch(proj),
        "gitlink": lambda: GITLINK,
        "mode": lambda: MODE,
        "link": lambda: link_patch("megatron/core/alias.py", "utils.py"),
    }[kind]()
    proj.write_series({"0001-x.patch": patch})
    assert apply(proj) == 2
    err = capsys.readouterr().err
    assert "0001-x.patch" in err and f"refused unless the series says `allow: [{key}]`" in err
    assert untouched(proj)
    proj.write_series({"0001-x.patch": patch}, allow=[key])
    assert apply(proj) == 0, capsys.readouterr().err
    assert g(proj.tree, "status", "--porcelain") == ""


@pytest.mark.parametrize("target", ["/etc/passwd", "../../../outside", "../../.git/config", "../../.."])
def test_a_link_resolving_outside_is_refused_even_when_links_are_allowed(proj, capsys, target):
    proj.write_series({"0001-l.patch": link_patch("megatron/core/l", target)}, allow=["symlinks"])
    assert apply(proj) == 2
    err = capsys.readouterr().err
    assert "0001-l.patch: 'megatron/core/l' becomes a symlink to" in err and "resolves outside the tree" in err
    assert untouched(proj)


@pytest.mark.parametrize(
    "path",
    [
        "megatron/core/_rocm.py",
        "megatron",
        "pyproject.toml",
        "requirements",
        "requirements-dev.txt",
        "megatron/core/package_info.py",
    ],
)
def test_a_link_where_a_later_step_writes_is_refused(proj, capsys, path):
    proj.write_series({"0001-l.patch": link_patch(path, "docs")}, allow=["symlinks"])
    assert apply(proj) == 2
    assert f"'{path}' becomes a symlink where a later step of apply writes" in capsys.readouterr().err
    assert untouched(proj)


def test_a_link_through_an_upstream_link_is_resolved_for_real(proj, capsys, tmp_path):
    """The lexical check passes (`../../up/x` stays inside), but `up` is upstream's own link to
    outside: after the patch applies, the real resolution refuses it and the tree is back at HEAD."""
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink(str(outside), proj.up / "up")
    g(proj.up, "add", "up")
    g(proj.up, "commit", "-qm", "an upstream link")
    proj.refresh_mirror()
    proj.pin(g(proj.up, "rev-parse", "HEAD"))
    good = make_patch(proj.up, {"megatron/core/utils.py": "x = 1\n"}, desc="good")
    proj.write_series(
        {"0001-good.patch": good, "0002-l.patch": link_patch("megatron/core/l", "../../up/secret")}, allow=["symlinks"]
    )
    assert apply(proj) == 2
    err = capsys.readouterr().err
    assert "0002-l.patch: 'megatron/core/l' becomes a symlink that resolves outside the tree" in err
    assert g(proj.tree, "status", "--porcelain") == "" and g(proj.tree, "log", "-1", "--format=%s") == "good"
    assert list(outside.iterdir()) == []


def test_file_turned_into_an_outside_link_leaks_nothing(proj, capsys, tmp_path):
    """The issue's leak: pyproject.toml turned into a link to an outside file got that file's content
    committed by the manifest step. Now the patch is refused and nothing outside is read."""
    secret = tmp_path / "secret.toml"
    secret.write_text('[project]\nname = "s"\ndependencies = ["SECRET-TOKEN"]\n')
    old = '[project]\nname = "x"\ndependencies = []\n'
    proj.pin(proj.upstream_commit({"pyproject.toml": old}))
    proj.refresh_mirror()
    proj.write_series({"0001-l.patch": file_to_link_patch("pyproject.toml", old, str(secret))}, allow=["symlinks"])
    assert apply(proj) == 2
    assert "'pyproject.toml' becomes a symlink to" in capsys.readouterr().err
    assert untouched(proj)


def test_patch_size_limit_is_configurable(proj, capsys):
    patch = make_patch(proj.up, {"megatron/core/big.py": "x = 1\n" * 5000})
    proj.write_series({"0001-big.patch": patch}, max_patch_bytes=10_000)
    assert apply(proj) == 2
    assert f"0001-big.patch: patch is {len(patch.encode())} bytes, over the limit of 10000" in capsys.readouterr().err
    assert untouched(proj)
    proj.write_series({"0001-big.patch": patch}, max_patch_bytes=100_000)
    assert apply(proj) == 0


@pytest.mark.parametrize("cut", ["mid-line", "no hunks", "short hunk"])
def test_truncated_patch_is_corrupt_not_a_conflict(proj, capsys, cut):
    good = make_patch(proj.up, {"megatron/core/layers.py": LAYERS.replace("line 20\n", "line twenty\n")})
    text = {
        "mid-line": good.rstrip("\n")[:-3],
        "no hunks": good[: good.index("@@")],
        "short hunk": good[: good.rstrip("\n").rindex("\n") + 1],
    }[cut]
    proj.write_series({"0001-t.patch": text})
    assert apply(proj) == 2
    err = capsys.readouterr().err
    assert "0001-t.patch" in err and "corrupt patch" in err or "a truncated patch?" in err
    assert "does not apply" not in err
    assert untouched(proj)


@pytest.mark.parametrize(
    "text",
    [
        "Description: x\nUpstream-Status: Pending\n---\ndiff --git a/a b/a\n--- a/a\n+++ b/a\n@@ -1 +1 @@\n-a\n+b\x00\n",
        "Description: x\nUpstream-Status: Pending\n---\ndiff --git a/a\x1bb b/a\x1bb\n--- a/a\x1bb\n+++ b/a\x1bb\n@@ -1 +1 @@\n-a\n+b\n",
        "Description: x\nUpstream-Status: Pending\n---\ndiff --git a/.git/config b/.git/config\n--- a/.git/config\n+++ b/.git/config\n@@ -1 +1 @@\n-a\n+b\n",
    ],
)
def test_patch_parser_refuses_oddities(tmp_path, text):
    path = tmp_path / "0001-x.patch"
    with pytest.raises(BadInput) as err:
        parse_patch(text, path)
    assert str(err.value).startswith(str(path)) and "\n" not in str(err.value)


def test_clean_real_series_still_loads():
    """The project's own series pass every check (no allow: needed)."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "patchsets"
    series = sorted(root.glob("*/*/series"))
    assert series
    for path in series:
        s = load_series(path)
        assert s.allow == frozenset() and all(p.files for p in s.patches)
