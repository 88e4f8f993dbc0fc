"""Real upstream-shaped git repositories for sync tests (no mocks of git)."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

from rocmport.verify.orchestration.launcher import free_port

ENV = {
    **os.environ,
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@t",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@t",
    "GIT_CONFIG_NOSYSTEM": "1",
}


def g(repo, *args, input=None) -> str:
    return subprocess.run(
        ["git", *args], cwd=repo, env=ENV, check=True, capture_output=True, text=True, input=input
    ).stdout.strip()


def init(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    g(path, "init", "-q", "-b", "main")
    return path


def commit(repo: Path, files: dict[str, str], msg: str, date: str = "2025-01-01T00:00:00+00:00") -> str:
    for rel, text in files.items():
        p = repo / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
        g(repo, "add", rel)
    env_date = {"GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date}
    subprocess.run(["git", "commit", "-q", "-m", msg], cwd=repo, env={**ENV, **env_date}, check=True)
    return g(repo, "rev-parse", "HEAD")


def package_info(version: str, pre: str = "") -> str:
    major, minor, patch = version.split(".")
    return f'MAJOR = {major}\nMINOR = {minor}\nPATCH = {patch}\nPRE_RELEASE = "{pre}"\n'


def build_mlm(root: Path) -> dict[str, str]:
    """Megatron-LM-shaped repo: tags v0.15.3 + core_v0.15.3 (same commit), core_v0.16.0, core_v0.16.1,
    core_v0.17.0rc0, core_v0.18.0, a release branch core_r0.16.0, and a refs/pull/* ref."""
    repo = init(root)
    c = {}
    c["0.15.3"] = commit(repo, {"megatron/core/package_info.py": package_info("0.15.3")}, "0.15.3")
    g(repo, "tag", "v0.15.3")
    g(repo, "tag", "-a", "-m", "release", "core_v0.15.3")
    c["0.16.0rc0"] = commit(
        repo, {"megatron/core/package_info.py": package_info("0.16.0", "rc0")}, "untagged 0.16.0rc0"
    )
    c["0.16.0"] = commit(
        repo, {"megatron/core/package_info.py": package_info("0.16.0")}, "0.16.0", "2025-02-01T00:00:00+00:00"
    )
    g(repo, "tag", "core_v0.16.0")
    c["0.16.1"] = commit(
        repo, {"megatron/core/package_info.py": package_info("0.16.1")}, "0.16.1", "2025-03-01T00:00:00+00:00"
    )
    g(repo, "tag", "-a", "-m", "release", "core_v0.16.1")
    g(repo, "branch", "core_r0.16.0")
    c["0.17.0rc0"] = commit(
        repo, {"megatron/core/package_info.py": package_info("0.17.0", "rc0")}, "0.17.0rc0", "2025-04-01T00:00:00+00:00"
    )
    g(repo, "tag", "core_v0.17.0rc0")
    c["0.18.0"] = commit(
        repo, {"megatron/core/package_info.py": package_info("0.18.0")}, "0.18.0", "2025-05-01T00:00:00+00:00"
    )
    g(repo, "tag", "core_v0.18.0")
    g(repo, "update-ref", "refs/pull/1/head", c["0.16.0"])
    return c


def bridge_pyproject(core_spec: str) -> str:
    return f'[project]\nname = "megatron-bridge"\ndependencies = [\n    "torch",\n    "megatron-core[dev,mlm]{core_spec}",\n]\n'


def build_bridge(root: Path, mlm: dict[str, str]) -> dict[str, str]:
    """Bridge-shaped repo, ranges as upstream declares them: v0.2.0 and v0.2.2 (gitlink an untagged 0.16.0rc0,
    declare >=0.15.0a0,<0.16), v0.3.1 (gitlink exactly 0.16.1, declares >=0.15.0a0,<0.17: admits 0.15.x too),
    v0.4.0 (gitlink 0.17.0rc0, unbounded), and a pre-release v0.5.0rc0."""
    repo = init(root)
    out = {}
    for tag, link, spec in (
        ("v0.2.0", mlm["0.16.0rc0"], ">=0.15.0a0,<0.16.0"),
        ("v0.2.2", mlm["0.16.0rc0"], ">=0.15.0a0,<0.16.0"),
        ("v0.3.1", mlm["0.16.1"], ">=0.15.0a0,<0.17.0"),
        ("v0.4.0", mlm["0.17.0rc0"], ""),
        ("v0.5.0rc0", mlm["0.18.0"], ""),
    ):
        g(repo, "update-index", "--add", "--cacheinfo", f"160000,{link},3rdparty/Megatron-LM")
        version = tag[1:].split("rc")[0]
        out[tag] = commit(
            repo,
            {"pyproject.toml": bridge_pyproject(spec), "src/megatron/bridge/package_info.py": package_info(version)},
            tag,
        )
        g(repo, "tag", tag)
    return out


class GitDaemon:
    """A real git:// server on loopback exporting ``base`` (for network-transport tests)."""

    def __init__(self, base: Path):
        self.base = base
        self.port = free_port()
        self.proc = None

    def __enter__(self):
        self.proc = subprocess.Popen(
            [
                "git",
                "daemon",
                "--reuseaddr",
                "--export-all",
                f"--base-path={self.base}",
                "--listen=127.0.0.1",
                f"--port={self.port}",
                str(self.base),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(100):
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return self
            time.sleep(0.05)
        raise RuntimeError("git daemon did not start")

    def url(self, name: str) -> str:
        return f"git://127.0.0.1:{self.port}/{name}"

    def __exit__(self, *exc):
        self.proc.terminate()
        self.proc.wait(5)
