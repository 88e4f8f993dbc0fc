"""One Slurm task of a verify stage (`srun ... python -m rocmport.verify.runtime.slurm_task --master-port P
TARGET...`): the torch.distributed environment torchrun would give it, derived from Slurm's, then
TARGET (`-m module args...` or `script.py args...`) runs in this process."""

from __future__ import annotations

import os
import re
import runpy
import sys
from collections.abc import Mapping

from rocmport.verify.runtime import protocol

_BRACKET = re.compile(r"^([^\[,]*)\[([^\]]+)\](.*)$")


def first_host(nodelist: str) -> str:
    """The first host of a Slurm node list (`node[001-004,007]`, `a,b`, `gpu-[1-2]-ib`); the
    first task (global rank 0) runs there."""
    head = nodelist.strip()
    m = _BRACKET.match(head)
    if m:
        first = m.group(2).split(",")[0].split("-")[0]
        return m.group(1) + first + m.group(3).split(",")[0]
    return head.split(",")[0]


def torch_env(environ: Mapping[str, str], master_port: int) -> dict[str, str]:
    try:
        rank, world, local = (int(environ[k]) for k in ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"))
    except KeyError as exc:
        raise SystemExit(
            f"rocmport.verify.runtime.slurm_task: {exc.args[0]} is not set; run it under srun (rocmport verify --launcher slurm)"
        )
    nodelist = environ.get("SLURM_STEP_NODELIST") or environ.get("SLURM_JOB_NODELIST") or "127.0.0.1"
    per_node = environ.get("SLURM_NTASKS_PER_NODE") or str(world // max(1, int(environ.get("SLURM_NNODES", "1"))))
    return {
        "RANK": str(rank),
        "WORLD_SIZE": str(world),
        "LOCAL_RANK": str(local),
        "LOCAL_WORLD_SIZE": per_node.split("(")[0],
        "GROUP_RANK": environ.get("SLURM_NODEID", "0"),
        "MASTER_ADDR": environ.get("MASTER_ADDR") or first_host(nodelist),
        "MASTER_PORT": str(master_port),
    }


def main(argv: list[str]) -> None:
    if not argv or not argv[0].startswith("--master-port="):
        raise SystemExit(
            "usage: python -m rocmport.verify.runtime.slurm_task --master-port=PORT (-m MODULE | SCRIPT) [ARGS...]"
        )
    os.environ.update(torch_env(os.environ, int(argv[0].split("=", 1)[1])))
    if protocol.SHIM_WORKERS.read():
        from rocmport.verify.runtime import proxy_shim

        proxy_shim.install_for_script()
    target = argv[1:]
    if target[:1] == ["-m"]:
        sys.argv = [target[1], *target[2:]]
        runpy.run_module(target[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = target
        sys.path.insert(0, os.path.dirname(os.path.abspath(target[0])))
        runpy.run_path(target[0], run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
