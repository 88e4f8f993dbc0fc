"""TE's real Python layer from the package index, and the environment of a process that imports it on
the CPU proxy as verify's started processes do (the bootstrap, the firewall with TE let through, the
layer's own variables, the HIP simulation): the one set-up of tests/test_te_flavour.py's probes and
tests/test_te_layer.py's tp2 workers."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from rocmport.errors import BadInput
from rocmport.nvidia_only import blocked
from rocmport.verify.orchestration import firewall, te_layer
from rocmport.verify.runtime import protocol
from tests.helpers.real import REAL_CACHE, REPO

# The ROCm version the probes' HIP simulation reports (a real ROCm 7.1 build string).
HIP_VERSION = "7.1.25424-4179531dcd"


def real_layer(version: str) -> te_layer.TELayer:
    """TE ``version``'s Python layer from the package index (cached between runs); skips without torch
    or TE's own Python dependencies."""
    pytest.importorskip("torch")
    try:
        te_layer.check_deps()
    except BadInput as exc:
        pytest.skip(str(exc))
    return te_layer.fetch(REAL_CACHE, te_layer.choose(version, None, te_layer.list_wheels()))


def proxy_env(
    layer: te_layer.TELayer, boot: Path, *, hip: str | None = HIP_VERSION, extra: dict[str, str] | None = None
) -> dict[str, str]:
    """The environment of a process that loads ``layer`` on the proxy: verify's bootstrap written to
    ``boot``, the simulated HIP ``hip`` (None: the CUDA path), then ``extra``, then the layer's own
    variables (child_env: None removes one)."""
    firewall.write_bootstrap(boot)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(boot), str(REPO)]),
        **protocol.PYTHON.entry(sys.executable),
        **protocol.FIREWALL.entry(tuple(te_layer.unblocked(blocked("cpu-proxy")))),
        **protocol.PROXY.entry(True),
        **(protocol.HIP_SIM.entry(hip) if hip else {}),
        "OMP_NUM_THREADS": "1",
        **(extra or {}),
    }
    for key, value in te_layer.child_env(layer).items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env
