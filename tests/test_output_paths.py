"""Issue #41, rule "Output paths" (rows 1, 8, 19, 22): every file rocmport writes goes through one
writer (rocmport.fsutil.write_file; tests/test_architecture.py holds every module to it). It replaces
regular files only, atomically; a device, a FIFO, a directory or a link at the path is refused (exit
2, one line naming it) and left as it was; `-` is stdout where the option says so; a new file gets
0666 & ~umask and an existing one keeps its mode; a full disk names the path and "no space left".

Real files, FIFOs, links, a char device made with mknod (root only, else skipped) and a real 5 MB
tmpfs filled up (root only, else skipped); the commands run through rocmport's own main()."""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rocmport.cli import main
from rocmport.errors import EXIT_PROBLEM, EXIT_USAGE
from tests.helpers.patches import Project
from tests.helpers.refresh import Ported
from tests.test_verify_inputs import fake_tree

REPO = Path(__file__).resolve().parents[1]
IS_ROOT = os.geteuid() == 0


@contextlib.contextmanager
def umask(value: int):
    old = os.umask(value)
    try:
        yield
    finally:
        os.umask(old)


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def char_device(path: Path) -> Path:
    """A char device with /dev/full's numbers (1, 7), in the test's own directory."""
    try:
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 7))
    except PermissionError:
        pytest.skip("mknod needs root")
    return path


@pytest.fixture()
def applied(tmp_path, monkeypatch) -> Project:
    """A project whose series has the v0.16 rocm: matrix, applied: what `emit docker` needs."""
    proj = Project(tmp_path, monkeypatch)
    data = yaml.safe_load((proj.series_dir / "series").read_text())
    data["rocm"] = yaml.safe_load((REPO / "patchsets/megatron-lm/v0.16/series").read_text())["rocm"]
    (proj.series_dir / "series").write_text(yaml.safe_dump(data, sort_keys=False))
    assert main(["-C", str(proj.root), "apply"]) == 0
    return proj


def refused(capsys, path: Path, rc: int) -> str:
    out, err = capsys.readouterr()
    assert rc == EXIT_USAGE, err
    lines = [ln for ln in err.splitlines() if ln.startswith("rocmport: error:")]
    assert len(lines) == 1 and str(path) in lines[0] and "regular file" in lines[0], err
    return lines[0]


# -- row 1: emit docker -o / verify --report --junit -----------------------------------------------


def test_emit_docker_refuses_a_device_a_fifo_and_a_link_and_leaves_them(applied, tmp_path, capsys):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    link = tmp_path / "stdout-link"
    link.symlink_to("/proc/self/fd/1")
    targets = [fifo, link] + ([char_device(tmp_path / "full")] if IS_ROOT else [])
    capsys.readouterr()
    for target in targets:
        before = target.lstat()
        rc = main(["-C", str(applied.root), "emit", "docker", "-o", str(target)])
        refused(capsys, target, rc)
        after = target.lstat()
        assert (after.st_mode, after.st_ino, after.st_rdev) == (before.st_mode, before.st_ino, before.st_rdev)
    assert os.readlink(link) == "/proc/self/fd/1"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no temp file left


def test_emit_docker_dash_is_stdout_and_a_regular_file_keeps_its_mode(applied, tmp_path, capsys):
    capsys.readouterr()
    assert main(["-C", str(applied.root), "emit", "docker", "-o", "-"]) == 0
    out, _ = capsys.readouterr()
    assert out.startswith("# syntax=") or "FROM " in out
    assert not (Path.cwd() / "-").exists()
    target = tmp_path / "Dockerfile"
    target.write_text("old\n")
    target.chmod(0o640)
    assert main(["-C", str(applied.root), "emit", "docker", "-o", str(target)]) == 0
    assert "FROM " in target.read_text() and mode_of(target) == 0o640


def test_verify_refuses_a_fifo_report_and_a_link_junit_before_running(tmp_path, capsys):
    tree = fake_tree(tmp_path / "t")
    fifo = tmp_path / "report-fifo"
    os.mkfifo(fifo)
    elsewhere = tmp_path / "elsewhere.xml"
    elsewhere.write_text("keep me\n")
    link = tmp_path / "junit-link"
    link.symlink_to(elsewhere)
    rc = main(["verify", "--tree", str(tree), "--stages", "1", "--report", str(fifo)])
    line = refused(capsys, fifo, rc)
    assert "--report" in line and "FIFO" in line
    rc = main(["verify", "--tree", str(tree), "--stages", "1", "--junit", str(link)])
    line = refused(capsys, link, rc)
    assert "--junit" in line and "symlink" in line
    assert stat.S_ISFIFO(fifo.lstat().st_mode) and link.is_symlink() and elsewhere.read_text() == "keep me\n"


# -- row 8: env --tune replay: the merged table never written through a link ------------------------


def test_tune_replay_refuses_a_merged_table_that_links_outside(tmp_path, capsys):
    d = tmp_path / "tuning"
    d.mkdir()
    (d / "te_hipblaslt_algos_1.csv").write_text("m,n,k,algo\n1,2,3,4\n")
    outside = tmp_path / "outside.txt"
    outside.write_text("precious\n")
    (d / "te_hipblaslt_algos.csv").symlink_to(outside)
    rc = main(["env", "--tune", "replay", str(d), "--no-fabric"])
    refused(capsys, d / "te_hipblaslt_algos.csv", rc)
    assert outside.read_text() == "precious\n" and (d / "te_hipblaslt_algos.csv").is_symlink()


def test_tune_replay_writes_the_merged_table_as_a_regular_file(tmp_path, capsys):
    d = tmp_path / "tuning"
    d.mkdir()
    (d / "te_hipblaslt_algos_1.csv").write_text("m,n,k,algo\n1,2,3,4\n")
    (d / "te_hipblaslt_algos_2.csv").write_text("m,n,k,algo\n5,6,7,8\n")
    with umask(0o022):
        assert main(["env", "--tune", "replay", str(d), "--no-fabric"]) == 0
    merged = d / "te_hipblaslt_algos.csv"
    assert merged.read_text() == "m,n,k,algo\n1,2,3,4\n5,6,7,8\n" and mode_of(merged) == 0o644


# -- row 19: the umask, and a tracked file keeps its mode ------------------------------------------


def test_sync_keeps_the_locks_mode_and_new_files_follow_the_umask(tmp_path, monkeypatch, capsys):
    port = Ported(tmp_path, monkeypatch)
    port.tag({"docs/index.md": "x\n"}, "core_v0.16.2", "0.16.2")
    lock = port.root / "upstream.lock"
    lock.chmod(0o644)
    local = port.root / ".rocmport" / "local.yaml"
    local.unlink(missing_ok=True)
    with umask(0o022):
        rc = main(["-C", str(port.root), "sync", "--ref", "v0.16", "--no-bridge", "--remote", f"megatron-lm={port.up}"])
    assert rc == 0, capsys.readouterr().err
    assert "core_v0.16.2" in lock.read_text()
    assert mode_of(lock) == 0o644  # was 0600 after every sync
    assert mode_of(local) == 0o644  # new: 0666 & ~022
    lock.chmod(0o664)  # a group-writable checkout stays so
    with umask(0o077):
        assert main(["-C", str(port.root), "sync", "--ref", "v0.16", "--no-bridge"]) == 0
    assert mode_of(lock) == 0o664


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    kind=st.sampled_from(["missing", "file", "link-to-file", "dangling-link", "fifo", "dir", "device"]),
    old_mode=st.sampled_from([0o600, 0o640, 0o644, 0o664, 0o755]),
    mask=st.sampled_from([0o002, 0o022, 0o027, 0o077]),
    data=st.one_of(st.text(max_size=200), st.binary(max_size=200)),
)
def test_the_writer_replaces_regular_files_only_property(tmp_path_factory, kind, old_mode, mask, data):
    """Over every kind of thing at the path: a regular file is replaced (its mode kept), a missing one
    created (0666 & ~umask), anything else refused and left exactly as it was (what a link points to too)."""
    from rocmport.fsutil import OutputRefused, write_file

    KINDS_SEEN[kind] = KINDS_SEEN.get(kind, 0) + 1
    d = tmp_path_factory.mktemp("w")
    path, target = d / "out", d / "target"
    target.write_text("target\n")
    if kind == "file":
        path.write_text("old\n")
        path.chmod(old_mode)
    elif kind == "link-to-file":
        path.symlink_to(target)
    elif kind == "dangling-link":
        path.symlink_to(d / "nowhere")
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "dir":
        path.mkdir()
    elif kind == "device":
        if not IS_ROOT:
            return
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 7))
    before = None if kind == "missing" else path.lstat()
    raw = data.encode() if isinstance(data, str) else data
    with umask(mask):
        if kind in ("missing", "file"):
            write_file(path, data)
        else:
            with pytest.raises(OutputRefused) as exc:
                write_file(path, data)
            assert str(path) in str(exc.value) and "\n" not in str(exc.value)
    if kind in ("missing", "file"):
        assert path.read_bytes() == raw and not path.is_symlink()
        assert mode_of(path) == (old_mode if kind == "file" else 0o666 & ~mask)
    else:
        after = path.lstat()
        assert (after.st_mode, after.st_ino) == (before.st_mode, before.st_ino)
        assert target.read_text() == "target\n" and not (d / "nowhere").exists()
    assert sorted(p.name for p in d.iterdir()) == ["out", "target"]  # no temp file left either way


KINDS_SEEN: dict[str, int] = {}


def test_the_property_saw_every_kind():
    """Runs after the property (file order): the examples covered every kind of path (counts printed)."""
    if not KINDS_SEEN:
        pytest.skip("run with the property test")
    print(f"\nwriter property examples by kind: {dict(sorted(KINDS_SEEN.items()))}")
    assert {"missing", "file", "link-to-file", "dangling-link", "fifo", "dir"} <= set(KINDS_SEEN)


# -- row 22: a full disk names the path and "no space left"; a patch that links outside ------------


@pytest.fixture()
def small_disk(tmp_path):
    """A real 5 MB tmpfs (root only)."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    if not IS_ROOT or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=5m", "tmpfs", str(mnt)]).returncode:
        pytest.skip("mounting a tmpfs needs root")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def fill(disk: Path, leave: int = 0) -> None:
    """Fill ``disk`` up, then free ``leave`` bytes again."""
    with contextlib.suppress(OSError), open(disk / "filler", "wb") as fh:
        while True:
            fh.write(b"\0" * 65536)
            fh.flush()
    size = (disk / "filler").stat().st_size
    os.truncate(disk / "filler", max(0, size - leave))


def test_the_writer_names_the_path_on_a_full_disk(small_disk):
    from rocmport.fsutil import DiskFull, write_file

    fill(small_disk)
    with pytest.raises(DiskFull) as exc:
        write_file(small_disk / "report.json", "x" * 200_000)
    assert str(exc.value).startswith(f"{small_disk / 'report.json'}: no space left on device")
    assert [p.name for p in small_disk.iterdir()] == ["filler"]  # no temp file left behind


def test_emit_and_apply_on_a_full_disk_name_the_path(tmp_path, monkeypatch, small_disk, capsys):
    proj = Project(small_disk, monkeypatch)
    data = yaml.safe_load((proj.series_dir / "series").read_text())
    data["rocm"] = yaml.safe_load((REPO / "patchsets/megatron-lm/v0.16/series").read_text())["rocm"]
    (proj.series_dir / "series").write_text(yaml.safe_dump(data, sort_keys=False))
    proj.pin(proj.upstream_commit({f"examples/big{i}.txt": "y" * 400_000 + str(i) for i in range(4)}))
    proj.refresh_mirror()
    fill(small_disk, leave=600_000)  # room for the clone, not for the checkout's 1.6 MB
    capsys.readouterr()
    rc = main(["-C", str(proj.root), "apply"])
    err = capsys.readouterr().err
    # git itself says only "unable to write file examples/big1.txt"
    assert rc == EXIT_PROBLEM and "checkout" in err and "no space left on device" in err and "Traceback" not in err, err
    (small_disk / "filler").unlink()
    assert main(["-C", str(proj.root), "apply"]) == 0
    fill(small_disk)
    capsys.readouterr()
    rc = main(["-C", str(proj.root), "emit", "docker", "-o", str(small_disk / "Dockerfile")])
    err = capsys.readouterr().err
    assert rc == EXIT_PROBLEM and f"{small_disk / 'Dockerfile'}: no space left on device" in err, err


def test_te_wheel_unpack_on_a_full_disk_names_the_cache_entry(small_disk):
    from packaging.version import Version

    from rocmport.fsutil import DiskFull
    from rocmport.upstream.store import Store
    from rocmport.verify.orchestration.te_layer import WheelFile, fetch

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("transformer_engine/__init__.py", "")
        z.writestr("transformer_engine/big.bin", os.urandom(3_000_000))
    wheel = buf.getvalue()
    name = "transformer_engine-9.9.9-py3-none-any.whl"
    store = Store(small_disk / "cache")
    store.sdist_dir().mkdir(parents=True)
    (store.sdist_dir() / name).write_bytes(wheel)
    sha = hashlib.sha256(wheel).hexdigest()
    with pytest.raises(DiskFull) as exc:
        fetch(small_disk / "cache", WheelFile(Version("9.9.9"), name, "https://example.invalid/x.whl", sha))
    assert str(exc.value).startswith(f"{small_disk / 'cache' / 'te' / '9.9.9'}: no space left on device")


def test_a_patch_that_links_outside_is_refused_without_echoing_its_target(tmp_path, monkeypatch, capsys):
    proj = Project(tmp_path, monkeypatch)
    secret = tmp_path / "secret.txt"
    secret.write_text("root:x:0:0:TOP-SECRET-LINE\n")
    (proj.series_dir / "0001-evil.patch").symlink_to(secret)
    data = yaml.safe_load((proj.series_dir / "series").read_text())
    data["patches"] = ["0001-evil.patch"]
    (proj.series_dir / "series").write_text(yaml.safe_dump(data, sort_keys=False))
    capsys.readouterr()
    for args in (["apply"], ["patches", "check"], ["patches", "list"]):
        rc = main(["-C", str(proj.root), *args])
        out, err = capsys.readouterr()
        assert rc == EXIT_USAGE and "TOP-SECRET" not in out + err, (args, err)
        assert "0001-evil.patch: is a link to a file outside" in err


def test_a_patch_link_inside_patchsets_is_still_read(tmp_path, monkeypatch, capsys):
    """Sharing a patch between lines by a link inside patchsets/ stays allowed."""
    from tests.helpers.patches import make_patch

    proj = Project(tmp_path, monkeypatch)
    shared = proj.root / "patchsets" / "shared"
    shared.mkdir()
    (shared / "0001-x.patch").write_text(make_patch(proj.up, {"megatron/core/new.py": "x = 1\n"}, desc="x"))
    (proj.series_dir / "0001-x.patch").symlink_to(shared / "0001-x.patch")
    data = yaml.safe_load((proj.series_dir / "series").read_text())
    data["patches"] = ["0001-x.patch"]
    (proj.series_dir / "series").write_text(yaml.safe_dump(data, sort_keys=False))
    assert main(["-C", str(proj.root), "patches", "list"]) == 0, capsys.readouterr().err
    out, err = capsys.readouterr()
    assert "0001-x.patch [ROCm-only] x" in out + err


def test_a_crash_log_follows_the_umask(tmp_path):
    """write_crash_log goes through the writer too (it was write_text, 0644 whatever the umask)."""
    env = {**os.environ, "ROCMPORT_CACHE_DIR": str(tmp_path / "cache")}
    code = "import os; os.umask(0o077); from rocmport.cli import write_crash_log; print(write_crash_log(['x']))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    assert mode_of(Path(out.strip())) == 0o600
