"""How verify starts its multi-process stages: torchrun on one node (the default), torchrun with
an elastic rendezvous across nodes (`--nnodes/--node-rank/--rdzv-endpoint`, the same command run on
every node), or Slurm's `srun` with one task per GPU (the job's allocation decides the nodes).

Every stage renders its command here, so `rocmport verify --dry-run` shows exactly what would run."""

from __future__ import annotations

import socket
import sys
from dataclasses import dataclass

from rocmport.errors import BadInput

KINDS = ("torchrun", "slurm")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _endpoint(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise BadInput(f"--rdzv-endpoint {text!r}: expected HOST:PORT (e.g. node001:29500)")
    return host, int(port)


@dataclass(frozen=True)
class Launcher:
    kind: str = "torchrun"
    nnodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: str | None = None
    rdzv_id: str = "rocmport-verify"
    gpus: bool = False  # slurm: ask for GPUs (not in CPU-proxy mode)

    def __post_init__(self):
        if self.kind not in KINDS:
            raise BadInput(f"--launcher {self.kind!r}: expected one of {', '.join(KINDS)}")
        if self.nnodes < 1 or not 0 <= self.node_rank < self.nnodes:
            raise BadInput(
                f"--nnodes {self.nnodes} --node-rank {self.node_rank}: need nnodes >= 1 and 0 <= node-rank < nnodes"
            )
        if self.kind == "torchrun" and self.nnodes > 1 and not self.rdzv_endpoint:
            raise BadInput(
                f"--nnodes {self.nnodes}: give --rdzv-endpoint HOST:PORT (a host every node reaches; node 0's address)"
            )
        if self.kind == "slurm" and (self.node_rank or self.rdzv_endpoint):
            raise BadInput(
                "--launcher slurm: srun starts every node from one command; drop --node-rank/--rdzv-endpoint"
            )
        if self.rdzv_endpoint:
            _endpoint(self.rdzv_endpoint)

    @property
    def multi_node(self) -> bool:
        return self.nnodes > 1

    @property
    def reports(self) -> bool:
        """Whether this invocation holds global rank 0, which writes the stages' results."""
        return self.kind == "slurm" or self.node_rank == 0

    def per_node(self, world: int) -> int:
        if world % self.nnodes:
            raise BadInput(
                f"world size {world} does not split over --nnodes {self.nnodes}; use a tp×pp×dp that is a multiple of it"
            )
        return world // self.nnodes

    def runs_stage(self, single_node: bool) -> bool:
        """Single-node stages (upstream's unit tests, like upstream CI) run from node 0 only."""
        return not single_node or self.reports

    def command(
        self,
        world: int,
        target: list[str],
        stage: str,
        port: int | None = None,
        single_node: bool = False,
        rank_server: str | None = None,
    ) -> list[str]:
        """The command that starts ``world`` processes of ``target`` (``["-m", module, ...]`` or
        ``["script.py", ...]``) for ``stage``. A world of 1 always runs here alone; ``single_node``
        keeps every process on one node (under Slurm: one node of the allocation). ``rank_server``: the
        socket of a rank server on this node (rocmport.verify.runtime.rank_server) that forks the
        processes in torchrun's place; the command is its client, torchrun's options spelled alike."""
        if rank_server is not None and (self.kind == "torchrun" and (single_node or not self.multi_node)):
            from rocmport.verify.runtime import rank_client

            # -I: the client imports nothing of the run (no bootstrap, no torch); the standard library only.
            return [
                sys.executable,
                "-I",
                rank_client.__file__,
                f"--socket={rank_server}",
                f"--nproc_per_node={world}",
                "--master_addr=127.0.0.1",
                f"--master_port={port or free_port()}",
                *target,
            ]
        if world == 1 or (self.kind == "torchrun" and (single_node or not self.multi_node)):
            return [
                sys.executable,
                "-m",
                "torch.distributed.run",
                f"--nproc_per_node={world}",
                "--master_addr=127.0.0.1",
                f"--master_port={port or free_port()}",
                *target,
            ]
        nnodes = 1 if single_node else self.nnodes
        per_node = world if single_node else self.per_node(world)
        if self.kind == "torchrun":
            # A rendezvous id per stage: each stage is its own torchrun job on every node.
            return [
                sys.executable,
                "-m",
                "torch.distributed.run",
                f"--nnodes={self.nnodes}",
                f"--node_rank={self.node_rank}",
                f"--nproc_per_node={per_node}",
                "--rdzv_backend=c10d",
                f"--rdzv_endpoint={self.rdzv_endpoint}",
                f"--rdzv_id={self.rdzv_id}-{stage}",
                *target,
            ]
        gpus = [f"--gpus-per-node={per_node}"] if self.gpus else []
        return [
            "srun",
            f"--nodes={nnodes}",
            f"--ntasks-per-node={per_node}",
            f"--ntasks={world}",
            *gpus,
            "--kill-on-bad-exit=1",
            "--export=ALL",
            sys.executable,
            "-m",
            "rocmport.verify.runtime.slurm_task",
            f"--master-port={port or free_port()}",
            *target,
        ]

    def to_dict(self) -> dict:
        return {
            "kind": self.kind,
            "nnodes": self.nnodes,
            "node_rank": self.node_rank,
            "rdzv_endpoint": self.rdzv_endpoint,
        }
