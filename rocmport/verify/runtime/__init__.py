"""What runs inside the processes verify starts (ranks, their children, upstream's scripts): the
bootstrap, the HIP simulation, the proxy shim, TE's CPU kernels and loader, the GPT worker, the
pytest plugin, the import probe and the Slurm task; and what in a failure is the proxy's own doing
(proxy_causes: the shim's frames and the CPU backend's messages, which stages 3 and 4 read too).
It talks to the parent only through ``protocol`` (environment variables) and imports nothing of the
orchestration side (tests/test_architecture.py)."""

import functools
import hashlib
from pathlib import Path


@functools.cache
def source_digest() -> str:
    """A digest of this package's sources: the proxy a rank ran on (the shim, the HIP simulation, TE's
    CPU layer, the plugin). The unported tree's runs are cached as baselines; one made on another proxy
    stood on other answers (a shim fix changes what both trees' runs do), so it is not reused."""
    h = hashlib.sha256()
    for f in sorted(Path(__file__).parent.glob("*.py")):
        h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]
