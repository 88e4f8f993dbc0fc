"""What runs inside the processes verify starts (ranks, their children, upstream's scripts): the
bootstrap, the HIP simulation, the proxy shim, TE's CPU kernels and loader, the GPT worker, the
pytest plugin, the import probe and the Slurm task. It talks to the parent only through
``protocol`` (environment variables) and imports nothing of the orchestration side
(tests/test_architecture.py)."""
