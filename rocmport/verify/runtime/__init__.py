"""What runs inside the processes verify starts (ranks, their children, upstream's scripts): the
bootstrap, the HIP simulation, the proxy shim, TE's CPU kernels and loader, the GPT worker, the
pytest plugin, the import probe and the Slurm task; and what in a failure is the proxy's own doing
(proxy_causes: the shim's frames and the CPU backend's messages, which stages 3 and 4 read too).
It talks to the parent only through ``protocol`` (environment variables) and imports nothing of the
orchestration side (tests/test_architecture.py)."""
