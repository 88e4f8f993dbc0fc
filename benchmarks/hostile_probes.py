"""The hostile and unlucky user's probes of issue 30 (items 1-21), run against the current code, each
in a temporary directory of its own on small real git projects (the test helpers' fixtures): prints
a markdown table, per probe: item, command, exit code, the first line of the message.

    python benchmarks/hostile_probes.py [--only 3,17]

No mirror, no network, no GPU. Skipped (said so in the table): item 21 (stage 3 on a loaded machine:
a real v0.19 tree from the mirror) and item 6's Ctrl-C during verify's stage 2 (torch's training
workers: tests/test_verify_kill.py runs it); item 6 is probed here on refresh instead. A few probes
start torch-importing verify stages on a tiny tree (items 7, 19, 20): seconds each.
Takes about a minute on 2 cores."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rocmport.cli import main as cli  # noqa: E402
from tests.helpers.patches import LAYERS  # noqa: E402
from tests.helpers.refresh import Ported, edit_line  # noqa: E402
from tests.helpers.sync import commit, g, init  # noqa: E402
from tests.test_refresh_kill import big_release, project as pooled_project  # noqa: E402
from tests.test_verify_inputs import CASE, fake_tree  # noqa: E402

Row = tuple[str, str, str, str]  # item, command, exit code, first line of the message


class Env:
    """What the test helpers' monkeypatch is asked for: environment variables, here for the whole script."""

    def setenv(self, name: str, value: str) -> None:
        os.environ[name] = value

    def chdir(self, path) -> None:
        os.chdir(path)


def rocmport(
    *args: str, cwd: Path | None = None, timeout: float = 300, env: dict | None = None
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rocmport", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
    )


def message(proc: subprocess.CompletedProcess | tuple[str, str]) -> str:
    """The line a user reads first: the error line if there is one, else the first line of the output."""
    out, err = (proc.stdout, proc.stderr) if isinstance(proc, subprocess.CompletedProcess) else proc
    lines = [ln.strip() for ln in err.splitlines() if ln.strip()]
    for ln in lines:
        if ln.startswith(("rocmport: error", "rocmport: internal error", "Error:")):
            return ln
    stdout = [ln.strip() for ln in out.splitlines() if ln.strip()]
    return (stdout or [ln for ln in lines if not ln.startswith("...")] or lines or [""])[0]


def shown(args: tuple[str, ...], tmp: Path) -> str:
    """The command as typed, with the probe's temporary directory written <tmp>."""
    return ("rocmport " + shlex.join(args)).replace(str(tmp), "<tmp>")


def run_row(
    item: str, tmp: Path, *args: str, note: str = "", pick: Callable[[subprocess.CompletedProcess], str] = message, **kw
) -> Row:
    proc = rocmport(*args, **kw)
    return (
        item,
        shown(args, tmp) + (f" ({note})" if note else ""),
        str(proc.returncode),
        pick(proc).replace(str(tmp), "<tmp>"),
    )


# --- the probes, one function per item: each returns its rows ------------------------------------


def item1(tmp: Path) -> list[Row]:
    tree = fake_tree(tmp / "t")
    (tmp / "x" / "evilcase").mkdir(parents=True)
    (tmp / "x" / "evilcase" / "model_config.yaml").write_text("MODEL_ARGS: {}\n")
    row = run_row(
        "1",
        tmp,
        "verify",
        "--tree",
        str(tree),
        "--case",
        str(tmp / "x" / "evilcase"),
        "--stages",
        "4",
        "--record-golden",
        cwd=tmp,
    )
    wrote = (tmp / "x" / "evilcase.cpu-proxy.json").exists()
    return [(*row[:3], f"{row[3]} [outside file written: {'yes' if wrote else 'no'}]")]


def item2(tmp: Path) -> list[Row]:
    tree = fake_tree(tmp / "t")
    return [run_row("2", tmp, "verify", "--tree", str(tree), "--case", "/nonexistent/case", "--stages", "4", cwd=tmp)]


def item3(tmp: Path) -> list[Row]:
    rows = []
    for n, (setting, args) in enumerate(
        [
            ('tp = "two"', ("refresh", "--to", "v0.17", "--no-verify")),
            ('tp = "two"', ("bot", "--once")),
            ("tp = [2]", ("status",)),
            ("release-lines = 5", ("status",)),
            ("cache-dir = 5", ("status",)),
            ("worktree-dir = 5", ("status",)),
            ('worktree-dir = ["a"]', ("status",)),
            ('release-lines = "v0.16"', ("status",)),
        ]
    ):
        root = tmp / f"p{n}"
        root.mkdir()
        (root / "pyproject.toml").write_text(f"[tool.rocmport]\n{setting}\n")
        item, cmd, rc, msg = run_row("3", tmp, "-C", str(root), *args, cwd=tmp)
        rows.append((item, f"[tool.rocmport] {setting}; {cmd}", rc, msg))
    return rows


def item4(tmp: Path) -> list[Row]:
    port = Ported(tmp, Env())
    port.tag({"megatron/core/layers.py": edit_line(LAYERS, 30, "line 30 upstream")}, "core_v0.17.0", "0.17.0")
    assert port.run("refresh", "--to", "v0.17", "--no-verify") == 1
    rtree = port.root / "build" / "refresh" / "megatron-lm"
    (rtree / "megatron/core/layers.py").write_text(edit_line(LAYERS, 30, "line 30 upstream rocm"))
    g(rtree, "commit", "-qam", "resolve by hand")
    (rtree / "notes.txt").write_text("mine\n")
    proc = rocmport("-C", str(port.root), "refresh", "--abort", cwd=tmp)
    saved = [ln for ln in proc.stderr.splitlines() if "saved the refresh tree's work" in ln]
    return [
        (
            "4",
            "rocmport refresh --abort (after a committed resolution and an untracked file)",
            str(proc.returncode),
            (saved[0] if saved else message(proc)).replace(str(tmp), "<tmp>"),
        )
    ]


def item5(tmp: Path) -> list[Row]:
    port = Ported(tmp, Env())
    port.tag({"docs/index.md": "x\n"}, "core_v0.17.0", "0.17.0")
    proc = rocmport("-C", str(port.root), "refresh", "--to", "v0.17", "--no-verify", "--json", cwd=tmp)
    data = json.loads(proc.stdout) if proc.returncode == 0 else {}
    md = (
        (port.root / "build/refresh/summary.md").read_text()
        if (port.root / "build/refresh/summary.md").exists()
        else ""
    )
    status_line = next((ln for ln in md.splitlines() if ln.startswith("**Status:**")), "")
    return [
        (
            "5",
            "rocmport refresh --to v0.17 --no-verify --json",
            str(proc.returncode),
            f'"status": "{data.get("status")}", "verify": {json.dumps(data.get("verify"))}; summary.md: {status_line[:90]}',
        )
    ]


def item6(tmp: Path) -> list[Row]:
    """refresh signalled while its codemod pool parses the new release; kill -9 of it."""
    from tests.test_refresh_kill import Run

    rows = []
    for n, (how, signum) in enumerate(
        [
            ("Ctrl-C (SIGINT to its process group)", signal.SIGINT),
            ("SIGTERM to its process group", signal.SIGTERM),
            ("kill -9 of refresh", signal.SIGKILL),
        ]
    ):
        sub = tmp / f"k{n}"
        sub.mkdir()
        root = pooled_project(sub, Env(), big_release())
        run = Run(sub, root, "refresh", "--to", "v0.17", "--no-verify")
        try:
            run.wait_for(lambda: len(run.workers()) >= 2)
            time.sleep(0.5)
            if signum == signal.SIGKILL:
                run.proc.kill()
                run.proc.wait(timeout=60)  # a surviving worker would hold the pipes open
                out, err = "", ""
            else:
                os.killpg(run.proc.pid, signum)
                out, err = run.proc.communicate(timeout=120)
        finally:
            run.close()
        left = run.gone_after()
        leftovers = list(run.tmpdir.iterdir())
        line = (
            message((out, err))
            if signum != signal.SIGKILL
            else "(killed: no message; its run directory stays, nothing can remove it)"
        )
        rows.append(
            (
                "6",
                f"rocmport refresh --to v0.17 --no-verify; {how} while its 2 codemod workers parse",
                str(run.proc.returncode),
                f"{line.replace(str(sub), '<tmp>')} [processes alive after: {len(left)}; temporary entries left: {len(leftovers)}]",
            )
        )
    rows.append(
        (
            "6",
            "Ctrl-C during verify's stage 2",
            "skipped",
            "torch training workers: run by tests/test_verify_kill.py (processes alive after: 0 asserted)",
        )
    )
    return rows


def item7(tmp: Path) -> list[Row]:
    """A --report that cannot be written (its directory is a file: unwritable for root too, which a
    read-only directory is not)."""
    tree = fake_tree(tmp / "t")
    (tmp / "a-file").write_text("")
    args = (
        "verify",
        "--tree",
        str(tree),
        "--stages",
        "1",
        "--report",
        str(tmp / "a-file" / "r.json"),
        "--junit",
        str(tmp / "j.xml"),
    )
    proc = rocmport(*args, cwd=tmp)
    said = [ln.strip() for ln in (proc.stdout + proc.stderr).splitlines() if "r.json" in ln]
    first = (said[0] if said else message(proc)).replace(str(tmp), "<tmp>")
    return [
        (
            "7",
            shown(args, tmp) + " (the report's directory is a file)",
            str(proc.returncode),
            f"{first} [summary printed: {'yes' if 'stages pass' in proc.stdout else 'no'}; JUnit written: {'yes' if (tmp / 'j.xml').exists() else 'no'}]",
        )
    ]


def item8(tmp: Path) -> list[Row]:
    tree = fake_tree(tmp / "t")
    return [
        run_row("8", tmp, "verify", "--tree", str(tree), *args, cwd=tmp)
        for args in (
            ("--dp", "-2", "--dry-run"),
            ("--nproc", "-4", "--dry-run"),
            ("--nproc", "0", "--dry-run"),
            ("--dry-run", "--tp", "99999999999999999999"),
        )
    ]


def item9(tmp: Path) -> list[Row]:
    tree = fake_tree(tmp / "t")
    return [
        run_row("9", tmp, "verify", "--tree", str(tree), "--unit-test", path, "--dry-run", cwd=tmp)
        for path in ("/etc/passwd", "tests/unit_tests/../../../megatron-bridge")
    ]


def item10(tmp: Path) -> list[Row]:
    tree = fake_tree(tmp / "t")
    return [run_row("10", tmp, "verify", "--tree", str(tree), "--hip-version", "", "--dry-run", cwd=tmp)]


def item11(tmp: Path) -> list[Row]:
    tree = fake_tree(tmp / "t")
    return [run_row("11", tmp, "verify", "--tree", str(tree), "--stages", s, "--dry-run", cwd=tmp) for s in (",,", "")]


def item12(tmp: Path) -> list[Row]:
    tree = fake_tree(tmp / "t")
    data = tmp / "data root"
    (data / "text/shard00/bpe").mkdir(parents=True)
    proc = rocmport(
        "verify", "--tree", str(tree), "--case", CASE, "--data-path", str(data), "--stages", "4", "--dry-run", cwd=tmp
    )
    said = next((ln for ln in proc.stdout.splitlines() if "--data-path" in ln), message(proc))
    missing = run_row(
        "12",
        tmp,
        "verify",
        "--tree",
        str(tree),
        "--case",
        CASE,
        "--data-path",
        str(tmp / "no such dir"),
        "--stages",
        "4",
        "--dry-run",
        cwd=tmp,
    )
    return [
        (
            "12",
            shown(
                ("verify", "--tree", str(tree), "--case", CASE, "--data-path", str(data), "--stages", "4", "--dry-run"),
                tmp,
            ),
            str(proc.returncode),
            said.strip().replace(str(tmp), "<tmp>"),
        ),
        missing,
    ]


def item13(tmp: Path) -> list[Row]:
    import yaml

    from tests.helpers.patches import Project

    proj = Project(tmp, Env())
    data = yaml.safe_load((proj.series_dir / "series").read_text())
    data["rocm"] = yaml.safe_load((REPO / "patchsets/megatron-lm/v0.16/series").read_text())["rocm"]
    (proj.series_dir / "series").write_text(yaml.safe_dump(data, sort_keys=False))
    assert cli(["-C", str(proj.root), "apply"]) == 0
    out = tmp / "Dockerfile"
    row = run_row(
        "13", tmp, "-C", str(proj.root), "emit", "docker", "--components", "apex,apex", "-o", str(out), cwd=tmp
    )
    return [(*row[:3], f"{row[3]} [Dockerfile written: {'yes' if out.exists() else 'no'}]")]


def item14(tmp: Path) -> list[Row]:
    bare = "/usr/bin/python3"
    if subprocess.run([bare, "-c", "import build"], capture_output=True).returncode == 0:
        return [
            ("14", "rocmport build --python <a Python without pypa build>", "skipped", f"{bare} has pypa build here")
        ]
    from tests.helpers.patches import Project

    proj = Project(tmp, Env())
    assert cli(["-C", str(proj.root), "apply"]) == 0  # the project root now has its build/ folder
    return [
        run_row(
            "14", tmp, "build", "--python", bare, cwd=proj.root, note="from the project root, which has a build/ folder"
        )
    ]


def item15(tmp: Path) -> list[Row]:
    from tests.helpers.patches import Project

    proj = Project(tmp, Env())
    assert cli(["-C", str(proj.root), "apply"]) == 0
    proj.write_series({}, codemods=["no-such-codemod"])
    root = str(proj.root)
    return [
        run_row("15", tmp, "-C", root, *args, cwd=tmp, note="series names an unknown codemod")
        for args in (
            ("patches", "check"),
            ("patches", "list"),
            ("status",),
            ("emit", "docker", "--components", "none", "-o", str(tmp / "D")),
        )
    ]


def item16(tmp: Path) -> list[Row]:
    port = Ported(tmp, Env())
    port.tag({"docs/index.md": "x\n"}, "core_v0.17.0", "0.17.0")
    missing = tmp / "no-such-remote.git"
    first = rocmport("-C", str(port.root), "bot", "--once", "--no-verify", "--push", str(missing), cwd=tmp)
    second = rocmport("-C", str(port.root), "bot", "--once", "--no-verify", cwd=tmp)
    good = tmp / "good.git"
    g(tmp, "init", "-q", "--bare", str(good))
    third = rocmport("-C", str(port.root), "bot", "--once", "--no-verify", "--push", str(good), "--json", cwd=tmp)
    processed = json.loads(third.stdout)["processed"] if third.returncode == 0 else []
    pushed = g(good, "branch", "--list")
    return [
        (
            "16",
            "bot --once --push <missing remote>; bot --once; bot --once --push good --json",
            f"{first.returncode}, {second.returncode}, {third.returncode}",
            f"last run: {[(p['tag'], p.get('push')) for p in processed]}; branches on good: {pushed or 'none'}",
        )
    ]


def item17(tmp: Path) -> list[Row]:
    root = init(tmp / "project")
    commit(root, {"README.md": "x\n"}, "project")
    (root / ".rocmport").mkdir()
    (root / ".rocmport" / "bot-state.json").write_text("[" * 100_000)
    return [
        run_row(
            "17", tmp, "-C", str(root), "bot", "--once", "--no-verify", cwd=tmp, note="bot-state.json: 100,000 nested ["
        )
    ]


def item18(tmp: Path) -> list[Row]:
    import shutil

    root = tmp / "project"
    shutil.copytree(REPO / "patchsets", root / "patchsets")

    def problem(proc: subprocess.CompletedProcess) -> str:
        said = [ln.strip() for ln in (proc.stdout + proc.stderr).splitlines() if "none of the components" in ln]
        return said[0] if said else message(proc)

    return [
        run_row(
            "18",
            tmp,
            "-C",
            str(root),
            "doctor",
            "--line",
            "v0.16",
            "--arch",
            arch,
            cwd=tmp,
            pick=problem,
            note="nothing installed",
        )
        for arch in ("gfx90a", "gfx1234")
    ]


def item19(tmp: Path) -> list[Row]:
    (tmp / "fake" / "megatron" / "core").mkdir(parents=True)
    return [run_row("19", tmp, "verify", "--tree", "fake", "--stages", "1", cwd=tmp)]


def item20(tmp: Path) -> list[Row]:
    port = Ported(tmp, Env())
    tree = port.root / "build" / "megatron-lm"
    v = rocmport("-C", str(port.root), "verify", "--stages", "1", cwd=tmp)
    dirty = g(tree, "status", "--porcelain", "--ignored")
    port.tag({"docs/index.md": "x\n"}, "core_v0.16.2", "0.16.2")  # a release the project's series admits
    s = rocmport(
        "-C", str(port.root), "sync", "--ref", "v0.16", "--no-bridge", "--remote", f"megatron-lm={port.up}", cwd=tmp
    )
    a = rocmport("-C", str(port.root), "apply", cwd=tmp)
    return [
        (
            "20",
            "rocmport verify --stages 1; rocmport sync --ref v0.16 (now core_v0.16.2); rocmport apply",
            f"{v.returncode}, {s.returncode}, {a.returncode}",
            f"tree after verify: {'clean' if not dirty else dirty.splitlines()[0]}; apply: {message(a)}".replace(
                str(tmp), "<tmp>"
            )[:200],
        )
    ]


def item21(tmp: Path) -> list[Row]:
    return [
        (
            "21",
            "verify stage 3 on a loaded machine (v0.19, Python 3.12, from the mirror)",
            "skipped",
            "needs the mirror's v0.19 tree and a long stage-3 run; the lead's item",
        )
    ]


# --- issue 41, rows 1, 2, 3, 8, 13, 19, 21, 22 (output paths, git operands, settings paths,
# interrupts, disk full): keys "41.N"; `--only 41.1,41.22`. Nothing here touches a real device: the
# "device" is a char device made with mknod in the probe's own directory (root) or skipped. --------


def _applied_project(tmp: Path):
    """The item-13 project: a series with the v0.16 rocm: matrix, applied (emit docker needs its tree)."""
    import yaml

    from tests.helpers.patches import Project

    proj = Project(tmp, Env())
    data = yaml.safe_load((proj.series_dir / "series").read_text())
    data["rocm"] = yaml.safe_load((REPO / "patchsets/megatron-lm/v0.16/series").read_text())["rocm"]
    (proj.series_dir / "series").write_text(yaml.safe_dump(data, sort_keys=False))
    assert cli(["-C", str(proj.root), "apply"]) == 0
    return proj


def _kind(path: Path) -> str:
    import stat as st

    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return "missing"
    return (
        "link"
        if st.S_ISLNK(mode)
        else "fifo"
        if st.S_ISFIFO(mode)
        else "chardev"
        if st.S_ISCHR(mode)
        else f"file {oct(st.S_IMODE(mode))}"
        if st.S_ISREG(mode)
        else "other"
    )


def row41_1(tmp: Path) -> list[Row]:
    proj = _applied_project(tmp)
    rows = []
    dev = tmp / "full"
    try:
        os.mknod(dev, 0o666 | 0o020000, os.makedev(1, 7))  # /dev/full's numbers, in the probe's directory
    except OSError:
        dev = None
    fifo = tmp / "fifo"
    os.mkfifo(fifo)
    link = tmp / "stdout-link"
    link.symlink_to("/proc/self/fd/1")
    for target, what in (
        (dev, "a char device (1,7: /dev/full)"),
        (fifo, "a FIFO"),
        (link, "a link to /proc/self/fd/1"),
    ):
        if target is None:
            rows.append(("41.1", "emit docker -o <char device>", "skipped", "mknod not permitted"))
            continue
        r = run_row("41.1", tmp, "-C", str(proj.root), "emit", "docker", "-o", str(target), cwd=tmp, note=what)
        rows.append((*r[:3], f"{r[3]} [after: {_kind(target)}]"))
    tree = fake_tree(tmp / "t")
    fifo2, link2 = tmp / "report-fifo", tmp / "junit-link"
    os.mkfifo(fifo2)
    (tmp / "elsewhere.xml").write_text("keep me\n")
    link2.symlink_to(tmp / "elsewhere.xml")
    r = run_row(
        "41.1",
        tmp,
        "verify",
        "--tree",
        str(tree),
        "--stages",
        "1",
        "--report",
        str(fifo2),
        "--junit",
        str(link2),
        cwd=tmp,
    )
    rows.append((*r[:3], f"{r[3]} [after: report {_kind(fifo2)}, junit {_kind(link2)}]"))
    return rows


def row41_2(tmp: Path) -> list[Row]:
    port = Ported(tmp, Env())
    port.tag({"docs/index.md": "x\n"}, "core_v0.17.0", "0.17.0")
    marker = tmp / "pwned"
    evil = f"--upload-pack=touch {marker};false"
    rows = []
    for args in (
        ("bot", "--once", "--no-verify", "--push", evil),
        ("sync", "--ref", "--upload-pack=touch x", "--no-bridge"),
        ("sync", "--ref", "v0.16", "--no-bridge", "--bridge-ref", "--output=x"),
        ("refresh", "--to", "--upload-pack=x", "--no-verify"),
    ):
        marker.unlink(missing_ok=True)
        r = run_row("41.2", tmp, "-C", str(port.root), *args, cwd=tmp, timeout=600)
        rows.append((*r[:3], f"{r[3]} [command ran: {'yes' if marker.exists() else 'no'}]"))
    return rows


def row41_3(tmp: Path) -> list[Row]:
    from tests.helpers.patches import Project

    proj = Project(tmp, Env())
    (proj.root / ".rocmport").mkdir()
    (proj.root / ".rocmport" / "local.yaml").write_text("worktree_dir: relbuild\n")
    elsewhere = tmp / "elsewhere"
    elsewhere.mkdir()
    r = run_row("41.3", tmp, "-C", str(proj.root), "apply", cwd=elsewhere, note="local.yaml worktree_dir: relbuild")
    where = (
        "caller's directory"
        if (elsewhere / "relbuild").exists()
        else "project"
        if (proj.root / "relbuild").exists()
        else "nowhere"
    )
    rows = [(*r[:3], f"{r[3]} [work trees in: {where}]")]
    (proj.root / ".rocmport" / "local.yaml").write_text("cache_dir: ~/tilde-cache\n")
    home = tmp / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "ROCMPORT_CACHE_DIR"}
    proc = subprocess.run(
        [sys.executable, "-m", "rocmport", "-C", str(proj.root), "sync", "--ref", "v0.16", "--no-bridge"]
        + ["--remote", f"megatron-lm={proj.up}"],
        cwd=elsewhere,
        capture_output=True,
        text=True,
        env={**env, "PYTHONPATH": str(REPO), "HOME": str(home)},
    )
    literal = [str(p.relative_to(tmp)) for p in (elsewhere / "~", proj.root / "~") if p.exists()]
    rows.append(
        (
            "41.3",
            "rocmport -C <project> sync --ref v0.16 --no-bridge (local.yaml cache_dir: ~/tilde-cache; from another dir)",
            str(proc.returncode),
            f"{message(proc)[:80]} [a literal '~' directory made: {literal or 'no'}; in $HOME: "
            f"{'yes' if (home / 'tilde-cache').exists() else 'no'}]".replace(str(tmp), "<tmp>"),
        )
    )
    return rows


def row41_8(tmp: Path) -> list[Row]:
    d = tmp / "tuning"
    d.mkdir()
    (d / "te_hipblaslt_algos_1.csv").write_text("m,n,k,algo\n1,2,3,4\n")
    outside = tmp / "outside.txt"
    outside.write_text("precious\n")
    (d / "te_hipblaslt_algos.csv").symlink_to(outside)
    r = run_row("41.8", tmp, "env", "--tune", "replay", str(d), "--no-fabric", cwd=tmp)
    return [
        (*r[:3], f"{r[3]} [outside file: {'kept' if outside.read_text() == 'precious' + chr(10) else 'OVERWRITTEN'}]")
    ]


def row41_13(tmp: Path) -> list[Row]:
    from tests.helpers.patches import Project

    proj = Project(tmp, Env())
    # A tree big enough that git checkout takes a moment (the signal lands while git itself runs).
    many = proj.up / "megatron" / "core" / "many"
    many.mkdir(parents=True)
    for i in range(15000):
        (many / f"f{i}.py").write_text(f"x = {i}\n")
    g(proj.up, "add", "-A")
    proj.pin(proj.upstream_commit({"megatron/core/many/__init__.py": ""}, "many files"))
    proj.refresh_mirror()
    shim = tmp / "shim"
    shim.mkdir()
    marker = tmp / "in-git-step"
    # A git that announces the checkout step (by a file), then runs it: the signal lands in git.
    (shim / "git").write_text(
        f'#!/bin/sh\ncase " $* " in *" checkout "*) touch {marker};; esac\nexec /usr/bin/git "$@"\n'
    )
    (shim / "git").chmod(0o755)
    proc = subprocess.Popen(
        [sys.executable, "-m", "rocmport", "-C", str(proj.root), "apply"],
        cwd=tmp,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env={**os.environ, "PYTHONPATH": str(REPO), "PATH": f"{shim}:{os.environ['PATH']}"},
    )
    deadline = time.monotonic() + 60
    while not marker.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.02)
    time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGINT)
    time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    again = rocmport("-C", str(proj.root), "apply", cwd=tmp)
    return [
        (
            "41.13",
            "rocmport apply; SIGINT to its group twice while git checkout runs",
            str(proc.returncode),
            f"{message((out, err))} [next apply: exit {again.returncode}]".replace(str(tmp), "<tmp>")[:220],
        )
    ]


def row41_19(tmp: Path) -> list[Row]:
    port = Ported(tmp, Env())
    port.tag({"docs/index.md": "x\n"}, "core_v0.16.2", "0.16.2")
    lock = port.root / "upstream.lock"
    lock.chmod(0o644)
    old = os.umask(0o022)
    try:
        r = run_row(
            "41.19",
            tmp,
            "-C",
            str(port.root),
            "sync",
            "--ref",
            "v0.16",
            "--no-bridge",
            "--remote",
            f"megatron-lm={port.up}",
            cwd=tmp,
        )
    finally:
        os.umask(old)
    return [(*r[:3], f"{r[3][:80]} [upstream.lock was file 0o644, now {_kind(lock)}]")]


def row41_21(tmp: Path) -> list[Row]:
    from tests.helpers.patches import Project

    rows = [run_row("41.21", tmp, "-C", str(tmp / "nonexistent"), "status", cwd=tmp)]
    proj = Project(tmp, Env())
    (proj.root / ".rocmport" / "local.yaml").mkdir(parents=True)
    rows.append(
        run_row("41.21", tmp, "-C", str(proj.root), "status", cwd=tmp, note=".rocmport/local.yaml is a directory")
    )
    return rows


def _fill(disk: Path, leave: int = 0) -> None:
    with contextlib.suppress(OSError), open(disk / "filler", "wb") as fh:
        while True:
            fh.write(b"\0" * 65536)
            fh.flush()
    os.truncate(disk / "filler", max(0, (disk / "filler").stat().st_size - leave))


def row41_22(tmp: Path) -> list[Row]:
    rows: list[Row] = []
    mnt = tmp / "small"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=5m", "tmpfs", str(mnt)], capture_output=True).returncode:
        rows.append(("41.22", "(a 5 MB tmpfs)", "skipped", "mount not permitted"))
    else:
        try:
            proj = _applied_project(mnt)
            _fill(mnt)
            r = run_row("41.22", mnt, "-C", str(proj.root), "emit", "docker", "-o", str(mnt / "D"), cwd=tmp)
            rows.append((r[0], r[1] + " (disk full)", r[2], r[3]))
            (mnt / "filler").unlink()
            import shutil

            shutil.rmtree(proj.tree)
            proj.pin(proj.upstream_commit({f"examples/big{i}.txt": "y" * 400_000 + str(i) for i in range(4)}))
            proj.refresh_mirror()
            _fill(mnt, leave=600_000)  # room for the clone, not for the checkout's 1.6 MB
            r = run_row("41.22", mnt, "-C", str(proj.root), "apply", cwd=tmp)
            rows.append((r[0], r[1] + " (disk nearly full: the checkout runs out)", r[2], r[3]))
        finally:
            subprocess.run(["umount", str(mnt)], check=False)
    from tests.helpers.patches import Project

    import yaml

    (tmp / "p").mkdir()
    proj = Project(tmp / "p", Env())
    (proj.series_dir / "0001-evil.patch").symlink_to("/etc/passwd")

    data = yaml.safe_load((proj.series_dir / "series").read_text())
    data["patches"] = ["0001-evil.patch"]
    (proj.series_dir / "series").write_text(yaml.safe_dump(data, sort_keys=False))
    first = Path("/etc/passwd").read_text().splitlines()[0]
    for args in (("apply",), ("patches", "check"), ("patches", "list")):
        proc = rocmport("-C", str(proj.root), *args, cwd=tmp)
        echoed = first[:10] in proc.stdout + proc.stderr
        rows.append(
            (
                "41.22",
                f"rocmport {' '.join(args)} (a patch that links to /etc/passwd)",
                str(proc.returncode),
                f"{message(proc)[:150]} [its target's content echoed: {'yes' if echoed else 'no'}]".replace(
                    str(tmp), "<tmp>"
                ),
            )
        )
    return rows


PROBES_41A: dict[str, Callable[[Path], list[Row]]] = {
    f"41.{n}": globals()[f"row41_{n}"] for n in (1, 2, 3, 8, 13, 19, 21, 22)
}


PROBES: dict[str, Callable[[Path], list[Row]]] = {str(i): globals()[f"item{i}"] for i in range(1, 22)}
PROBES.update(PROBES_41A)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", help="comma-separated item numbers")
    args = p.parse_args()
    chosen = [i.strip() for i in args.only.split(",")] if args.only else list(PROBES)
    rows: list[Row] = []
    started = time.monotonic()
    home = os.environ.copy()
    for item in chosen:
        with tempfile.TemporaryDirectory(prefix=f"rocmport-probe{item}-") as tmp:
            os.environ["ROCMPORT_CACHE_DIR"] = str(Path(tmp) / "cache")
            cwd = os.getcwd()
            try:
                with (
                    contextlib.redirect_stdout(io.StringIO()),
                    contextlib.redirect_stderr(io.StringIO()),
                ):  # the fixtures' own output
                    rows += PROBES[item](Path(tmp).resolve())
            except Exception as exc:  # a probe that could not be set up: said in the table, the rest still run
                rows.append((str(item), "(probe setup)", "error", f"{type(exc).__name__}: {exc}"[:200]))
            finally:
                os.chdir(cwd)
                os.environ.clear()
                os.environ.update(home)
    print("| item | command | exit | first line of the message |")
    print("|---|---|---|---|")
    for item, command, rc, msg in rows:
        cell = lambda s: (s if len(s) <= 220 else s[:219] + "…").replace("|", "\\|").replace("\n", " ")  # noqa: E731
        print(f"| {item} | `{cell(command)}` | {rc} | {cell(msg)} |")
    print(
        f"\n{len(rows)} probes of {len(chosen)} items in {time.monotonic() - started:.0f} s; "
        "skipped: item 21 (mirror, long stage 3) and item 6's verify stage 2 (torch workers; tests/test_verify_kill.py)."
    )


# --- issue 41, rows 4-7, 9-12, 14-18, 20 (checked readers, parsing limits, options, TE inputs, status) --


def _series_with_te_versions(tmp: Path, versions) -> Path:
    """A synced and applied project whose series' rocm: matrix gives transformer_engine ``versions``."""
    import yaml

    from tests.helpers.patches import Project

    proj = Project(tmp, Env())
    data = yaml.safe_load((proj.series_dir / "series").read_text())
    data["rocm"] = yaml.safe_load((REPO / "patchsets/megatron-lm/v0.16/series").read_text())["rocm"]
    assert cli(["-C", str(proj.root), "apply"]) == 0
    data["rocm"]["components"]["transformer_engine"]["versions"] = versions
    (proj.series_dir / "series").write_text(yaml.safe_dump(data, sort_keys=False))
    return proj.root


def row41_4(tmp: Path) -> list[Row]:
    rows = []
    for versions in (5, 2.9):
        root = _series_with_te_versions(tmp / f"v{versions}", versions)
        for args in (
            ("status",),
            ("patches", "list"),
            ("emit", "docker", "-o", str(tmp / "D")),
            ("verify", "--te", "auto", "--dry-run"),
        ):
            item, cmd, rc, msg = run_row("41.4", tmp, "-C", str(root), *args, cwd=tmp)
            rows.append((item, f"versions: {versions}; {cmd}", rc, msg))
    return rows


def _last_json(tmp: Path, name: str, text: str) -> Path:
    root = tmp / name
    (root / "build" / "verify").mkdir(parents=True)
    (root / "build" / "verify" / "last.json").write_text(text)
    return root


LAST_OK = {
    "started": "2026-01-01T00:00:00",
    "tree": "/x/megatron-lm",
    "line": "v0.16",
    "commit": "0" * 40,
    "verdict": "all stages pass",
    "stages": [{"name": "imports", "status": "pass"}],
    "report": "/x/r.json",
}


def row41_5(tmp: Path) -> list[Row]:
    rows = []
    for n, (what, text) in enumerate(
        [
            ("[]", "[]"),
            ("null", "null"),
            ('"x"', '"x"'),
            ("100,000 nested [", "[" * 100_000),
            ("stages: 5", json.dumps({**LAST_OK, "stages": 5})),
            ("verdict: [1]", json.dumps({**LAST_OK, "verdict": [1]})),
        ]
    ):
        root = _last_json(tmp, f"p{n}", text)
        item, cmd, rc, msg = run_row("41.5", tmp, "-C", str(root), "status", cwd=tmp, pick=_last_verify_line)
        rows.append((item, f"last.json {what}; {cmd}", rc, msg))
    return rows


def _last_verify_line(proc: subprocess.CompletedProcess) -> str:
    said = [ln.strip() for ln in (proc.stdout + proc.stderr).splitlines() if "last verify" in ln or "not a" in ln]
    return said[0] if said else message(proc)


APEX = "from apex.normalization import FusedLayerNorm\n"  # what makes the codemods parse a file


def row41_6(tmp: Path) -> list[Row]:
    rows = []
    for name, text in (
        ("3,000 nested (", APEX + "x = " + "(" * 3000 + "1" + ")" * 3000 + "\n"),
        ("1,000 nested ( unclosed", APEX + "x = " + "(" * 1000 + "\n"),
        ("20,000-term 1+1+...", APEX + "x = " + "+".join(["1"] * 20000) + "\n"),
    ):
        tree = tmp / name.split()[0].replace(",", "")
        (tree / "megatron" / "core").mkdir(parents=True)
        (tree / "megatron" / "core" / "ok.py").write_text(APEX)
        (tree / "megatron" / "core" / "hostile.py").write_text(text)
        started = time.monotonic()
        try:
            item, cmd, rc, msg = run_row(
                "41.6",
                tmp,
                "codemod",
                "--check",
                "--jobs",
                "2",
                str(tree),
                cwd=tmp,
                timeout=150,
                pick=lambda p: next(
                    (ln.strip() for ln in p.stderr.splitlines() if "hostile.py" in ln or "files would" in ln),
                    message(p),
                ),
            )
        except subprocess.TimeoutExpired:
            item, cmd, rc, msg = (
                "41.6",
                shown(("codemod", "--check", str(tree)), tmp),
                "timeout",
                "still running at 150 s",
            )
        rows.append((item, f"{cmd} ({name})", rc, f"{msg} [{time.monotonic() - started:.0f} s]"))
    return rows


def row41_7(tmp: Path) -> list[Row]:
    d = tmp / "tune"
    d.mkdir()
    (d / "te_hipblaslt_algos_1.csv").write_bytes(b"M,N,K\n\xff\xfe1,2,3\n")
    return [run_row("41.7", tmp, "env", "--no-fabric", "--tune", "replay", str(d), cwd=tmp)]


def row41_9(tmp: Path) -> list[Row]:
    label = "a" * 64 + ".example"
    return [
        run_row("41.9", tmp, "env", "--master-addr", label, cwd=tmp),
        run_row("41.9", tmp, "env", cwd=tmp, env={"MASTER_ADDR": label}, note="MASTER_ADDR a 64-character label"),
    ]


def _te_wheel(path: Path, version: str, python_layer: bool = True) -> Path:
    import zipfile

    whl = path / f"transformer_engine-{version}-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as zf:
        if python_layer:
            zf.writestr("transformer_engine/__init__.py", f"__version__ = '{version}'\n")
        zf.writestr(
            f"transformer_engine-{version}.dist-info/METADATA", f"Name: transformer_engine\nVersion: {version}\n"
        )
    return whl


def _te_run(
    tmp: Path, index_url: str, *args: str, timeout: float = 200, cache: str = "cache"
) -> subprocess.CompletedProcess:
    tree = fake_tree(tmp / "t")
    return rocmport(
        "-C",
        str(tmp),
        "verify",
        "--tree",
        str(tree),
        *args,
        cwd=tmp,
        timeout=timeout,
        env={"ROCMPORT_INDEX_URL": index_url, "ROCMPORT_CACHE_DIR": str(tmp / cache)},
    )


def _te_row(row: str, tmp: Path, proc: subprocess.CompletedProcess, args: tuple[str, ...], note: str) -> Row:
    said = [ln.strip() for ln in (proc.stdout + proc.stderr).splitlines() if "Transformer Engine" in ln or "TE " in ln]
    msg = message(proc) if proc.returncode else (said[0] if said else message(proc))
    return (row, f"rocmport verify {shlex.join(args)} ({note})", str(proc.returncode), msg.replace(str(tmp), "<tmp>"))


def row41_10(tmp: Path) -> list[Row]:
    from tests.helpers.pypi import Index

    files = tmp / "files"
    files.mkdir()
    rows = []
    with Index(files) as index:
        for v in ("0.0.0", "1.9.0"):
            index.add("transformer-engine", _te_wheel(files, v, python_layer=False))
        for v in ("0.0.0", "1.9.0"):
            args = ("--te", v, "--stages", "1", "--dry-run")
            rows.append(
                _te_row(
                    "41.10", tmp, _te_run(tmp, index.url, *args), args, "a wheel with no transformer_engine package"
                )
            )
        index.add("transformer-engine", _te_wheel(files, "2.5.0"))
        args = ("--te", "2.5.0", "--stages", "1", "--dry-run")
        rows.append(
            _te_row("41.10", tmp, _te_run(tmp, index.url, *args), args, "below a line's >=2.9 range; no series here")
        )
    return rows


def row41_11(tmp: Path) -> list[Row]:
    import socket
    import threading

    from tests.helpers.pypi import Index

    files = tmp / "files"
    files.mkdir()
    rows = []
    args = ("--te", "2.12.0", "--dry-run")
    with Index(files) as index:
        index.add("transformer-engine", _te_wheel(files, "2.12.0"))
        assert _te_run(tmp, index.url, *args).returncode == 0  # fetched into the cache
    rows.append(
        _te_row("41.11", tmp, _te_run(tmp, "http://127.0.0.1:9/simple", *args), args, "wheel cached, index unreachable")
    )
    stalled = socket.socket()
    stalled.bind(("127.0.0.1", 0))
    stalled.listen(8)
    held: list = []
    threading.Thread(target=lambda: [held.append(stalled.accept()) for _ in range(8)], daemon=True).start()
    url = f"http://127.0.0.1:{stalled.getsockname()[1]}/simple"
    args = ("--te", "auto", "--dry-run")
    started = time.monotonic()
    try:
        proc = _te_run(tmp, url, *args, timeout=150, cache="empty-cache")
        row = _te_row("41.11", tmp, proc, args, "an index that accepts and never answers; nothing cached")
        rows.append((*row[:3], f"{row[3]} [{time.monotonic() - started:.0f} s]"))
    except subprocess.TimeoutExpired:
        rows.append(
            (
                "41.11",
                f"rocmport verify {shlex.join(args)} (an index that never answers)",
                "timeout",
                "silent, still waiting at 150 s",
            )
        )
    finally:
        stalled.close()
    return rows


def row41_12(tmp: Path) -> list[Row]:
    from tests.helpers.pypi import Index

    files = tmp / "files"
    files.mkdir()
    (files / "transformer_engine-2.12.0-py3-none-any.whl").write_bytes(b"this is not a zip file\n")
    with Index(files) as index:
        index.add("transformer-engine", files / "transformer_engine-2.12.0-py3-none-any.whl")
        args = ("--te", "2.12.0", "--dry-run")
        return [_te_row("41.12", tmp, _te_run(tmp, index.url, *args), args, "a non-zip wheel, its sha256 matching")]


def row41_14(tmp: Path) -> list[Row]:
    ro = tmp / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    rows = [
        run_row("41.14", tmp, "env", "--arch", "", "--no-fabric", cwd=tmp),
        run_row("41.14", tmp, "env", "--tune", "record", "", "--no-fabric", cwd=tmp),
        run_row("41.14", tmp, "env", "--tune", "record", str(ro), "--no-fabric", cwd=tmp, note="a 0555 directory"),
    ]
    ro.chmod(0o755)
    return rows


def row41_15(tmp: Path) -> list[Row]:
    tree = fake_tree(tmp / "t")
    project = init(tmp / "project")
    commit(project, {"README.md": "x\n"}, "project")
    rows = [
        run_row("41.15", tmp, "verify", "--tree", str(tree), *args, "--dry-run", cwd=tmp)
        for args in (
            ("--te", "none", "--moe"),
            ("--unit-tests", "all", "--unit-test", "tests/unit_tests/test_x.py"),
            ("--no-unit-tests", "--unit-tests", "all"),
        )
    ]
    for args in (
        ("bot", "--once", "--interval", "5", "--no-verify"),
        ("bot", "--once", "--track", "main", "--lines", "v0.16", "--no-verify"),
    ):
        rows.append(run_row("41.15", tmp, "-C", str(project), *args, cwd=tmp, timeout=120))
    rows.append(run_row("41.15", tmp, "emit", "docker", "-o", "", cwd=tmp, pick=lambda p: message(p)[:120]))
    root = _series_with_te_versions(tmp / "e", ">=2.9.0a0,<2.13")
    (root / "build" / "megatron-lm" / "pyproject.toml").write_text(  # as the real tree's: extras to choose from
        '[project]\nname = "megatron-core"\nversion = "0.16.1"\ndependencies = ["numpy"]\n'
        '[project.optional-dependencies]\nmlm = ["flask"]\ndev = ["pytest"]\n'
    )
    rows.append(
        run_row(
            "41.15",
            tmp,
            "-C",
            str(root),
            "emit",
            "docker",
            "--components",
            "none",
            "--extra",
            "megatron-core:nosuchextra",
            "-o",
            str(tmp / "D"),
            cwd=tmp,
        )
    )
    return rows


def row41_16(tmp: Path) -> list[Row]:
    project = init(tmp / "project")
    commit(project, {"README.md": "x\n"}, "project")
    args = ("-C", str(project), "bot", "--watch", "--interval", "1e-300", "--no-verify")
    proc = subprocess.Popen(
        [sys.executable, "-m", "rocmport", *args],
        cwd=tmp,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=8)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    cycles = sum(1 for ln in err.splitlines() if "failed" in ln and "cycle" in ln)
    return [
        (
            "41.16",
            shown(args, tmp) + " (8 s)",
            str(proc.returncode),
            f"{message((out, err))} [failed cycles in 8 s: {cycles}]".replace(str(tmp), "<tmp>"),
        )
    ]


def row41_17(tmp: Path) -> list[Row]:
    tree = fake_tree(tmp / "t")
    (tmp / "pyproject.toml").write_text("[tool.rocmport]\ntp = 8\n")
    return [
        run_row(
            "41.17",
            tmp,
            "-C",
            str(tmp),
            "verify",
            "--tree",
            str(tree),
            "--dry-run",
            cwd=tmp,
            note="[tool.rocmport] tp = 8",
        )
    ]


def row41_18(tmp: Path) -> list[Row]:
    port = Ported(tmp, Env())
    port.tag({"docs/index.md": "x\n"}, "core_v0.17.0", "0.17.0")
    b = rocmport("-C", str(port.root), "bot", "--once", "--no-verify", "--lines", "v0.17", cwd=tmp)
    s = rocmport("-C", str(port.root), "status", cwd=tmp)
    flagged = [
        ln.strip()
        for ln in (s.stdout + s.stderr).splitlines()
        if "lock" in ln.lower() and ("pins" in ln or "mismatch" in ln or "not" in ln)
    ]
    tree = [ln.strip() for ln in s.stdout.splitlines() if "megatron-lm" in ln]
    return [
        (
            "41.18",
            "rocmport bot --once --no-verify --lines v0.17; rocmport status",
            f"{b.returncode}, {s.returncode}",
            (flagged[0] if flagged else f"not flagged: {tree[0] if tree else message(s)}").replace(str(tmp), "<tmp>")[
                :200
            ],
        )
    ]


def row41_20(tmp: Path) -> list[Row]:
    root = _last_json(tmp, "p", json.dumps({**LAST_OK, "verdict": "\x1b]0;pwned\x07all \x1b[2Jstages pass"}))
    proc = rocmport("-C", str(root), "status", cwd=tmp)
    raw = "\x1b" in proc.stdout + proc.stderr
    return [
        (
            "41.20",
            "rocmport status (last.json's verdict holds an OSC title and a clear-screen escape)",
            str(proc.returncode),
            f"{_last_verify_line(proc)!r}"[:150] + f" [ESC reached the terminal: {'yes' if raw else 'no'}]",
        )
    ]


PROBES.update({f"41.{n}": globals()[f"row41_{n}"] for n in (4, 5, 6, 7, 9, 10, 11, 12, 14, 15, 16, 17, 18, 20)})


if __name__ == "__main__":
    main()
