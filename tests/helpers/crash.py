"""Kill `rocmport apply` from outside at seeded random points and check what the next run does.

A round: start `apply` in its own process group, wait until it is observably under way (its state
file says in-progress), sleep a seeded random time, SIGKILL the whole group (the apply and every git
it started). In some rounds a user then works in the tree: appends to a tracked file, adds an
untracked file with an awkward name, commits a new file. The next `apply` must end at the reference
port (same commit id, clean tree, no git lock files left) — after refusing the user's work (exit 2),
and `apply --force` keeping it on a backup ref — and the user's work must be on a backup ref."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path


def _git(cwd: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=cwd, check=check, capture_output=True, text=True)


def run_apply(root: Path, *args: str, timeout: float = 1800) -> tuple[int, str]:
    p = subprocess.run(
        [sys.executable, "-m", "rocmport", "-C", str(root), "apply", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return p.returncode, p.stderr


def _state(tree: Path) -> dict:
    try:
        return json.loads((tree / ".git" / "rocmport-state.json").read_text())
    except (OSError, ValueError):
        return {}


@dataclass
class Round:
    seed: int
    delay: float
    fresh: bool  # the round began without a work tree (else: a rebuild over one)
    killed: bool = False  # the kill landed before the apply finished
    phase: str = ""  # what the state file said after the kill
    user_work: bool = False
    refused: bool | None = None  # the next apply refused the user's work (exit 2)
    recovered: bool = False  # ended at the reference commit, clean, no lock files
    work_kept: bool | None = None  # the user's edit, untracked file (and commit) are on a backup ref
    locks_removed: int = 0  # stale git locks the next run removed
    notes: list[str] = field(default_factory=list)

    def ok(self) -> bool:
        return self.recovered and (not self.user_work or bool(self.work_kept))


def kill_round(root: Path, tree: Path, reference: str, seed: int, max_delay: float) -> Round:
    rnd = random.Random(seed)
    r = Round(seed, round(rnd.uniform(0, max_delay), 3), fresh=rnd.random() < 0.5, user_work=rnd.random() < 0.5)
    if r.fresh or not (tree / ".git").exists():
        shutil.rmtree(tree, ignore_errors=True)
    else:  # the recorded inputs no longer match (as after a series edit): a full rebuild over the tree
        st = _state(tree)
        st["inputs"] = f"changed {seed}"
        (tree / ".git" / "rocmport-state.json").write_text(json.dumps(st))
    proc = subprocess.Popen(
        [sys.executable, "-m", "rocmport", "-C", str(root), "apply"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 600
    while proc.poll() is None and time.monotonic() < deadline and _state(tree).get("status") != "in-progress":
        time.sleep(0.005)
    time.sleep(r.delay)
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        r.killed = True
    proc.wait()
    st = _state(tree)
    r.phase = f"{st.get('status')}/{len(st.get('patches', []))} patches/{(st.get('step') or {}).get('kind', '-')}"
    marker = f"user work {seed}"
    committed = False
    if r.user_work and (tree / ".git").exists():
        tracked = tree / "megatron" / "core" / "package_info.py"
        if tracked.is_file():
            tracked.write_text(tracked.read_text() + f"# {marker}\n")
        (tree / f"notes {seed} — ü.txt").write_text(marker + "\n")
        if _git(tree, "rev-parse", "--verify", "-q", "HEAD", check=False).returncode == 0:
            (tree / f"mine_{seed}.py").write_text(f"# {marker}\n")
            add = _git(tree, "add", "--", f"mine_{seed}.py", check=False)
            committed = add.returncode == 0 and _git(tree, "commit", "-qm", marker, check=False).returncode == 0
            if not committed:
                r.notes.append("the user's own commit failed (git lock left by the kill)")
    rc, err = run_apply(root)
    r.locks_removed = err.count("left behind by an interrupted git")
    if r.user_work:
        r.refused = rc == 2 and "refusing to rebuild over" in err
        if rc == 2:
            rc, err = run_apply(root, "--force")
    if rc != 0:
        r.notes.append(f"apply exit {rc}: {err.strip().splitlines()[-1:] if err.strip() else ''}")
    head = _git(tree, "rev-parse", "HEAD").stdout.strip() if rc == 0 else ""
    clean = rc == 0 and _git(tree, "status", "--porcelain", "-z").stdout == ""
    locks = [str(p.relative_to(tree)) for p in (tree / ".git").rglob("*.lock")] if (tree / ".git").exists() else []
    if locks:
        r.notes.append(f"lock files left: {locks}")
    r.recovered = rc == 0 and head == reference and clean and not locks
    if r.user_work:
        refs = _git(tree, "for-each-ref", "--format=%(refname)", "refs/rocmport/backup/").stdout.split()
        found = set()
        for ref in refs:
            names = _git(tree, "grep", "-z", "-I", "-l", marker, ref, check=False).stdout.split("\0")
            found |= {n.split(":", 1)[1] for n in names if ":" in n}
        wanted = {f"notes {seed} — ü.txt"} | ({f"mine_{seed}.py"} if committed else set())
        r.work_kept = wanted <= found
    return r


def summary(rounds: list[Round]) -> str:
    killed = [r for r in rounds if r.killed]
    users = [r for r in rounds if r.user_work]
    return (
        f"{len(rounds)} rounds, {len(killed)} killed mid-apply, {sum(r.recovered for r in killed)} of them recovered to the "
        f"reference commit; user work in {len(users)} rounds: {sum(bool(r.refused) for r in users)} refused until --force, "
        f"{sum(bool(r.work_kept) for r in users)} kept on a backup ref; {sum(r.locks_removed for r in rounds)} stale git locks removed"
    )
