"""What every process verify starts on its own interpreter installs first (called by the
bootstrap's sitecustomize.py, after the import firewall; see rocmport.verify.orchestration.firewall): the HIP
simulation, TE's Python layer, the port-coverage record and the proxy shim, each as the protocol's
variables ask."""

from __future__ import annotations

import os
import sys
import time

from rocmport.verify.runtime import protocol


def install() -> None:
    # HIP simulation (CPU proxy): this process's torch is a ROCm build of protocol.HIP_SIM.
    if protocol.HIP_SIM.read():
        from rocmport.verify.runtime import hip_sim

        hip_sim.install()

    # Transformer Engine's own Python layer on the CPU proxy (verify --te): its compiled extension is
    # rocmport.verify.runtime.te_cpu (see rocmport.verify.orchestration.te_layer).
    if protocol.TE.read():
        from rocmport.verify.runtime import te_loader

        te_loader.install()

    # Port coverage: which of the tree's modules this process imported (the generated helpers record
    # the rewritten call sites that ran; see rocmport.verify.analyses.port_sites).
    sites = protocol.PORT_SITES.read()
    if sites:
        import atexit

        atexit.register(_record_modules, sites)

    # Upstream scripts (pretrain_gpt.py) in CPU-proxy mode: the shim goes into each torchrun worker.
    # (Under Slurm, rocmport.verify.runtime.slurm_task installs it once it has set the rank variables;
    # a rank server, rocmport.verify.runtime.rank_server, before the imports its ranks inherit.)
    if protocol.SHIM_WORKERS.read() and "LOCAL_RANK" in os.environ:
        install_worker_shim()
    # A child that a unit-test rank (shimmed by the pytest plugin, which sets protocol.SHIM_CHILDREN)
    # starts with multiprocessing's spawn gets the same shim: upstream's persistent async-checkpoint
    # worker begins with torch.cuda.set_device(rank % torch.cuda.device_count()); unshimmed, it dies
    # there and its rank waits on a queue for ever (a hang on the port and the unported tree alike).
    elif protocol.SHIM_CHILDREN.read() and "--multiprocessing-fork" in sys.argv:
        from rocmport.verify.runtime import proxy_shim

        try:
            proxy_shim.install_for_upstream_code()
        except proxy_shim.Unsupported:  # the rank that started it has reported the missing hook
            pass


def install_worker_shim() -> None:
    """The proxy shim of a worker of an upstream script, when the run asks for it (protocol.SHIM_WORKERS)."""
    if protocol.SHIM_WORKERS.read():
        from rocmport.verify.runtime import proxy_shim

        proxy_shim.install_for_script()


def _record_modules(directory: str) -> None:
    """At exit: the tree's modules this process imported, to <directory>/modules-<pid>-<ns>.txt."""
    files = sorted(
        {f for f in (getattr(m, "__file__", None) for m in list(sys.modules.values())) if f and "/megatron/" in f}
    )
    from rocmport.fsutil import write_file

    # A file of its own per process (a pid can be reused within one run): read as modules-*.txt.
    name = f"modules-{os.getpid()}-{time.monotonic_ns()}.txt"
    write_file(os.path.join(directory, name), "".join(f + "\n" for f in files), durable=False)
