"""The package-index source: resolution, sha256 checks, deterministic commits, safety, CLI."""

from __future__ import annotations

import tarfile
import time

import pytest
import yaml

from rocmport.cli import main
from rocmport.errors import BadInput, ProblemFound
from rocmport.upstream import package_index
from rocmport.upstream.store import Store
from rocmport.verify.orchestration.launcher import free_port
from tests.helpers.pypi import Index, make_sdist
from tests.helpers.sync import g, package_info

CORE_FILES = {
    "megatron/core/package_info.py": package_info("0.16.1"),
    "megatron/core/__init__.py": "",
    "tools/run.sh": "#!/bin/sh\n",
}


@pytest.fixture()
def index(tmp_path, monkeypatch):
    files = tmp_path / "files"
    with Index(files) as idx:
        for v in ("0.15.3", "0.16.0", "0.16.1", "0.16.2rc1", "0.16.3.dev20250101", "0.17.0"):
            idx.add(
                "megatron-core",
                make_sdist(
                    files,
                    "megatron-core",
                    v,
                    {**CORE_FILES, "megatron/core/package_info.py": package_info(v.split("rc")[0].split(".dev")[0])},
                ),
            )
        for v, req in (
            ("0.2.0", "megatron-core<0.16.0,>=0.15.0a0"),
            ("0.2.2", "megatron-core<0.16.0,>=0.15.0a0"),
            ("0.3.1", "megatron-core[dev,mlm]<0.17.0,>=0.15.0a0"),
            ("0.4.0", "megatron-core[dev,mlm]"),
        ):
            idx.add(
                "megatron-bridge",
                make_sdist(
                    files, "megatron-bridge", v, {"src/megatron/bridge/__init__.py": ""}, f"Requires-Dist: {req}\n"
                ),
            )
        monkeypatch.setenv("ROCMPORT_INDEX_URL", idx.url)
        yield idx


@pytest.mark.parametrize(
    "ref, want",
    [
        ("v0.16", "0.16.1"),
        ("0.16", "0.16.1"),
        ("core_v0.16.0", "0.16.0"),
        ("v0.15.3", "0.15.3"),
        ("0.16.2rc1", "0.16.2rc1"),
    ],
)
def test_version_selection_ignores_dev_and_rc(index, tmp_path, ref, want):
    pin = package_index.pin_from_index(Store(tmp_path / "c"), "megatron-lm", ref)
    assert pin.resolved_ref == want and pin.version == want and pin.source == "pypi"
    assert pin.sdist["filename"] == f"megatron_core-{want}.tar.gz"


def test_pre_and_unknown(index, tmp_path):
    store = Store(tmp_path / "c")
    assert package_index.pin_from_index(store, "megatron-lm", "v0.16", pre=True).version == "0.16.3.dev20250101"
    with pytest.raises(BadInput, match=r"no final release matching 'v0.18'.*closest"):
        package_index.pin_from_index(store, "megatron-lm", "v0.18")
    with pytest.raises(BadInput, match="knows versions, not 'main'"):
        package_index.pin_from_index(store, "megatron-lm", "main")


def test_commit_is_deterministic_and_holds_the_tree(index, tmp_path):
    a = package_index.pin_from_index(Store(tmp_path / "a"), "megatron-lm", "v0.16")
    b = package_index.pin_from_index(Store(tmp_path / "b"), "megatron-lm", "v0.16")
    assert a.commit == b.commit
    mirror = Store(tmp_path / "a").mirror_dir("megatron-lm")
    files = g(mirror, "ls-tree", "-r", "--name-only", a.commit).split()
    assert files == ["PKG-INFO", "megatron/core/__init__.py", "megatron/core/package_info.py", "tools/run.sh"]
    assert g(mirror, "ls-tree", a.commit, "tools/run.sh").startswith("100755")
    assert g(mirror, "rev-parse", "refs/rocmport/pypi/megatron-core/0.16.1") == a.commit
    assert "megatron-core 0.16.1 from the package index" in g(mirror, "log", "-1", "--format=%B", a.commit)


def test_cache_reuse_downloads_once(index, tmp_path):
    store = Store(tmp_path / "c")
    package_index.pin_from_index(store, "megatron-lm", "v0.16")
    package_index.pin_from_index(store, "megatron-lm", "v0.16")
    assert index.hits["megatron_core-0.16.1.tar.gz"] == 1


def test_tampered_file_is_refused_and_removed(index, tmp_path):
    sdist = make_sdist(tmp_path / "evil", "megatron-core", "0.19.0", CORE_FILES)
    (index.root / sdist.name).write_bytes(sdist.read_bytes() + b"x")
    index.add("megatron-core", sdist)  # the index advertises the hash of the untampered file
    store = Store(tmp_path / "c")
    with pytest.raises(ProblemFound, match="megatron_core-0.19.0.tar.gz: sha256 .* does not match"):
        package_index.pin_from_index(store, "megatron-lm", "0.19.0")
    assert not list(store.sdist_dir().glob("megatron_core-0.19.0*"))


@pytest.mark.parametrize(
    "name, link",
    [
        ("megatron_core-0.20.0/../escape.py", None),
        ("/etc/passwd", None),
        ("megatron_core-0.20.0/link", "../../outside"),
        ("megatron_core-0.20.0/abs", "/etc/shadow"),
    ],
)
def test_unsafe_members_are_refused(index, tmp_path, name, link):
    info = tarfile.TarInfo(name)
    if link:
        info.type, info.linkname = tarfile.SYMTYPE, link
    sdist = make_sdist(index.root, "megatron-core", "0.20.0", CORE_FILES, members=[info])
    index.add("megatron-core", sdist)
    with pytest.raises(BadInput, match="megatron_core-0.20.0.tar.gz: .*(escapes|outside)"):
        package_index.pin_from_index(Store(tmp_path / "c"), "megatron-lm", "0.20.0")


def test_bridge_companion_is_the_tightest_bounded_range(index, tmp_path):
    store = Store(tmp_path / "c")
    sdist, why = package_index.choose_bridge_from_index(store, "0.16.1")
    assert str(sdist.version) == "0.3.1"
    sdist, why = package_index.choose_bridge_from_index(store, "0.15.3")  # 0.3.1 admits it too; 0.2.x is its line
    assert str(sdist.version) == "0.2.2"
    assert (
        "candidates (newest first): 0.3.1 declares <0.17.0,>=0.15.0a0; 0.2.2, 0.2.0 declare <0.16.0,>=0.15.0a0" in why
    )
    assert package_index.choose_bridge_from_index(store, "0.18.0") is None  # 0.4.0 is unbounded: never a match


def test_cli_source_pypi_and_auto_fallback(index, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ROCMPORT_CACHE_DIR", str(tmp_path / "cache"))
    project = tmp_path / "p"
    project.mkdir()
    assert main(["-C", str(project), "sync", "--ref", "v0.16", "--source", "pypi"]) == 0
    data = yaml.safe_load((project / "upstream.lock").read_text())["upstreams"]
    assert (
        data["megatron-lm"]["source"] == "pypi"
        and data["megatron-lm"]["sdist"]["filename"] == "megatron_core-0.16.1.tar.gz"
    )
    assert (
        data["megatron-bridge"]["resolved_ref"] == "0.3.1" and data["megatron-bridge"]["chosen_by"] == "declared-range"
    )
    first = (project / "upstream.lock").read_bytes()
    assert main(["-C", str(project), "sync"]) == 0  # verifies the pins against the index
    (project / "upstream.lock").unlink()
    capsys.readouterr()
    dead = f"git://127.0.0.1:{free_port()}/x"
    assert main(["-C", str(project), "sync", "--ref", "v0.16", "--remote", f"megatron-lm={dead}"]) == 0
    assert "FALLING BACK TO THE PACKAGE INDEX" in capsys.readouterr().err
    assert (project / "upstream.lock").read_bytes() == first


def test_unreachable_index(tmp_path, monkeypatch):
    monkeypatch.setenv("ROCMPORT_INDEX_URL", "http://127.0.0.1:9/simple")
    with pytest.raises(package_index.IndexUnreachable, match="cannot read http://127.0.0.1:9/simple/megatron-core/"):
        package_index.pin_from_index(Store(tmp_path / "c"), "megatron-lm", "v0.16")


@pytest.mark.network
def test_real_megatron_core_sdist(tmp_path, real_index):
    """Integration: the real megatron-core 0.16.1 sdist from the package index (cached between runs)."""
    cache = real_index
    start = time.monotonic()
    pin = package_index.pin_from_index(Store(cache), "megatron-lm", "v0.16.1")
    assert pin.version == "0.16.1" and pin.sdist["filename"] == "megatron_core-0.16.1.tar.gz"
    assert len(pin.sdist["sha256"]) == 64
    mirror = Store(cache).mirror_dir("megatron-lm")
    assert "MINOR = 16" in g(mirror, "show", f"{pin.commit}:megatron/core/package_info.py")
    # Same sdist, fresh cache: the same commit id.
    again = Store(tmp_path / "fresh").import_sdist(
        Store(cache).sdist_dir() / pin.sdist["filename"], "megatron-lm", "0.16.1", pin.sdist["sha256"]
    )
    assert again == pin.commit
    print(f"real sdist pin took {time.monotonic() - start:.1f}s")
