"""What runs inside the processes verify starts (ranks, their children, upstream's scripts): the
bootstrap, the HIP simulation, the proxy shim, TE's CPU kernels and loader, the GPT worker, the
pytest plugin (and the seeding of the host's generators the two share: seeding), the import probe
and the Slurm task; and what in a failure is the proxy's own doing (proxy_causes: the shim's frames
and the CPU backend's messages, which stages 3 and 4 read too).
It talks to the parent only through ``protocol`` (environment variables) and imports nothing of the
orchestration side (tests/test_architecture.py)."""

import hashlib
from pathlib import Path

# The code the proxy's ranks run besides the tree (the shim, the HIP simulation, TE's CPU layer, the rank
# server, the plugin).
SOURCES = Path(__file__).parent


def source_digest() -> str:
    """A digest of the Python sources under SOURCES: the proxy a rank ran on. The unported tree's runs
    are cached as baselines; one made on another proxy stood on other answers (a shim fix changes what
    both trees' runs do: the virtual-pipeline cases' NaN was a cached baseline's after the proxy held
    the sent memory), so it is not reused."""
    h = hashlib.sha256()
    for f in sorted(SOURCES.glob("*.py")):
        h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]
