"""`rocmport sync` against real git repositories built in temp dirs."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from rocmport.cli import main
from rocmport.verify.orchestration.launcher import free_port
from tests.helpers.sync import GitDaemon, build_bridge, build_mlm, commit, g, package_info


@pytest.fixture()
def upstreams(tmp_path, monkeypatch):
    monkeypatch.setenv("ROCMPORT_CACHE_DIR", str(tmp_path / "cache"))
    # Hermetic: a fallback to the package index must never reach the real one from these tests.
    monkeypatch.setenv("ROCMPORT_INDEX_URL", "http://127.0.0.1:9/simple")
    mlm_commits = build_mlm(tmp_path / "up" / "mlm")
    bridge_commits = build_bridge(tmp_path / "up" / "bridge", mlm_commits)
    project = tmp_path / "project"
    project.mkdir()
    return {
        "mlm": tmp_path / "up" / "mlm",
        "bridge": tmp_path / "up" / "bridge",
        "c": mlm_commits,
        "b": bridge_commits,
        "project": project,
        "tmp": tmp_path,
    }


def run(u, *args):
    return main(["-C", str(u["project"]), *args])


def remotes(u):
    return ["--remote", f"megatron-lm={u['mlm']}", "--remote", f"megatron-bridge={u['bridge']}"]


def lock(u):
    return yaml.safe_load((u["project"] / "upstream.lock").read_text())["upstreams"]


@pytest.mark.parametrize(
    "ref, resolved, version, bridge, rule",
    [
        ("v0.16", "core_v0.16.1", "0.16.1", "v0.3.1", "gitlink-exact"),
        ("0.16", "core_v0.16.1", "0.16.1", "v0.3.1", "gitlink-exact"),
        ("core_v0.16.0", "core_v0.16.0", "0.16.0", "v0.3.1", "gitlink-minor"),
        ("v0.15", "core_v0.15.3", "0.15.3", "v0.2.2", "declared-range"),
        ("core_r0.16.0", "core_r0.16.0", "0.16.1", "v0.3.1", "gitlink-exact"),
    ],
)
def test_resolution_and_companion_rules(upstreams, capsys, ref, resolved, version, bridge, rule):
    assert run(upstreams, "sync", "--ref", ref, *remotes(upstreams)) == 0
    pins = lock(upstreams)
    assert pins["megatron-lm"]["resolved_ref"] == resolved
    assert pins["megatron-lm"]["version"] == version
    assert pins["megatron-lm"]["requested_ref"] == ref
    assert pins["megatron-bridge"]["resolved_ref"] == bridge
    assert pins["megatron-bridge"]["commit"] == upstreams["b"][bridge]
    assert pins["megatron-bridge"]["chosen_by"] == rule
    err = capsys.readouterr().err
    assert f"chosen by rule {rule}" in err


def test_both_v_and_core_v_tags_explained(upstreams, capsys):
    assert run(upstreams, "sync", "--ref", "v0.15", *remotes(upstreams)) == 0
    err = capsys.readouterr().err
    assert "v0.15.3 names the same version, core_v0.15.3 chosen" in err
    assert run(upstreams, "sync", "--ref", "v0.15.3", "--no-bridge") == 0
    assert "core_v0.15.3 also exists (same commit)" in capsys.readouterr().err
    assert lock(upstreams)["megatron-lm"]["resolved_ref"] == "v0.15.3"
    assert "megatron-bridge" not in lock(upstreams)


def test_sha_and_abbreviated_sha(upstreams):
    sha = upstreams["c"]["0.16.0"]
    assert run(upstreams, "sync", "--ref", sha[:8], "--no-bridge", *remotes(upstreams)) == 0
    assert lock(upstreams)["megatron-lm"]["commit"] == sha
    assert lock(upstreams)["megatron-lm"]["resolved_ref"] == sha


def test_prerelease_only_with_pre(upstreams, capsys):
    assert run(upstreams, "sync", "--ref", "v0.17", *remotes(upstreams)) == 2
    assert "only pre-releases: core_v0.17.0rc0; add --pre" in capsys.readouterr().err
    assert run(upstreams, "sync", "--ref", "v0.17", "--pre", *remotes(upstreams)) == 0
    pins = lock(upstreams)
    assert pins["megatron-lm"]["resolved_ref"] == "core_v0.17.0rc0"
    assert pins["megatron-bridge"]["resolved_ref"] == "v0.4.0"  # its gitlink is exactly that commit


def test_declared_range_takes_the_tightest_range_and_lists_the_candidates(upstreams, capsys):
    """0.15.3: v0.3.1 (<0.17) and v0.2.x (<0.16) all admit it; the 0.2 line, made for 0.15, wins, newest first."""
    assert run(upstreams, "sync", "--ref", "v0.15", *remotes(upstreams)) == 0
    assert lock(upstreams)["megatron-bridge"]["resolved_ref"] == "v0.2.2"
    err = " ".join(capsys.readouterr().err.split())
    assert "v0.2.2: the tightest declared megatron-core range admitting 0.15.3 (<0.16.0,>=0.15.0a0)" in err
    assert (
        "candidates (newest first): v0.3.1 declares <0.17.0,>=0.15.0a0; v0.2.2, v0.2.0 declare <0.16.0,>=0.15.0a0"
        in err
    )


@pytest.mark.parametrize(
    "spec, upper, lower",
    [
        ("<0.16.0,>=0.15.0a0", ("0.16.0", 0), "0.15.0a0"),
        ("<=0.16.0", ("0.16.0", 1), None),
        ("~=0.15.2", ("0.16", 0), "0.15.2"),
        ("~=1.4", ("2", 0), "1.4"),
        ("==0.15.*", ("0.16", 0), "0.15"),
        ("==0.15.3", ("0.15.3", 1), "0.15.3"),
        (">=0.15", None, "0.15"),
    ],
)
def test_range_bounds(spec, upper, lower):
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    from rocmport.upstream.companion import range_bounds

    got_upper, got_lower = range_bounds(SpecifierSet(spec))
    assert got_upper == ((Version(upper[0]), upper[1]) if upper else None)
    assert got_lower == (Version(lower) if lower else None)


def test_tightest_range_orders_upper_then_lower_then_newest():
    from packaging.specifiers import SpecifierSet as S

    from rocmport.upstream.companion import tightest_range

    cands = [
        ("c", S(">=0.15,<0.17")),
        ("b2", S(">=0.15,<0.16")),
        ("b1", S(">=0.14,<0.16")),
        ("a", S("<=0.16")),
        ("x", None),
        ("u", S(">=0.1")),
    ]
    assert tightest_range(cands, "0.15.3")[0] == "b2"  # <0.16 beats <=0.16 and <0.17; >=0.15 beats >=0.14
    assert tightest_range(cands, "0.16.0")[0] == "a"  # only <=0.16 and <0.17 admit it
    assert tightest_range(cands, "0.17.0") is None  # the unbounded range never matches
    assert tightest_range([("n", S("<0.16")), ("o", S("<0.16"))], "0.15")[0] == "n"  # equals: the newest


def test_no_companion_is_a_warning_and_unbounded_range_never_matches(upstreams, capsys):
    # 0.18.0: no Bridge gitlinks a 0.18 commit (v0.5.0rc0 is not final) and v0.4.0 declares no upper bound.
    assert run(upstreams, "sync", "--ref", "v0.18", *remotes(upstreams)) == 0
    assert "megatron-bridge" not in lock(upstreams)
    assert "no companion pinned" in capsys.readouterr().err


def test_bridge_ref_override(upstreams):
    assert run(upstreams, "sync", "--ref", "v0.16", "--bridge-ref", "v0.2.0", *remotes(upstreams)) == 0
    assert lock(upstreams)["megatron-bridge"]["chosen_by"] == "override"
    assert lock(upstreams)["megatron-bridge"]["commit"] == upstreams["b"]["v0.2.0"]


def test_unknown_ref_lists_closest_tags(upstreams, capsys):
    assert run(upstreams, "sync", "--ref", "core_v0.16.7", *remotes(upstreams)) == 2
    err = capsys.readouterr().err.strip()
    assert "unknown ref 'core_v0.16.7'" in err and "core_v0.16.1" in err and "core_v0.16.0" in err
    assert len(err.splitlines()) <= 3  # progress lines + one error line
    assert not (upstreams["project"] / "upstream.lock").exists()


def test_persisted_overrides_and_canonical_url(upstreams):
    assert run(upstreams, "sync", "--ref", "v0.16", *remotes(upstreams)) == 0
    pins = lock(upstreams)
    assert pins["megatron-lm"]["url"] == "https://github.com/NVIDIA/Megatron-LM.git"
    assert pins["megatron-bridge"]["url"] == "https://github.com/NVIDIA-NeMo/Megatron-Bridge.git"
    local = yaml.safe_load((upstreams["project"] / ".rocmport" / "local.yaml").read_text())
    assert local["remotes"]["megatron-lm"] == str(upstreams["mlm"])
    # No flags now: the remembered local remotes are used (the canonical URLs are unreachable here).
    assert run(upstreams, "sync", "--ref", "core_v0.16.0") == 0
    assert lock(upstreams)["megatron-lm"]["commit"] == upstreams["c"]["0.16.0"]


def test_lock_is_deterministic(upstreams):
    assert run(upstreams, "sync", "--ref", "v0.16", *remotes(upstreams)) == 0
    first = (upstreams["project"] / "upstream.lock").read_bytes()
    assert run(upstreams, "sync", "--ref", "v0.16") == 0
    assert (upstreams["project"] / "upstream.lock").read_bytes() == first


def test_verify_without_ref_and_moved_tag(upstreams, capsys):
    assert run(upstreams, "sync", "--ref", "v0.16", *remotes(upstreams)) == 0
    before = (upstreams["project"] / "upstream.lock").read_bytes()
    assert run(upstreams, "sync") == 0
    g(upstreams["mlm"], "tag", "-f", "-a", "-m", "moved", "core_v0.16.1", upstreams["c"]["0.16.0"])
    capsys.readouterr()
    assert run(upstreams, "sync") == 1
    err = capsys.readouterr().err
    assert "tag core_v0.16.1 moved" in err
    assert (upstreams["project"] / "upstream.lock").read_bytes() == before


def test_malformed_lock_is_not_overwritten(upstreams, capsys):
    path = upstreams["project"] / "upstream.lock"
    path.write_text("schema_version: 1\nupstreams:\n  megatron-lm:\n    url: x\n")
    for args in (["sync"], ["sync", "--ref", "v0.16", *remotes(upstreams)]):
        assert run(upstreams, *args) == 2
        err = capsys.readouterr().err
        assert "upstream.lock: key 'upstreams.megatron-lm.source' is missing" in err
        assert path.read_text().endswith("url: x\n")


def test_offline_uses_only_the_cache(upstreams, capsys):
    assert run(upstreams, "sync", "--ref", "v0.16", "--offline", *remotes(upstreams)) == 2
    assert "no cached mirror of megatron-lm" in capsys.readouterr().err
    with GitDaemon(upstreams["tmp"] / "up") as daemon:
        args = ["--remote", f"megatron-lm={daemon.url('mlm')}", "--remote", f"megatron-bridge={daemon.url('bridge')}"]
        assert run(upstreams, "sync", "--ref", "v0.16", *args) == 0
    # The server is gone: --offline still resolves from the cache and touches no network.
    assert run(upstreams, "sync", "--ref", "core_v0.16.0", "--offline") == 0
    assert lock(upstreams)["megatron-lm"]["commit"] == upstreams["c"]["0.16.0"]
    assert run(upstreams, "sync", "--ref", "core_v0.16.0", "--source", "git") == 2
    assert "cannot reach megatron-lm" in capsys.readouterr().err


def test_local_mirror_that_vanished_is_reported(upstreams, capsys):
    assert run(upstreams, "sync", "--ref", "v0.16", *remotes(upstreams)) == 0
    upstreams["mlm"].rename(upstreams["tmp"] / "gone")
    assert run(upstreams, "sync", "--ref", "v0.16", "--offline") == 2
    assert "borrows objects from" in capsys.readouterr().err


def test_network_fetch_is_incremental_and_skips_pull_refs(upstreams):
    base = upstreams["tmp"] / "up"
    with GitDaemon(base) as daemon:
        args = ["--remote", f"megatron-lm={daemon.url('mlm')}", "--remote", f"megatron-bridge={daemon.url('bridge')}"]
        assert run(upstreams, "sync", "--ref", "v0.16", *args) == 0
        mirror = upstreams["tmp"] / "cache" / "mirrors" / "megatron-lm.git"
        refs = g(mirror, "for-each-ref", "--format=%(refname)")
        assert "refs/pull/" not in refs and "refs/tags/core_v0.16.1" in refs
        # The lock records the URL as given: it is not a machine-local path.
        assert lock(upstreams)["megatron-lm"]["url"] == daemon.url("mlm")
        # A new upstream release arrives; the next sync fetches just that.
        new = commit(upstreams["mlm"], {"megatron/core/package_info.py": package_info("0.16.2")}, "0.16.2")
        g(upstreams["mlm"], "tag", "core_v0.16.2")
        assert run(upstreams, "sync", "--ref", "v0.16") == 0
        assert lock(upstreams)["megatron-lm"]["commit"] == new


def test_unreachable_remote(upstreams, capsys):
    url = f"git://127.0.0.1:{free_port()}/nothing"
    assert run(upstreams, "sync", "--ref", "v0.16", "--source", "git", "--remote", f"megatron-lm={url}") == 2
    err = capsys.readouterr().err
    assert f"cannot reach megatron-lm at {url}" in err


@pytest.mark.parametrize(
    "url",
    [
        "ext::sh -c touch% {marker}",
        "fd::17",
        "-uTOUCH{marker}",
        "--upload-pack=touch {marker}",
        "ssh://-oProxyCommand=touch%20{marker}/x",
        "-oProxyCommand=touch {marker}:x",
        "gopher://example.org/x",
    ],
)
def test_dangerous_urls_are_refused_and_nothing_runs(upstreams, capsys, url):
    marker = upstreams["tmp"] / "pwned"
    url = url.format(marker=marker)
    assert run(upstreams, "sync", "--ref", "v0.16", "--remote", f"megatron-lm={url}") == 2
    err = capsys.readouterr().err
    assert "rocmport: error: remote megatron-lm=" in err
    assert not marker.exists()
    assert not (upstreams["tmp"] / "cache" / "mirrors").exists()
    assert not (upstreams["project"] / ".rocmport").exists()


def test_mirror_with_missing_blob(upstreams, capsys):
    """A mirror lacking a large blob: plain-path import works; a packing transport says what to do."""
    big = commit(upstreams["bridge"], {"docs/big.gif": "GIF89a" + "x" * 5000}, "docs")
    g(upstreams["bridge"], "tag", "v0.3.2")
    mirror = upstreams["tmp"] / "up" / "bridge-mirror.git"
    g(upstreams["tmp"], "clone", "-q", "--bare", "--no-local", str(upstreams["bridge"]), str(mirror))
    blob = g(mirror, "rev-parse", f"{big}:docs/big.gif")
    g(mirror, "repack", "-a", "-d", "-q")
    # Drop the blob: unpack everything except it, as the fetched mirrors lack files >= 4 MiB.
    packs = list((mirror / "objects" / "pack").glob("*.pack"))
    for pack in packs:
        data = pack.read_bytes()
        pack.unlink()
        pack.with_suffix(".idx").unlink()
        subprocess.run(["git", "unpack-objects", "-q"], cwd=mirror, input=data, check=True)
    (mirror / "objects" / blob[:2] / blob[2:]).unlink()
    assert (
        run(
            upstreams,
            "sync",
            "--ref",
            "v0.16",
            "--bridge-ref",
            "v0.3.2",
            "--remote",
            f"megatron-lm={upstreams['mlm']}",
            "--remote",
            f"megatron-bridge={mirror}",
        )
        == 0
    )
    assert lock(upstreams)["megatron-bridge"]["commit"] == big
    with GitDaemon(upstreams["tmp"] / "up") as daemon:
        cache2 = upstreams["tmp"] / "cache2"
        rc = run(
            upstreams,
            "sync",
            "--ref",
            "v0.16",
            "--bridge-ref",
            "v0.3.2",
            "--cache-dir",
            str(cache2),
            "--remote",
            f"megatron-bridge={daemon.url('bridge-mirror.git')}",
        )
    assert rc != 0
    err = capsys.readouterr().err
    assert "clone it by plain path instead" in err


def test_concurrent_syncs(upstreams):
    cmd = [
        sys.executable,
        "-m",
        "rocmport",
        "-C",
        str(upstreams["project"]),
        "sync",
        "--ref",
        "v0.16",
        *remotes(upstreams),
    ]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(3)]
    results = [p.communicate(timeout=120) + (p.returncode,) for p in procs]
    assert [r[2] for r in results] == [0, 0, 0], results
    pins = lock(upstreams)
    assert pins["megatron-lm"]["commit"] == upstreams["c"]["0.16.1"]
    mirror = upstreams["tmp"] / "cache" / "mirrors" / "megatron-lm.git"
    assert g(mirror, "fsck", "--connectivity-only") == ""


def test_json_output_and_status(upstreams, capsys):
    assert run(upstreams, "sync", "--ref", "v0.16", "--json", *remotes(upstreams)) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["lock"]["upstreams"]["megatron-lm"]["resolved_ref"] == "core_v0.16.1"
    assert run(upstreams, "status", "--json") == 0
    st = json.loads(capsys.readouterr().out)
    assert st["lock"]["schema_version"] == 1
    assert st["cached"] == {"megatron-bridge": True, "megatron-lm": True}
    assert st["worktrees"] == {}


def test_credentials_are_used_never_stored_or_printed(upstreams, capsys):
    """`user:TOKEN@` in a URL: not in upstream.lock, not in .rocmport/local.yaml, not in any output
    (progress, errors, --json), and the user is pointed at git credential helpers."""
    url = "https://user:TOKEN123@127.0.0.1:9/NVIDIA/Megatron-LM.git"
    assert (
        run(upstreams, "sync", "--ref", "v0.16", "--source", "git", "--no-bridge", "--remote", f"megatron-lm={url}")
        == 2
    )
    out, err = capsys.readouterr()
    assert "TOKEN123" not in out + err and "https://***@127.0.0.1:9/" in err and "credential helper" in err
    assert run(upstreams, "sync", "--ref", "v0.16", *remotes(upstreams)) == 0
    capsys.readouterr()
    assert run(upstreams, "sync", "--ref", "v0.16", "--offline", "--json", "--remote", f"megatron-lm={url}") == 0
    out, err = capsys.readouterr()
    assert "TOKEN123" not in out + err
    lock_text = (upstreams["project"] / "upstream.lock").read_text()
    local = (upstreams["project"] / ".rocmport" / "local.yaml").read_text()
    assert "TOKEN123" not in lock_text + local and "user" not in lock_text + local
    assert lock(upstreams)["megatron-lm"]["url"] == "https://127.0.0.1:9/NVIDIA/Megatron-LM.git"


@pytest.mark.parametrize(
    "url",
    [
        "ssh://%2DoProxyCommand=touch%20{marker}/x",
        "ssh://git@host/%2D-upload-pack=touch%20{marker}",
        "ssh://%2Duser@host/x",
        "ssh://host%0Aevil/x",
        "https://host/%0Ax",
    ],
)
def test_urls_are_checked_after_percent_decoding(upstreams, capsys, url):
    marker = upstreams["tmp"] / "pwned"
    assert run(upstreams, "sync", "--ref", "v0.16", "--remote", f"megatron-lm={url.format(marker=marker)}") == 2
    assert "after percent-decoding" in capsys.readouterr().err
    assert not marker.exists() and not (upstreams["tmp"] / "cache" / "mirrors").exists()


def test_offline_with_a_missing_remote_path_stores_nothing(upstreams, capsys):
    assert run(upstreams, "sync", "--ref", "v0.16", *remotes(upstreams)) == 0
    local = (upstreams["project"] / ".rocmport" / "local.yaml").read_bytes()
    capsys.readouterr()
    assert (
        run(upstreams, "sync", "--ref", "v0.16", "--offline", "--remote", "megatron-lm=/nonexistent/Megatron-LM") == 2
    )
    assert "/nonexistent/Megatron-LM': no such directory" in capsys.readouterr().err
    assert (upstreams["project"] / ".rocmport" / "local.yaml").read_bytes() == local


def test_deleted_tag_is_reported_like_a_moved_one(upstreams, capsys):
    assert run(upstreams, "sync", "--ref", "v0.16", *remotes(upstreams)) == 0
    before = (upstreams["project"] / "upstream.lock").read_bytes()
    g(upstreams["mlm"], "tag", "-d", "core_v0.16.1")
    capsys.readouterr()
    assert run(upstreams, "sync") == 1
    assert "core_v0.16.1 is gone upstream (the tag was deleted)" in capsys.readouterr().err
    assert (upstreams["project"] / "upstream.lock").read_bytes() == before


def test_unknown_line_suggests_the_nearest_lines(upstreams, capsys):
    g(upstreams["mlm"], "tag", "core_v0.60.0")
    g(upstreams["mlm"], "tag", "core_v0.62.0")
    assert run(upstreams, "sync", "--ref", "v0.61", *remotes(upstreams)) == 2
    err = capsys.readouterr().err
    assert (
        "nearest release lines: v0.18 (newest core_v0.18.0), v0.60 (newest core_v0.60.0), v0.62 (newest core_v0.62.0)"
        in err
    )
    assert "v0.15.3" not in err
